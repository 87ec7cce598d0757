"""The view the worker publishes after each commit (`copied.take`): the first event past the
service's projection (how long the projection lags) is read from the store once per projection
position, not once per group commit (under a stream of submits on PostgreSQL that read was a
fifth of the worker thread's time, 2026-12-07)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from ledger.server import copied


@dataclass
class FakeLedger:
    """A log of events appended at t = 100 + position; counts its reads."""

    position: int
    rewound: int = 0
    reads: list[int] = field(default_factory=list)
    state: Any = field(default_factory=lambda: SimpleNamespace(copy=lambda: "state"))

    def read(self, after: int, limit: int) -> list[tuple[int, Any]]:
        self.reads.append(after)
        return [(p, SimpleNamespace(at=100.0 + p)) for p in range(after + 1, self.position + 1)][
            :limit
        ]


def worker(ledger: FakeLedger, projected: int) -> Any:
    service = SimpleNamespace(
        ledger=ledger,
        stats=SimpleNamespace(projection_position=projected),
        clock=SimpleNamespace(now=lambda: 500.0),
    )
    return SimpleNamespace(service=service, follow_error=None, ha=None)


def opened() -> tuple[FakeLedger, Any, copied.Copy]:
    """A log at 10 whose projection holds 4, and its first view."""
    ledger = FakeLedger(position=10)
    w = worker(ledger, projected=4)
    return ledger, w, copied.take(w)


def test_commits_while_the_projection_stands_still_read_the_store_once() -> None:
    ledger, w, view = opened()
    for head in range(11, 60):  # 49 group commits, the projection still at 4
        ledger.position = head
        view = copied.take(w, view)
        assert view.unprojected == (5, 105.0)
        assert view.ledger.position == head
    assert ledger.reads == [4]


def test_a_projection_that_moves_or_a_history_read_back_reads_the_first_event_again() -> None:
    ledger, w, view = opened()
    w.service.stats.projection_position = 7
    view = copied.take(w, view)
    assert view.unprojected == (8, 108.0)
    ledger.rewound = 1  # the log held other events at the same position (atk51-ha F2)
    view = copied.take(w, view)
    assert ledger.reads == [4, 7, 7]


def test_a_projection_that_caught_up_lags_by_nothing_and_reads_nothing() -> None:
    ledger, w, view = opened()
    w.service.stats.projection_position = 10
    view = copied.take(w, view)
    assert view.unprojected is None
    assert ledger.reads == [4]


def test_a_view_before_an_event_past_the_projection_was_found_does_not_keep_none() -> None:
    ledger = FakeLedger(position=10)
    w = worker(ledger, projected=4)
    w.follow_error = "the store does not answer"
    view = copied.take(w)
    assert view.unprojected is None and ledger.reads == []
    w.follow_error = None
    view = copied.take(w, view)
    assert view.unprojected == (5, 105.0)
