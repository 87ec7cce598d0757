"""Estimated starts: when a waiting job may start, as `queue` and `explain` say (Slurm's
`squeue --start`): from the running jobs' limits and contracts, the dispatch order, and for a
job held by its dependency or its array's `%N` limit, from what it waits for."""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Mapping, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING

import msgspec

from ledger.dispatch.ordering import lazily
from ledger.reads.stopping import reaping_kill
from schemas.bounds import job_grace

if TYPE_CHECKING:
    from ledger.core.jobs import Blocked
    from ledger.core.state import Job, State
    from ledger.dispatch.decision import Decision
    from ledger.dispatch.ordering import SortKey
    from ledger.dispatch.policy import Policy
    from ledger.dispatch.snapshot import Snapshot
    from schemas.events import JobSubmitted


NOTHING_PLACED = "nothing is placed: the service runs with --executor none"


def placing(state: State) -> bool:
    """Whether the service, as last recorded, places jobs: `serve --executor none` places
    nothing, so no cycle places a job and no start can be estimated."""
    return state.service is None or state.service.executor != "none"


class Room:
    """The GPUs the queue leaves, as `estimated_starts` simulated it: the free pool per GPU
    type and the releases still to come (`_Release`). Jobs held by a dependency or an array's
    limit take from it in job order (`blocked_starts`)."""

    def __init__(self) -> None:
        self.free: dict[str, int] = {}
        self.releases: list[_Release] = []

    def take(self, spec: JobSubmitted, at: float) -> float | None:
        """Pure but for itself: the first moment at or after `at` when the job's GPUs are
        free, or None when no known release frees them; it takes them from then."""
        types = [t for t in self.free if spec.gpu_type is None or t == spec.gpu_type]
        mine = sorted((ends, g) for ends, _, t, g in self.releases if t in types and ends < INF)
        have = sum(self.free[t] for t in types) + sum(g for ends, g in mine if ends <= at)
        start: float | None = at if have >= spec.gpus else None
        for ends, g in (x for x in mine if x[0] > at):
            if start is not None:
                break
            have += g
            start = ends if have >= spec.gpus else None
        if start is not None:
            self.releases = _take(self.free, self.releases, types, spec.gpus, start)
            ends = INF if spec.time_limit_s is None else start + spec.time_limit_s
            contract = start if spec.min_runtime_s == 0 else INF
            self.releases.append((ends, contract, types[0] if types else "", spec.gpus))
        return start


def estimated_starts(
    state: State,
    snapshot: Snapshot,
    decision: Decision,
    now: float,
    through: int | None = None,
    room: Room | None = None,
    blocked: Sequence[tuple[SortKey, int]] = (),
) -> dict[int, float | None]:
    """Pure: an estimated start for every pending job, or None when it cannot be known; with
    `through`, only for the jobs up to that one in dispatch order (a job's estimate depends on
    the jobs ahead of it alone, so those are the same as in the full answer).

    The queue ahead is simulated in dispatch order over cluster-wide GPU counts per GPU type:
    the jobs the next cycle places start `now` and take their GPUs; GPUs free up when running
    jobs (and jobs started in the simulation) reach their time limits, and a job without one
    holds its GPUs for a time nobody knows. A job the next cycle does not place starts at the
    first release after `now` that gives it enough GPUs (it was not placed with the GPUs free
    now: a node fit, a reserve or a limit kept it); a job waiting for contracts to end
    (WAIT_CONTRACT) may also have the GPUs of running jobs once their contracts end (and no
    earlier than the dispatcher says), each GPU going to one such job: two of them never
    "start" on the same GPUs at the same moment. A job no known release makes room for is None
    ("unknown"): nothing the ledger knows says when it starts. An estimate, not a promise.
    `room`, when given, is left holding the GPUs the whole queue leaves (`Room`).

    `blocked`: the jobs a dependency or an array's limit holds (`jobs.blocked`) with the sort
    keys the policy gives them (`blocked_keys`). The dispatcher places each by its own key once
    what it waits for is met, so each is simulated at its place in the order, from the earliest
    moment its dependency or its array's limit lets it run (`blocked_starts`' rules), before
    every job its key precedes (atk33 F4: they were all put behind the whole queue).
    """
    if not placing(state):
        return {}
    placed = {p.job_id for p in decision.placements}
    free: dict[str, int] = {}
    for n in snapshot.nodes:
        if n.state == "active":
            free[n.gpu_type] = free.get(n.gpu_type, 0) + len(n.free)
    releases: list[_Release] = []
    node_type = {n.name: n.gpu_type for n in snapshot.nodes}
    step = state.service.interval_s if state.service is not None else 0.0
    for r in snapshot.running:
        job = state.jobs.get(r.job_id)
        limit = job.spec.time_limit_s if job is not None else None
        begun = job.started_at if job is not None and job.started_at is not None else r.placed_at
        ends = INF if limit is None else begun + limit
        if job is not None and now >= ends:
            # past its limit, stopping in its grace: free at its SIGKILL at the latest plus a
            # cycle, as a stopped run's (`stopping_releases`); it ended "now", a release no
            # start is found at, so the next job was carried to another's limit (atk49-23 F5)
            ends = max(now, ends + job.grace(state.grace_s)) + step
        if job is not None and (reaped := reaping_kill(job, state.grace_s)) is not None:
            # its command exited leaving processes: free at their SIGKILL at the latest plus a
            # cycle, not at its time limit (atk49-23 F4)
            ends = min(ends, max(now, reaped) + step)
        ends = max(now, ends)
        # preempted once its contract (from its real start) ends, its GPUs come free when its
        # processes have had their grace (atk33 F6)
        contract = max(now, victim_free_at(job, r.placed_at + r.min_runtime_s, state.grace_s))
        for sl in r.slots:
            releases.append((ends, contract, node_type.get(sl.node, ""), len(sl.gpu_indices)))
    releases += stopping_releases(state, snapshot, now)
    out: dict[int, float | None] = {}
    pending = {p.job_id: p for p in snapshot.pending}
    waiting = decision.waiting
    held = _Held(state, {j for _, j in blocked}, now)
    search = _Search()
    left = Room()
    deferred: list[int] = []
    merged = heapq.merge(
        ((k, q.job_id, False) for k, q in lazily(decision.order)),  # keys up to `through`
        ((k, j, True) for k, j in blocked),
        key=lambda x: x[0],
    )
    for _, job_id, is_blocked in merged:
        if is_blocked:  # it may run once what it waits for is met: when that is known
            deferred.append(job_id)
            left.free, left.releases = free, releases
            deferred = held.ready(deferred, left, out)
            free, releases = left.free, left.releases
            if job_id == through:
                break
            continue
        p = pending.get(job_id)
        if p is None:
            continue
        types = [t for t in free if p.gpu_type is None or t == p.gpu_type]
        wait = waiting.get(p.job_id)
        # a job waiting for contracts to end may have GPUs once they end: the dispatcher may
        # preempt the jobs in the way then (each such GPU goes to one of them, in order)
        until = None
        if wait is not None and wait.code == "WAIT_CONTRACT" and wait.until is not None:
            until = max(now, wait.until)
        start: float | None = None
        if p.job_id in placed:
            start = now
        elif until is None:  # the releases sorted once while they stay (atk51-29 F5)
            start = search.first(releases, types, sum(free[t] for t in types), p.gpus, now)
        else:
            have = sum(free[t] for t in types)
            for at, t, g in sorted((_when(x, until), x[2], x[3]) for x in releases):
                if t in types and at < INF:
                    have += g
                    if have >= p.gpus and (at > now or until is not None):
                        start = at
                        break
        out[p.job_id] = start
        if start is not None:  # it takes its GPUs from `start`: the free pool, then releases
            releases = _take(free, releases, types, p.gpus, start, until)
            ends = INF if p.time_limit_s is None else start + p.time_limit_s
            # whether a later job may preempt it at its contract's end depends on ranks to
            # come: only an unfunded one (always preemptible) is counted as free before then
            contract = start if p.min_runtime_s == 0 else INF
            releases.append((ends, contract, types[0] if types else "", p.gpus))
        held.known[p.job_id] = start
        left.free, left.releases = free, releases
        deferred = held.ready(deferred, left, out)  # what waited for this one may go now
        free, releases = left.free, left.releases
        if p.job_id == through:
            break
    left.free, left.releases = free, releases
    held.ready(deferred, left, out, last=True)  # what they wait for has no known start
    if room is not None:
        room.free, room.releases = left.free, left.releases
    return out


class _Search:
    """The first release at which a job that waits for no contract has its GPUs, found by
    bisection in the releases of its GPU types sorted by time with their running sums, made
    again only once the releases change (a start taken from them): sorting every release for
    each of 10,000 pending jobs that find none cost ~1.7 s of CPU a cold queue page at 1M
    events (atk51-29 F5). The same start as the walk in time order it replaces."""

    def __init__(self) -> None:
        self.of: list[_Release] | None = None
        self.size = -1
        self.sums: dict[tuple[str, ...], tuple[list[float], list[int]]] = {}

    def first(
        self, releases: list[_Release], types: list[str], have: int, gpus: int, now: float
    ) -> float | None:
        """The first moment after `now` when `have` GPUs free now and the releases of `types`
        up to it (their time limits) reach `gpus`; None when none does."""
        if self.of is not releases or self.size != len(releases):  # a new list, or grown
            self.of, self.size, self.sums = releases, len(releases), {}
        key = tuple(types)
        got = self.sums.get(key)
        if got is None:
            mine = sorted((r[0], r[3]) for r in releases if r[2] in types and r[0] < INF)
            got = self.sums[key] = ([a for a, _ in mine], list(accumulate(g for _, g in mine)))
        times, sums = got
        k = max(bisect_left(sums, gpus - have), bisect_right(times, now))
        return times[k] if k < len(times) else None


def stopping_releases(state: State, snapshot: Snapshot, now: float) -> list[_Release]:
    """Pure: the GPUs of stopped runs in their grace that the snapshot holds (never free for a
    placement until the run's end is recorded: `cycle.inputs.stopping_gpus`), released at
    their SIGKILL at the latest (`stopping.stopped_kill_at`, the time `explain` names) plus
    one cycle interval, the cycle after the end is recorded that places on them; one overdue
    (its engine late to report) from the next cycle. atk48-23 F3: they had no release, so a job
    waiting for them was estimated at another job's limit, 9 min late, or "unknown". GPUs a
    live job holds again, or free in a snapshot that counted them free (an older record's
    rule), are the running jobs' or the free pool's."""
    from ledger.reads.stopping import stopped_kill_at

    if not state.stopped_runs:
        return []
    step = state.service.interval_s if state.service is not None else 0.0
    free = {n.name: (n.gpu_type, set(n.free)) for n in snapshot.nodes if n.state == "active"}
    at: dict[tuple[str, int], float] = {}
    for sr in state.stopped_runs.values():
        ends = max(now, stopped_kill_at(sr, state.grace_s)) + step
        for sl in sr.slots:
            for i in sl.gpu_indices if sl.node in free else ():
                if i not in free[sl.node][1] and (sl.node, i) not in state.holders:
                    at[(sl.node, i)] = max(ends, at.get((sl.node, i), ends))
    counts: dict[tuple[float, str], int] = {}
    for (node, _), ends in at.items():
        key = (ends, free[node][0])
        counts[key] = counts.get(key, 0) + 1
    return [(ends, ends, t, g) for (ends, t), g in sorted(counts.items())]


def stopping_ends(state: State, now: float) -> dict[int, tuple[int | None, float]]:
    """Pure: job -> (its array, when it is gone) for the jobs stopping in their grace whose
    record ended (`State.stopping_arrays`: they hold back their dependents and their array's
    limit, `jobs.blocked`): their SIGKILL at the latest plus a cycle, as their GPUs'
    (`stopping_releases`)."""
    from ledger.reads.stopping import stopped_kill_at

    if not state.stopped_runs:
        return {}
    step = state.service.interval_s if state.service is not None else 0.0
    kills: dict[int, float] = {}
    for sr in state.stopped_runs.values():
        kill = stopped_kill_at(sr, state.grace_s)
        kills[sr.job_id] = max(kill, kills.get(sr.job_id, kill))
    return {j: (a, max(now, kills[j]) + step) for j, a in state.stopping_arrays().items()}


def blocked_keys(
    state: State, snapshot: Snapshot, policy: Policy, waits: Mapping[int, Blocked]
) -> list[tuple[SortKey, int]]:
    """Pure: the jobs `waits` holds with the sort keys `policy` gives them (in order), as the
    dispatcher will rank them once they may run."""
    from ledger.cycle.inputs import pending_view

    if not waits:
        return []
    views = tuple(pending_view(state.jobs[j]) for j in sorted(waits))
    keyed = policy.order(msgspec.structs.replace(snapshot, pending=views))
    return [(k, p.job_id) for k, p in keyed]


INF = float("inf")


def victim_free_at(job: Job | None, contract_ends_at: float, default_s: float) -> float:
    """Pure: when a running job's GPUs come free if it is preempted as its contract ends: its
    contract counted from its real start when known (`Job.contract_ends_at`, as the dispatcher
    on Slurm counts it; never earlier than the snapshot's), plus its grace (`Job.grace`: its
    own, else the service's when it was placed, else `default_s`), SIGTERM to SIGKILL, before
    which the engine starts nothing on them."""
    if job is None:
        return contract_ends_at + job_grace(None, default_s)
    ends = max(contract_ends_at, job.contract_ends_at() or contract_ends_at)
    return ends + job.grace(default_s)  # its own, else its placement's (atk49-23 F1)


_Release = tuple[float, float, str, int]
"""GPUs a running (or simulated) job frees: (at its time limit, INF without one; when its
contract ends, from which a job waiting for contracts may have them; GPU type; GPUs)."""


def _when(r: _Release, until: float | None) -> float:
    """Pure: when a job may have the release's GPUs: at its time limit, or, for a job waiting
    for contracts (`until`: when the dispatcher says they end), once its contract has ended."""
    return r[0] if until is None else min(r[0], max(r[1], until))


def _take(
    free: dict[str, int],
    releases: list[_Release],
    types: list[str],
    gpus: int,
    start: float,
    until: float | None = None,
) -> list[_Release]:
    """Pure: take `gpus` GPUs of `types` from the free pool (changed in place), then from the
    releases the job may have at or before `start` (`_when`); the releases left."""
    need = gpus
    for t in types:
        take = min(free[t], need)
        free[t] -= take
        need -= take
    kept = []
    # in time order (`_when`); with no `until`, that is the releases' own order (no key: a
    # key called for each release cost ~1 s a cold queue page at 1M events, atk51-29 F5)
    ordered = (
        sorted(releases) if until is None else sorted(releases, key=lambda x: (_when(x, until), x))
    )
    for i, r in enumerate(ordered):
        if not need:  # the rest as they are
            kept += ordered[i:]
            break
        ends, contract, t, g = r
        if t in types and (ends if until is None else _when(r, until)) <= start:
            take = min(g, need)
            need -= take
            if g - take:
                kept.append((ends, contract, t, g - take))
        else:
            kept.append(r)
    return kept


def dependency_ends(
    state: State, job_id: int, starts: Mapping[int, float | None], now: float
) -> float | None:
    """Pure: the earliest moment `job_id`'s dependency may be met: every job it waits for
    (`afterok`/`afterany`/`afternotok`; an array's id stands for its tasks) reaching its time
    limit from its start (the real one, else the queue's estimate `starts`), and every one
    stopping in its grace ending (`stopping_ends`). None when one of them has no limit or no
    known start, or for a singleton: nobody knows."""
    from ledger.core.jobs import active_ids

    ends: list[float] = [now]
    stopping = stopping_ends(state, now)
    for term in state.jobs[job_id].spec.dependency:
        if term.kind == "singleton":
            return None
        ids = set(term.job_ids)
        ends += [at for j, (array, at) in stopping.items() if j in ids or array in ids]
        for dep in (d for jid in term.job_ids for d in active_ids(state, jid)):
            job = state.jobs[dep]
            holding = job.status in ("placed", "running")
            begun = (job.started_at or job.placed_at) if holding else starts.get(dep)
            limit = job.spec.time_limit_s
            if begun is None or limit is None:
                return None
            ends.append(begun + limit)
    return max(ends)


def blocked_starts(
    state: State,
    waits: Mapping[int, Blocked],
    starts: Mapping[int, float | None],
    now: float,
    room: Room | None = None,
) -> dict[int, float | None]:
    """Pure: an estimated start for each job in `waits` (`jobs.blocked`: a dependency, an
    array's `%N` limit), after the queue (`starts`, its estimates), in job order (`_Held.start`
    says how each is estimated). `estimated_starts` with `blocked` puts each at its place in
    the queue instead, as the dispatcher will."""
    held = _Held(state, set(waits), now)
    held.known.update(starts)
    out: dict[int, float | None] = {}
    for job_id in sorted(waits):
        out[job_id] = held.start(job_id, room)
    return out


class _Held:
    """Jobs held by a dependency or an array's `%N` limit, estimated as the queue simulation
    reaches them: what they wait for must have an estimate first (`ready`)."""

    def __init__(self, state: State, held: set[int], now: float) -> None:
        self.state, self.held, self.now = state, held, now
        self.known: dict[int, float | None] = {}
        """The estimates so far (job id -> start, None: unknown)."""
        self.slots: dict[int, list[float | None]] = {}
        """Array -> when each of its `%N` slots frees."""

    def ready(
        self, waiting: list[int], room: Room, out: dict[int, float | None], last: bool = False
    ) -> list[int]:
        """Estimate (into `out`, taking from `room`) each of `waiting` whose dependency has
        an estimate (all of them when `last`), in order, until none more can go; the rest."""
        moved = True
        while moved and waiting:
            moved = False
            for job_id in list(waiting):
                if last or self._can_tell(job_id):
                    waiting.remove(job_id)
                    out[job_id] = self.start(job_id, room)
                    moved = True
        return waiting

    def _can_tell(self, job_id: int) -> bool:
        """Whether every job `job_id` depends on holds GPUs or has an estimate already."""
        from ledger.core.jobs import active_ids

        state = self.state
        for term in state.jobs[job_id].spec.dependency:
            for dep in (d for jid in term.job_ids for d in active_ids(state, jid)):
                holding = state.jobs[dep].status in ("placed", "running")
                if not holding and dep not in self.known:
                    return False
        return True

    def start(self, job_id: int, room: Room | None) -> float | None:
        """A dependent starts when what it depends on reaches its limit (`dependency_ends`);
        an array task held by its limit when the first of the `%N` tasks ahead of it (holding
        GPUs, going next, or held before it) reaches its limit. None where a limit or a start
        is unknown, or for a singleton. With `room` (what the queue ahead leaves), it also
        waits, from then, for its GPUs to be free, and takes them: it never "starts" on GPUs
        the queue ahead, or another held job, holds then."""
        state, now = self.state, self.now
        s = state.jobs[job_id].spec
        start: float | None = now
        if s.dependency:
            if any(t.kind == "singleton" for t in s.dependency):
                start = None
            else:
                start = dependency_ends(state, job_id, self.known, now)
        limit = s.array_limit
        slot: int | None = None
        if s.array_job_id is not None and limit is not None:
            free = self.slots.get(s.array_job_id)
            if free is None:
                free = _array_slots(state, s.array_job_id, self.held, self.known, now)
                free += [now] * (limit - len(free))
                self.slots[s.array_job_id] = free
            if not free:  # a limit of 0 never frees a slot
                start = None
            else:
                slot = min(range(len(free)), key=lambda i: _later(free[i]))
                at = free[slot]
                start = None if start is None or at is None else max(start, at)
        if room is not None and start is not None:
            start = room.take(s, start)
        if s.array_job_id is not None and slot is not None:
            lim = s.time_limit_s
            self.slots[s.array_job_id][slot] = None if start is None or lim is None else start + lim
        self.known[job_id] = start
        return start


def _later(at: float | None) -> tuple[bool, float]:
    """Pure: a sort key where an unknown time (None) comes after every known one."""
    return (at is None, at or 0.0)


def _array_slots(
    state: State,
    array: int,
    held: Collection[int],
    starts: Mapping[int, float | None],
    now: float,
) -> list[float | None]:
    """Pure: when each task of `array` that holds GPUs or goes next (not `held`: the queue's
    estimate `starts`) reaches its limit (None: unknown), or, stopping in its grace, ends
    (`stopping_ends`)."""
    ends: list[float | None] = [at for a, at in stopping_ends(state, now).values() if a == array]
    for job_id in sorted(state.active):
        job = state.jobs[job_id]
        if job.spec.array_job_id != array or job_id in held or job.status == "finished":
            continue
        if job.status in ("placed", "running"):
            begun: float | None = job.started_at or job.placed_at
        else:
            begun = starts.get(job_id)
        lim = job.spec.time_limit_s
        ends.append(None if begun is None or lim is None else max(now, begun + lim))
    return ends
