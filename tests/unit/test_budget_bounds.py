"""A budget file lists at most `MAX_NAMES` accounts, members and managers, and a batch holds at
most `MAX_BATCH` commands: past either, one line before anything is planned or decided (a
70,000-member plan held the worker 35 s, a 40,000-command batch 21 s: atk44-25 F6, F7)."""

from __future__ import annotations

import msgspec
import pytest

from ledger.core import budget as b
from schemas import api
from schemas.errors import InvalidCommand


def members_file(accounts: int, members: int, managers: int = 0) -> bytes:
    out = []
    for a in range(accounts):
        names = ", ".join(f'"u{a}x{i}"' for i in range(members))
        bosses = ", ".join(f'"m{a}x{i}"' for i in range(managers))
        out.append(f'[accounts."p/q{a}"]\nkind = "project"\nmembers = [{names}]\n'
                   f"managers = [{bosses}]\n")  # fmt: skip
    return "".join(out).encode()


def test_a_file_of_2000_names_is_planned_and_one_more_is_one_line() -> None:
    assert b.MAX_NAMES == 2_000
    assert len(b.parse(members_file(4, 399, 100)).accounts) == 4  # 4 + 1,596 + 400 = 2,000
    with pytest.raises(InvalidCommand) as got:
        b.parse(members_file(4, 400, 100), "big.toml")  # 2,004
    line = got.value.line()
    assert "big.toml: lists 2,004 accounts, members and managers" in line, line
    assert "at most 2,000" in line and "\n" not in line, line
    with pytest.raises(InvalidCommand, match="lists 70,001"):
        b.parse(members_file(1, 70_000))


def test_a_batch_holds_at_most_2000_commands() -> None:
    one = {"op": "cancel", "actor": "", "job_id": 1}
    decode = msgspec.json.Decoder(api.Batch).decode
    assert len(decode(msgspec.json.encode({"commands": [one] * api.MAX_BATCH})).commands) == 2_000
    with pytest.raises(msgspec.ValidationError, match=r"length <= 2000 - at `\$.commands`"):
        decode(msgspec.json.encode({"commands": [one] * 2_001}))


def test_a_dry_run_past_its_time_limit_is_stopped_in_one_line() -> None:
    """The server's dry runs (a plan's check, a batch's) run beside the worker with a time limit
    (`stop`, asked every 100 commands): stopped, one line, the state untouched."""
    from ledger.core.decide import decide
    from ledger.core.evolve import evolve
    from ledger.core.state import State
    from ledger.store.clock import seeded_ids
    from schemas import commands as c

    state = State()
    for cmd in (c.InitLedger(actor="root", admin="root"),
                c.OpenAccount(actor="root", path="p", kind="program", shares=1),
                c.OpenAccount(actor="root", path="p/q", kind="project", shares=1)):  # fmt: skip
        for ev in decide(state, cmd, 0.0, seeded_ids(1)):
            evolve(state, ev)
    cmds: list[c.AnyCommand] = [
        c.AddMember(actor="root", user=f"u{i}", project="p/q") for i in range(150)
    ]
    asked: list[int] = []
    b.check(state, cmds, 0.0, seeded_ids(2), stop=lambda: bool(asked.append(1)))
    assert len(asked) == 1  # asked every 100 commands
    with pytest.raises(InvalidCommand) as got:
        b.check(state, cmds, 0.0, seeded_ids(2), stop=lambda: True)
    assert "stopped at its time limit after 100 of 150 changes" in got.value.line()
    assert "p/q" not in state.members  # a copy was tried, never the state
