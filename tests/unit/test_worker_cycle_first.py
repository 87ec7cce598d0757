"""The dispatcher cycle goes first once it is due, between the worker's calls: several people's
accepted batches (2,000 commands each) queued together held the cycle for all of them
(atk44-25 F7). A stand-in service counts the cycles; the worker's own turn is the real one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ledger.server.worker import Worker, _Task


def test_a_due_cycle_runs_between_calls_not_after_all_of_them() -> None:
    seen: list[str] = []
    result = SimpleNamespace(decision=SimpleNamespace(wake_at=None))

    def step(now: float) -> Any:
        seen.append("cycle")
        return result

    service = SimpleNamespace(step=step, clock=SimpleNamespace(now=lambda: 0.0))
    worker = Worker(service, tick_s=3600.0)  # type: ignore[arg-type]
    worker._publish = lambda: None  # type: ignore[method-assign]  # no live state to copy here
    worker._next_cycle = 0.0  # due now
    calls = [_Task(None, None, call=lambda i=i: seen.append(f"batch{i}")) for i in range(3)]
    worker._handle(calls)
    assert seen == ["batch0", "cycle", "batch1", "batch2"], seen  # was: every batch, then it
