"""How the Slurm executor stops a run the ledger no longer runs, as the node agents do:
`scancel --signal=TERM --full`, the job's own grace (`submit --grace`; the service's when it has
none), then `scancel`; and the run's real end as Slurm kept it (EndTime), recorded for the audit
(`job.run_ended.v1`). Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ledger.core.state import State
from ledger.cycle.executor import Exit, Launch
from ledger.engines.slurm.words import SlurmJob, ended_gpus, held_gpus, processes_end
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


def stopped_end(
    st: Stopping, j: SlurmJob, now: float, completing_seen: float | None = None
) -> Exit:
    """Pure: a stopped run's real end as Slurm kept it (its EndTime, exit code and state), or,
    when its processes outlived the EndTime of a scancel (seen COMPLETING after it:
    `completing_seen`), the read that found them gone (`processes_end`)."""
    assert st.run is not None
    end = processes_end(j.end_time, j.state, now, completing_seen)
    at = now if end is None else min(now, end)
    note = f"Slurm: {j.state}" + (", killed after its grace" if st.killed else "")
    state = "KILLED" if st.killed else j.state
    return Exit(st.run[0], j.exit_code, at, "exited", j.slurm_id, state, note, run=st.run[1])


def grace_in(state: State, job_id: int) -> float | None:
    """Pure: a job's own grace (`submit --grace`) as the ledger holds it; None: it has none."""
    job = state.jobs.get(job_id)
    return None if job is None else job.spec.grace_s


def completing(
    view: Mapping[str, SlurmJob], mine: set[str], seen: Mapping[str, float], now: float
) -> dict[str, float]:
    """Pure: `seen` (our Slurm job -> the last read showing it COMPLETING) for the jobs still
    `mine`, with those COMPLETING now at `now` (`processes_end` reads it)."""
    out = {k: v for k, v in seen.items() if k in mine}
    out.update({k: now for k in mine if (j := view.get(k)) is not None and j.state == "COMPLETING"})
    return out


def stopping_gpus(
    stopping: Mapping[str, Stopping],
    view: Mapping[str, SlurmJob],
    pinned: Mapping[str, tuple[str, ...]],
) -> dict[str, frozenset[int]]:
    """Pure: the GPUs (node -> indices) of the runs the ledger stopped that Slurm has not ended
    yet: running through their grace, or COMPLETING (SIGTERM ignored until KillWait). Slurm
    starts nothing on them meanwhile, so `node list` shows them held (`Observed.stopping`)."""
    out: dict[str, set[int]] = {}
    for slurm_id, st in stopping.items():
        j = view.get(slurm_id)
        if st.run is None or j is None or j.ended:
            continue
        for node, idx in held_gpus(j, pinned).items():
            out.setdefault(node, set()).update(idx)
    return {n: frozenset(i) for n, i in out.items()}


def grace_of(
    launch: Launch | None,
    seen: SlurmJob | None,
    job_grace: Callable[[], float | None],
    service_s: float,
) -> float:
    """Pure: a stopped run's grace: its launch's (`submit --grace`); for a run adopted after a
    restart, its Slurm comment's (atk34-23 F2: the live state holds no finished job, so a run
    cancelled across a restart got the service's), else the ledger's word; else the service's."""
    if launch is not None:
        grace = launch.grace_s
    else:
        grace = None if seen is None else seen.grace_s
        grace = job_grace() if grace is None else grace
    return service_s if grace is None else grace


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


def gpus_differ(launch: Launch | None, j: SlurmJob) -> str:
    """Pure: how the GPUs Slurm gave a running job differ from the ledger's ("" if not)."""
    if launch is None:
        return ""
    want = {sl.node: tuple(sl.gpu_indices) for sl in launch.slots}
    got = {n: tuple(i) for n, i in j.gpus.items() if i}
    if j.holding and got and got != want:
        return f"Slurm gave GPUs {got}, the ledger chose {want}"
    return ""
