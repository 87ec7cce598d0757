"""A job being stopped, in one definition every read uses: `jobs`, `queue`, `node list`,
`explain`, the dashboard and their `/v1` faces (atk46-23 F7: a job past its time limit, in its
grace, showed `running` everywhere; Slurm shows it `CG`).

A job is **stopping** from the moment its engine is told to stop it until its processes are
gone:
- a running job past its time limit (`past_limit`): SIGTERM at the limit, SIGKILL at the
  limit plus its grace at the latest (`limit_kill_at`). Its ledger status stays `running`
  until its end is recorded; every read shows `stopping`, with `kill_at`;
- a run the ledger stopped (a cancel, a preemption, a requeue: `State.stopped_runs`) whose end
  its engine has not reported: the job's record is already its outcome (`jobs` shows
  `cancelled`, as `sacct` shows CANCELLED), and the live reads (`queue --state running`, `node
  list`) show the run stopping until the engine reports its processes gone, SIGKILL at
  `stopped_kill_at` at the latest (at once after a second cancel: `StoppedRun.kill`).

The grace is the job's own (`submit --grace`, at most `MAX_GRACE_S`), else the services'
default (`DEFAULT_GRACE_S`: a service run with another `--grace` kills then instead).

Pure: `now` is a parameter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeVar

from schemas.bounds import job_grace

if TYPE_CHECKING:
    from ledger.core.state import State, StoppedRun

DEFAULT_GRACE_S = 30.0
"""The services' grace for a job that names none (`serve`/`up --grace`'s default)."""

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


def limit_kill_at(started_at: float | None, time_limit_s: float | None,
                  grace_s: float | None) -> float | None:  # fmt: skip
    """Pure: when a job stopped at its time limit is SIGKILLed at the latest: its limit plus
    its grace (None: no limit or no start)."""
    if started_at is None or time_limit_s is None:
        return None
    return started_at + time_limit_s + job_grace(grace_s, DEFAULT_GRACE_S)


def shown(
    status: W,
    started_at: float | None,
    time_limit_s: float | None,
    grace_s: float | None,
    now: float,
) -> tuple[W | Literal["stopping"], float | None]:
    """Pure: the status a read shows for a job of ledger status `status`, and when it is
    SIGKILLed at the latest (None unless stopping)."""
    if past_limit(status, started_at, time_limit_s, now):
        return "stopping", limit_kill_at(started_at, time_limit_s, grace_s)
    return status, None


def stopped_kill_at(run: StoppedRun) -> float:
    """Pure: when a run the ledger stopped is SIGKILLed at the latest: its stop plus its grace;
    the second cancel that cut the grace (`StoppedRun.kill`, its `killed_at`; the stop itself
    in a state made before it was kept), never after that grace's end."""
    end = run.at + job_grace(run.grace_s, DEFAULT_GRACE_S)
    if not run.kill:
        return end
    return run.at if run.killed_at is None else min(end, run.killed_at)


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
