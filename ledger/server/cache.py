"""Answers of reads, kept per log position on the server (the worker thread's; the answers
the read pool computes are kept with `put`, under a lock).

A read's answer depends on the log up to a position and, for the reads that look at the clock
(the queue preview, explain, shares, ...), on the moment. Many callers asking between two
appends get one computation:
- a read at an explicit moment (`at`), or one that never looks at the clock, is the same answer
  for as long as the log stays at the position it was computed at;
- a read "now" is answered from an answer computed at the same position that became ready at
  most `fresh_s` earlier (it says the state as of then: a queue preview at 10k pending costs
  ~0.3 s, the dispatcher's cycle is 2 s by default). Ready, not begun: on a loaded machine a
  preview may take longer than `fresh_s`, and the read that waited for it takes it;
- an answer built on a shared value (a queue page, `queue`, a job's page on the shared preview:
  its `basis`) is kept exactly as long as that value is the one `shared` gives: once a newer
  preview is taken, no read answers from the older one. Kept for `fresh_s` from its own
  readiness, an answer outlived the preview it was read from: a queue page read after another
  read at the same position showed an older moment than it (the queue's order moves with the
  clock: two reads of one position disagreed, s54-suite).
Any append moves the position and so retires every entry.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from ledger.server.fairlane import shared_work

T = TypeVar("T")

CLOCKED = frozenset(
    {"jobs", "shares", "usage", "queue", "queue_total", "priority", "explain", "squatters"}
    | {"nodes", "metrics"}
)
"""Reads whose answer depends on the moment unless `at` names it (`nodes`: the GPUs foreign
work holds, as the service last observed its engine, which moves without an append;
`metrics`: what a scrape reads of the ledger, its window figures of the moment)."""


class Basis(NamedTuple):
    """The shared value an answer was built on: its name and the moment it was asked at."""

    name: str
    moment: float


FRESH_S = 2.0
MAX_ENTRIES = 256
FLIGHT_WAIT_S = 10.0
"""The longest a read waits for a shared value another thread is computing (`shared`)."""


@dataclass
class ReadCache:
    fresh_s: float = FRESH_S
    max_entries: int = MAX_ENTRIES
    clock: Callable[[], float] | None = None
    """When an answer became ready (None: the moment it was asked at)."""
    hits: int = 0
    misses: int = 0
    _entries: dict[tuple[str, Any, str], tuple[int, float, bytes, Basis | None]] = field(
        default_factory=dict
    )
    _shared: dict[str, tuple[int, float, Any, float]] = field(default_factory=dict)
    """Name -> the position, when it became ready, the value and the moment it was asked at."""
    _flights: dict[str, tuple[int, threading.Event]] = field(default_factory=dict)
    """The shared values being computed now (`shared`), by name: the position and its end."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    """The answers' entries: kept from the read pool's threads too (`put`)."""

    def answer(
        self,
        name: str,
        args: Any,
        position: int,
        now: float,
        compute: Callable[[], bytes],
        viewer: str = "",
    ) -> bytes:
        """The encoded answer of read `name` with `args` at `position` (`now` for reads that
        look at the clock without `at`) for `viewer` (reads whose answer depends on who asks;
        "" for the others): from the cache when still valid, else computed."""
        got = self.get(name, args, position, now, viewer)
        if got is not None:
            return got
        data = compute()
        self.put(name, args, position, now, data, viewer)
        return data

    def get(
        self, name: str, args: Any, position: int, now: float, viewer: str = ""
    ) -> bytes | None:
        """The kept answer `answer` would give without computing, else None (a miss)."""
        clocked = name in CLOCKED and getattr(args, "at", None) is None
        with self._lock:
            got = self._entries.get((name, args, viewer))
            if got is not None:
                at_position, computed_at, data, basis = got
                if (
                    at_position == position
                    and (not clocked or 0 <= now - computed_at <= self.fresh_s)
                    and (basis is None or self._gives(basis, position, now))
                ):
                    self.hits += 1
                    return data
            self.misses += 1
            return None

    def put(
        self,
        name: str,
        args: Any,
        position: int,
        now: float,
        data: bytes,
        viewer: str = "",
        basis: Basis | None = None,
    ) -> None:
        """Keep an answer computed elsewhere (the read pool) at `position`, asked at `now`;
        `basis`: the shared value it was built on (kept only as long as `shared` gives that)."""
        now = self._ready(now)
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries = {k: x for k, x in self._entries.items() if x[0] == position}
                if len(self._entries) >= self.max_entries:
                    self._entries.clear()
            self._entries[(name, args, viewer)] = (position, now, data, basis)

    def _gives(self, basis: Basis, position: int, now: float) -> bool:
        """Whether `shared(name, position, now, ...)` would give the value `basis` names."""
        got = self._shared.get(basis.name)
        return got is not None and got[3] == basis.moment and self.holds(basis.name, position, now)

    def recent(self, name: str, position: int, now: float, compute: Callable[[], T]) -> T:
        """A value of the moment rather than of the log (sums over a window, as /metrics
        shows them), computed at `position`: reused for `fresh_s` wherever the log moved
        meanwhile (and one under way on another thread is waited for: `shared`)."""
        got = self._shared.get(name)
        if got is not None and 0 <= now - got[1] <= self.fresh_s:
            self.hits += 1
            value: T = got[2]
            return value
        return self._once(name, position, now, compute, any_position=True)

    def _ready(self, asked: float) -> float:
        return asked if self.clock is None else max(asked, self.clock())

    def holds(self, name: str, position: int, now: float | None = None) -> bool:
        """Whether `shared(name, position, now, ...)` would be answered without computing
        (`now` None: whether one was computed at `position`, however old)."""
        got = self._shared.get(name)
        if got is None or got[0] != position:
            return False
        return now is None or 0 <= now - got[1] <= self.fresh_s

    def last(self, name: str) -> Any:
        """The value last kept as `name` (`shared`), at whatever position and however old
        (None: none): what the next one may be made from."""
        got = self._shared.get(name)
        return None if got is None else got[2]

    def shared(self, name: str, position: int, now: float, compute: Callable[[], T]) -> T:
        """A value several reads build on (the queue preview the queue, job, nodes pages and
        /metrics share), kept like a read "now": one per name, reused at the same position
        for at most `fresh_s`. Computed once at a time per name and position: a read that
        finds it under way on another thread (another read's, or the one computed ahead) waits
        for that one, at most `FLIGHT_WAIT_S`, rather than compute it again beside it."""
        if self.holds(name, position, now):
            self.hits += 1
            value: T = self._shared[name][2]
            return value
        return self._once(name, position, now, compute)

    def _once(
        self,
        name: str,
        position: int,
        now: float,
        compute: Callable[[], T],
        *,
        any_position: bool = False,
    ) -> T:
        """`compute()` kept as `name` at `position`, unless it is under way on another thread
        (at that position; `any_position`: at any): then that one, waited for. Computing it or
        waiting for it is shared work: not charged to the person whose read in a lane of the
        read pool asked (`fairlane.shared_work`)."""
        with shared_work():
            return self._once_shared(name, position, now, compute, any_position)

    def _once_shared(
        self, name: str, position: int, now: float, compute: Callable[[], T], any_position: bool
    ) -> T:
        with self._lock:
            flight = self._flights.get(name)
            waiting = flight is not None and (any_position or flight[0] == position)
            if flight is None or not waiting:
                flight = self._flights[name] = (position, threading.Event())
        if waiting:
            flight[1].wait(FLIGHT_WAIT_S)
            got = self._shared.get(name)
            if got is not None and (any_position or got[0] == position):
                self.hits += 1
                value: T = got[2]
                return value
            self.misses += 1
            return compute()  # the one under way failed or is late: this read's own
        self.misses += 1
        try:
            value = compute()
            self._shared[name] = (position, self._ready(now), value, now)
            return value
        finally:
            with self._lock:
                if self._flights.get(name) is flight:
                    del self._flights[name]
            flight[1].set()
