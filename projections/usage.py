"""Usage folded in memory: the fair-share inputs of a cycle from new events only.

Pure: `UsageFold.apply(event)` folds events in log order; `usage(now)` and `ranks(now, shape)`
are functions of what was folded and `now`. No clock, no I/O, no DuckDB.

The same math as the projection (`fairshare.interval_usage`, `fairshare.TreeShape`), kept as
intervals charged to the user leaf `<account>/<user>` with the GPU type of the first node (as the
projection's `job_intervals`), as the policy's `charge` says: from the run's real start
(`JobStarted.started_at`) to a stopped run's real end as its engine first reports it
(`JobRunEnded`, or `JobEngineEnded` for the job's last run), counted to its release
(`JobPreempted`, `JobUnplaced`, `JobFinished`) until then, or to `JobFinished` at the run's real end
(`fairtree-3`); the same but to the release when a stopped run's end came later (`fairtree-2`;
the projection also ends a stopped run's charge at its `JobRunEnded` when that is earlier: the
fold under `fairtree-2` does not, as no log it folded has one: the simulator's kernel names no
engine); or, as decisions before them were ranked, from `JobPlaced` to the release event's own
time (`fairtree-1`, which the simulator keeps: its kernel starts every launch at placement):

- window mode: closed intervals wholly inside the window are summed per leaf; the window's start
  moves them to a short "partial" list (computed one by one) and drops them once it passes them;
- half-life mode: closed intervals fold into one decayed number per leaf.

Its numbers are a function of the events folded and `now` alone, whichever times it was asked
at before: leaves are summed in name order, and in half-life mode the decayed numbers change
only with events. So a replay that folds the same events gets the same floats as the run that
recorded them, bit for bit (decision records say which computation ranked them:
`RankInputs.computed_by`). The projection's SQL sums the same terms in another order: in
half-life mode its numbers differ from these in the last bits (`FOLD` records are replayed with
this fold, not the SQL). In window mode both are exact while times are whole seconds.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Protocol

from projections import fairshare as fs
from schemas import events as e

FOLD = "fold"

_Release = e.JobPreempted | e.JobUnplaced | e.JobFinished
"""The events that release a job's GPUs (a run taken back unstarted is charged nothing: it
never started, but under `fairtree-1` from its placement, as a preemption)."""
"""`RankInputs.computed_by` of ranks computed by this fold ("": the projection's SQL)."""

Accounts = tuple[tuple[str, str | None, str, int], ...]
"""(path, parent, kind, shares) of the open accounts, in the order the ledger's state has them."""


class UsageFold:
    """Usage per user leaf from events folded one by one (see the module docstring)."""

    def __init__(self, policy: fs.UsagePolicy | None = None) -> None:
        self.policy = policy or fs.UsagePolicy()
        self._specs: dict[int, tuple[str, str, int]] = {}
        """Funded jobs not finished: job id -> (leaf, user, GPUs)."""
        self._node_type: dict[str, str] = {}
        self._open: dict[int, fs.Interval] = {}
        self._placed: dict[int, tuple[str | None, float]] = {}
        """Run rule: funded jobs placed and not yet started -> the GPU type of their placement,
        and when they were placed."""
        self._unstarted: dict[tuple[int, int], tuple[fs.Interval, float]] = {}
        """Run rule: (job, run) -> a placement released before any `JobStarted` (its interval
        from the placement, and its release), kept `fs.OWN_START_KEPT_S` after the placement
        for a `JobRunEnded` that says when its run really started (`_run_ended`)."""
        self._full: dict[str, tuple[float, int]] = {}
        """Window mode: leaf -> (usage, count) of its closed intervals wholly inside the window."""
        self._by_start: list[tuple[float, int, fs.Interval]] = []
        """Window mode: those intervals by start (a heap), to move out as the window passes."""
        self._partial: list[fs.Interval] = []
        """Window mode: closed intervals the window's start cuts (computed one by one)."""
        self._n = 0
        self._decayed: dict[str, tuple[float, float]] = {}
        """Half-life mode: leaf -> (decayed usage of its closed intervals, as of time)."""
        self._shape: tuple[Accounts, fs.TreeShape] | None = None
        self._runs: dict[int, int] = {}
        """Jobs not finished -> their runs preempted or taken back unstarted so far: the run of
        their current placement."""
        self._stopped: dict[tuple[int, int], fs.Interval] = {}
        """`CHARGE_REAL`: (job, run) -> the interval of a run the ledger stopped, closed at its
        release until its engine reports the run's real end (computed one by one)."""

    def apply(self, ev: e.AnyEvent) -> None:
        """Fold one event (in log order)."""
        if isinstance(ev, e.JobSubmitted):
            if ev.min_runtime_s > 0:
                self._specs[ev.job_id] = (f"{ev.account}/{ev.user}", ev.user, ev.gpus)
        elif isinstance(ev, e.NodeRegistered):
            self._node_type[ev.node] = ev.gpu_type
        elif isinstance(ev, e.JobPlaced):
            spec = self._specs.get(ev.job_id)
            if spec is not None:
                node_type = self._node_type.get(ev.slots[0].node) if ev.slots else None
                if self.policy.charge == fs.CHARGE_PLACEMENT:
                    self._open[ev.job_id] = self._interval(spec, ev.at, node_type)
                else:
                    self._placed[ev.job_id] = (node_type, ev.at)
        elif isinstance(ev, e.JobStarted):
            spec = self._specs.get(ev.job_id)
            if spec is not None and ev.job_id in self._placed:
                start = ev.at if ev.started_at is None else ev.started_at
                node_type, _ = self._placed.pop(ev.job_id)
                self._open[ev.job_id] = self._interval(spec, start, node_type)
        elif isinstance(ev, e.JobPreempted | e.JobUnplaced | e.JobFinished):
            self._released(ev)
        elif isinstance(ev, e.JobRunEnded | e.JobEngineEnded):
            self._run_ended(ev)

    def _released(self, ev: _Release) -> None:
        """A job's GPUs are released: its interval closes at the release (at its run's real
        end when the finish says it), or, under `CHARGE_REAL` when its run was stopped, waits
        for the run's real end (`_run_ended`), counted to the release until then."""
        run = self._runs.get(ev.job_id, 0)
        spec = self._specs.get(ev.job_id)
        if isinstance(ev, e.JobFinished):
            self._specs.pop(ev.job_id, None)
            self._runs.pop(ev.job_id, None)
        else:
            self._runs[ev.job_id] = run + 1
        placed = self._placed.pop(ev.job_id, None)
        if placed is not None and spec is not None:
            self._keep_unstarted((ev.job_id, run), spec, placed, ev)
        iv = self._open.pop(ev.job_id, None)
        if iv is None:
            return
        charge = self.policy.charge
        ended_at = ev.ended_at if isinstance(ev, e.JobFinished) else None
        lost = isinstance(ev, e.JobFinished) and ev.reason == "node_lost"
        if charge == fs.CHARGE_REAL and lost and ended_at is not None:
            # at its node's fence, maybe: the run's real end, once its node reports it, wins
            self._stopped[(ev.job_id, run)] = _closed(iv, max(iv.start_at, ended_at))
        elif charge != fs.CHARGE_PLACEMENT and ended_at is not None:
            self._close(iv, max(iv.start_at, ended_at))
        elif charge == fs.CHARGE_REAL:
            self._stopped[(ev.job_id, run)] = _closed(iv, ev.at)
        else:
            self._close(iv, ev.at)

    def _keep_unstarted(self, key: tuple[int, int], spec: tuple[str, str, int],
                        placed: tuple[str | None, float], ev: _Release) -> None:  # fmt: skip
        """A placement released before any `JobStarted`: kept for a `JobRunEnded` that says its
        run started (`fs.OWN_START_KEPT_S`), released as the projection's interval ends (a
        finish at its run's real end when it says it); those placed longer ago are dropped."""
        gpu_type, placed_at = placed
        ended_at = ev.ended_at if isinstance(ev, e.JobFinished) else None
        release = ev.at if ended_at is None else ended_at
        self._unstarted[key] = (self._interval(spec, placed_at, gpu_type), release)
        cut = ev.at - fs.OWN_START_KEPT_S
        while self._unstarted:
            oldest = next(iter(self._unstarted))
            if self._unstarted[oldest][0].start_at >= cut:
                break
            del self._unstarted[oldest]

    def _own_start(self, ev: e.JobRunEnded) -> None:
        """A stopped run's report that says when it really started, where no `JobStarted` did:
        charged from then (never before its placement) to its real end (`CHARGE_RUN`: no later
        than its release), as the projection's `intervals_run_ended` charges it."""
        kept = self._unstarted.pop((ev.job_id, ev.run), None)
        if kept is None or ev.started_at is None:
            return
        iv, release = kept
        if ev.at > iv.start_at + fs.OWN_START_KEPT_S:
            return
        start = max(iv.start_at, ev.started_at)
        end = ev.at if ev.ended_at is None else ev.ended_at
        if self.policy.charge == fs.CHARGE_RUN:
            end = min(end, release)
        begun = fs.Interval(leaf=iv.leaf, user=iv.user, gpus=iv.gpus, funded=True,
                            start_at=start, end_at=None, gpu_type=iv.gpu_type, run_start_at=start)  # fmt: skip  # noqa: E501
        self._close(begun, max(start, end))

    def _run_ended(self, ev: e.JobRunEnded | e.JobEngineEnded) -> None:
        """Under `CHARGE_REAL`: a stopped run's real end, as its engine first reports it
        (`JobRunEnded` names its run; `JobEngineEnded` is about the job's last one), closes its
        interval there, before or after its release; a run never `JobStarted` is charged from
        its own start when the report says it (`_own_start`)."""
        if isinstance(ev, e.JobRunEnded):
            self._own_start(ev)
            key: tuple[int, int] | None = (ev.job_id, ev.run)
        elif e.fenced(ev):  # the fence's presumption: the node's own word is still to come
            return
        else:
            key = max((k for k in self._stopped if k[0] == ev.job_id), default=None)
        iv = self._stopped.pop(key, None) if key is not None else None
        if iv is not None:
            end = ev.at if ev.ended_at is None else ev.ended_at
            self._close(iv, max(iv.start_at, end))

    def _interval(
        self, spec: tuple[str, str, int], start: float, gpu_type: str | None
    ) -> fs.Interval:
        """An open interval of a funded job charged from `start` (its placement or its run's
        start, as the policy charges)."""
        leaf, user, gpus = spec
        return fs.Interval(
            leaf=leaf,
            user=user,
            gpus=gpus,
            funded=True,
            start_at=start,
            end_at=None,
            gpu_type=gpu_type,
            run_start_at=start,
        )

    def apply_all(self, events: Iterable[e.AnyEvent]) -> None:
        for ev in events:
            self.apply(ev)

    def _close(self, iv: fs.Interval, at: float) -> None:
        closed = _closed(iv, at)
        policy = self.policy
        if policy.half_life_s is None:
            if closed.start_at >= at - policy.window_s:
                self._n += 1
                heapq.heappush(self._by_start, (closed.start_at, self._n, closed))
                u, n = self._full.get(iv.leaf, (0.0, 0))
                self._full[iv.leaf] = (u + self._whole(closed), n + 1)
            else:
                self._partial.append(closed)
        else:
            value, since = self._decayed.get(iv.leaf, (0.0, at))
            value = value * _decay(at - since, policy.half_life_s)
            value += fs.interval_usage(closed, at, policy)
            self._decayed[iv.leaf] = (value, at)

    def usage(self, now: float) -> dict[str, float]:
        """Usage per user leaf at `now` (the projection's `leaf` usage), leaves in name order.
        In window mode `now` may not go back (the window's start only moves forward)."""
        parts: dict[str, list[float]] = {}
        policy = self.policy
        h = policy.half_life_s
        if h is None:
            self._slide(now - policy.window_s)
            for leaf, (u, n) in self._full.items():
                if n and u > 0.0:
                    parts.setdefault(leaf, []).append(u)
            for iv in sorted(self._partial, key=_interval_order):
                u = fs.interval_usage(iv, now, policy)
                if u > 0.0:
                    parts.setdefault(iv.leaf, []).append(u)
        else:
            for leaf, (value, at) in self._decayed.items():
                parts.setdefault(leaf, []).append(value * _decay(now - at, h))
        running = [self._open[job_id] for job_id in sorted(self._open)]
        for iv in [*running, *(self._stopped[k] for k in sorted(self._stopped))]:
            u = fs.interval_usage(iv, now, policy)
            if u > 0.0:
                parts.setdefault(iv.leaf, []).append(u)
        return {leaf: _sum(parts[leaf]) for leaf in sorted(parts)}

    def _whole(self, iv: fs.Interval) -> float:
        end = iv.end_at if iv.end_at is not None else iv.start_at
        return iv.gpus * self.policy.weight(iv.gpu_type) * (end - iv.start_at)

    def _slide(self, cutoff: float) -> None:
        """Move closed intervals that the window's start now cuts from whole to partial, and
        drop partial ones the window has left."""
        heap = self._by_start
        while heap and heap[0][0] < cutoff:
            _, _, iv = heapq.heappop(heap)
            u, n = self._full[iv.leaf]
            self._full[iv.leaf] = (u - self._whole(iv), n - 1) if n > 1 else (0.0, 0)
            self._partial.append(iv)
        self._partial = [iv for iv in self._partial if (iv.end_at or cutoff) > cutoff]

    def shape(self, accounts: Accounts) -> fs.TreeShape:
        """The tree of these open accounts (`fs.TreeShape`), rebuilt only when they change."""
        if self._shape is None or self._shape[0] != accounts:
            self._shape = (accounts, fs.TreeShape(accounts))
        return self._shape[1]

    def ranks(self, now: float, accounts: Accounts) -> tuple[dict[str, int], dict[str, float]]:
        """(user leaf -> rank, account -> level fair share) at `now` over the open `accounts`:
        the numbers `fs.fair_tree` gives for this usage, without building its rows."""
        shape = self.shape(accounts)
        return shape.ranks_levels(shape.usage_of(self.usage(now)))

    def usage_shares(
        self, now: float, accounts: Accounts
    ) -> tuple[dict[str, float], dict[str, float]]:
        """(account -> usage, account -> norm share) at `now` over the open `accounts`: the
        numbers `fs.fair_tree` rows give for this usage (`fs.TreeShape.usage_shares`)."""
        shape = self.shape(accounts)
        return shape.usage_shares(shape.usage_of(self.usage(now)))


class Account(Protocol):
    """What `open_accounts` reads of an account (the write side's `State.accounts` values)."""

    @property
    def path(self) -> str: ...
    @property
    def parent(self) -> str | None: ...
    @property
    def kind(self) -> str: ...
    @property
    def shares(self) -> int: ...
    @property
    def open(self) -> bool: ...


def open_accounts(accounts: Iterable[Account]) -> Accounts:
    """The (path, parent, kind, shares) of the open accounts, in the order given."""
    return tuple((a.path, a.parent, a.kind, a.shares) for a in accounts if a.open)


def _closed(iv: fs.Interval, at: float) -> fs.Interval:
    """The interval `iv` ended at `at`."""
    return fs.Interval(
        leaf=iv.leaf,
        user=iv.user,
        gpus=iv.gpus,
        funded=True,
        start_at=iv.start_at,
        end_at=at,
        gpu_type=iv.gpu_type,
        run_start_at=iv.run_start_at,
    )


def _interval_order(iv: fs.Interval) -> tuple[float, float, str, int]:
    return (iv.start_at, iv.end_at or 0.0, iv.leaf, iv.gpus)


def _sum(values: list[float]) -> float:
    """A leaf's parts, added in the order made above (which is canonical)."""
    total = 0.0
    for v in values:
        total += v
    return total


def _decay(dt: float, half_life_s: float) -> float:
    return float(2.0 ** (-dt / half_life_s))
