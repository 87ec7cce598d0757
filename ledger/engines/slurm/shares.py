"""Slurm association shares as a budget file: `gpuledger slurm import-shares`.

Pure: `sacctmgr` output in, budget TOML (`gpuledger budget apply`) out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from schemas.errors import InvalidCommand

SACCTMGR_ARGS = ("sacctmgr", "-nP", "show", "associations", "format=Account,ParentName,User,Share")


def parse_sacctmgr_shares(text: str) -> tuple[list[tuple[str, str, int]], dict[str, str]]:
    """Pure: `sacctmgr -nP show associations format=Account,ParentName,User,Share` as
    ((account, user or "", shares) rows, account -> parent account). A share of "parent" (the
    association uses its parent's) is skipped; the root account's user rows too."""
    rows: list[tuple[str, str, int]] = []
    parents: dict[str, str] = {}
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
        if parent:
            parents[account] = parent
        if share.lower() == "parent" or (account == "root" and user):
            continue
        if not share.isdigit():
            raise InvalidCommand(f"sacctmgr line {n}: share {share!r} is not a whole number")
        rows.append((account, user, int(share)))
    return rows, parents


def shares_toml(rows: Iterable[tuple[str, str, int]], parents: Mapping[str, str]) -> str:
    """Pure: a budget file (`gpuledger budget apply`) from Slurm association shares. `parents`
    maps each Slurm account to its parent (`sacctmgr -nP show account withassoc
    format=Account,ParentName`); the root account is the tree's top, not an account. An account
    with users, or under one that has users, is a project; the others are programs."""
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

    lines = ["# imported from Slurm associations (sacctmgr); review, then `gpuledger budget apply`"]
    accounts = sorted(
        {a for a, _, _ in rows} - {"root"}, key=lambda a: "/".join(reversed(chain(a)))
    )
    for acct in accounts:
        path = "/".join(reversed(chain(acct)))
        kind = "project" if any(a in users for a in chain(acct)) else "program"
        lines += ["", f'[accounts."{path}"]', f'kind = "{kind}"']
        lines.append(f"shares = {account_shares.get(acct, 1)}")
        if acct in users:
            members = sorted(users[acct])
            lines.append("members = [" + ", ".join(f'"{u}"' for u, _ in members) + "]")
            weights = [(u, s) for u, s in members if s != 1]
            if weights:
                lines.append(
                    "member_shares = { " + ", ".join(f"{u} = {s}" for u, s in weights) + " }"
                )
    return "\n".join(lines) + "\n"
