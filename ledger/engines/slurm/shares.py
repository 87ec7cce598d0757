"""Slurm association shares as a budget file: `gpuledger slurm import-shares`.

Pure: `sacctmgr` output in, budget TOML (`gpuledger budget apply`) out, and what `budget apply`
accepts is what this writes (tests/unit/test_slurm_pure.py applies every file it writes):

- Slurm's tree has one root; the ledger's programs are its top level and hold projects, and
  only projects hold users. An account with users (or under one that has users) is a project,
  the others programs; when a top-level account holds users itself, Slurm's root is kept as the
  program `root` above every account, so the projects sit under a program.
- A share of `parent` is Slurm's "no share of its own: it competes as its parent, with the
  parent's share and usage" (sacctmgr's `Fairshare=parent`). A user with it becomes a member
  with the default member share, 1: inside its account it has no weight of its own, and its
  usage is charged to the account as every member's is (the account's share is the account's
  alone; the member's share, 40 say, would be a weight against the account's other users, which
  Slurm never gives it). The ledger has no member without a share, so such users are ranked
  among the account's members as equals: Slurm would rank them as the account. The caller
  names them (`Imported.inherit`). An account with `parent` takes its parent account's share.
- An association that appears more than once (one per cluster or partition) is reported by
  the caller (`Imported.duplicates`), and its first share and parent are kept.
- Account names are lowercased (Slurm stores them so); an account that is its own ancestor and
  a share over the ledger's bound are refused with one line naming the line or the loop.
- Users associated with Slurm's root account itself (`root||alice|3`) become members of the
  project `root/root` (their shares its member shares, the project's share their sum: in Slurm
  each competes beside the top-level accounts), and Slurm's root is kept as the program `root`.
  Slurm's own `root||root|1` association (made by every install) is left out, and named
  (`Imported.left_out`): the ledger's admins are named at `init`, not by membership.
- An account whose parent is in no line (a filtered or partial output, a parent on another
  cluster) is placed at the top, as if its parent were Slurm's root, and named
  (`Imported.orphans`): `budget apply` refuses a parent it does not know.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from schemas.bounds import NAME_PATTERN
from schemas.errors import InvalidCommand

_NAME = re.compile(NAME_PATTERN)

MAX_SHARES = 1_000_000_000
"""The largest share `budget apply` takes (`schemas.bounds.Shares`)."""
SACCTMGR_ARGS = ("sacctmgr", "-nP", "show", "associations", "format=Account,ParentName,User,Share")
PARENT = -1
"""A share of `parent` in the rows, before it is resolved."""


class Imported(NamedTuple):
    """What `parse_sacctmgr_shares` read: (account, user or "", shares) rows with every
    `parent` share resolved, account -> parent account, and the associations seen more than
    once with each share they were given ("account" or "account/user" -> shares)."""

    rows: list[tuple[str, str, int]]
    parents: dict[str, str]
    duplicates: dict[str, list[int]]
    inherit: list[str]
    """The users ("account/user") whose share was `parent`: members with the default share."""
    orphans: dict[str, str]
    """The accounts whose parent is in no line (account -> that parent): placed at the top."""
    left_out: list[str]
    """The associations ("account/user") not written: Slurm's own `root/root`."""


def parse_sacctmgr_shares(text: str) -> Imported:
    """Pure: `sacctmgr -nP show associations format=Account,ParentName,User,Share` read (module
    doc): Slurm's own `root||root` is left out, an unknown parent made the top, both named."""
    seen: dict[tuple[str, str], int] = {}
    duplicates: dict[str, list[int]] = {}
    parents: dict[str, str] = {}
    left_out: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.strip().split("|")]
        if len(cells) != 4:
            raise InvalidCommand(
                f"sacctmgr line {n} has {len(cells)} fields, not 4: {line.strip()!r}",
                hint="run: " + " ".join(SACCTMGR_ARGS),
            )
        account, parent, user, share = cells
        if (account, user, share) == ("Account", "User", "Share"):
            continue  # a header line
        account, parent = account.lower(), parent.lower()  # Slurm's accounts are lowercase
        for what, name in (("account", account), ("parent account", parent), ("user", user)):
            if name and not _NAME.match(name):  # what `budget apply` would refuse: refused here
                raise InvalidCommand(
                    f"sacctmgr line {n}: {what} name {name!r} cannot be a ledger name (letters, "
                    "digits, '_', '.', '-'; at most 63)",
                    hint="rename it in the saved output (--from FILE), or leave the line out",
                )
        if parent:
            parents.setdefault(account, parent)  # the first association's, as its share
        if account == "root" and user == "root":
            if "root/root" not in left_out:
                left_out.append("root/root")
            continue
        if share.lower() == "parent":
            value = PARENT
        elif share.isdigit() and int(share) <= MAX_SHARES:
            value = int(share)
        elif share.isdigit():
            raise InvalidCommand(
                f"sacctmgr line {n}: share {share} is over the ledger's {MAX_SHARES:,}",
                hint="scale the shares down in the saved output (--from FILE)",
            )
        else:
            raise InvalidCommand(f"sacctmgr line {n}: share {share!r} is not a whole number")
        key = (account, user)
        if key in seen:
            name = f"{account}/{user}" if user else account
            duplicates.setdefault(name, [seen[key]]).append(value)
            continue
        seen[key] = value
    for account in parents:
        _no_cycle(parents, account)
    known = {a for a, _ in seen} | {"root"}
    orphans = {a: p for a, p in parents.items() if p not in known}
    parents.update({a: "root" for a in orphans})
    rows = [(a, u, _resolved(seen, parents, a, u)) for (a, u) in seen]
    inherit = [f"{a}/{u}" for (a, u), share in seen.items() if u and share == PARENT]
    return Imported(rows, parents, duplicates, inherit, orphans, left_out)


def _no_cycle(parents: Mapping[str, str], account: str) -> None:
    """Pure: refuse an account that is its own ancestor (`a|a||1`, or a longer loop): Slurm's
    tree has none, so the saved output was edited or is not sacctmgr's."""
    path = [account]
    while parents.get(path[-1], "") not in ("", "root"):
        path.append(parents[path[-1]])
        if path[-1] in path[:-1]:
            raise InvalidCommand(
                f"sacctmgr: account {account!r} is its own ancestor ({' -> '.join(path)})",
                hint="Slurm's accounts form a tree: fix the ParentName column",
            )


def _resolved(
    seen: Mapping[tuple[str, str], int], parents: Mapping[str, str], a: str, u: str
) -> int:
    """The share of association (a, u): a user's `parent` the default member share, 1 (module
    doc); an account's `parent` its parent account's, up the tree (the root's, 1 when it says
    none)."""
    if u and seen.get((a, u)) == PARENT:
        return 1
    for _ in range(128):
        share = seen.get((a, u))
        if share is not None and share != PARENT:
            return share
        if u:  # a user's parent is its account's association
            u = ""
        elif a in parents and parents[a] not in ("", a):
            a = parents[a]
        else:
            return 1
    return 1


def accounts_written(toml: str) -> int:
    """Pure: how many accounts a budget file written by `shares_toml` holds (Slurm's root
    included when it is kept as the program `root`)."""
    return sum(1 for line in toml.splitlines() if line.startswith("[accounts."))


def shares_toml(rows: Iterable[tuple[str, str, int]], parents: Mapping[str, str]) -> str:
    """Pure: a budget file (`gpuledger budget apply`) from Slurm association shares (module
    doc). `parents` maps each Slurm account to its parent account."""
    rows = list(rows)
    users: dict[str, list[tuple[str, int]]] = {}
    for a, u, s in rows:
        if u:
            users.setdefault(a, []).append((u, s))
    account_shares = {a: s for a, u, s in rows if not u}

    def chain(acct: str) -> list[str]:
        out = [acct]
        while parents.get(out[-1], "root") not in ("root", "") and len(out) < 64:
            out.append(parents[out[-1]])
        return out

    accounts = {a for a, _, _ in rows} - {"root"}
    root_users = sorted(users.get("root", []))
    top_holds_users = bool(root_users) or any(len(chain(a)) == 1 and a in users for a in accounts)
    prefix = ["root"] if top_holds_users else []
    lines = ["# imported from Slurm associations (sacctmgr); review, then `gpuledger budget apply`"]
    if top_holds_users:
        lines += [
            "# a top-level account holds users (a project here), so Slurm's root is the program",
            "# `root` above every account",
            "",
            '[accounts."root"]',
            'kind = "program"',
            f"shares = {account_shares.get('root', 1)}",
        ]
    if root_users:  # users of Slurm's root account itself: one project beside the others
        lines += [
            "",
            "# the users associated with Slurm's root account itself",
            '[accounts."root/root"]',
            'kind = "project"',
            f"shares = {min(MAX_SHARES, sum(s for _, s in root_users))}",
            *_members(root_users),
        ]
    for acct in sorted(accounts, key=lambda a: "/".join(reversed(chain(a)))):
        path = "/".join(prefix + list(reversed(chain(acct))))
        kind = "project" if any(a in users for a in chain(acct)) else "program"
        lines += ["", f'[accounts."{path}"]', f'kind = "{kind}"']
        lines.append(f"shares = {account_shares.get(acct, 1)}")
        if acct in users:
            lines += _members(sorted(users[acct]))
    return "\n".join(lines) + "\n"


def _members(members: list[tuple[str, int]]) -> list[str]:
    """Pure: a project's `members` (and `member_shares` for those not of share 1) lines."""
    out = ["members = [" + ", ".join(f'"{u}"' for u, _ in members) + "]"]
    weights = [(u, s) for u, s in members if s != 1]
    if weights:
        out.append("member_shares = { " + ", ".join(f'"{u}" = {s}' for u, s in weights) + " }")
    return out
