"""Budgets as code: a TOML file describes accounts, shares, members and managers; `plan` diffs it
against the ledger's state and returns the commands that make the ledger match.

Pure: `parse` reads bytes, `plan` reads a State; neither touches files or the clock.

```toml
[accounts."ai2"]
kind = "program"
shares = 1
managers = ["carol"]          # optional; when present, exactly these manage the subtree

[accounts."ai2/olmo"]
kind = "project"
shares = 3
members = ["alice", "bob"]    # optional; when present, exactly these are members
member_shares = { alice = 2 } # optional; default 1
```
Accounts missing from the file are left alone unless `prune` is set, which closes them.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec

from ledger.core.decide import NewId, decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from schemas import commands as c
from schemas import toml_bounds
from schemas.bounds import AccountPath, Name, Shares, Text, describe
from schemas.errors import InvalidCommand, NotAuthorised
from schemas.events import AccountKind


class BudgetAccount(msgspec.Struct, forbid_unknown_fields=True):
    """One account of a budget file; its values have the bounds of the commands they become."""

    kind: AccountKind
    shares: Shares = 1
    members: list[Name] | None = None
    member_shares: dict[Name, Shares] = {}
    managers: list[Name] | None = None
    reason: Text = ""


class BudgetFile(msgspec.Struct, forbid_unknown_fields=True):
    accounts: dict[AccountPath, BudgetAccount] = {}


@dataclass(frozen=True)
class Change:
    symbol: str  # + add, ~ change, - remove
    text: str
    command: c.AnyCommand


def parse(data: bytes, name: str = "budget file") -> BudgetFile:
    """Parse and validate a budget TOML document; errors name the file and the problem."""
    try:
        text = data.decode("utf-8")
        toml_bounds.check(text, name)  # before tomllib: dotted keys cost it quadratic memory
        raw = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InvalidCommand(f"{name}: malformed TOML: {e}", hint="fix the file and retry") from e
    except RecursionError as e:  # arrays or tables nested thousands deep
        raise InvalidCommand(
            f"{name}: malformed TOML: nested too deep", hint="fix the file and retry"
        ) from e
    accounts = raw.get("accounts")
    for path, spec in accounts.items() if isinstance(accounts, dict) else ():
        try:
            msgspec.convert(spec, BudgetAccount)
        except msgspec.ValidationError as e:
            raise InvalidCommand(
                f"{name}: account {path!r}: {describe(e, spec)}",
                hint="see `gpuledger budget apply --help`",
            ) from e
    try:
        budget = msgspec.convert(raw, BudgetFile)
    except msgspec.ValidationError as e:
        raise InvalidCommand(
            f"{name}: {describe(e, raw)}", hint="see `gpuledger budget apply --help`"
        ) from e
    _require_size(budget, name)
    for path, spec in budget.accounts.items():
        strangers = sorted(set(spec.member_shares) - set(spec.members or ()))
        if spec.members is not None and strangers:
            raise InvalidCommand(
                f"{name}: account {path!r} gives member_shares to {', '.join(strangers)}, "
                "who are not in its members",
                hint="add them to `members` or remove their member_shares",
            )
        if spec.members is None and spec.member_shares:
            raise InvalidCommand(
                f"{name}: account {path!r} has member_shares but no members list",
                hint="list the members the shares are for",
            )
    return budget


MAX_NAMES = 2_000
"""The most accounts, members and managers one budget file lists, all together: its plan and
its batch stay small (`schemas.api.MAX_BATCH` commands: a 70,000-member file took 35 s to plan
and check, atk44-25 F6). A larger tree is several files (an account a file leaves out is left
alone, without `--prune`)."""


def _require_size(budget: BudgetFile, name: str) -> None:
    """One line for a file listing more than `MAX_NAMES` accounts, members and managers."""
    listed = sum(
        1 + len(spec.members or ()) + len(spec.managers or ()) for spec in budget.accounts.values()
    )
    if listed > MAX_NAMES:
        raise InvalidCommand(
            f"{name}: lists {listed:,} accounts, members and managers; a budget file lists "
            f"at most {MAX_NAMES:,}",
            hint="split it into several files (an account a file leaves out is left alone)",
        )


def _depth(path: str) -> int:
    return path.count("/")


def plan(state: State, budget: BudgetFile, actor: str, *, prune: bool = False) -> list[Change]:
    """Pure: the ordered changes that make `state` match `budget` (opens parents before children,
    closes children before parents)."""
    out: list[Change] = []
    wanted = budget.accounts
    for path in sorted(wanted, key=lambda p: (_depth(p), p)):
        spec = wanted[path]
        have = state.accounts.get(path)
        if have is not None and have.open and have.kind != spec.kind:
            raise InvalidCommand(
                f"account {path!r} is a {have.kind} in the ledger but a {spec.kind} in the file",
                hint="an account's kind never changes: fix the file, or close the account and "
                "open a new one",
                account=path,
            )
        if have is None or not have.open:
            out.append(
                Change(
                    "+",
                    f"open {spec.kind} {path} shares={spec.shares}",
                    c.OpenAccount(
                        actor=actor,
                        path=path,
                        kind=spec.kind,
                        shares=spec.shares,
                        reason=spec.reason or "budget file",
                    ),
                )
            )
        elif have.shares != spec.shares:
            out.append(
                Change(
                    "~",
                    f"shares {path} {have.shares} -> {spec.shares}",
                    c.SetShares(
                        actor=actor,
                        account=path,
                        shares=spec.shares,
                        reason=spec.reason or "budget file",
                    ),
                )
            )
    for path in sorted(wanted):
        out += _people(state, path, wanted[path], actor)
    if prune:
        listed = set(wanted)
        stale = [
            a.path
            for a in state.accounts.values()
            if a.open and a.kind != "user" and a.path not in listed
        ]
        for path in sorted(stale, key=lambda p: (-_depth(p), p)):
            out.append(
                Change(
                    "-",
                    f"close {path}",
                    c.CloseAccount(actor=actor, path=path, reason="budget file"),
                )
            )
    return out


def _people(state: State, path: str, spec: BudgetAccount, actor: str) -> list[Change]:
    """The member and manager changes of account `path`: a list the file gives is the whole list
    (a member's shares are its leaf's)."""
    a = state.accounts.get(path)
    current = set(state.members.get(path, ())) if a and a.open else set()
    out: list[Change] = []

    def join(user: str) -> Change:
        shares = spec.member_shares.get(user, 1)
        cmd = c.AddMember(actor=actor, user=user, project=path, shares=shares)
        return Change("+", f"member {user} -> {path} shares={shares}", cmd)

    if spec.members is not None:
        out += _listed(
            spec.members,
            current,
            join,
            lambda user: Change(
                "-", f"member {user} x {path}", c.RemoveMember(actor=actor, user=user, project=path)
            ),
        )
    for user, shares in sorted(spec.member_shares.items()):
        leaf = state.accounts.get(f"{path}/{user}")
        if user in current and leaf is not None and leaf.open and leaf.shares != shares:
            out.append(
                Change(
                    "~",
                    f"shares {path}/{user} {leaf.shares} -> {shares}",
                    c.SetShares(
                        actor=actor,
                        account=f"{path}/{user}",
                        shares=shares,
                        reason="budget file",
                    ),
                )
            )
    if spec.managers is not None:
        out += _listed(
            spec.managers,
            {u for u, roots in state.managers.items() if path in roots},
            lambda user: Change(
                "+",
                f"manager {user} of {path}",
                c.GrantManager(actor=actor, user=user, account=path),
            ),
            lambda user: Change(
                "-",
                f"manager {user} x {path}",
                c.RevokeManager(actor=actor, user=user, account=path),
            ),
        )
    return out


def _listed(
    listed: Iterable[str],
    have: set[str],
    add: Callable[[str], Change],
    remove: Callable[[str], Change],
) -> list[Change]:
    """The changes that make the users `have` the users `listed`: additions, then removals, each
    in name order."""
    want = set(listed)
    return [add(u) for u in sorted(want - have)] + [remove(u) for u in sorted(have - want)]


def require_may_change(state: State, actor: str) -> None:
    """Pure: raise NotAuthorised at once when `actor` manages no account and is no admin: every
    change of a budget file would be refused (checked before a file is parsed or planned)."""
    if not state.is_admin(actor) and not state.managers.get(actor):
        raise NotAuthorised(
            f"{actor!r} manages no account: budget changes are a manager's or an admin's",
            hint="`gpuledger account tree` shows who manages what",
            actor=actor,
        )


def check(
    state: State,
    commands: list[c.AnyCommand],
    now: float,
    new_id: NewId,
    admit: Callable[[State, c.AnyCommand], c.AnyCommand] | None = None,
    stop: Callable[[], bool] | None = None,
) -> None:
    """Pure: apply `commands` one after another to a copy of `state` (the dry run), raising the
    first rejection; `state` is left as it was. `admit` is the edge's look at each command
    before it is decided (the ledger's `admit`: system accounts as members...), as the real
    apply has it, so the dry run refuses what the apply would. `stop()` true (asked every
    100 commands): InvalidCommand, the dry run stopped."""
    scratch = state.copy()
    for i, cmd in enumerate(commands):
        if stop is not None and i % 100 == 99 and stop():  # the edge's time limit
            raise InvalidCommand(
                f"the dry run was stopped at its time limit after {i + 1:,} of "
                f"{len(commands):,} changes", hint="apply a smaller file",
            )  # fmt: skip
        if admit is not None:
            cmd = admit(scratch, cmd)
        for ev in decide(scratch, cmd, now, new_id):
            evolve(scratch, ev)
