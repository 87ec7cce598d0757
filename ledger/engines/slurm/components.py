"""A heterogeneous Slurm job's components (`sbatch ... : ...`, a gang whose nodes need different
GPUs: `words.sbatch_args`) are one run of the ledger. Pure.

Slurm lists each component as a job of its own (`JobId` = the first's + its offset, the same
name and comment, `HetJobId` the first's): under sched/backfill the executor took the second for
"a second copy" of the run and cancelled it (109 refused `scancel`s, two accepted kills that
ended its node's part before the stop's grace was out), and read the GPUs Slurm gave from the
first component alone (atk59 F3). The first component stands for the run: it carries every
component's GPUs (`joined`), and a later component is never a copy (`takeover.duplicates`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ledger.engines.slurm.words import SlurmJob


def joined(jobs: Iterable[SlurmJob]) -> list[SlurmJob]:
    """Pure: `jobs` with each heterogeneous job's first component holding the GPUs of all its
    components (`gpus`, by node); every job kept, in order."""
    jobs = list(jobs)
    parts: dict[str, list[SlurmJob]] = {}
    for j in jobs:
        if j.het_component:
            parts.setdefault(j.het_job_id, []).append(j)
    if not parts:
        return jobs
    out = []
    for j in jobs:
        if j.slurm_id in parts and not j.het_component:
            gpus = dict(j.gpus)
            for part in parts[j.slurm_id]:
                for node, idx in part.gpus.items():
                    gpus[node] = tuple(sorted({*gpus.get(node, ()), *idx}))
            j = replace(j, gpus=gpus)
        out.append(j)
    return out
