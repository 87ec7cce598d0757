"""The view of the live state the worker publishes (`Worker.view`, `copied.take`) under a stream
of group commits: copied only when someone reads (a read in the last `WANTED_S`), before the
worker rests, runs a cycle or a call; a read that finds it behind the writes answered gets the
next one (`Worker.current_view`), never an older one. Copying the live state after every group
commit was a fifth of the worker's time under bench_pg with nobody reading (2026-12-07)."""

from __future__ import annotations

import asyncio
import math
import threading
from types import SimpleNamespace
from typing import Any

from ledger.server.worker import Worker, _Task
from ledger.store.appended import Appended
from schemas.commands import HoldJob


class CountedState:
    """A live state whose copies are counted."""

    def __init__(self) -> None:
        self.copies = 0

    def copy(self) -> CountedState:
        self.copies += 1
        return self


class FakeLedger:
    """Appends every command (one event each) at once."""

    def __init__(self) -> None:
        self.position = 0
        self.state = CountedState()
        self.dsn = None

    def execute_each(self, cmds: list[Any], keys: list[Any]) -> list[Appended]:
        done = []
        for _ in cmds:
            self.position += 1
            done.append(Appended([], self.position))
        return done


def worker() -> tuple[Worker, FakeLedger]:
    ledger = FakeLedger()
    service = SimpleNamespace(
        ledger=ledger,
        stats=SimpleNamespace(projection_position=10**9),  # the projection never lags here
        clock=SimpleNamespace(now=lambda: 0.0),
    )
    w = Worker(service=service)  # type: ignore[arg-type]
    w._next_cycle = math.inf  # no cycle in these tests
    return w, ledger


def commit(w: Worker, n: int = 2) -> None:
    """One turn of the worker thread with `n` writes queued."""
    tasks = [_Task(None, None, command=HoldJob(actor="alice", job_id=1)) for _ in range(n)]
    for t in tasks[1:]:
        w._queue.put(t)
    with w._lock:
        w._turn(tasks[0])


def test_a_stream_of_group_commits_nobody_reads_copies_the_state_once() -> None:
    w, ledger = worker()
    for _ in range(20):
        commit(w)
    assert ledger.position == 40
    assert ledger.state.copies == 1  # the first view; none per group commit
    assert w.view.ledger.position == 2
    assert w.answered == 40


def test_a_read_after_a_write_was_answered_sees_it() -> None:
    w, _ = worker()
    for _ in range(5):
        commit(w)

    async def read() -> int:
        worker_thread = threading.Thread(target=commit, args=(w,))
        asked = asyncio.ensure_future(w.current_view())
        await asyncio.sleep(0.05)
        assert not asked.done()  # waits for the worker's next publication
        worker_thread.start()
        got = await asyncio.wait_for(asked, 5.0)
        worker_thread.join()
        return int(got.ledger.position)

    assert asyncio.run(read()) >= 10  # every write answered when it was asked
    assert w.view.ledger.position == 12
    commit(w)  # read a moment ago: published after each group commit
    assert w.view.ledger.position == 14


def test_the_worker_publishes_before_it_rests() -> None:
    w, ledger = worker()
    w.quiet_s = 0.01
    for _ in range(3):
        commit(w)
    assert w.view.ledger.position == 2
    w._moved_at = 0.0  # quiet long since: `_wait` returns at once once it has published
    w._wait()
    assert w.view.ledger.position == 6
    assert ledger.state.copies == 2


def test_a_pause_between_group_commits_copies_nothing_and_a_read_waits_for_no_rest() -> None:
    w, ledger = worker()
    w.rest_s = 5.0
    w._moved_at = None  # nothing due: the worker rests until work comes
    for _ in range(3):
        commit(w)
    assert (w.view.ledger.position, w.answered, ledger.state.copies) == (2, 6, 1)
    soon = _Task(None, None, command=HoldJob(actor="alice", job_id=1))
    threading.Timer(0.1, w._queue.put, args=(soon,)).start()
    assert w._wait() is soon  # the next group came within `rest_s`: no copy meanwhile
    assert ledger.state.copies == 1

    got: list[Any] = []
    resting = threading.Thread(target=lambda: got.append(w._wait()))
    resting.start()  # in its first `rest_s`, the view behind the writes answered

    async def read() -> int:
        view = await asyncio.wait_for(w.current_view(), 1.0)  # not `rest_s` later
        return int(view.ledger.position)

    assert asyncio.run(read()) == 6
    w._queue.put(None)
    resting.join(5.0)
    assert got == [None]
