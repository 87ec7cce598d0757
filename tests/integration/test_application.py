"""The Ledger application on the real eventsourcing stores: the SQLite file under tmp_path and a
fresh PostgreSQL database (every test runs against both: the store contract).

Rejected commands leave the store byte-identical; a reopened ledger folds to the same state;
concurrent writers never double-book a GPU; stale commands conflict only when something they
depend on changed; a corrupt stored event is reported with its position.
"""

from __future__ import annotations

import copy
import math
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ledger.core.evolve import fold
from ledger.core.state import State
from ledger.store import EVENTS_DB, recorded
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from schemas import codec
from schemas import commands as c
from schemas import events as e
from schemas.errors import (
    Conflict,
    ContractViolation,
    EventDecodeError,
    InvalidCommand,
    InvalidTransition,
    LedgerError,
    NotAuthorised,
    UnknownEntity,
)

T0 = 1_000.0
HOUR = 3_600


def slot(node: str, *gpus: int) -> e.GpuSlot:
    return e.GpuSlot(node=node, gpu_indices=gpus)


def place(
    job_id: int, *slots: e.GpuSlot, expected: int | None = None, cycle: str = "c"
) -> c.ApplyDecision:
    return c.ApplyDecision(
        actor="@dispatcher",
        expected_position=expected,
        decision=c.DecisionBody(
            cycle_id=cycle,
            based_on=expected or 0,
            policy_version="test",
            placements=(c.Placement(job_id=job_id, slots=slots),),
        ),
    )


def submit(user: str, **kw: Any) -> c.SubmitJob:
    kw.setdefault("account", "ai2/olmo")
    kw.setdefault("gpus", 4)
    kw.setdefault("min_runtime_s", HOUR)
    return c.SubmitJob(actor=user, **kw)


@pytest.fixture
def busy(org_ledger: Ledger) -> Ledger:
    """The org with job 1 (alice) placed on n1 GPUs 0-3 and job 2 (bob) pending."""
    org_ledger.execute_all([submit("alice"), submit("bob")])
    org_ledger.execute(place(1, slot("n1", 0, 1, 2, 3)))
    return org_ledger


@pytest.fixture
def home(any_home: Path) -> Path:
    """Each test of this module runs on the SQLite store and on PostgreSQL."""
    return any_home


def store_rows(home: Path) -> tuple[list[tuple[Any, ...]], int | None]:
    """Every stored event row (with its rowid = position) and the max notification id."""
    dsn = recorded(home)
    if dsn is not None:
        import psycopg

        with psycopg.connect(dsn) as pg:
            rows = pg.execute(
                "SELECT notification_id, originator_id::text, originator_version, topic, state "
                "FROM gpuledger_events ORDER BY notification_id"
            ).fetchall()
        return [(*r[:4], bytes(r[4])) for r in rows], (rows[-1][0] if rows else None)
    con = sqlite3.connect(home / EVENTS_DB)
    try:
        rows = con.execute("SELECT rowid, * FROM stored_events ORDER BY rowid").fetchall()
        (head,) = con.execute("SELECT MAX(rowid) FROM stored_events").fetchone()
    finally:
        con.close()
    return rows, head


def snapshot(led: Ledger) -> tuple[State, int, int]:
    return copy.deepcopy(led.state), led.position, led.version


@pytest.fixture
def other(home: Path, clock: SimClock, busy: Ledger) -> Iterator[Ledger]:
    """A second writer on the same home, caught up with `busy`."""
    led = Ledger(home, clock, seeded_ids(2))
    yield led
    led.close()


# --- rejected commands leave no trace -----------------------------------------------------------

REJECTED = [
    pytest.param([c.OpenAccount(actor="root", path="ai2/bad name", kind="project")], InvalidCommand,
                 "invalid account name 'bad name'", id="a malformed account path"),
    pytest.param([submit("alice", account="ai2/nope")], UnknownEntity, "unknown account 'ai2/nope'",
                 id="an unknown account"),
    pytest.param([c.RegisterNode(actor="alice", node="n9", gpu_type="h100", gpus=8)], NotAuthorised,
                 "'alice' may not register nodes", id="an unauthorised actor"),
    pytest.param([c.StartJob(actor="@executor", job_id=2)], InvalidTransition,
                 "job 2 is pending, not placed", id="an invalid transition"),
    pytest.param([submit("alice", min_runtime_s=8 * HOUR + 1)], ContractViolation,
                 "is outside 0..28800s", id="a contract over the cap"),
    pytest.param([place(2, slot("n1", 3, 4, 5, 6))], InvalidTransition,
                 "GPU 3 of node 'n1' is already held", id="a placement onto held GPUs"),
    pytest.param(
        [
            c.OpenAccount(actor="root", path="ai2/new", kind="project"),
            c.AddMember(actor="root", user="dave", project="ai2/new"),
            submit("dave", account="ai2/new", gpus=99),
        ],
        InvalidCommand, "99 GPUs requested", id="a batch whose last command fails",
    ),
    pytest.param(
        [c.StartJob(actor="@executor", job_id=1), place(2, slot("n2", 0, 1, 2, 3)),
         c.StartJob(actor="@executor", job_id=2),
         c.FinishJob(actor="@executor", job_id=2, exit_code=0),
         c.RemoveNode(actor="root", node="n1")],
        InvalidTransition, "node 'n1' still runs 1 jobs",
        id="a batch of lifecycle steps whose last fails",
    ),
    pytest.param(
        [c.OpenAccount(actor="root", path="ai2/new", kind="project"),
         c.OpenAccount(actor="root", path="ai2/new", kind="project")],
        InvalidTransition, "'ai2/new' is already open", id="a batch that conflicts with itself",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("cmds", "want_error", "want_message"), REJECTED)
def test_a_rejected_command_leaves_the_store_and_state_unchanged(
    busy: Ledger,
    home: Path,
    cmds: list[c.AnyCommand],
    want_error: type[LedgerError],
    want_message: str,
) -> None:
    rows, head = store_rows(home)
    before = snapshot(busy)
    with pytest.raises(LedgerError) as info:
        busy.execute_all(cmds) if len(cmds) > 1 else busy.execute(cmds[0])
    assert type(info.value) is want_error
    assert want_message in info.value.message
    assert store_rows(home) == (rows, head)
    assert busy.head() == head
    assert snapshot(busy) == before


def test_an_accepted_batch_is_appended_in_order_and_returns_its_last_position(busy: Ledger) -> None:
    start = busy.position
    done = busy.execute_all(
        [c.OpenAccount(actor="root", path="ai2/new", kind="project"),
         c.AddMember(actor="root", user="dave", project="ai2/new"),
         submit("dave", account="ai2/new")]
    )  # fmt: skip
    assert [type(ev) for ev in done.events] == [
        e.AccountOpened, e.SharesSet, e.MemberAdded, e.AccountOpened, e.SharesSet, e.JobSubmitted,
    ]  # fmt: skip
    assert done.position == start + len(done.events) == busy.position == busy.head()
    assert [ev for _, ev in busy.read(start, 100)] == done.events
    assert [pos for pos, _ in busy.read(start, 100)] == list(range(start + 1, done.position + 1))


def test_a_reopened_ledger_folds_to_the_same_state(
    busy: Ledger, home: Path, clock: SimClock
) -> None:
    busy.execute(c.StartJob(actor="@executor", job_id=1))  # its contract runs from its start
    clock.advance_to(T0 + HOUR)  # ... and is over by now
    busy.execute_all(
        [
            c.DrainNode(actor="root", node="n1", reason="maintenance"),
            c.ApplyDecision(actor="@dispatcher", decision=c.DecisionBody(
                cycle_id="c2", based_on=busy.position, policy_version="t",
                preemptions=(c.Preemption(job_id=1, reason="maintenance"),),
                placements=(c.Placement(job_id=2, slots=(slot("n2", 0, 1, 2, 3),)),),
            )),
        ]
    )  # fmt: skip
    assert busy.state.nodes["n1"].state == "drained"
    again = Ledger(home, clock)
    try:
        assert again.state == busy.state
        assert (again.position, again.version) == (busy.position, busy.version)
        assert fold(ev for _, ev in again.read(0, 10_000)) == busy.state
    finally:
        again.close()


def test_reading_pages_through_the_whole_log(busy: Ledger, home: Path, clock: SimClock) -> None:
    busy.execute_all([submit("alice", gpus=1) for _ in range(30)])
    again = Ledger(home, clock)
    try:
        again.page = 7  # many short pages
        again.state, again.position, again.version = State(), 0, 0
        again.catch_up()
        assert again.state == busy.state and again.position == busy.head()
    finally:
        again.close()


# --- what is appended must reload as it was ------------------------------------------------------


@pytest.mark.parametrize(
    "cmd",
    [
        pytest.param(
            c.ApplyDecision(actor="@dispatcher", decision=c.DecisionBody(
                cycle_id="c", based_on=0, policy_version="t",
                ranks=e.RankInputs(position=0, digest="d", ranking_version="r",
                                   usage=e.UsageSettings(window_s=math.inf)),
            )),
            id="a decision whose usage window is inf",
        ),
        pytest.param(submit("alice", duration_s=math.inf), id="an infinite duration"),
        pytest.param(submit("alice", labels={"team": "\udcff"}),
                     id="a label that is not valid unicode (argv bytes via surrogateescape)"),
        pytest.param(c.DrainNode(actor="root", node="n2", reason="\udcff"),
                     id="a drain reason that is not valid unicode"),
    ],
)  # fmt: skip
def test_a_command_the_store_cannot_hold_is_rejected_or_reloads_unchanged(
    busy: Ledger, home: Path, clock: SimClock, cmd: c.AnyCommand
) -> None:
    """JSON has no inf and no lone surrogates: such a command must be refused with a LedgerError
    (store untouched), or be stored so that a reopened ledger folds to the same state."""
    rows, before = store_rows(home), snapshot(busy)
    try:
        busy.execute(cmd)
    except LedgerError:
        assert store_rows(home) == rows and snapshot(busy) == before
        return
    again = Ledger(home, clock)
    try:
        assert again.state == busy.state
    finally:
        again.close()


# --- two writers --------------------------------------------------------------------------------


def placed_rows(home: Path) -> list[e.JobPlaced]:
    rows, _ = store_rows(home)
    events = [codec.decode(row[4]) for row in rows]
    return [ev for ev in events if isinstance(ev, e.JobPlaced)]


def test_a_stale_writer_catches_up_and_cannot_double_book(
    busy: Ledger, other: Ledger, home: Path
) -> None:
    other.execute(place(2, slot("n2", 0, 1, 2, 3)))  # `busy` has not seen this yet
    busy.execute(submit("alice"))  # job 3: catching up first, `busy` numbers it after job 2
    assert busy.state.jobs[3].spec.user == "alice"
    with pytest.raises(InvalidTransition, match="GPU 0 of node 'n2' is already held"):
        other.execute(place(3, slot("n2", 0, 4, 5, 6)))
    assert [(p.job_id, p.slots) for p in placed_rows(home)] == [
        (1, (slot("n1", 0, 1, 2, 3),)), (2, (slot("n2", 0, 1, 2, 3),)),
    ]  # fmt: skip


def _race(loser: Ledger, winner: Ledger, winning: c.AnyCommand) -> list[int]:
    """Make `winner` append `winning` after `loser` decided but before its insert reaches the
    store. Returns the list of the loser's insert attempts (its position at each)."""
    calls: list[int] = []
    real_insert = loser.recorder.insert_events

    def insert_events(*args: Any, **kw: Any) -> Any:
        calls.append(loser.position)
        if len(calls) == 1:
            winner.execute(winning)
        return real_insert(*args, **kw)

    loser.recorder.insert_events = insert_events  # type: ignore[method-assign]
    return calls


def test_racing_writers_never_hold_one_gpu_twice(busy: Ledger, other: Ledger, home: Path) -> None:
    busy.execute(submit("bob"))  # job 3
    other.catch_up()
    calls = _race(busy, other, place(3, slot("n2", 0, 1, 2, 3)))
    head = busy.head()
    with pytest.raises(InvalidTransition, match="GPU 2 of node 'n2' is already held"):
        busy.execute(place(2, slot("n2", 2, 3, 4, 5)))
    assert len(calls) == 1, "the loser re-decided after catching up and did not try to save again"
    assert busy.position == other.position == head + 2  # caught up with the winner's decision
    assert store_rows(home)[1] == head + 2
    assert [p.job_id for p in placed_rows(home)] == [1, 3]
    assert busy.state == other.state
    assert busy.state.holders[("n2", 2)] == 3


def test_a_racing_writer_whose_decision_still_holds_appends_after_the_winner(
    busy: Ledger, other: Ledger, home: Path
) -> None:
    busy.execute(submit("bob"))  # job 3
    other.catch_up()
    calls = _race(busy, other, place(3, slot("n2", 0, 1, 2, 3)))
    done = busy.execute(place(2, slot("n2", 4, 5, 6, 7)))
    assert len(calls) == 2, "the first save lost the race, the second appended"
    assert [p.job_id for p in placed_rows(home)] == [1, 3, 2]
    assert done.position == busy.head()
    other.catch_up()
    assert busy.state == other.state
    rows, _ = store_rows(home)
    assert [row[2] for row in rows] == list(range(1, len(rows) + 1)), "versions stay gap-free"


# --- expected positions -------------------------------------------------------------------------


def test_a_stale_placement_on_a_node_that_changed_conflicts(busy: Ledger, home: Path) -> None:
    busy.execute(submit("bob", gpus=2))  # job 3
    seen = busy.position
    busy.execute(place(2, slot("n2", 0, 1, 2, 3)))  # CycleDecided at seen+1, JobPlaced at seen+2
    rows, before = store_rows(home), snapshot(busy)
    with pytest.raises(Conflict) as info:  # GPUs 4 and 5 are free, but n2 moved since `seen`
        busy.execute(place(3, slot("n2", 4, 5), expected=seen))
    err = info.value
    assert err.fields == {"position": seen + 2, "expected": seen}
    assert f"position {seen + 2} changed node:n2 after the expected position {seen}" in err.message
    assert store_rows(home) == rows and snapshot(busy) == before
    done = busy.execute(place(3, slot("n2", 4, 5), expected=busy.position))
    assert isinstance(done.events[-1], e.JobPlaced)


def stale_place(job_id: int, *slots: e.GpuSlot) -> Callable[[int], c.AnyCommand]:
    return lambda seen: place(job_id, *slots, expected=seen)


def stale(cmd: c.AnyCommand) -> Callable[[int], c.AnyCommand]:
    return lambda seen: msgspec.structs.replace(cmd, expected_position=seen)


DRAIN_N2 = c.DrainNode(actor="root", node="n2", reason="fan")


@pytest.mark.parametrize(
    ("change", "stale_cmd", "want_conflict"),
    [
        pytest.param(place(2, slot("n2", 0, 1, 2, 3)), stale_place(3, slot("n1", 4, 5, 6, 7)),
                     None, id="a placement on another node does not conflict"),
        pytest.param(place(2, slot("n1", 4, 5, 6, 7)), stale_place(3, slot("n2", 0, 1, 2, 3)),
                     None, id="a placement of another job does not conflict"),
        pytest.param(c.CancelJob(actor="bob", job_id=3), stale_place(3, slot("n2", 0, 1, 2, 3)),
                     "job:3", id="cancelling the job conflicts with placing it"),
        pytest.param(c.SetShares(actor="root", account="ai2/tulu", shares=7),
                     stale(submit("alice")), None,
                     id="shares of another project do not conflict with a submission"),
        pytest.param(c.SetShares(actor="root", account="ai2/olmo", shares=7),
                     stale(submit("alice")), "account:ai2/olmo",
                     id="shares of the same project conflict with a submission"),
        pytest.param(c.DrainNode(actor="root", node="a1", reason="fan"), stale(DRAIN_N2), None,
                     id="draining another node does not conflict"),
        pytest.param(DRAIN_N2, stale(c.ReturnNode(actor="root", node="n2")), "node:n2",
                     id="draining the node conflicts with a stale command on it"),
    ],
)  # fmt: skip
def test_expected_positions(
    busy: Ledger,
    home: Path,
    change: c.AnyCommand,
    stale_cmd: Callable[[int], c.AnyCommand],
    want_conflict: str | None,
) -> None:
    busy.execute(submit("bob"))  # job 3, pending
    seen = busy.position
    busy.execute(change)
    cmd = stale_cmd(seen)
    if want_conflict is None:
        done = busy.execute(cmd)
        assert done.events and done.position == busy.head()
        return
    rows, before = store_rows(home), snapshot(busy)
    with pytest.raises(Conflict, match=want_conflict):
        busy.execute(cmd)
    assert store_rows(home) == rows and snapshot(busy) == before


def test_an_expected_position_at_the_head_never_conflicts(busy: Ledger) -> None:
    done = busy.execute(place(2, slot("n1", 4, 5, 6, 7), expected=busy.position))
    assert isinstance(done.events[-1], e.JobPlaced)


def test_an_expected_position_more_than_1000_events_behind_is_one_line(busy: Ledger) -> None:
    """atk44-25 F7: each command's expected position was checked by reading the log after it,
    per command: a batch of 2,000 commands expecting position 0 read the whole log 2,000 times
    on the worker thread. Now the log is read once per batch, `LOOKBACK` events back at most."""
    from ledger.core.conflicts import LOOKBACK

    first = busy.position
    busy.execute_all([submit("bob", gpus=1)] * 1_001)
    with pytest.raises(Conflict, match=f"expected position {first} is more than 1,000 events "
                       f"behind the log's head {busy.position}"):  # fmt: skip
        busy.execute_all([c.CancelJob(actor="bob", job_id=9, expected_position=first)] * 2)
    fine = busy.position - LOOKBACK  # within it: checked as before, against the events after
    last = busy.state.next_job_id - 1  # submitted after `fine`: a conflict
    with pytest.raises(Conflict, match=f"changed job:{last} after the expected position {fine}"):
        busy.execute_all([c.CancelJob(actor="bob", job_id=n, expected_position=fine)
                          for n in (2, last)])  # fmt: skip
    done = busy.execute_all([c.CancelJob(actor="bob", job_id=2, expected_position=fine)])
    assert isinstance(done.events[-1], e.JobFinished) and done.events[-1].job_id == 2


# --- corrupt stored events ----------------------------------------------------------------------


def _corrupt(home: Path, position: int, data: bytes) -> None:
    dsn = recorded(home)
    if dsn is not None:
        import psycopg

        with psycopg.connect(dsn) as pg:
            pg.execute(
                "UPDATE gpuledger_events SET state = %s WHERE notification_id = %s",
                (data, position),
            )
        return
    con = sqlite3.connect(home / EVENTS_DB)
    try:
        with con:
            con.execute("UPDATE stored_events SET state = ? WHERE rowid = ?", (data, position))
    finally:
        con.close()


def _with_tag(home: Path, position: int, tag: str) -> bytes:
    rows, _ = store_rows(home)
    raw: bytes = rows[position - 1][4]
    old = codec.peek_tag(raw)
    assert old is not None
    return raw.replace(old.encode(), tag.encode(), 1)


@pytest.mark.parametrize(
    ("make", "want_tag", "want_known", "want_hint"),
    [
        pytest.param(lambda home: _with_tag(home, 3, "account.moved.v9"), "account.moved.v9",
                     False, "upgrade gpu-ledger", id="an event of a newer version"),
        pytest.param(lambda home: _with_tag(home, 3, "member.added.v1"), "member.added.v1", True,
                     "the store is corrupt", id="a known tag with the wrong fields"),
        pytest.param(lambda home: b'{"type": "account.opened.v1", "at": ', None, False,
                     "the store is corrupt", id="truncated bytes"),
        pytest.param(lambda home: b"\x00\xff garbage", None, False, "the store is corrupt",
                     id="bytes that are not JSON"),
    ],
)  # fmt: skip
def test_a_corrupt_stored_event_is_reported_with_its_position(
    org_ledger: Ledger, home: Path, clock: SimClock, make: Any, want_tag: str | None,
    want_known: bool, want_hint: str,
) -> None:  # fmt: skip
    org_ledger.close()
    _corrupt(home, 3, make(home))
    with pytest.raises(EventDecodeError) as info:
        Ledger(home, clock)
    err = info.value
    assert err.message.startswith("log position 3: ")
    assert (err.tag, err.known, err.fields.get("position")) == (want_tag, want_known, 3)
    assert err.hint == want_hint
