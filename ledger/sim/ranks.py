"""Rank sources for the simulator: fair-share ranks at a moment, two ways.

- `ProjectionRanks`: the real read side (`ledger.cycle.dispatcher.ProjectionRanks`): catches the
  DuckDB
  projection up to the snapshot's position and asks `projections.queries.fair_share` (SQL usage
  + Fair Tree).
- `IncrementalRanks`: the same math (`projections.fairshare`) on usage intervals kept in memory
  and updated from new events only: closed intervals older than the window are dropped; in
  half-life mode closed intervals fold into one decayed number per leaf.

Both implement `ledger.cycle.dispatcher.RankSource`. docs/simulation.md gives the measured cost of
each and which one the simulator uses by default; tests check that both give the same ranks.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from pathlib import Path

from ledger.cycle import dispatcher as service
from ledger.store.application import Ledger
from ledger.store.embedded import EmbeddedSource
from projections import fairshare as fs
from projections.projector import Projector
from projections.store import Store
from schemas import events as e

Ranks = tuple[Mapping[str, int], Mapping[str, float]]


class NoRanks:
    """For policies that do not read ranks (fifo, legacy): nothing to compute."""

    usage_policy = None
    read_position = None

    def ranks(self, now: float, position: int) -> Ranks:
        return {}, {}


class IncrementalRanks:
    """Fair-share ranks from intervals folded incrementally out of the ledger's new events.

    An interval runs from `JobPlaced` to `JobPreempted`/`JobFinished`, charged to the user leaf
    `<account>/<user>` with the GPU type of its first node, as the projection's `job_intervals`.
    """

    def __init__(self, ledger: Ledger, policy: fs.UsagePolicy | None = None) -> None:
        self.ledger = ledger
        self.policy = policy or fs.UsagePolicy()
        self._seen = 0
        self._open: dict[int, fs.Interval] = {}
        self._full: dict[str, tuple[float, int]] = {}
        """Window mode: leaf -> (usage, count) of its closed intervals wholly inside the window."""
        self._by_start: list[tuple[float, int, fs.Interval]] = []
        """Window mode: those intervals by start (a heap), to move out as the window passes."""
        self._partial: list[fs.Interval] = []
        """Window mode: closed intervals the window's start cuts (computed one by one)."""
        self._n = 0
        self._decayed: dict[str, tuple[float, float]] = {}
        """Half-life mode: leaf -> (decayed usage of its closed intervals, as of time)."""
        self._node_type: dict[str, str] = {}
        self._cache: tuple[float, int, Ranks] | None = None
        self._shape: tuple[tuple[tuple[str, str | None, str, int], ...], fs.TreeShape] | None = None

    def _observe(self) -> None:
        for pos, ev in self.ledger.follow(self._seen):
            self._apply(ev)
            self._seen = pos

    def _apply(self, ev: e.AnyEvent) -> None:
        if isinstance(ev, e.NodeRegistered):
            self._node_type[ev.node] = ev.gpu_type
        elif isinstance(ev, e.JobPlaced):
            job = self.ledger.state.jobs[ev.job_id].spec
            if job.min_runtime_s > 0:
                self._open[ev.job_id] = fs.Interval(
                    leaf=f"{job.account}/{job.user}",
                    user=job.user,
                    gpus=job.gpus,
                    funded=True,
                    start_at=ev.at,
                    end_at=None,
                    gpu_type=self._node_type.get(ev.slots[0].node) if ev.slots else None,
                )
        elif isinstance(ev, e.JobPreempted | e.JobFinished):
            iv = self._open.pop(ev.job_id, None)
            if iv is None:
                return
            closed = fs.Interval(
                leaf=iv.leaf,
                user=iv.user,
                gpus=iv.gpus,
                funded=True,
                start_at=iv.start_at,
                end_at=ev.at,
                gpu_type=iv.gpu_type,
            )
            if self.policy.half_life_s is None:
                if closed.start_at >= ev.at - self.policy.window_s:
                    self._n += 1
                    heapq.heappush(self._by_start, (closed.start_at, self._n, closed))
                    u, n = self._full.get(iv.leaf, (0.0, 0))
                    self._full[iv.leaf] = (u + self._whole(closed), n + 1)
                else:
                    self._partial.append(closed)
            else:
                value, at = self._decayed.get(iv.leaf, (0.0, ev.at))
                value = value * _decay(ev.at - at, self.policy.half_life_s)
                value += fs.interval_usage(closed, ev.at, self.policy)
                self._decayed[iv.leaf] = (value, ev.at)

    def usage(self, now: float) -> dict[str, float]:
        """Usage per user leaf at `now` (the projection's `leaf` usage)."""
        self._observe()
        out: dict[str, float] = {}
        h = self.policy.half_life_s
        if h is None:
            self._slide(now - self.policy.window_s)
            for leaf, (u, n) in self._full.items():
                if n and u > 0.0:
                    out[leaf] = u
            for iv in self._partial:
                u = fs.interval_usage(iv, now, self.policy)
                if u > 0.0:
                    out[iv.leaf] = out.get(iv.leaf, 0.0) + u
        else:
            for leaf, (value, at) in self._decayed.items():
                out[leaf] = value * _decay(now - at, h)
        for iv in self._open.values():
            u = fs.interval_usage(iv, now, self.policy)
            if u > 0.0:
                out[iv.leaf] = out.get(iv.leaf, 0.0) + u
        return out

    def _whole(self, iv: fs.Interval) -> float:
        return (
            iv.gpus * self.policy.weight(iv.gpu_type) * ((iv.end_at or iv.start_at) - iv.start_at)
        )

    def _slide(self, cutoff: float) -> None:
        """Move closed intervals that the window's start now cuts from whole to partial, and
        drop partial ones the window has left. Times only move forward in a simulation."""
        heap = self._by_start
        while heap and heap[0][0] < cutoff:
            _, _, iv = heapq.heappop(heap)
            u, n = self._full[iv.leaf]
            self._full[iv.leaf] = (u - self._whole(iv), n - 1) if n > 1 else (0.0, 0)
            self._partial.append(iv)
        self._partial = [iv for iv in self._partial if (iv.end_at or cutoff) > cutoff]

    def tree(self, now: float) -> fs.FairTree:
        usage = fs.rollup(self.usage(now))
        return fs.fair_tree(
            fs.AccountUsage(
                path=a.path,
                parent=a.parent,
                kind=a.kind,
                shares=a.shares,
                usage=usage.get(a.path, 0.0),
            )
            for a in self.ledger.state.accounts.values()
            if a.open
        )

    read_position = None
    """Ranks are read from the ledger itself, at the snapshot's position."""

    @property
    def usage_policy(self) -> fs.UsagePolicy:
        return self.policy

    def shape(self) -> fs.TreeShape:
        """The open accounts' tree (`fs.TreeShape`), rebuilt only when they change."""
        accounts = tuple(
            (a.path, a.parent, a.kind, a.shares)
            for a in self.ledger.state.accounts.values()
            if a.open
        )
        if self._shape is None or self._shape[0] != accounts:
            self._shape = (accounts, fs.TreeShape(accounts))
        return self._shape[1]

    def ranks(self, now: float, position: int) -> Ranks:
        """Ranks at `now` over the ledger's events (the dispatcher has just caught it up to
        `position`, which is therefore every event there is): the numbers of `tree(now)`,
        computed on the cached tree shape without building the table's rows."""
        self._observe()
        if self._cache is not None and self._cache[:2] == (now, self._seen):
            return self._cache[2]
        shape = self.shape()
        out = shape.ranks_levels(shape.usage_of(self.usage(now)))
        self._cache = (now, self._seen, out)
        return out


def _decay(dt: float, half_life_s: float) -> float:
    return float(2.0 ** (-dt / half_life_s))


class ProjectionRanks:
    """`ledger.cycle.dispatcher.ProjectionRanks` over the projection of `home`, owning its files."""

    def __init__(self, home: Path, policy: fs.UsagePolicy | None = None) -> None:
        self.source = EmbeddedSource(home)
        self.store = Store.open(home)
        self.projector = Projector(self.store, self.source)
        self.inner = service.ProjectionRanks(self.projector, policy or fs.UsagePolicy())

    @property
    def usage_policy(self) -> fs.UsagePolicy:
        return self.inner.usage

    @property
    def read_position(self) -> int | None:
        return self.inner.read_position

    def ranks(self, now: float, position: int) -> Ranks:
        return self.inner.ranks(now, position)

    def close(self) -> None:
        self.store.close()
        self.source.close()
