"""The catch-up of the projection for the reads beside the worker (`copied.caught_up`): a read
that finds the projection behind starts one at once, waiting for no cycle and no fixed pace,
and rests only `REST` times as long as the last one took."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from ledger.server import copied


@dataclass
class FakeStore:
    at: int

    def position(self) -> int:
        return self.at


@dataclass
class FakeProjector:
    """Folds up to `until` at once, taking `took_s` of a thread's time."""

    store: FakeStore
    took_s: float = 0.0
    folds: list[int] = field(default_factory=list)

    def catch_up(self, until: int) -> None:
        time.sleep(self.took_s)
        self.folds.append(until)
        self.store.at = until


@dataclass
class FakePool:
    """What `caught_up` reads and sets of a `ReadPool`; `projecting` runs on the loop."""

    projector: FakeProjector
    projected: int = 0
    caught_up_at: float = 0.0
    catching: Any = None
    catch_up_s: float = 0.0
    catch_up_rest: float = 0.0
    stalled: bool = False
    catch_ups: int = 0
    caught_up_by: int = 0

    async def projecting(self, fn: Any) -> Any:
        return fn()


def world(head: int, projected: int, cycle_in_s: float) -> tuple[Any, FakePool]:
    """A worker at `head` whose projection holds `projected` and whose next cycle is due in
    `cycle_in_s` (`next_cycle_at`, which the old rule waited for), and a pool whose last
    catch-up ended just now."""
    service = SimpleNamespace(
        ledger=SimpleNamespace(position=head, dsn=None),
        stats=SimpleNamespace(projection_position=projected),
    )
    due = time.monotonic() + cycle_in_s
    worker = SimpleNamespace(service=service, follow_error=None, ha=None, next_cycle_at=lambda: due)
    pool = FakePool(FakeProjector(FakeStore(projected)), projected=projected)
    pool.caught_up_at = time.monotonic()
    return worker, pool


class Waited(Exception):
    """A read slept before its catch-up began."""


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """`copied`'s sleeps raise `Waited` (the sleeps asked are recorded first)."""
    asked: list[float] = []

    async def sleep(s: float) -> None:
        asked.append(s)
        raise Waited(s)

    monkeypatch.setattr(copied.asyncio, "sleep", sleep)
    return asked


@pytest.mark.parametrize(
    ("case", "cycle_in_s"),
    [
        ("a cycle due in 0.2 s is not waited for", 0.2),
        ("a cycle due now is not waited for", 0.0),
        ("a cycle overdue (held) is not waited for", -0.5),
    ],
)
def test_a_read_that_finds_the_projection_behind_starts_a_catch_up_at_once(
    case: str, cycle_in_s: float, no_sleep: list[float]
) -> None:
    worker, pool = world(head=110, projected=100, cycle_in_s=cycle_in_s)
    asyncio.run(copied.caught_up(worker, pool, 110))
    assert (no_sleep, pool.projector.folds, pool.projected) == ([], [110], 110), case
    assert pool.catch_ups == pool.caught_up_by == 1


def test_the_rest_after_a_catch_up_is_three_times_its_time() -> None:
    worker, pool = world(head=110, projected=100, cycle_in_s=10.0)
    pool.projector.took_s = 0.002
    asyncio.run(copied.caught_up(worker, pool, 110))
    assert pool.catch_up_s >= 0.002
    assert pool.catch_up_rest == pytest.approx(copied.REST * pool.catch_up_s)


def test_a_read_during_the_rest_waits_it_out(no_sleep: list[float]) -> None:
    worker, pool = world(head=110, projected=100, cycle_in_s=10.0)
    pool.catch_up_rest = 5.0
    with pytest.raises(Waited):
        asyncio.run(copied.caught_up(worker, pool, 110))
    assert pool.projector.folds == [] and 0 < no_sleep[0] <= copied.POLL_S


def test_a_read_the_projection_already_holds_does_not_catch_up(no_sleep: list[float]) -> None:
    worker, pool = world(head=110, projected=110, cycle_in_s=0.0)
    asyncio.run(copied.caught_up(worker, pool, 110))
    assert (no_sleep, pool.projector.folds, pool.catch_ups) == ([], [], 0)
