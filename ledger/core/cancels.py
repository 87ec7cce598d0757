"""`cancel`, decided: a job, or every unfinished task of an array, ends `cancelled`.

Pure: state and commands in, events out; `now` is a parameter (in the stamp).
"""

from __future__ import annotations

from ledger.core.runs import Stamp, drained_after
from ledger.core.state import State
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidTransition


def cancel(state: State, cmd: c.CancelJob, s: Stamp) -> list[e.AnyEvent]:
    """One job, or every unfinished task of the array `job_id` names (`whole_array`)."""
    tasks = state.array_tasks(cmd.job_id) if cmd.whole_array else set()
    if not tasks:
        job = state.job(cmd.job_id)
        if not job.active:
            raise InvalidTransition(f"job {cmd.job_id} already {job.outcome}")
        tasks = {cmd.job_id}
    out: list[e.AnyEvent] = []
    nodes: list[str] = []
    for job_id in sorted(tasks):
        out.append(e.JobFinished(**s.kw(), job_id=job_id, outcome="cancelled", reason="cancelled"))
        nodes += [sl.node for sl in state.jobs[job_id].slots]
    return out + drained_after(state, nodes, tasks, s)
