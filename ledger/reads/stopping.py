"""A job being stopped, in one definition every read uses: `jobs`, `queue`, `node list`,
`explain`, the dashboard and their `/v1` faces (atk46-23 F7: a job past its time limit, in its
grace, showed `running` everywhere; Slurm shows it `CG`).

A job is **stopping** from the moment its engine is told to stop it until its processes are
gone:
- a running job past its time limit (`past_limit`): SIGTERM at the limit, SIGKILL at the
  limit plus its grace at the latest (`limit_kill_at`; a SIGTERM its engine sent late gets
  `LATE_TERM_GRACE_S` before the SIGKILL all the same: `limit_sigkill_at`). Its ledger
  status stays `running` until its end is recorded; every read shows `stopping`, with `kill_at`;
- a running job whose command (its leader) has exited leaving processes its engine reaps
  (`Job.reaping_kill_at`, from `LeaderEnded`: atk49-23 F4): SIGTERM when the command ended,
  SIGKILL at the reaping's `kill_at` at the latest (its time limit's when earlier); its status
  stays `running` until its end is recorded (Slurm shows such a job `CG`);
- a run the ledger stopped (a cancel, a preemption, a requeue: `State.stopped_runs`) whose end
  its engine has not reported: the job's record is already its outcome (`cancelled`), and the
  reads (`queue --state running`, `node list`, `jobs` with that outcome: `stopping_kills`)
  show it stopping until the engine reports its processes gone, SIGKILL at `stopped_kill_at`
  at the latest (at once after a second cancel: `StoppedRun.kill`).

The grace is the job's own (`submit --grace`, at most `MAX_GRACE_S`), else the service's
(`serve`/`up --grace`, as `service.configured` recorded it: `State.grace_s`; the projection's
`history.service_grace`), which every read is handed as `default_s` (atk48-23 F4: the reads
assumed `DEFAULT_GRACE_S` while an `up --grace 90s` killed 60 s later than they said).

Pure: `now` is a parameter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeVar

from schemas.bounds import DEFAULT_GRACE_S as DEFAULT_GRACE_S
from schemas.bounds import job_grace

if TYPE_CHECKING:
    from ledger.core.state import Job, State, StoppedRun
    from ledger.dispatch.engine import Unplaceable
    from ledger.dispatch.snapshot import PendingJob, Snapshot

W = TypeVar("W", bound=str)
"""A status word (`schemas.views.JobStatusWord`)."""

STOPPING = "stopping"
"""The status word of a stopping job (`schemas.views.JobStatusWord`), and `STOPPING` its
`queue` code."""


def past_limit(status: str, started_at: float | None, time_limit_s: float | None,
               now: float) -> bool:  # fmt: skip
    """Pure: a running job whose time limit (counted from its start) has passed: its engine
    signalled it and it lives out its grace."""
    return (
        status == "running"
        and started_at is not None
        and time_limit_s is not None
        and now >= started_at + time_limit_s
    )


LATE_TERM_GRACE_S = 10.0
"""The least time a job stopped at its time limit has between the SIGTERM it was really sent
and its SIGKILL (its grace when shorter): an engine that noticed the limit late (a loaded
machine, a service restarted or stopped past it) still gives the job its SIGTERM and a chance to
checkpoint, as Slurm's TERM then `KillWait` does (s56: a `-t 1 --grace 15s` job noticed 38 s
late was SIGKILLed with no SIGTERM)."""


def limit_sigkill_at(limit_at: float, grace_s: float, termed_at: float | None) -> float:
    """Pure: when a run stopped at its time limit (`limit_at`, the moment it reached it) is
    SIGKILLed, its grace `grace_s` (capped: `job_grace`) counted from the limit; `termed_at`: when
    its SIGTERM was really sent (None: not known, as for every read, or not yet). The SIGTERM
    always comes first, and the SIGKILL no sooner than `min(grace, LATE_TERM_GRACE_S)` after it:
    the later of the two. One rule for both engines (the Slurm executor and the node agents)
    and the reads (`limit_kill_at`), which know no SIGTERM time: theirs is exact whenever the
    SIGTERM went out by `limit + grace - min(grace, 10 s)`; later, the SIGKILL comes at most
    `LATE_TERM_GRACE_S` past it, where `kill_words` says it overdue. A cancel of a job past its
    limit is not this rule: the user's order to kill, at once (`StoppedRun.kill`)."""
    end = limit_at + grace_s
    if termed_at is None:
        return end
    return max(end, termed_at + min(grace_s, LATE_TERM_GRACE_S))


def limit_kill_at(started_at: float | None, time_limit_s: float | None,
                  grace_s: float | None, default_s: float,
                  termed_at: float | None = None) -> float | None:  # fmt: skip
    """Pure: when a job stopped at its time limit is SIGKILLed at the latest: its limit plus
    its grace (its own, else the service's `default_s`; None: no limit or no start), or, its
    SIGTERM sent late (`termed_at`), `LATE_TERM_GRACE_S` after it (`limit_sigkill_at`)."""
    if started_at is None or time_limit_s is None:
        return None
    return limit_sigkill_at(started_at + time_limit_s, job_grace(grace_s, default_s), termed_at)


def shown(
    status: W,
    started_at: float | None,
    time_limit_s: float | None,
    grace_s: float | None,
    now: float,
    default_s: float,
    reaping_kill_at: float | None = None,
) -> tuple[W | Literal["stopping"], float | None]:
    """Pure: the status a read shows for a job of ledger status `status`, and when it is
    SIGKILLed at the latest (None unless stopping; `default_s`: the service's grace;
    `reaping_kill_at`: `Job.reaping_kill_at`, its command exited leaving processes)."""
    if status == "running" and reaping_kill_at is not None:
        limit = limit_kill_at(started_at, time_limit_s, grace_s, default_s)
        return "stopping", reaping_kill_at if limit is None else min(limit, reaping_kill_at)
    if past_limit(status, started_at, time_limit_s, now):
        return "stopping", limit_kill_at(started_at, time_limit_s, grace_s, default_s)
    return status, None


def reaping_kill(job: Job, default_s: float) -> float | None:
    """Pure: a running job whose command exited leaving processes its engine reaps
    (`LeaderEnded`, atk49-23 F4): their SIGKILL at the latest (their reaping's, or its time
    limit's when that comes first); None for any other job."""
    if job.status != "running" or job.reaping_kill_at is None:
        return None
    s = job.spec
    return shown("running", job.started_at, s.time_limit_s, s.grace_s, 0.0,
                 job.service_grace(default_s), job.reaping_kill_at)[1]  # fmt: skip


def is_stopping(job: Job, now: float) -> bool:
    """Pure: whether a job the ledger holds running is `stopping` at `now` (past its time
    limit, or its command exited leaving processes to reap)."""
    return job.status == "running" and (
        job.reaping_kill_at is not None
        or past_limit(job.status, job.started_at, job.spec.time_limit_s, now)
    )


def holding_reason(job: Job, kill_at: float | None, now: float) -> str:
    """Pure: why a running job is `stopping` ("" when it is not): its command exited leaving
    processes, or it reached its time limit; SIGTERM sent, SIGKILL by `kill_at`."""
    from schemas.units import when

    if kill_at is None or job.started_at is None:
        return ""
    if job.reaping_kill_at is not None and job.leader_ended_at is not None:
        n, kill = job.reaping_left, kill_words(kill_at, now)
        return (f"its command exited at {when(job.leader_ended_at)} leaving {n} "
                f"process{'' if n == 1 else 'es'}: SIGTERM sent, {kill}")  # fmt: skip
    limit = job.spec.time_limit_s
    if limit is None:
        return ""
    return (f"reached its time limit at {when(job.started_at + limit)}: SIGTERM sent, "
            f"{kill_words(kill_at, now)}")  # fmt: skip


OVERDUE_AFTER_S = 10.0
"""How long past a SIGKILL "at the latest" a run not reported gone is said overdue (its engine
reports a kill within a few seconds; longer, its agent or the service is not running it)."""


def kill_words(kill_at: float, now: float) -> str:
    """Pure: "SIGKILL at K at the latest", or, `OVERDUE_AFTER_S` past it with the run still not
    reported gone, that it is overdue (atk49-23 F2: with the service down past K the reads kept
    promising a SIGKILL at a time long past while the processes lived)."""
    from schemas.units import when

    if now > kill_at + OVERDUE_AFTER_S:
        return (f"SIGKILL overdue since {when(kill_at)} (its end is not reported: its node's "
                "agent or the service has not run it)")  # fmt: skip
    return f"SIGKILL at {when(kill_at)} at the latest"


def stopped_kill_at(run: StoppedRun, default_s: float) -> float:
    """Pure: when a run the ledger stopped is SIGKILLed at the latest: its stop plus its grace
    (its job's own, else the service's `default_s`); the second cancel that cut the grace
    (`StoppedRun.kill_at`), never after that grace's end."""
    return run.kill_at(default_s)


def stopped_shown(state: State) -> dict[int, StoppedRun]:
    """Pure: job -> its latest run the ledger stopped whose end its engine has not reported,
    for the jobs whose record ended (gone from the live state, or finished): what `queue` and
    `node list` show stopping besides the jobs past their limit. A requeued job shows as it is
    (pending, placed, running again); `node list` still counts its old run's GPUs stopping."""
    latest = {sr.job_id: sr for sr in state.stopped_runs.values()}
    return {
        j: sr for j, sr in latest.items()
        if (job := state.jobs.get(j)) is None or job.status == "finished"
    }  # fmt: skip


def stopping_kills(state: State) -> dict[int, float]:
    """Pure: job -> its SIGKILL at the latest, for the jobs whose record ended while the run
    the ledger stopped lives out its grace (`stopped_shown`): what `jobs` shows `stopping`
    instead of `finished` at the cancel, until its end is recorded (and `finished_at` is that
    end)."""
    return {j: stopped_kill_at(sr, state.grace_s) for j, sr in stopped_shown(state).items()}


def reaping_kills(state: State) -> dict[int, float]:
    """Pure: job -> its SIGKILL at the latest, for the running jobs whose command exited
    leaving processes (`reaping_kill`): what `jobs` shows `stopping` though its record runs
    (atk49-23 F4). Apart from `stopping_kills`: a requeued job running again beside its
    earlier stopped run is not stopping itself."""
    out = {}
    for j in state.active:
        if (job := state.jobs.get(j)) is not None and (at := reaping_kill(job, state.grace_s)):
            out[j] = at
    return out


def stopping_note(
    state: State, snapshot: Snapshot, job: PendingJob | None, wait: Unplaceable | None
) -> str:
    """Pure, at read time: what a job told it waits for GPUs (`WAIT_RESOURCES`) would take once
    stopped runs in their grace are gone, when their GPUs (held, never free, for the dispatcher:
    atk47-23 F8) and the free ones would fit it on a node of its kind, as "; ..." to add to its
    reason; "" otherwise. The recorded reason is the dispatcher's, byte for byte."""
    from schemas.units import plural, when

    if job is None or wait is None or wait.code != "WAIT_RESOURCES" or not state.stopped_runs:
        return ""
    held: dict[str, set[int]] = {}
    runs: dict[str, list[StoppedRun]] = {}
    for sr in state.stopped_runs.values():
        for sl in sr.slots:
            held.setdefault(sl.node, set()).update(sl.gpu_indices)
            runs.setdefault(sl.node, []).append(sr)
    kind = [
        n for n in snapshot.nodes
        if n.state == "active" and n.name in held
        and job.gpu_type in (None, n.gpu_type) and job.cluster in (None, n.cluster)
    ]  # fmt: skip
    fits = [n for n in kind if len(n.free) + len(held[n.name]) >= job.gpus]
    if not fits and sum(len(n.free) + len(held[n.name]) for n in kind) < job.gpus:
        return ""
    named: list[str] = []
    for n in fits or kind:
        gpus = ",".join(map(str, sorted(held[n.name])))
        who = sorted({(sr.job_id, stopped_kill_at(sr, state.grace_s)) for sr in runs[n.name]})
        jobs = ", ".join(f"job {j}'s SIGKILL by {when(at)}" for j, at in who[:3])
        named.append(f"{n.name} GPUs {gpus} ({jobs})")
    more = f" and {plural(len(named) - 3, 'more node')}" if len(named) > 3 else ""
    return (
        f"; it waits for GPUs of stopped runs still in their grace, free once their processes "
        f"are gone: {'; '.join(named[:3])}{more}"
    )
