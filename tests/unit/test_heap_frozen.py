"""The server's live state out of the cyclic collector's sight (issue 29: 2 in 7 cold Queue
pages at 10,000 pending paid a full collection over it, 80-105 ms of CPU inside the read): the
worker freezes the heap after its first cycle and then every `freeze_every_s`, a full
collection first (what an earlier freeze kept is collected too)."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace
from typing import Any

import pytest

from ledger.server import worker as worker_module
from ledger.server.worker import _WAKE, Worker
from schemas.codec import freeze_heap


class _Cyclic:
    def __init__(self) -> None:
        self.me = self


def test_a_frozen_heap_is_collected_first_and_kept_out_of_later_collections() -> None:
    garbage = _Cyclic()
    gone = weakref.ref(garbage)
    held = _Cyclic()
    was = weakref.ref(held)
    del garbage
    try:
        freeze_heap()
        assert gone() is None  # a full collection first
        assert gc.get_freeze_count() > 0
        del held  # garbage now, but frozen: a collection does not see it
        gc.collect()
        assert was() is not None
        freeze_heap()  # thawed, collected, frozen again
        assert was() is None
    finally:
        gc.unfreeze()


def test_the_worker_freezes_after_its_first_cycle_and_then_every_so_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    frozen: list[float] = []
    clock = [1000.0]
    monkeypatch.setattr(worker_module, "freeze_heap", lambda: frozen.append(clock[0]))
    monkeypatch.setattr(worker_module.time, "monotonic", lambda: clock[0])
    result = SimpleNamespace(decision=SimpleNamespace(wake_at=None))
    service: Any = SimpleNamespace(step=lambda now: result, clock=SimpleNamespace(now=lambda: 0.0))
    worker = Worker(service, tick_s=1.0, freeze_every_s=600.0)
    worker._publish = lambda: None  # type: ignore[method-assign]  # no live state to copy here
    for _ in range(3):  # a cycle each second
        worker._next_cycle = 0.0
        worker._turn(_WAKE)
        clock[0] += 1.0
    assert frozen == [1000.0]  # after the first cycle (was: never)
    clock[0] = 1600.0
    worker._next_cycle = 0.0
    worker._turn(_WAKE)
    assert frozen == [1000.0, 1600.0]
    never = Worker(service, tick_s=1.0, freeze_every_s=None)
    never._publish = lambda: None  # type: ignore[method-assign]
    never._turn(_WAKE)
    assert frozen == [1000.0, 1600.0]


def test_the_view_of_a_cycle_is_published_before_the_heap_is_frozen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI of stop 62: `/v1/health` said the first cycle had run while the published view was
    still the one before it, for the 0.1-0.2 s of the first freeze: a page read then showed
    the job the cycle had placed still queued."""
    order: list[str] = []
    monkeypatch.setattr(worker_module, "freeze_heap", lambda: order.append("freeze"))
    result = SimpleNamespace(decision=SimpleNamespace(wake_at=None))

    def step(now: float) -> Any:
        order.append("cycle")
        return result

    service: Any = SimpleNamespace(step=step, clock=SimpleNamespace(now=lambda: 0.0))
    worker = Worker(service, tick_s=1.0, freeze_every_s=600.0)
    worker._publish = lambda: order.append("publish")  # type: ignore[method-assign]
    worker._next_cycle = 0.0
    worker._turn(_WAKE)
    assert order[order.index("cycle") :] == ["cycle", "publish", "freeze"]
