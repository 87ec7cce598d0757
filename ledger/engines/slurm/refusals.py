"""What Slurm refuses to run, and what the executor does about it (docs/slurm.md, "A run Slurm
will not start"). Pure.

atk59 F1: a gang whose nodes get different GPUs (6 GPUs on 4-GPU nodes: 4 + 2) is one
heterogeneous Slurm job (`sbatch ... : ...`), which Slurm runs only under `sched/backfill`;
under `sched/builtin` every `sbatch` of it failed ("Requested operation not supported on this
system") and was retried at every cycle for good, the job `placed`, its GPUs held, and the
take-back of a run Slurm will not start never applied, since nothing reached Slurm. Now:

1. the executor reads `SchedulerType` at its start (`scheduler_type`) and never submits a
   heterogeneous job to a Slurm that does not run them (`het_refusal`): the job ends
   `launch_failed` with why, its GPUs free at once;
2. any `sbatch` refusal that is Slurm's answer, not a failure to reach it (`sbatch_refusal`),
   takes the run back the same way, and so does a refusal of any kind that has repeated for the
   take-back time (`start_within_s`, 5 minutes)."""

from __future__ import annotations

from collections.abc import Mapping

from ledger.cycle.executor import Launch
from ledger.engines.slurm.words import gres_per_node

NO_HET_SCHEDULERS = frozenset({"sched/builtin"})
"""Slurm's schedulers that refuse a heterogeneous job at its submission (Slurm's docs: they are
scheduled by the backfill scheduler alone)."""

RETRIED = (
    "timed out",
    "temporarily unavailable",
    "try again",
    "unable to contact",
    "connection refused",
    "connection reset",
    "not responding",
    "zero bytes were transmitted",
    "in standby mode",
    "partition not available",  # "Required partition not available (inactive or drain)": an
    # admin's pause of the partition, whose next read takes the run back to the queue (`paused`;
    # atk59b N4: every job placed meanwhile ended launch_failed)
    "communication connection failure",
    "Invalid node name",  # a node taken out of the partition: requeued by its drain (atk44ha F2)
    "sbatch failed:",  # the executor's own: sbatch did not run, or did not answer in time
)
"""Words of an `sbatch` failure that a later try may not meet (Slurm unreachable or busy, a
node the next read drains): retried at the next cycle, up to the take-back time."""


def scheduler_type(config: str) -> str:
    """Pure: Slurm's `SchedulerType` from `scontrol show config` output ("" when unsaid)."""
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "SchedulerType":
            return value.strip()
    return ""


def runs_het(scheduler: str) -> bool:
    """Pure: whether Slurm with this `SchedulerType` runs heterogeneous jobs (unknown: yes)."""
    return scheduler not in NO_HET_SCHEDULERS


def scheduler_note(scheduler: str) -> str:
    """Pure: what `status` says of a Slurm whose scheduler is `scheduler` ("" for nothing)."""
    if runs_het(scheduler):
        return ""
    return (
        f"Slurm's SchedulerType={scheduler} runs no heterogeneous job: a gang whose nodes get "
        "different GPUs (not a multiple of its nodes' GPUs) ends launch_failed; sched/backfill "
        "runs it"
    )


def het_refusal(job: Launch, pinned: Mapping[str, tuple[str, ...]], scheduler: str) -> str:
    """Pure: why `job` is not submitted to a Slurm whose scheduler is `scheduler`: its nodes
    need different GPUs (`words.gres_per_node`: a heterogeneous job) and that scheduler runs
    none; "" when it may be submitted."""
    gres = gres_per_node(job, pinned)
    if runs_het(scheduler) or len(set(gres)) <= 1:
        return ""
    each = ", ".join(f"{sl.node}: {len(sl.gpu_indices)}" for sl in job.slots)
    return (
        f"Slurm here does not run heterogeneous jobs (SchedulerType={scheduler}; "
        f"sched/backfill does), and this gang's nodes need different GPUs ({each}): it would "
        "be one, which sbatch refuses; never submitted (a gang of whole nodes runs)"
    )


def slurm_words(line: str) -> str:
    """Pure: Slurm's own words in an `sbatch` failure line (`sbatch --job-name=...: sbatch:
    error: Batch job submission failed: X` -> `Batch job submission failed: X`)."""
    _, sep, rest = line.partition("error: ")
    return rest.strip() if sep else line.strip()


def sbatch_refusal(line: str, refused_since: float, now: float, within_s: float) -> str:
    """Pure: why a run whose `sbatch` failed with `line` is taken back (its job ends
    `launch_failed`): Slurm refused it (not a failure to reach Slurm: `RETRIED`), or its
    `sbatch` has failed since `refused_since` for `within_s`; "" while it is retried."""
    words = slurm_words(line)
    if not any(w.lower() in line.lower() for w in RETRIED):
        return f"Slurm refused to run it: {words}"
    if now - refused_since >= within_s:
        return f"sbatch failed for {now - refused_since:.0f} s ({words}): not retried"
    return ""
