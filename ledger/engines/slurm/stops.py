"""How the Slurm executor stops a run the ledger no longer runs, as the node agents do:
`scancel --signal=TERM --full`, the job's own grace (`submit --grace`; the service's when it has
none), then `scancel`; and the run's real end as Slurm kept it (EndTime), recorded for the audit
(`job.run_ended.v1`). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ledger.core.state import State
from ledger.cycle.executor import Exit
from ledger.engines.slurm.words import SlurmJob, ended_gpus
from schemas.events import GpuSlot

Tag = tuple[int, int]
"""(job, run) of a run of this ledger."""


@dataclass
class Stopping:
    """A Slurm job being stopped: since when, its grace, and whether `scancel` was sent."""

    since: float
    cancelled: bool = False
    grace_s: float = 30.0
    """The job's own grace (`submit --grace`; the service's when it has none)."""
    run: Tag | None = None
    """(job, run) of a run the ledger stopped, whose end is recorded (`JobRunEnded`)."""
    killed: bool = False
    """It outlived its grace: `scancel` (Slurm's kill) was sent after the TERM."""


def stopped_end(st: Stopping, j: SlurmJob, now: float) -> Exit:
    """Pure: a stopped run's real end as Slurm kept it (its EndTime, exit code and state)."""
    assert st.run is not None
    at = now if j.end_time is None else min(now, j.end_time)
    note = f"Slurm: {j.state}" + (", killed after its grace" if st.killed else "")
    state = "KILLED" if st.killed else j.state
    return Exit(st.run[0], j.exit_code, at, "exited", j.slurm_id, state, note, run=st.run[1])


def grace_in(state: State, job_id: int) -> float | None:
    """Pure: a job's own grace (`submit --grace`) as the ledger holds it; None: it has none."""
    job = state.jobs.get(job_id)
    return None if job is None else job.spec.grace_s


def no_grace(_: int) -> float | None:
    """No job's own grace (nor time limit) is known (an executor built without its ledger)."""
    return None


def limit_in(state: State, job_id: int) -> float | None:
    """Pure: a job's time limit in seconds (`submit -t`) as the ledger holds it; None: none."""
    job = state.jobs.get(job_id)
    return None if job is None else job.spec.time_limit_s


def run_gpus(j: SlurmJob, pinned: Mapping[str, tuple[str, ...]]) -> tuple[GpuSlot, ...]:
    """Pure: the GPUs a started run got, as Slurm says: `-d`'s IDX while it holds them; once
    it has ended (first seen then, or adopted after a restart) its JOB_GRES on pinned nodes;
    else none, and the ledger records the placement's (Slurm was asked for exactly those:
    `decide`'s StartJob)."""
    got = {n: i for n, i in j.gpus.items() if i} or ended_gpus(j, pinned)
    return tuple(GpuSlot(node=n, gpu_indices=i) for n, i in sorted(got.items()))
