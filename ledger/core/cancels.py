"""`cancel`, decided: a job, or every unfinished task of an array, ends `cancelled`; a job
cancelled again while the run the ledger stopped lives out its grace is killed at once, and so
is a requeued job's earlier run still in its grace when the job is cancelled.

Pure: state and commands in, events out; `now` is a parameter (in the stamp).
"""

from __future__ import annotations

from ledger.core.runs import Stamp, drained_after, limit_passed
from ledger.core.state import Job, State, StoppedRun
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidTransition
from schemas.units import when


def cancel(state: State, cmd: c.CancelJob, s: Stamp) -> list[e.AnyEvent]:
    """One job, or every unfinished task of the array `job_id` names (`whole_array`)."""
    tasks = state.array_tasks(cmd.job_id) if cmd.whole_array else set()
    if not tasks and (ending := stopping_of(state, cmd)):
        return cancel_again(cmd.job_id, ending, s)
    if not tasks:
        job = state.job(cmd.job_id)
        if not job.active:
            raise InvalidTransition(f"job {cmd.job_id} already {job.outcome}")
        tasks = {cmd.job_id}
    out: list[e.AnyEvent] = []
    nodes: list[str] = []
    for job_id in sorted(tasks):
        job = state.jobs[job_id]
        out.append(_completed(job, s) or _timed_out(job, s) or _cancelled(job, s))
        out += _earlier_runs_killed(state, job_id, s)
        nodes += [sl.node for sl in job.slots]
    return out + drained_after(state, nodes, tasks, s)


def _earlier_runs_killed(state: State, job_id: int, s: Stamp) -> list[e.AnyEvent]:
    """Pure: a requeued job (a `node lost` or a preemption requeued it: it is pending) whose
    earlier run the ledger stopped still lives out its grace: the cancel that ends the job
    kills that run at once too (`JobKillOrdered`), as `scancel` of a requeued job leaves
    nothing of it running (atk50b-23 F2: it took a second cancel; the run lived on to its old
    SIGKILL time, up to the whole grace after the user cancelled)."""
    runs = sorted(sr.run for sr in state.stopped_runs.values()
                  if sr.job_id == job_id and not sr.kill)  # fmt: skip
    return [e.JobKillOrdered(**s.kw(), job_id=job_id, run=run) for run in runs]


def _timed_out(job: Job, s: Stamp) -> e.JobFinished | None:
    """Pure: the end of a running job cancelled past its time limit, in its limit's grace: it
    timed out (as `sacct` keeps TIMEOUT for a job `scancel`ed in `KillWait`), so it ends
    `time_limit`, as it would have at its SIGKILL, and the cancel only cuts the grace (its
    run is killed at once: `StoppedRun.kill`; atk47-23 F11: it was recorded `cancelled`, and
    `jobs --status TO` and an `afternotok` dependency missed it). None otherwise."""
    passed = limit_passed(job, s.now)
    if passed is None:
        return None
    note = f"its time limit passed at {when(passed)}; cancelled by {s.actor} in its grace"
    return e.JobFinished(**s.kw(), job_id=job.job_id, outcome="failed", reason="time_limit",
                         note=note[:1000])  # fmt: skip


def _completed(job: Job, s: Stamp) -> e.JobFinished | None:
    """Pure: the end of a running job cancelled after its command exited 0 (`LeaderEnded`
    with `exit_code` 0, on every part), while the processes it left live out their grace: it
    completed, so it ends `completed` (exit 0), as Slurm keeps COMPLETED a job whose batch
    script ended, and its `afterok` dependents run; the cancel only cuts the leftovers' grace
    (killed at once: `StoppedRun.kill`, as `evolve` stops the run of a user's `completed`
    end). Before, it was recorded `cancelled` (atk52-23 F2). Its command ended before its time
    limit (its engine then no longer stops it there): a limit that passed since does not make
    it `time_limit`. A `LeaderEnded` without `exit_code` (every record made before it) leaves
    the cancel as it was. None otherwise."""
    ended, began, limit = job.leader_ended_at, job.started_at, job.spec.time_limit_s
    if job.status != "running" or job.leader_exit_code != 0 or ended is None:
        return None
    if began is not None and limit is not None and ended >= began + limit:
        return None  # its command ended past its limit: the limit's (`_timed_out`)
    note = (f"its command exited 0 at {when(ended)}; cancelled by {s.actor} while "
            "the processes it left were being stopped")  # fmt: skip
    return e.JobFinished(**s.kw(), job_id=job.job_id, outcome="completed", exit_code=0,
                         reason="completed", note=note[:1000])  # fmt: skip


def _cancelled(job: Job, s: Stamp) -> e.JobFinished:
    """Pure: a job's end by a cancel, `cancelled`; a running job whose command had exited
    non-zero (`LeaderEnded` with its `exit_code`) while the processes it left live out their
    grace keeps that code (`exit_code`, and a note of when), as `sacct` shows a job's exit
    code: its outcome stays `cancelled`, as docs/agent.md says (atk54-23 F4: it was recorded
    with no exit code, the command's own code lost)."""
    code, ended = job.leader_exit_code, job.leader_ended_at
    if job.status != "running" or code is None or ended is None:
        return e.JobFinished(**s.kw(), job_id=job.job_id, outcome="cancelled",
                             reason="cancelled")  # fmt: skip
    note = (f"its command exited {code} at {when(ended)}; cancelled by {s.actor} while "
            "the processes it left were being stopped")  # fmt: skip
    return e.JobFinished(**s.kw(), job_id=job.job_id, outcome="cancelled", exit_code=code,
                         reason="cancelled", note=note[:1000])  # fmt: skip


def stopping_of(state: State, cmd: c.CancelJob) -> list[StoppedRun]:
    """Pure: what a cancel finds stopping when nothing it names is unfinished: the job's runs
    in their grace (`State.stopped_of`), and for an array's id (`whole_array`) every task's, as
    a second `scancel ARRAY_ID` signals every task (atk47-23 F13: only the first task's)."""
    ending = state.array_stopped(cmd.job_id) if cmd.whole_array else []
    return ending or state.stopped_of(cmd.job_id)


def cancel_again(job_id: int, ending: list[StoppedRun], s: Stamp) -> list[e.AnyEvent]:
    """Pure: a cancel of a job (or an array's tasks) whose record ended (cancelled, preempted)
    while the runs the ledger stopped live out their grace (`stopping_of`): each is killed at
    once (`JobKillOrdered`), as a second `scancel` ends a job Slurm is stopping (atk46-23 F7).
    Once: runs already ordered killed make it an error, as a cancel of a finished job is."""
    left = [sr for sr in ending if not sr.kill]
    if not left:
        raise InvalidTransition(
            f"job {job_id} is finished; its processes are being killed",
            hint="`gpuledger node list` shows them stopping until they are gone",
            job_id=job_id,
        )
    return [e.JobKillOrdered(**s.kw(), job_id=sr.job_id, run=sr.run) for sr in left]
