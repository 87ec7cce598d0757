"""A reservation (`Hold`): the nodes a waiting job can have soonest, and how it starts there.

Pure: functions of their arguments (the cycle's free-GPU index, running jobs, `now`); no I/O,
no clock. `engine._Cycle` makes the reservation (`_hold_for`: which running jobs free their
GPUs when, by the policy) and starts it (`_start_held`: the preemptions); this module holds
the arithmetic of both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence, Set

import msgspec

from ledger.dispatch.placement import FreeIndex, Pool
from ledger.dispatch.snapshot import PendingJob, RunningJob


class Hold(msgspec.Struct, frozen=True, kw_only=True):
    """A reservation: the nodes whose GPUs job `job_id` can have soonest, held for it until
    `until` (when the last of them is free or holds only jobs it may preempt then); only jobs
    the policy lets backfill are placed there meanwhile."""

    job_id: int
    nodes: frozenset[str]
    until: float


_Slots = list[tuple[str, tuple[str, str], int]]
_Row = tuple[int, float, float, _Slots]

KeptSlots = tuple[Mapping[str, tuple[str, str]], dict[int, tuple[RunningJob, _Slots]]]
"""What one cycle's `Frees` hands the next: the index's node -> pool map it read (the same
object while the active nodes and their pools stay the same: `FreeIndex.of`) and, per running
job, the job's view and its (node, pool, GPUs) on those active nodes."""


class Frees:
    """When each running job of a cycle frees its GPUs, for the reservations it weighs: at its
    contract's end, or when the policy expects it to end (`expected_end`; both at least `now`),
    on which active nodes and pools. Worked out once per job per cycle (the index's active
    nodes and `now` do not change inside one)."""

    def __init__(
        self,
        now: float,
        index: FreeIndex,
        expected_end: Callable[[RunningJob, float], float],
        last: KeptSlots | None = None,
    ) -> None:
        """`last`: what the last cycle's `kept()` handed on (its jobs' slots on active nodes,
        read again for a job whose view is the same object while the active nodes are)."""
        self.now = now
        self.index = index
        self.expected_end = expected_end
        self.rows: dict[int, _Row] = {}
        self.slots: dict[int, tuple[RunningJob, _Slots]] = {}
        self.last = last[1] if last is not None and last[0] is index.pool_of else {}
        self.infinity: tuple[set[int], set[int]] | None = None
        """What `infinite` worked out this cycle."""

    def _row(self, r: RunningJob) -> _Row:
        now = self.now
        job_id = r.job_id
        was = self.last.get(job_id)
        if was is not None and was[0] is r:
            on = was[1]
        else:
            free, pool_of = self.index.free, self.index.pool_of
            on = [(sl.node, pool_of[sl.node], len(sl.gpu_indices)) for sl in r.slots
                  if sl.node in free]  # fmt: skip
        self.slots[job_id] = (r, on)
        row = self.rows[job_id] = (
            job_id,
            max(now, r.placed_at + r.min_runtime_s),
            max(now, self.expected_end(r, now)),
            on,
        )
        return row

    def kept(self, last: KeptSlots | None) -> KeptSlots | None:
        """What to hand the next cycle: this cycle's slots when it worked any out (a reservation
        reads every running job), else `last` as it was."""
        if not self.slots:
            return last
        return (self.index.pool_of, self.slots)

    def infinite(self, live: Mapping[int, RunningJob]) -> tuple[set[int], set[int]]:
        """The jobs of `live` (job id -> view) whose time at their contract's end, and whose
        expected time, is infinite: worked out once per cycle, as `on` times them (the jobs
        leave `live` only, inside a cycle)."""
        inf = self.infinity
        if inf is None:
            ready: set[int] = set()
            expected: set[int] = set()
            rows = self.rows
            for r in live.values():
                row = rows.get(r.job_id) or self._row(r)
                if row[1] == math.inf:
                    ready.add(row[0])
                if row[2] == math.inf:
                    expected.add(row[0])
            inf = self.infinity = (ready, expected)
        return inf

    def never(
        self, live: Mapping[int, RunningJob], eligible: Set[int], keys: Set[tuple[str, str]]
    ) -> set[str]:
        """The active nodes of the pools `keys` that a job of `live` never frees, timed as `on`
        times it for a gang job (at its contract's end when `eligible`, else when expected; no
        `takes`): a node `on` times at infinity, never whole for a gang reservation
        (`soonest`). `eligible` need only say which of the jobs `infinite` names are."""
        ready, expected = self.infinite(live)
        blocking = expected - eligible
        if ready:
            blocking |= ready & eligible
        out: set[str] = set()
        rows = self.rows
        for job_id in blocking:
            if job_id in live:
                for node, pool, _ in rows[job_id][3]:
                    if pool in keys:
                        out.add(node)
        return out

    def on(
        self,
        live: Iterable[RunningJob],
        eligible: Set[int],
        takes: Callable[[RunningJob], bool | None] | None,
        keys: Set[tuple[str, str]],
        gang: bool,
    ) -> dict[str, list[tuple[float, int]]]:
        """Node -> (when, GPUs) per job of `live` on the nodes of the pools `keys`: a job frees
        its GPUs at its contract's end when it is `eligible` (or `takes` says so), else when it
        is expected to end. For a gang job (`gang`), which reads only the latest time per node
        (`soonest`), that time alone."""
        rows = self.rows
        if gang and takes is None:  # most reservations: one time per node, eligibility by id
            latest: dict[str, tuple[float, int]] = {}
            seen = latest.get
            for r in live:
                hit = rows.get(r.job_id) or self._row(r)
                when = hit[1] if hit[0] in eligible else hit[2]
                for node, pool, gpus in hit[3]:
                    if pool in keys:
                        prior = seen(node)
                        if prior is None or when > prior[0]:
                            latest[node] = (when, gpus)
            return {node: [last] for node, last in latest.items()}
        out: dict[str, list[tuple[float, int]]] = {}
        for r in live:
            row = rows.get(r.job_id)
            if row is None:
                row = self._row(r)
            job_id, ready, expected, slots = row
            said = takes(r) if takes is not None else None
            at = ready if (job_id in eligible if said is None else said) else expected
            for node, pool, gpus in slots:
                if pool not in keys:
                    continue
                if not gang:
                    out.setdefault(node, []).append((at, gpus))
                    continue
                was = out.get(node)
                if was is None:
                    out[node] = [(at, gpus)]
                elif at > was[0][0]:
                    was[0] = (at, gpus)
        return out


def soonest(
    job: PendingJob,
    gang: bool,
    index: FreeIndex,
    pools: Sequence[Pool],
    on: Mapping[str, list[tuple[float, int]]],
    skip: set[str],
    now: float,
    window: float,
) -> Hold | None:
    """The nodes of `pools` (but `skip`) whose GPUs `job` can have soonest, given when each
    running job's GPUs free on each node (`on`: node -> (time, GPUs)); None when no set frees
    in finite time, or the soonest frees later than `window` from now."""
    times: list[tuple[float, str]] = []
    for p in pools:
        if gang:  # a node is whole once its last job's GPUs are free (`Frees.on`: one time)
            for name in p.nodes:
                if name in skip:
                    continue
                last = on.get(name)
                if not last:
                    times.append((now, name))
                else:
                    times.append((last[0][0] if len(last) == 1 else max(t for t, _ in last), name))
            continue
        for name in p.nodes:
            if name in skip:
                continue
            frees = sorted(on.get(name, ()))
            room = len(index.free[name])
            at = now if room >= job.gpus else math.inf
            for t, g in frees:
                if room >= job.gpus:
                    break
                room += g
                at = t
            if room >= job.gpus:
                times.append((at, name))
    times.sort()
    chosen: list[str] = []
    got = 0
    until = now
    for at, name in times:
        if got >= job.gpus or math.isinf(at):
            break
        if not gang and chosen:
            break
        chosen.append(name)
        got += index.size[name] if gang else job.gpus
        until = max(until, at)
    if got < job.gpus or until - now > window:
        return None
    return Hold(job_id=job.job_id, nodes=frozenset(chosen), until=until)


def start_plan(
    job: PendingJob,
    gang: bool,
    index: FreeIndex,
    live: Iterable[RunningJob],
    hold: Hold,
    now: float,
) -> tuple[list[str], list[tuple[RunningJob, str]]] | None:
    """The nodes (in name order) and the jobs to preempt, each with its note, that start `job`
    on its reservation's nodes: every job there, when all are past their contracts and the
    nodes then fit it; else None."""
    nodes = sorted(hold.nodes)
    on = hold.nodes
    victims = sorted(
        (r for r in live if any(sl.node in on for sl in r.slots)),
        key=lambda r: r.job_id,
    )
    if any(r.in_contract(now) for r in victims):
        return None
    freed: dict[str, int] = {n: len(index.free.get(n, ())) for n in nodes}
    for r in victims:
        for sl in r.slots:
            if sl.node in freed:
                freed[sl.node] += len(sl.gpu_indices)
    if gang:
        if any(freed[n] < index.size[n] for n in nodes) or sum(freed.values()) < job.gpus:
            return None
    elif len(nodes) != 1 or freed[nodes[0]] < job.gpus:
        return None
    out: list[tuple[RunningJob, str]] = []
    for r in victims:
        kind = "unfunded" if r.min_runtime_s <= 0 else (
            "resumable" if r.resumable else "not resumable")  # fmt: skip
        lost = r.gpus * r.work_lost_s(now)
        note = (
            f"reservation: nodes {', '.join(nodes)} held for job {job.job_id} "
            f"({job.gpus} GPUs) are past their contracts; {kind}, loses {lost / 3600:.2f} GPU-h"
        )
        out.append((r, note))
    return nodes, out


def freest_node(index: FreeIndex, pools: Sequence[Pool], gpus: int, skip: Set[str]) -> str | None:
    """The node a waiting single-node job of `gpus` GPUs drains (`Policy.drains_for`): of the
    active nodes of `pools` (but `skip`) that hold at least `gpus` GPUs, the one with the most
    free now, then the first by name; None when there is none. No time is read: the node is
    the one closest to holding the job, and it drains as its runs end (a reservation by node,
    not by time: the free tier's runs declare no end)."""
    free, size = index.free, index.size
    best: tuple[int, str] | None = None
    for pool in pools:
        for n in pool.nodes:
            if n in skip or size[n] < gpus:
                continue
            key = (-len(free[n]), n)
            if best is None or key < best:
                best = key
    return None if best is None else best[1]


def newer_runs_node(
    index: FreeIndex,
    pools: Sequence[Pool],
    job: PendingJob,
    live: Mapping[int, RunningJob],
    skip: Set[str],
    now: float,
) -> tuple[str, list[RunningJob]] | None:
    """The node on which `job`, the free tier's waiting head (`Policy.drains_for` with
    `free_drain_takes`), takes back runs: of the active nodes of `pools` (but `skip`) that
    hold at least `job.gpus` GPUs and on which every run is an unfunded one on that node alone
    submitted after `job` (the free tier's order: oldest first), the one whose runs lose the
    fewest GPU-seconds of work, then with the most GPUs free, then the first by name; with
    those runs (fewest first, enough to fit `job`: newest submissions first). None when none."""
    on: dict[str, list[RunningJob]] = {}
    bad: set[str] = set()
    mine = (job.submitted_at, job.job_id)
    for r in live.values():
        nodes = {sl.node for sl in r.slots}
        newer = r.min_runtime_s <= 0 and (r.submitted_at, r.job_id) > mine and len(nodes) == 1
        for n in nodes:
            if newer:
                on.setdefault(n, []).append(r)
            else:
                bad.add(n)
    free, size = index.free, index.size
    best: tuple[float, int, str, list[RunningJob]] | None = None
    for pool in pools:
        for n in pool.nodes:
            have = len(free[n])
            if n in skip or n in bad or size[n] < job.gpus or have >= job.gpus:
                continue
            runs = sorted(on.get(n, []), key=lambda r: (-r.submitted_at, -r.job_id))
            taken: list[RunningJob] = []
            for r in runs:
                if have >= job.gpus:
                    break
                taken.append(r)
                have += r.gpus
            if have < job.gpus:
                continue
            lost = sum(r.gpus * r.work_lost_s(now) for r in taken)
            key = (lost, -len(free[n]), n, taken)
            if best is None or key[:3] < best[:3]:
                best = key
    return None if best is None else (best[2], best[3])
