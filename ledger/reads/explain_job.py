"""`explain`, the read: why a job is pending, placed where it is, or was preempted, from the
live state (`explain_now`: its wait, its place in the queue, its estimated start, on the
dispatcher's preview) and the projection (`explain_told`: its history told, any thread).

The sentences are `ledger.reads.explain`'s (pure); the preview and the queue's estimates are
`ledger.reads.preview`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from ledger.reads.estimates import NOTHING_PLACED, placing
from ledger.reads.explain import (
    earlier_runs_said,
    explain_history,
    explain_pending,
    stopping_said,
)
from ledger.reads.layer import Viewer, redact_event
from ledger.reads.preview import _reason, _starts, live, readable, too_long_waits
from ledger.reads.stopping import is_stopping, past_limit
from schemas import events as e
from schemas import views as v
from schemas.errors import UnknownEntity

if TYPE_CHECKING:
    from ledger.core.state import Job, State
    from ledger.cycle.dispatcher import LiveState
    from ledger.dispatch.decision import Decision
    from ledger.dispatch.policy import Policy
    from ledger.dispatch.snapshot import Snapshot
    from projections.store import Store

NEXT_LINE = "It would be placed in the next cycle."
NEXT_LINE_NONE = (
    "It would be placed in the next cycle, but nothing is placed: the service runs with "
    "--executor none (no start can be estimated)."
)


def _history(store: Store, job_id: int) -> list[e.AnyEvent]:
    from projections import history

    return [r.event for r in history.job_events(store.con, job_id)]


_JOB_EVENTS = (
    e.JobSubmitted, e.JobPlaced, e.JobStarted, e.JobPreempted, e.JobHeld, e.JobReleased,
    e.JobRequeued, e.JobUnplaced, e.JobFinished, e.CheckpointReported, e.LeaderEnded,
)  # fmt: skip


def _preemptors(store: Store, history: Iterable[e.AnyEvent]) -> list[e.AnyEvent]:
    """The submissions of the jobs its preemptions made room for: whose account and funding
    its takebacks name (`Job.takebacks`)."""
    from projections.history import events_of

    ids = {
        ev.for_job for ev in history if isinstance(ev, e.JobPreempted) and ev.for_job is not None
    }
    return (
        [ev for _, ev in events_of(store.con, [e.JobSubmitted], job_ids=sorted(ids))] if ids else []
    )


def job_from_history(
    job_id: int, history: Iterable[e.AnyEvent], preemptors: Iterable[e.AnyEvent] = ()
) -> Job | None:
    """Pure: a job as the full fold holds it, from its own events and the submissions of the
    jobs it was preempted for (`_preemptors`) alone (a live state keeps no finished jobs; their
    history is in the projection); None when it was never submitted."""
    from ledger.core.evolve import evolve
    from ledger.core.state import State

    scratch = State()
    for ev in preemptors:
        if isinstance(ev, e.JobSubmitted) and ev.job_id != job_id:
            evolve(scratch, ev)
    for ev in history:
        if isinstance(ev, _JOB_EVENTS) and ev.job_id == job_id:
            if not isinstance(ev, e.JobSubmitted) and job_id not in scratch.jobs:
                continue
            evolve(scratch, ev)
    return scratch.jobs.get(job_id)


def _decisions(store: Store, history: Iterable[e.AnyEvent]) -> dict[str, e.CycleDecided]:
    cycles = sorted(
        {
            ev.cycle_id
            for ev in history
            if isinstance(ev, e.JobPlaced | e.JobPreempted) and ev.cycle_id
        }
    )
    if not cycles:
        return {}
    from projections.history import decisions_of_cycles

    return decisions_of_cycles(store.con, cycles)


def _tag(ev: e.AnyEvent) -> str:
    return e.tag_of(type(ev))


def explain(
    ledger: LiveState,
    store: Store,
    job_id: int,
    policy: Policy,
    now: float,
    preview: tuple[Snapshot, Decision] | None = None,
    viewer: Viewer | None = None,
    longest_s: float | None = None,
) -> v.ExplainView:
    """Why a job is pending, placed where it is, or was preempted: structured, and in words.
    `preview`: `live(...)` at `now` when the caller already holds it. `viewer`: who reads; a
    job whose private parts they may not see is told from its `redact_event`ed history.
    `longest_s`: the engine's longest time limit, as the service last observed it
    (`preview.too_long_waits`)."""
    job = ledger.state.jobs.get(job_id)
    current = (
        None if job is None else explain_now(ledger, store, job, policy, now, preview, longest_s)
    )
    return explain_told(store, job_id, job, current, now, viewer, live=ledger.state)


class Now(NamedTuple):
    """What the live state says of a job at a moment (`explain_now`): its wait, its place in
    the queue and when it may start; the rest of `explain` comes from the projection."""

    status: v.JobStatusWord
    code: str | None = None
    reason: str | None = None
    position: int | None = None
    queue_length: int | None = None
    sort_key: list[float | int | str] | None = None
    blocking: tuple[int, ...] = ()
    start: float | None = None
    lines: list[str] | None = None
    """What a pending job's explanation says in place of its told history (None: the history)."""
    after: tuple[str, ...] = ()
    """Said after the told history."""
    earlier: bool = False
    """A pending job's lines are followed by its told history when it was preempted before."""


def explain_now(
    ledger: LiveState | None,
    store: Store | None,
    job: Job,
    policy: Policy | None,
    now: float,
    preview: tuple[Snapshot, Decision] | None = None,
    longest_s: float | None = None,
) -> Now:
    """The part of `explain` the live state answers (on the thread that owns it); a job that
    is not pending needs no state (`ledger` None). A job whose time limit is over the engine's
    longest (`longest_s`) waits for that, with no estimated start (`too_long_waits`)."""
    held = job.held
    status: v.JobStatusWord = "held" if held and job.status == "pending" else job.status
    if is_stopping(job, now):
        status = "stopping"  # as every read shows it (`ledger.reads.stopping`)
    if job.status != "pending" or ledger is None:
        return Now(status)
    if held:
        held_line = "It is held: the dispatcher skips it until it is released."
        return Now(status, "HELD", "held: `gpuledger release` lets it be scheduled",
                   after=(held_line,))  # fmt: skip
    from ledger.core.jobs import blocked_now

    state = ledger.state
    job_id = job.spec.job_id
    waits = blocked_now(state).get(job_id)
    if waits is not None:
        what = "its dependency" if waits.code == "WAIT_DEPENDENCY" else "its array's limit"
        blocking = _blocking(state, job) if waits.code == "WAIT_DEPENDENCY" else []
        assert store is not None and policy is not None
        snapshot, decision = preview or live(ledger, store, policy, now, longest_s=longest_s)
        start = _starts(state, snapshot, decision, policy, now, job_id).get(job_id)
        return Now(status, waits.code, waits.reason, blocking=tuple(blocking), start=start,
                   after=(f"It may not run yet ({what}): {waits.reason}.",))  # fmt: skip
    long = too_long_waits(state, longest_s).get(job_id)
    if long is not None:  # never placed while it is: no start to estimate (atk60-slurm F4)
        line = f"It may not run yet (the partition's MaxTime): {long.reason}."
        return Now(status, long.code, long.reason, after=(line,))
    assert store is not None and policy is not None
    snapshot, decision = preview or live(ledger, store, policy, now, longest_s=longest_s)
    lines = [readable(x) for x in explain_pending(job, decision, snapshot, now, policy, state)]
    order = [j.job_id for _, j in decision.order]
    if job_id not in order:
        return Now(status, lines=lines, earlier=True)
    i = order.index(job_id)
    wait = decision.waiting.get(job_id)
    code = wait.code if wait else "NEXT_CYCLE"
    mine = next((p for p in snapshot.pending if p.job_id == job_id), None)
    reason = (
        _reason(wait, policy, snapshot, mine, now, state)
        if wait
        else "it would be placed in the next cycle"
        if placing(state)
        else f"first in line, but {NOTHING_PLACED}"
    )
    if wait is None and not placing(state):
        lines = [NEXT_LINE_NONE if x == NEXT_LINE else x for x in lines]
    if wait is not None and wait.code == "WAIT_CONTRACT":
        ahead = sorted(r.job_id for r in snapshot.running if r.placed_at + r.min_runtime_s > now)
        blocked_by = tuple(ahead[:50])
    else:
        blocked_by = tuple(order[max(0, i - 50) : i]) if wait is not None else ()
    return Now(
        status, code, reason, i + 1, len(order), list(decision.order[i][0]),
        blocked_by, _starts(state, snapshot, decision, policy, now, job_id).get(job_id), lines,
        earlier=True,
    )  # fmt: skip


def explain_told(
    store: Store, job_id: int, job: Job | None, current: Now | None, now: float,
    viewer: Viewer | None = None, *, live: State | None = None,
) -> v.ExplainView:  # fmt: skip
    """`explain` from the projection (any thread, any cursor of it): the job's history told,
    joined with what the live state said of it (`explain_now`; None: the job is not in the
    live state, so finished: its history alone tells it). A finished job whose stopped run
    lives out its grace in the live state (`live`, else the viewer's) is told `stopping`, with
    its SIGKILL at the latest, as `queue` and `jobs` show it (atk49-23 F7)."""
    history = _history(store, job_id)
    job = job or job_from_history(job_id, history, _preemptors(store, history))
    if job is None:
        raise UnknownEntity(f"no job {job_id}", hint="see `gpuledger jobs`", job_id=job_id)
    if current is None:
        current = explain_now(None, None, job, None, now)
    if viewer is not None and not viewer.sees(job.spec.user, job.spec.account):
        history = [redact_event(ev) for ev in history]
    decisions = _decisions(store, history)
    told = explain_history(job, history, decisions, now, _grace(store, job, now))
    state = live if live is not None or viewer is None else viewer.state
    said = stopping_said(job, state, now)
    if said is not None:
        current = Now("stopping")
        told = [told[0].replace(" is finished (", " is stopping (", 1), *told[1:], said]
    events = [
        v.ExplainEvent(at=ev.at, tag=_tag(ev), text=t) for ev, t in _history_texts(history, told)
    ]
    lines = [*told, *current.after] if current.lines is None else list(current.lines)
    if (
        current.lines is not None
        and current.earlier
        and any(isinstance(ev, e.JobPreempted | e.JobUnplaced) for ev in history)
    ):  # placed before: what became of those runs
        lines += ["Earlier:", *told[1:]]
    lines += earlier_runs_said(job, state, now)
    return v.ExplainView(
        job_id=job_id,
        status=current.status,
        outcome=job.outcome,
        code=current.code,
        reason=current.reason,
        position=current.position,
        queue_length=current.queue_length,
        blocking_jobs=list(current.blocking),
        sort_key=current.sort_key,
        estimated_start_at=current.start,
        contract_ends_at=job.contract_ends_at(),
        history=events,
        lines=lines,
    )


def _blocking(state: State, job: Job) -> list[int]:
    """The unfinished jobs `job`'s dependency names (an array's tasks for its id), at most 50."""
    ids: set[int] = set()
    for term in job.spec.dependency:
        for jid in term.job_ids:
            ids |= ({jid} & state.active) | state.array_tasks(jid)
    return sorted(ids)[:50]


def _grace(store: Store, job: Job, now: float) -> float:
    """The service's grace for the job's run: as recorded when it was placed (`Job.service_grace`,
    else the last `service.configured` by its placement: `history.service_grace`), read only for
    a job past its time limit (the one line of `explain_history` that needs it)."""
    from projections.history import placement_graces, service_grace
    from schemas.bounds import DEFAULT_GRACE_S

    if not past_limit(job.status, job.started_at, job.spec.time_limit_s, now):
        return DEFAULT_GRACE_S
    if job.service_grace_s is not None:
        return job.service_grace_s
    placed = placement_graces(store.con, [job.job_id]).get(job.job_id)
    return service_grace(store.con) if placed is None else placed


def _history_texts(history: Sequence[e.AnyEvent], told: list[str]) -> list[tuple[e.AnyEvent, str]]:
    """Pair the events `explain_history` tells about with their sentences (it writes one per
    told event, in order, after its headline)."""
    tellable = (
        e.JobSubmitted, e.JobPlaced, e.JobStarted, e.CheckpointReported, e.JobPreempted,
        e.JobRequeued, e.JobUnplaced, e.JobHeld, e.JobReleased, e.JobFinished, e.JobRunEnded,
        e.JobKillOrdered, e.LeaderEnded,
    )  # fmt: skip
    shown = [ev for ev in history if isinstance(ev, tellable)]
    return list(zip(shown, told[1 : 1 + len(shown)], strict=False))
