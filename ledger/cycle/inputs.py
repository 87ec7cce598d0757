"""The dispatcher's input taken from the write side: `snapshot_from_state`.

The adapter between the two pure cores: it reads the write side's `State` (`ledger.core.state`) and
builds the dispatcher's `Snapshot` (`ledger.dispatch`), so neither core imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import itemgetter

from ledger.core.jobs import blocked, over_max_time
from ledger.core.state import NODE_LOST, Job, Node, State
from ledger.dispatch.snapshot import (
    KeptRanks,
    NodeView,
    PendingDelta,
    PendingJob,
    RunningJob,
    Snapshot,
    complete_ranks_kept,
)
from schemas.bounds import job_grace
from schemas.events import GpuSlot


def _since(placed_at: float, started_at: float | None, now: float, from_start: bool) -> float:
    """Pure: since when a run counts as running for the dispatcher (`snapshot_from_state`)."""
    if not from_start:
        return placed_at
    return started_at if started_at is not None else now


def pending_view(job: Job) -> PendingJob:
    """Pure: the dispatcher's view of a pending job."""
    spec = job.spec
    return PendingJob(
        job_id=spec.job_id,
        account=spec.account,
        user=spec.user,
        gpus=spec.gpus,
        gpu_type=spec.gpu_type,
        cluster=spec.cluster,
        min_runtime_s=spec.min_runtime_s,
        resumable=spec.resumable,
        priority=spec.priority,
        submitted_at=spec.at,
        debug=spec.debug,
        time_limit_s=spec.time_limit_s,
        runs=job.preemptions,
        ran_s=job.ran_s,
    )


def stopping_gpus(
    state: State, lost: bool = True, placed: bool = True
) -> dict[str, frozenset[int]]:
    """Pure: node -> the GPUs of the runs the ledger stopped whose end is not recorded yet
    (`State.stopped_runs`: a cancel's, a preemption's or a requeue's run in its grace, and a
    run a `node lost` ended: `NODE_LOST`, left out when not `lost`, as decisions recorded before
    s50 counted: `CycleDecided.lost_held`; and a run stopped while placed, whose launch may
    run unheard: `StoppedRun.placed`, left out when not `placed`: `CycleDecided.placed_held`,
    s52). Their processes may still hold them, and the engine
    starts nothing there until they are gone, so they are not free for a placement (as Slurm's
    COMPLETING job's are not: atk47-23 F8)."""
    held: dict[str, set[int]] = {}
    for sr in state.stopped_runs.values():
        if (not lost and sr.why == NODE_LOST) or (not placed and sr.placed):
            continue
        for sl in sr.slots:
            held.setdefault(sl.node, set()).update(sl.gpu_indices)
    return {node: frozenset(gpus) for node, gpus in held.items()}


def _busy(
    unavailable: Mapping[str, frozenset[int]] | None, stopping: Mapping[str, frozenset[int]]
) -> Mapping[str, frozenset[int]]:
    """Pure: the GPUs never free in a snapshot: foreign work's and stopping runs'."""
    if not stopping:
        return unavailable or {}
    out = dict(stopping)
    for node, gpus in (unavailable or {}).items():
        out[node] = out.get(node, frozenset()) | gpus
    return out


KEEP_FROM = 256
"""Live jobs from which `snapshot_kept` looks only at the job records that changed since the
last call: below it, walking every live job is cheaper (docs/simulation.md, "Speed, eleventh
round")."""


def too_long(time_limit_s: float | None, grace_s: float | None, longest_s: float | None) -> bool:
    """Pure: a pending job of this time limit and grace is not placed under the engine's
    longest (`longest_s`, Slurm's MaxTime as recorded; `jobs.over_max_time`): Slurm would never
    start it (over MaxTime in whole minutes), or its TIMEOUT would come before the ledger's
    SIGKILL (limit + grace + a minute over MaxTime: atk62b G2), or it has no limit (Slurm
    would stop it at MaxTime, a limit nobody asked for: atk61-slurm F3). `grace_s` None: the
    rule before s63 (a decision recorded without `grace_held`), over MaxTime in whole minutes."""
    if grace_s is None:
        if longest_s is None:
            return False
        return time_limit_s is None or slurm_minutes(time_limit_s) * 60.0 > longest_s
    return over_max_time(time_limit_s, grace_s, longest_s)


def _too_long(job: Job, grace_s: float | None, longest_s: float | None) -> bool:
    """Pure: `too_long` of a job, with its own grace or the service's (`grace_s`; None: the
    rule before s63)."""
    if longest_s is None:
        return False
    spec = job.spec
    grace = None if grace_s is None else job_grace(spec.grace_s, grace_s)
    return too_long(spec.time_limit_s, grace, longest_s)


def slurm_minutes(time_limit_s: float) -> int:
    """Pure: a time limit as Slurm counts it, in whole minutes rounded up (at least 1)."""
    return max(1, math.ceil(time_limit_s / 60))


def snapshot_from_state(
    state: State,
    ranks: Mapping[str, int],
    now: float,
    *,
    level_fs: Mapping[str, float] | None = None,
    usage: Mapping[str, float] | None = None,
    shares: Mapping[str, float] | None = None,
    low_util_since: Mapping[int, float] | None = None,
    position: int | None = None,
    unavailable: Mapping[str, frozenset[int]] | None = None,
    unobserved: frozenset[str] = frozenset(),
    from_start: bool = False,
    longest_s: float | None = None,
    hold_stopping: bool = False,
    hold_lost: bool = False,
    hold_placed: bool = False,
    hold_grace: bool = False,
) -> Snapshot:
    """Pure: the snapshot of the write-side `state` (tests, simulation, replay): the one of
    `snapshot_kept` built from nothing kept."""
    return snapshot_kept(
        state,
        ranks,
        now,
        None,
        level_fs=level_fs,
        usage=usage,
        shares=shares,
        low_util_since=low_util_since,
        position=position,
        unavailable=unavailable,
        unobserved=unobserved,
        from_start=from_start,
        longest_s=longest_s,
        hold_stopping=hold_stopping,
        hold_lost=hold_lost,
        hold_placed=hold_placed,
        hold_grace=hold_grace,
    )[0]


@dataclass(frozen=True, slots=True)
class Views:
    """What one `snapshot_kept` hands the next: the node names of its state as the state keys
    them and sorted, the views it made of the nodes (by name: the write side's node and its
    view) and of the live jobs (by job id: the write side's job, the other inputs of a running
    job's view (since when it runs, since when its GPUs idle), and the view), and the ranks it
    completed. A node or job whose record is the same object (records are frozen: a change is a
    new one) with the same inputs (a node's free GPUs) gets the same view again, so a cycle
    builds views only for what changed since the last one. Each call makes new ones (never
    changed after): they hold the live jobs of one state, and a call over another state's jobs
    only misses. The cycle's owner (the service's dispatcher, a replay) keeps them."""

    order: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    nodes: dict[str, tuple[Node, NodeView]] = field(default_factory=dict)
    running: dict[int, tuple[Job, tuple[float, float | None], RunningJob]] = field(
        default_factory=dict
    )
    pending: dict[int, tuple[Job, PendingJob]] = field(default_factory=dict)
    ranks: KeptRanks | None = None
    live: dict[int, Job] | None = None
    """The live jobs' records it read, by `id()` (held here, so an id is not reused while it is
    kept): the next call walks only the records that came or went since (`_jobs_kept`); None
    below `KEEP_FROM` live jobs (the next call walks them all)."""
    waiting: frozenset[int] = frozenset()
    """The pending jobs `blocked` held back."""
    settings: tuple[object, ...] = ()
    """What else a job's view reads (`unobserved`, `from_start`, `longest_s` with the service's
    grace): the next call
    walks every live job when they differ."""
    low: dict[int, float] | None = None
    """The `low_util_since` it read (a copy)."""
    token: object | None = None
    """Names the pending views of the snapshot it made (`PendingDelta.token`)."""


def snapshot_kept(
    state: State,
    ranks: Mapping[str, int],
    now: float,
    kept: Views | None,
    *,
    level_fs: Mapping[str, float] | None = None,
    usage: Mapping[str, float] | None = None,
    shares: Mapping[str, float] | None = None,
    low_util_since: Mapping[int, float] | None = None,
    position: int | None = None,
    unavailable: Mapping[str, frozenset[int]] | None = None,
    unobserved: frozenset[str] = frozenset(),
    from_start: bool = False,
    longest_s: float | None = None,
    hold_stopping: bool = False,
    hold_lost: bool = False,
    hold_placed: bool = False,
    hold_grace: bool = False,
) -> tuple[Snapshot, Views]:
    """Pure: the snapshot of the write-side `state`, made with what the last call handed on
    (`kept`; None: nothing), and what to hand the next call (`Views`).

    `position` defaults to the number of events folded into `state`, which is the log position of
    a single-stream ledger. Interior ranks are completed from the leaf ranks (`complete_ranks`).
    `usage` and `shares` (account -> usage, norm share) are the numbers behind the ranks, for
    a policy that reads them (`ledger.cycle.dispatcher.usage_shares`). Utilisation is not
    part of the write-side state: pass `low_util_since` (job id -> time).
    A held job, and one that may not run yet (`ledger.core.jobs.blocked`: its dependency, its
    array's limit), is not pending in the snapshot: the dispatcher never considers it.
    `unavailable` (node -> GPU indices) are busy with work outside the ledger (an engine's
    foreign jobs): never free. `unobserved` nodes (its engine cannot see them now) have no free
    GPU and their runs are no victims: nothing is decided about what cannot be seen.
    `from_start` (an engine that may hold a placement before it starts it: Slurm): a run's
    contract, time limit and work count from the engine's real start, and a placement not yet
    started has its whole contract ahead. A pending job `too_long` for `longest_s` (the
    engine's partition MaxTime, as the log records it: its limit, its grace and a minute over
    it) is not pending in the snapshot: the engine would never start it, or its TIMEOUT would
    come before the ledger's SIGKILL, so nothing is placed or preempted for it.
    `hold_stopping`: the GPUs of stopped runs in their grace (`stopping_gpus`) are not free
    either (every cycle since atk47-23 F8; a replay of an older record, whose cycle counted
    them free, passes False: `CycleDecided.stopping_held`); with `hold_lost` those of the runs
    a `node lost` ended while their processes may live too (s50: `CycleDecided.lost_held`);
    with `hold_placed` those stopped while placed, whose launch may run unheard (s52:
    `CycleDecided.placed_held`). `hold_grace` (`CycleDecided.grace_held`, every cycle since
    s63): a job is `too_long` by its limit, its grace and a minute; else (a replay of an older
    record) by its limit in whole minutes only.
    """
    low = low_util_since or {}
    held = stopping_gpus(state, hold_lost, hold_placed) if hold_stopping else {}
    busy = _busy(unavailable, held)
    last = kept or Views()
    made_nodes: dict[str, tuple[Node, NodeView]] = last.nodes
    kept_nodes: dict[str, tuple[Node, NodeView]] = {}
    views: list[NodeView] = []
    names = tuple(state.nodes)
    order = last.order
    if order[0] != names:
        order = (names, tuple(sorted(names)))
    all_nodes = state.nodes
    for n in [all_nodes[name] for name in order[1]]:  # by name (a node is keyed by its name)
        if n.state == "removed":
            continue
        if n.name in unobserved:
            free: tuple[int, ...] = ()
        elif n.name in busy:
            free = tuple(i for i in state.free_gpus(n.name) if i not in busy[n.name])
        else:
            free = state.free_gpus(n.name)
        seen_node = made_nodes.get(n.name)
        if seen_node is not None and seen_node[0] is n and seen_node[1].free == free:
            view = seen_node[1]
        else:
            view = NodeView(
                name=n.name,
                cluster=n.cluster,
                gpu_type=n.gpu_type,
                gpus=n.gpus,
                state=n.state,
                free=free,
            )
        kept_nodes[n.name] = (n, view)
        views.append(view)
    nodes = tuple(views)
    # only the live jobs (`state.active`), in id order: the cost follows live work, not the
    # finished jobs a full state keeps
    jobs = state.jobs
    live = list(map(jobs.__getitem__, sorted(state.active)))
    # a dependency not met, an array at its limit: not placed yet (a stopping job counts)
    waiting = blocked(state, live, hold_stopping, hold_lost, hold_placed)
    longest = (longest_s, state.grace_s if hold_grace else None)  # its grace counts (s63)
    settings = (unobserved, from_start, longest)
    seen = dict(zip(map(id, live), live, strict=True)) if len(live) >= KEEP_FROM else None
    token = object()  # names this call's pending views (`PendingDelta`)
    delta: PendingDelta | None = None
    if seen is not None and last.live is not None and last.settings == settings:
        kept_pending, kept_running, touched = _jobs_kept(
            state, last, seen, waiting, now, low, unobserved, from_start, longest
        )
        if last.token is not None:
            delta = _delta(last, kept_pending, touched, token)
    else:
        kept_pending, kept_running = _jobs_walked(
            live, last, waiting, now, low, unobserved, from_start, longest
        )
    pending = tuple(map(_VIEW_OF_PENDING, map(kept_pending.__getitem__, sorted(kept_pending))))
    running = tuple(map(_VIEW_OF_RUNNING, map(kept_running.__getitem__, sorted(kept_running))))
    completed, kept_ranks = complete_ranks_kept(ranks, last.ranks)
    snapshot = Snapshot(
        position=state.events if position is None else position,
        taken_at=now,
        nodes=nodes,
        running=running,
        pending=pending,
        ranks=completed,
        level_fs=dict(level_fs or {}),
        usage=dict(usage or {}),
        shares=dict(shares or {}),
    )
    kept = Views(order, kept_nodes, kept_running, kept_pending, kept_ranks, seen,
                 frozenset(waiting), settings, dict(low), token)  # fmt: skip
    return (snapshot if delta is None else snapshot.with_delta(delta)), kept


_Pending = dict[int, tuple[Job, PendingJob]]
_Running = dict[int, tuple[Job, tuple[float, float | None], RunningJob]]
_VIEW_OF_PENDING = itemgetter(1)
_VIEW_OF_RUNNING = itemgetter(2)


def _jobs_walked(
    live: list[Job],
    last: Views,
    waiting: Mapping[int, object],
    now: float,
    low: Mapping[int, float],
    unobserved: frozenset[str],
    from_start: bool,
    longest: tuple[float | None, float | None],
) -> tuple[_Pending, _Running]:
    """Pure: the views of every live job (`snapshot_kept`), each the last call's again where
    its record and inputs are the same: pending (not held, not `waiting`, not too long) and
    running (placed, not in doubt, seen)."""
    made_pending = last.pending
    kept_pending: _Pending = {}
    kept_running: _Running = {}
    for job in live:
        status = job.status
        if status == "pending":
            if job.held:
                continue
            spec = job.spec
            job_id = spec.job_id
            if job_id in waiting or _too_long(job, longest[1], longest[0]):
                continue
            known = made_pending.get(job_id)
            wait = known[1] if known is not None and known[0] is job else pending_view(job)
            kept_pending[job_id] = (job, wait)
            continue
        if status not in ("placed", "running"):
            continue
        if job.doubt_until is not None:
            continue  # its node is lost and its run may live: its GPUs stay held, it is no victim
        if unobserved and any(sl.node in unobserved for sl in job.slots):
            continue  # its engine cannot see it now: it is no victim
        _run_view(job, last.running, kept_running, now, low, from_start)
    return kept_pending, kept_running


def one_slot_per_node(slots: tuple[GpuSlot, ...]) -> tuple[GpuSlot, ...]:
    """Pure: `slots` with each node once (its GPUs joined, nodes in first-seen order). The
    ledger takes a placement that names a node in two slots; the dispatcher's searches count a
    victim once per slot and would take it twice (s52: hypothesis, `KeyError` in `_preempt`)."""
    if len(slots) < 2 or len({sl.node for sl in slots}) == len(slots):
        return slots
    joined: dict[str, list[int]] = {}
    for sl in slots:
        joined.setdefault(sl.node, []).extend(sl.gpu_indices)
    return tuple(GpuSlot(node=n, gpu_indices=tuple(g)) for n, g in joined.items())


def _run_view(
    job: Job,
    made: _Running,
    kept: _Running,
    now: float,
    low: Mapping[int, float],
    from_start: bool,
) -> None:
    """Put the view of the running `job` in `kept` (the one in `made` again when its record
    and inputs are the same); nothing for a job not placed."""
    placed_at = job.placed_at
    if placed_at is None:
        return
    spec = job.spec
    job_id = spec.job_id
    since = _since(placed_at, job.started_at, now, True) if from_start else placed_at
    inputs = (since, low.get(job_id))
    hit = made.get(job_id)
    if hit is not None and hit[0] is job and hit[1] == inputs:
        run = hit[2]
    else:
        run = RunningJob(
            job_id=job_id,
            account=spec.account,
            user=spec.user,
            gpus=spec.gpus,
            slots=one_slot_per_node(job.slots),
            placed_at=inputs[0],
            min_runtime_s=spec.min_runtime_s,
            resumable=spec.resumable,
            checkpoint_at=job.checkpoint_at,
            debug=spec.debug,
            low_util_since=inputs[1],
            time_limit_s=spec.time_limit_s,
            runs=job.preemptions,
            submitted_at=spec.at,
            takebacks=job.takebacks,
            ran_s=job.ran_s,
        )
    kept[job_id] = (job, inputs, run)


def _jobs_kept(
    state: State,
    last: Views,
    seen: Mapping[int, Job],
    waiting: Mapping[int, object],
    now: float,
    low: Mapping[int, float],
    unobserved: frozenset[str],
    from_start: bool,
    longest: tuple[float | None, float | None],
) -> tuple[_Pending, _Running, list[int]]:
    """Pure: `_jobs_walked`'s answer, worked out from the last call's (same settings): a
    record is frozen (a change is a new one), so only the records that came or went since
    (by identity) and the pending jobs `blocked` now holds back or lets go are looked at; a
    pending view reads nothing else. A running view reads `low` too (and `now`, with
    `from_start`): while they are the same, so is every unchanged record's view; else each is
    checked again."""
    assert last.live is not None
    old = last.live
    gone = old.keys() - seen.keys()
    came = seen.keys() - old.keys()
    kept_pending = dict(last.pending)
    touched: list[int] = []
    """The pending jobs whose entry this call took out or put in (`_delta`)."""
    # a running view reads its record and `low` (and `now`, for a run not started yet, with
    # `from_start`): while `low` is the same, the unchanged records' views are the last ones
    same_low = not from_start and last.low == low
    kept_running: _Running = dict(last.running) if same_low else {}
    for key in gone:
        job = old[key]
        job_id = job.spec.job_id
        hit = kept_pending.get(job_id)
        if hit is not None and hit[0] is job:
            del kept_pending[job_id]
            touched.append(job_id)
        ran = kept_running.get(job_id)
        if ran is not None and ran[0] is job:
            del kept_running[job_id]
    changed = [seen[key] for key in came]
    if waiting or last.waiting:
        held_back = waiting.keys()
        for job_id in held_back - last.waiting:
            kept_pending.pop(job_id, None)
            touched.append(job_id)
        jobs, active = state.jobs, state.active
        changed += [jobs[i] for i in last.waiting - held_back if i in active]
    changed.sort(key=_job_id)
    running = [] if same_low else [
        hit[0] for hit in last.running.values() if seen.get(id(hit[0])) is hit[0]
    ]  # fmt: skip
    for job in changed:
        status = job.status
        if status == "pending":
            job_id = job.spec.job_id
            if job.held or job_id in waiting or _too_long(job, longest[1], longest[0]):
                continue
            known = last.pending.get(job_id)
            wait = known[1] if known is not None and known[0] is job else pending_view(job)
            kept_pending[job_id] = (job, wait)
            touched.append(job_id)
        elif (
            status in ("placed", "running")
            and job.doubt_until is None
            and not (unobserved and any(sl.node in unobserved for sl in job.slots))
        ):
            running.append(job)
    for job in running:
        _run_view(job, last.running, kept_running, now, low, from_start)
    return kept_pending, kept_running, touched


def _delta(last: Views, kept_pending: _Pending, touched: list[int], token: object) -> PendingDelta:
    """Pure: the pending views that went and came between the last call's snapshot and this
    one, from the entries this call touched (every other entry is the last one's)."""
    before = last.pending
    gone: list[PendingJob] = []
    came: list[PendingJob] = []
    for job_id in sorted(set(touched)):
        was, now = before.get(job_id), kept_pending.get(job_id)
        old = was[1] if was is not None else None
        new = now[1] if now is not None else None
        if old is not new:
            if old is not None:
                gone.append(old)
            if new is not None:
                came.append(new)
    return PendingDelta(token=token, base=last.token, gone=tuple(gone), came=tuple(came))


def _job_id(job: Job) -> int:
    return job.spec.job_id
