"""A leader cut off from its store, or whose appends stall, answers every write within about a
lease and says so in one form (atk60-ha, docs/ha.md "A server's own link to the store"):

- F1: a write that reached the leader just before its link went silent waited for the whole
  outage (a raw client for ever), while later ones were refused at once: once the lease runs
  out by its own clock it is answered 503, its outcome unknown (the append is fenced);
- F2: a lease statement's connection is abandoned two thirds of a lease after it was sent, as
  said, even when the cancel hangs too (it was abandoned after the cancel's own timeout);
- F3: the statement so failed says it had no answer, not "server closed the connection";
- F4: a leader's health gives its lease's end by its own renewals, never a row's older figure;
- F5: a leader whose append has had no answer for a lease hands the lease over;
- F6: the worker's store-away refusal is HAFront's: the same words and `X-Gpuledger-Store`."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest

import ledger.store.lease as lease_mod
from ledger.server.app import problem
from ledger.server.ha import Leadership, append_stall_s
from ledger.server.worker import Worker
from ledger.store.lease import Holder, Lease, Unanswered
from schemas.commands import SubmitJob
from schemas.errors import Unavailable


class SilentConnection:
    """A connection over a silent link: its statement and its cancel get no answer; the
    statement fails once the socket is shut (as psycopg says it)."""

    closed = False

    def __init__(self) -> None:
        self.shut = threading.Event()

    def execute(self, sql: Any, params: Any = ()) -> Any:
        if self.shut.wait(30):
            raise psycopg.OperationalError(
                "consuming input failed: server closed the connection unexpectedly"
            )
        raise AssertionError("never shut")

    def cancel_safe(self, timeout: float) -> None:
        time.sleep(timeout)
        raise psycopg.errors.CancellationTimeout("cancellation timeout expired")

    def close(self) -> None:
        self.closed = True


def test_a_lease_statement_over_a_silent_link_is_given_up_in_two_thirds_of_a_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    con = SilentConnection()
    lease = Lease("postgresql://127.0.0.1:1/x", "me", "http://me:1", 3.0)
    monkeypatch.setattr(lease, "_connection", lambda which="lease": con)
    monkeypatch.setattr(lease_mod, "abandon_connection", lambda c: c.shut.set())
    began = time.monotonic()
    with pytest.raises(Unanswered) as err:
        lease.leader()
    took = time.monotonic() - began
    assert 2.0 <= took < 2.8, took  # 2 x answer_s (1 s) + 0.1 s; was 3.1 s (the cancel's 1 s)
    assert (
        str(err.value) == "a lease statement had no answer for 2.1 s: its connection was given up"
    )


class OwnLease:
    """A leader's lease by its own clock: renewed 1 s ago (deadline 3 s on, 5 s lease)."""

    epoch, lease_s, answer_s, address, holder, node = 4, 5.0, 1.7, "http://me:1", "me", None
    renewing, answered_at = None, 0.0

    def __init__(self) -> None:
        self.deadline = time.monotonic() + 3.0
        self.released: list[bool] = []
        self.took = 0

    def may_act(self) -> bool:
        return time.monotonic() < self.deadline

    def release(self, clean: bool = True) -> None:
        self.released.append(clean)
        self.deadline = 0.0

    def acquire(self) -> bool:
        self.took += 1
        return False

    def leader(self) -> Holder:
        return Holder(4, "me", "http://me:1", 4.0, 5.0)

    def refusal(self, holder: Holder | None) -> str | None:
        return None


def test_a_leaders_health_says_its_own_lease_never_an_older_reads() -> None:
    ha = Leadership(OwnLease())  # type: ignore[arg-type]
    ha.leading = True
    ha.leader = Holder(4, "me", "http://me:1", 0.5, 5.0)  # read 1 s ago, with 0.5 s left then
    ha._leader_read_at = time.monotonic() - 1.0
    left, ago = ha.lease_times()
    assert ha.role == "leader"
    assert left is not None and ago is not None
    assert 3.9 < left <= 4.0, left  # its renewal's sending + the lease (the row's end is later)
    assert 0.9 < ago < 1.1, ago
    ha.leading = False  # a standby: the row as read, moved on by its clock
    left, _ = ha.lease_times()
    assert left is not None and -0.6 < left < -0.4, left


def test_a_leader_whose_append_waits_past_a_lease_hands_the_lease_over() -> None:
    lease = OwnLease()
    ha = Leadership(lease)  # type: ignore[arg-type]
    ha.leading, ha._took_at = True, time.monotonic() - 30
    assert ha.stall_s == append_stall_s(5.0) == 5.0
    ha.appending = lambda: time.monotonic() - 4.0
    ha._tick()
    assert lease.released == [] and ha.stalled() is None  # 4 s: it waits
    ha.appending = lambda: time.monotonic() - 5.5
    assert ha.stalled() is not None
    ha._tick()
    assert lease.released == [False]  # expired now (its worker is in the append)
    assert not ha.acting() and ha.changed.is_set()
    ha._tick()
    assert lease.took == 0  # not again before its worker has looked at the role


class Leading:
    """A leader's lease that runs out `runs_out_in` s from now, its store silent."""

    def __init__(self, runs_out_in: float, away: str | None) -> None:
        self.lease = OwnLease()
        self.lease.deadline = time.monotonic() + runs_out_in
        self._away = away

    def away(self) -> str | None:
        return self._away if not self.acting() else None

    def acting(self) -> bool:
        return self.lease.may_act()

    def leader_address(self) -> str:
        return ""


@pytest.mark.parametrize("away", [None, "a lease statement had no answer for 3.4 s"])
def test_a_write_waiting_on_its_append_is_answered_once_the_lease_runs_out(
    away: str | None,
) -> None:
    worker = Worker(service=None)  # type: ignore[arg-type]
    worker.ha = Leading(0.5, away)  # type: ignore[assignment]
    command = SubmitJob(actor="alice", account="ai2/olmo", gpus=1)

    async def write() -> tuple[Unavailable, float]:
        began = time.monotonic()
        try:
            await asyncio.wait_for(worker.execute(command), 5.0)  # nothing answers it
        except Unavailable as err:
            return err, time.monotonic() - began
        raise AssertionError("answered")

    err, took = asyncio.run(write())
    assert 0.45 < took < 1.0, took
    assert err.fields["outcome"] == "unknown"  # never "not taken": the commit may land
    assert err.message.endswith("had no answer from the store before this server stopped "
                                "leading: it may still be stored"), err.message  # fmt: skip
    headers = problem(err).headers
    assert headers["X-Gpuledger-Outcome"] == "unknown"
    assert headers.get("x-gpuledger-store") == ("away" if away else None)


def test_the_writes_waiting_on_their_appends_share_one_look_at_the_lease() -> None:
    """One timer on the event loop for every write waiting (a wait with a timeout of its own
    per write was a twentieth of the event loop's time under a stream of submits), and each
    still answered once the lease runs out."""
    worker = Worker(service=None)  # type: ignore[arg-type]
    worker.ha = Leading(0.5, None)  # type: ignore[assignment]
    command = SubmitJob(actor="alice", account="ai2/olmo", gpus=1)

    async def writes() -> tuple[int, list[BaseException | None]]:
        scheduled = asyncio.get_running_loop()._scheduled  # type: ignore[attr-defined]
        before = len(scheduled)  # this test's own time limit
        tasks = [asyncio.ensure_future(worker.execute(command)) for _ in range(50)]
        await asyncio.sleep(0.05)
        timers = len(scheduled) - before
        done = await asyncio.gather(*tasks, return_exceptions=True)
        return timers, [d if isinstance(d, BaseException) else None for d in done]

    timers, errors = asyncio.run(asyncio.wait_for(writes(), 5.0))
    assert timers == 1
    assert all(isinstance(err, Unavailable) and err.fields["outcome"] == "unknown"
               for err in errors), errors  # fmt: skip


def test_the_workers_store_away_refusal_is_the_fronts() -> None:
    worker = Worker(service=None)  # type: ignore[arg-type]
    ha = Leading(5.0, None)
    ha.away = lambda: "terminating connection due to unexpected postmaster exit"  # type: ignore[method-assign]
    worker.ha = ha  # type: ignore[assignment]
    with pytest.raises(Unavailable) as err:
        worker._check_leading()
    assert err.value.message == (
        "the store does not answer (terminating connection due to unexpected postmaster exit): "
        "no write is taken until it does; reads still answer"
    )
    assert problem(err.value).headers["x-gpuledger-store"] == "away"


def test_a_fenced_group_commit_is_one_log_line_saying_so(caplog: pytest.LogCaptureFixture) -> None:
    """A deposed leader's append refused by the fence is an expected outcome: one line saying
    another server leads, no traceback (atk60-ha: "group commit failed" and a traceback)."""
    from types import SimpleNamespace

    from ledger.store.application import Ledger

    def fenced(commands: Any, keys: Any) -> Any:
        ledger = Ledger.__new__(Ledger)
        ledger.dsn = "postgresql://x"

        class Recorder:
            def insert_events(self, stored: Any, **kw: Any) -> Any:
                from eventsourcing.persistence import PersistenceError

                raise PersistenceError("gpuledger: not the leader (epoch 3)")

        ledger.recorder, ledger.last_hash = Recorder(), ""  # type: ignore[assignment]
        return ledger._insert([SimpleNamespace(originator_version=5)])  # type: ignore[list-item]

    worker = Worker(SimpleNamespace(ledger=SimpleNamespace(execute_each=fenced)))  # type: ignore[arg-type]
    task = SimpleNamespace(command=SubmitJob(actor="", account="a", gpus=1), key=None)
    with caplog.at_level("WARNING", logger="gpuledger.server"):
        ((_, result),) = worker._execute_each([task])  # type: ignore[list-item]
    assert isinstance(result, Unavailable)
    assert [(r.levelname, r.exc_info) for r in caplog.records] == [("WARNING", None)]
    line = caplog.records[0].getMessage()
    assert "\n" not in line
    assert line == (
        "group commit of 1 command(s) not taken: this server is not the leader any more: "
        "another server took over (the store fenced its append: nothing of it was written)"
    )


def test_a_slow_read_on_the_worker_thread_counts_toward_the_stall_bound() -> None:
    """The writes wait behind the worker thread whatever its store call: a slow read held them
    until the lease ran out, where an append hands the lease over after `append_stall_s` (s61).
    Any statement of the worker's thread now counts (`Ledger.store_call_began`, what
    `Leadership.appending` reads); another thread's (an audit walk's) does not."""
    from ledger.store.application import Ledger
    from ledger.store.postgres import LedgerPostgresRecorder

    recorder = LedgerPostgresRecorder.__new__(LedgerPostgresRecorder)
    ledger = Ledger.__new__(Ledger)
    ledger.dsn, ledger.recorder = "postgresql://x", recorder
    gate = threading.Event()
    reader = threading.Thread(target=lambda: recorder._bounded(lambda self: gate.wait(10)))
    reader.start()
    try:
        time.sleep(0.3)
        began = ledger.store_call_began(reader.ident)
        assert began is not None and time.monotonic() - began >= 0.3
        assert ledger.store_call_began(threading.get_ident()) is None  # another thread's
        ha = Leadership(OwnLease())  # type: ignore[arg-type]
        ha.leading = True
        ha.appending = lambda: ledger.store_call_began(reader.ident)
        assert ha.stalled() is None  # 0.3 s of 5 s
        ha.appending = lambda: (began or 0.0) - 5.0
        assert ha.stalled() is not None
    finally:
        gate.set()
        reader.join()
    assert ledger.store_call_began(reader.ident) is None


def test_a_standby_whose_store_hangs_after_the_leaders_lease_ran_out_says_the_store_away() -> None:
    """s61: once the leader's row it last read has run out, a standby whose lease statement
    (its take) has had no answer for a statement's time waited as for an election: a write was
    held `TAKEOVER_WAIT_S`, then "this server is a standby", and health named no reason. Nobody
    is elected without the store: it says the store away, in one line, names no leader, and
    its writes are refused at once (`HAFront`: no election to wait for)."""
    lease = OwnLease()
    lease.deadline = 0.0  # a standby: it holds no lease
    ha = Leadership(lease)  # type: ignore[arg-type]
    now = time.monotonic()
    ha.leader, ha._leader_read_at = Holder(3, "other", "http://other:1", 0.5, 5.0), now - 1.0
    ha._asking_since = now - 2.0  # its take sent 2 s ago (a statement's time: 1.7 s)
    why = ha.away()
    assert why is not None and why.startswith("a lease statement has had no answer for 2.0 s; "
                                              "the leader's lease as this server last read it "
                                              "ran out 0.5 s ago"), why  # fmt: skip
    assert "\n" not in why
    assert ha.store_error() == why  # health's store_error
    assert (ha.role, ha.leader_address()) == ("standby", "")
    assert not ha.lease.may_act()  # and it takes no lease: its take is the statement unanswered
    ha._asking_since = now - 1.0  # an election: its statement not long unanswered yet
    assert ha.away() is None
    ha._asking_since = now - 2.0  # a live leader as read: the writes go there
    ha.leader, ha._leader_read_at = Holder(3, "other", "http://other:1", 4.0, 5.0), now
    assert ha.away() is None and ha.leader_address() == "http://other:1"
    ha.leader = None  # no leader row read (released): the same
    assert (ha.away() or "").endswith("no server holds the lease as this server last read it")
