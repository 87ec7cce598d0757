"""A manager gives one project at most `MAX_MEMBERS` members, and keeps at most `MAX_BELOW` open
accounts below any account they manage (an admin may go past both): every cycle ranks every open
account, and 20,000 members added in one batch made every cycle 3-8x slower for everyone
(atk44-25 F13); the bound per project alone let a program's manager open projects of 2,000
members at will (atk44w F3)."""

from __future__ import annotations

import pytest

from ledger.core.decide import MAX_BELOW, MAX_MEMBERS, decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.store.clock import seeded_ids
from schemas import commands as c
from schemas.errors import InvalidTransition, NotAuthorised


def run(state: State, cmd: c.AnyCommand) -> None:
    for ev in decide(state, cmd, 1000.0, seeded_ids(1)):
        evolve(state, ev)


def test_a_manager_gives_a_project_at_most_2000_members_an_admin_more() -> None:
    state = State()
    run(state, c.InitLedger(actor="root", admin="root"))
    run(state, c.OpenAccount(actor="root", path="p", kind="program", shares=1))
    run(state, c.OpenAccount(actor="root", path="p/q", kind="project", shares=1))
    run(state, c.GrantManager(actor="root", user="mgr", account="p/q"))
    assert MAX_MEMBERS == 2_000
    for i in range(MAX_MEMBERS):
        run(state, c.AddMember(actor="mgr", user=f"u{i}", project="p/q"))
    with pytest.raises(NotAuthorised) as got:
        run(state, c.AddMember(actor="mgr", user="one-more", project="p/q"))
    line = got.value.line()
    assert "'p/q' has 2,000 members, the most a manager may give one project (2,000)" in line
    assert "one-more" not in state.members["p/q"]
    run(state, c.AddMember(actor="root", user="one-more", project="p/q"))  # an admin may
    assert len(state.members["p/q"]) == 2_001


def test_a_manager_keeps_at_most_10000_open_accounts_below_an_account_an_admin_more() -> None:
    """atk44w F3: the bound on members is per project, and a program's manager opens projects
    at will: six projects of 2,000 members each were 12,006 open accounts, every one ranked in
    every cycle. Now at most `MAX_BELOW` below any account a manager manages, members' included;
    past it one 409 line, nothing appended."""
    state = State()
    run(state, c.InitLedger(actor="root", admin="root"))
    run(state, c.OpenAccount(actor="root", path="p", kind="program", shares=1))
    run(state, c.GrantManager(actor="root", user="mgr", account="p"))
    assert MAX_BELOW == 10_000
    refused: list[str] = []
    for k in range(6):
        project = f"p/q{k}"
        try:
            run(state, c.OpenAccount(actor="mgr", path=project, kind="project", shares=1))
            for i in range(MAX_MEMBERS):
                run(state, c.AddMember(actor="mgr", user=f"u{i}", project=project))
        except InvalidTransition as err:
            refused.append(err.line())
            break
    assert state.open_below("p") == MAX_BELOW == open_below(state, "p")
    assert refused == [
        "'p' has 10,000 open accounts below it, the most a manager may keep below one account "
        "(10,000) (close unused ones, or ask an admin)"
    ]
    events = state.events
    with pytest.raises(InvalidTransition):  # a project of its own counts too
        run(state, c.OpenAccount(actor="mgr", path="p/more", kind="project", shares=1))
    assert state.events == events and "p/more" not in state.accounts
    run(state, c.OpenAccount(actor="root", path="p/more", kind="project", shares=1))  # an admin
    assert state.open_below("p") == MAX_BELOW + 1
    run(state, c.CloseAccount(actor="mgr", path="p/more"))
    run(state, c.RemoveMember(actor="mgr", user="u0", project="p/q0"))  # its account closes
    run(state, c.AddMember(actor="mgr", user="new", project="p/q0"))  # room for one
    assert state.open_below("p") == MAX_BELOW == open_below(state, "p")


def open_below(state: State, path: str) -> int:
    """The open accounts below `path`, counted afresh."""
    return sum(a.open and a.path.startswith(path + "/") for a in state.accounts.values())


def test_the_count_of_open_accounts_below_is_kept_as_accounts_open_and_close() -> None:
    state = State()
    run(state, c.InitLedger(actor="root", admin="root"))
    assert state.open_below("a") == 0  # built now, then kept
    for path, kind in [
        ("a", "program"),
        ("a/b", "program"),
        ("a/b/c", "project"),
        ("d", "program"),
    ]:
        run(state, c.OpenAccount(actor="root", path=path, kind=kind, shares=1))
    run(state, c.AddMember(actor="root", user="x", project="a/b/c"))
    run(state, c.OpenAccount(actor="root", path="a/b/c/e", kind="project", shares=1))
    run(state, c.CloseAccount(actor="root", path="a/b/c/e"))
    run(state, c.OpenAccount(actor="root", path="a/b/c/e", kind="project", shares=1))  # reopened
    run(state, c.RemoveMember(actor="root", user="x", project="a/b/c"))
    run(state, c.AddMember(actor="root", user="x", project="a/b/c"))
    fresh = state.copy()  # built again from the accounts
    for path in ("a", "a/b", "a/b/c", "a/b/c/e", "d", "zz"):
        assert state.open_below(path) == fresh.open_below(path) == open_below(state, path), path
    assert state.open_below("a") == 4
