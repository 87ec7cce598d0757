"""A partition an admin paused (docs/slurm.md, "A partition an admin paused"; atk59b N4).

Slurm starts nothing on a partition whose `State` is not UP: `INACTIVE` and `DRAIN` refuse every
`sbatch` ("Required partition not available (inactive or drain)"), `DOWN` queues it `PENDING`
(`PartitionDown`). Running jobs run on. Before, such a pause failed every job placed meanwhile:
the refused `sbatch` was retried until the take-back time (5 minutes), then the job ended
`launch_failed`, and its user had to submit it again, though the pause was no fault of the job.
Now the executor reads the partition's `State` with its `MaxTime` (every `probe_every_s`) and,
while it is not UP, submits nothing, takes each run of its own that has not started (not
submitted yet, refused, or pending in Slurm) back to the queue (its `taken-back` mark, `scancel`,
and an `unplace` naming its job: requeued, never run, nothing charged), and reports the
partition's nodes unobserved with the pause as why (`status`: nothing is placed on or preempted
from them, as nothing can start there), until the partition is UP again. A job Slurm refuses
for itself (`AccountNotAllowed`, a `sbatch` refusal of its own) still ends `launch_failed` with
Slurm's words (`refusals`); a run pending under a MaxTime lowered below its limit goes back to
the queue (`run_loop.over_max_time`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ledger.cycle.executor import NodeChange
from ledger.engines.slurm.leaked_runs import pending, placed_on, take_back

if TYPE_CHECKING:
    from ledger.engines.slurm.executor import SlurmExecutor

log = logging.getLogger("gpuledger.slurm")


def paused_why(partition: str, state: str) -> str:
    """Pure: why nothing starts on `partition` whose Slurm `State` is `state` ("" when UP, or
    unsaid: Slurm's default)."""
    if not state or state == "UP":
        return ""
    return (
        f"Slurm's partition {partition} is {state} (an admin's pause): nothing starts on it "
        "until it is UP"
    )


def unplace_paused(ex: SlurmExecutor, why: str, now: float) -> list[NodeChange]:
    """Take the executor's runs that have not started back to the queue while the partition is
    paused (`why`): not submitted yet (or refused), or pending in Slurm (`take_back`), adopted
    after a restart too (atk61-slurm F4: one stayed placed the whole pause)."""
    out = []
    for r in list(ex._runs.values()):
        if r.started or (r.slurm_id is None and not placed_on(r)):
            continue
        if r.slurm_id is not None and not pending(r, ex.view):
            continue  # Slurm runs it (or ends it): read as any run
        log.warning("job %s run %s: %s; back to the queue", r.job_id, r.run, why)
        out.append(take_back(ex, r, placed_on(r), why, now))
    return out
