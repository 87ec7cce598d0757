"""A group that waited while the last group commit ran takes the writes of the clients that
commit answered, when they come within as long as that commit took (`Worker._linger`, at most
`LINGER_S`): one commit for both. Under bench_pg the 8 clients split in two cohorts that took
turns, a commit (the store's flush) for each half: groups of 4.5 on average, 8 after."""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from ledger.server import worker as worker_module
from ledger.server.worker import LINGER_S, Worker, _Task
from schemas.commands import HoldJob

COMMIT_S = 0.02


def writes(n: int) -> list[_Task]:
    return [_Task(None, None, command=HoldJob(actor="alice", job_id=1)) for _ in range(n)]


def worker(groups: list[int], commit_s: float = COMMIT_S) -> Worker:
    w = Worker(service=SimpleNamespace(ledger=SimpleNamespace(position=0)))  # type: ignore[arg-type]

    def execute_each(tasks: list[_Task]) -> list[tuple[_Task, Any]]:
        groups.append(len(tasks))
        time.sleep(commit_s)
        return [(t, None) for t in tasks]

    w._execute_each = execute_each  # type: ignore[method-assign, assignment]
    w._publish_after_writes = lambda: None  # type: ignore[method-assign]
    return w


def test_the_waiting_group_takes_the_answered_writers_next_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker_module, "LINGER_S", 1.0)  # a loaded machine's timer is late
    groups: list[int] = []
    w = worker(groups, commit_s=0.3)
    w._queue.put(writes(5))  # gathered while the commit of 3 ran
    w._handle(writes(3))
    later = threading.Timer(0.01, w._queue.put, [writes(3)])  # the 3 answered send again
    later.start()
    first = w._queue.get()
    assert isinstance(first, list)
    group = w._linger(first)
    later.join()
    assert len(group) == 8  # one commit of 8, not 5 and then 3
    w._handle(group)
    assert groups == [3, 8]


def test_it_waits_no_longer_than_the_commit_took_nor_for_a_lone_writer() -> None:
    groups: list[int] = []
    w = worker(groups)
    w._queue.put(writes(5))
    w._handle(writes(3))
    began = time.monotonic()
    group = w._linger(w._queue.get())  # type: ignore[arg-type]
    assert len(group) == 5
    assert time.monotonic() - began < min(LINGER_S, COMMIT_S) + 0.05
    w._handle(group)  # nothing waited meanwhile: the next group waits for nobody
    assert w._cohort == 0
    w._queue.put(writes(1))
    began = time.monotonic()
    assert len(w._linger(w._queue.get())) == 1  # type: ignore[arg-type]
    assert time.monotonic() - began < 0.002


def test_a_read_or_a_stop_coming_meanwhile_is_its_turns() -> None:
    w = worker([])
    w._queue.put(writes(5))
    w._handle(writes(3))
    w._queue.put(None)  # told to stop
    group = w._linger(w._queue.get())  # type: ignore[arg-type]
    assert len(group) == 5
    assert w._held == [None]


class Watched(queue.SimpleQueue):  # type: ignore[type-arg]
    """Records the takes that wait on the queue (a put then wakes the waiting thread)."""

    waited: int = 0

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        self.waited += block
        return super().get(block, timeout)


def test_it_looks_at_the_queue_and_never_waits_on_it() -> None:
    """The event loop's put that finds the worker waiting on the queue wakes it holding the
    loop's interpreter lock (a fifth of the event loop's samples under bench_pg): the linger
    polls instead, so that put finds nobody to wake."""
    w = worker([])
    w._queue = Watched()
    w._queue.put(writes(5))
    w._handle(writes(3))
    w._queue.put(writes(3))
    group = w._linger(w._queue.get_nowait())
    assert len(group) == 8
    assert w._queue.waited == 0
