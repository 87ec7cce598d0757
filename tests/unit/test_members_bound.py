"""A manager gives one project at most `MAX_MEMBERS` members (an admin may go past it): every
cycle ranks every open account, and 20,000 members added in one batch made every cycle 3-8x
slower for everyone (atk44-25 F13)."""

from __future__ import annotations

import pytest

from ledger.core.decide import MAX_MEMBERS, decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.store.clock import seeded_ids
from schemas import commands as c
from schemas.errors import NotAuthorised


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
