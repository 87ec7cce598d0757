"""What engines report about runs, decided: a run's true start and end times, the ends of runs the
ledger had stopped, and which runs of a lost node are still in doubt.

Pure: state and commands in, events out; `now` is a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from ledger.core.state import Job, State
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidTransition, UnknownEntity


class Stamp(Protocol):
    """The envelope of the events a command makes (`decide._Stamp`)."""

    @property
    def now(self) -> float: ...

    @property
    def actor(self) -> str: ...

    def kw(self) -> Any: ...


def between(at: float | None, low: float | None, high: float) -> float | None:
    """Pure: an engine's time of a run's start or end, kept inside what the ledger knows (not
    before the placement or start, not after now); None when the engine gave none."""
    if at is None:
        return None
    return max(low if low is not None else at, min(at, high))


def confirm_run_ended(state: State, cmd: c.ConfirmRunEnded, s: Stamp) -> list[e.AnyEvent]:
    """A stopped run's end, for the record (and the audit): any run of a job the ledger has
    known, up to its current one, even once the job has finished. Once: a run whose end is
    recorded already (`State.run_ends`; an agent's report sent again) records nothing, and the
    first report stands (issue 24: one `job.run_ended.v2` per run)."""
    job = state.jobs.get(cmd.job_id)
    if job is None and not 0 < cmd.job_id < state.next_job_id:
        raise UnknownEntity(f"unknown job {cmd.job_id}", job_id=cmd.job_id)
    if job is not None and cmd.run > job.run:
        raise InvalidTransition(
            f"job {cmd.job_id} is at its run {job.run}, not run {cmd.run}",
            job_id=cmd.job_id,
        )
    if (cmd.job_id, cmd.run) in state.run_ends:
        return []
    ended: list[e.AnyEvent] = [
        e.JobRunEnded(
            **s.kw(),
            job_id=cmd.job_id,
            engine=cmd.engine,
            engine_job_id=cmd.engine_job_id,
            run=cmd.run,
            ended_at=None if cmd.ended_at is None else min(cmd.ended_at, s.now),
            exit_code=cmd.exit_code,
            killed=cmd.killed,
            note=cmd.note,
            by_itself=cmd.by_itself,
            started_at=_own_start(state, cmd, s.now),
            exit_decides=cmd.exit_decides,
        )
    ]
    if job is not None and ended_meanwhile(job, cmd):
        at = None if cmd.ended_at is None else min(cmd.ended_at, s.now)
        ended.append(_its_outcome(job, cmd.exit_code or 0, at, s))
        ended += drained_after(state, (sl.node for sl in job.slots), {job.job_id}, s)
    return ended


def _its_outcome(job: Job, code: int, at: float | None, s: Stamp) -> e.JobFinished:
    """Pure: the job's end by its stopped run's own exit (`ended_meanwhile`): completed for
    exit 0, else failed with its code."""
    if code == 0:
        return e.JobFinished(**s.kw(), job_id=job.job_id, outcome="completed", exit_code=0,
                             reason="completed", note=COMPLETED_MEANWHILE, ended_at=at)  # fmt: skip
    return e.JobFinished(**s.kw(), job_id=job.job_id, outcome="failed", exit_code=code,
                         reason="failed", note=FAILED_MEANWHILE.format(code=code),
                         ended_at=at)  # fmt: skip


def _own_start(state: State, cmd: c.ConfirmRunEnded, now: float) -> float | None:
    """Pure: the run's own start as the engine reports it, never after its end nor `now` (a
    run the ledger stopped while it ran, `State.stopped_runs`, has its `JobStarted`: none; one
    stopped while placed has none: `StoppedRun.placed`)."""
    stopped = state.stopped_runs.get((cmd.job_id, cmd.run))
    if cmd.started_at is None or (stopped is not None and not stopped.placed):
        return None
    end = now if cmd.ended_at is None else min(cmd.ended_at, now)
    return min(cmd.started_at, end)


COMPLETED_MEANWHILE = "its run completed by itself (exit 0) before the stop reached it"
FAILED_MEANWHILE = "its run ended by itself (exit {code}) before the stop reached it"


def ended_meanwhile(job: Job, cmd: c.ConfirmRunEnded) -> bool:
    """Pure: a stopped run's end is its job's outcome (atk38-24 F3, atk53-23 F3): its command
    ended by itself before the stop's signal reached it (`by_itself`, the engine's word), and
    it is the run the ledger requeued last, no later run having started since (the job waits,
    or is placed again). Exit 0 completes the job; another code (a signal of its own) fails
    it, under the rule the report names (`exit_decides`, s54: before it such a job was
    requeued and ran its whole command again). Without `by_itself` (older reports, logs
    written before) the run's end is only recorded, as it always was. A job the preemption
    finished (not resumable) or a cancel ended stays as recorded: it is not run again."""
    return (
        cmd.by_itself
        and (cmd.exit_code == 0 or (cmd.exit_decides and cmd.exit_code is not None))
        and job.active
        and job.status != "running"
        and cmd.run == job.run - 1
    )


LIMITING_EXECUTORS = frozenset({"agents", "local", "slurm"})
"""The engines that stop a job at its time limit (`service.configured`'s executor)."""


def limits_stop(state: State) -> bool:
    """Pure: the service records running an engine that stops jobs at their time limits
    (`LIMITING_EXECUTORS`). A ledger with no such record (the simulator's, whose kernel lets
    runs outlive their limits unless its policy says otherwise) or another engine is not taken
    to: a running job past its limit there is no job in its limit's grace."""
    return state.service is not None and state.service.executor in LIMITING_EXECUTORS


def limit_passed(job: Job, now: float) -> float | None:
    """Pure: when the time limit of a running job passed, counted from its start, if it has:
    the job is in that limit's grace, its engine stopping it; None otherwise."""
    began, limit = job.started_at, job.spec.time_limit_s
    if job.status != "running" or began is None or limit is None or now < began + limit:
        return None
    return began + limit


def drained_after(
    state: State, freed_nodes: Iterable[str], leaving: set[int], s: Stamp
) -> list[e.AnyEvent]:
    """Pure: NodeDrained for each draining node that the leaving jobs leave empty."""
    out: list[e.AnyEvent] = []
    for name in sorted(set(freed_nodes)):
        node = state.nodes[name]
        if node.state == "draining" and not (state.node_jobs.get(name, set()) - leaving):
            out.append(e.NodeDrained(**s.kw(), node=name))
    return out


def in_doubt(job: Job) -> bool:
    """Pure: the job's run is on a lost node whose fence has not passed (`NodeLost`)."""
    return job.doubt_until is not None


def settle_commands(state: State, now: float, actor: str) -> list[c.FinishJob]:
    """Pure: the end of every run in doubt whose fence has passed without word from its node:
    `node_failure` (resumable jobs are requeued, the others fail), ended at the fence time: the
    node's lease stopped its processes by then, and until then they may have run (recording
    the moment of loss would charge less than they held)."""
    out: list[c.FinishJob] = []
    for job_id in sorted(state.active):
        job = state.jobs[job_id]
        if job.doubt_until is None or now < job.doubt_until:
            continue
        out.append(
            c.FinishJob(
                actor=actor,
                job_id=job_id,
                exit_code=-1,
                engine=job.engine,
                engine_job_id=job.engine_job_id,
                reason="node_failure",
                engine_state=e.FENCED_STATE,
                ended_at=job.doubt_until,
                note="its node was lost and did not return within the fence",
            )
        )
    return out
