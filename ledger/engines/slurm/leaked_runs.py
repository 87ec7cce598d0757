"""Runs the ledger placed on GPUs Slurm leaked (docs/slurm.md, "Foreign jobs"; atk45s F4).

A GPU Slurm counts allocated with no job holding it (`leaks`) takes no new run: Slurm starts
nothing that asks for it until slurmctld restarts. A run placed there before two reads showed
the leak (the ledger places a job again as soon as its run ends, often before) waited in Slurm
until its start bound (300 s) and failed `launch_failed`. Now it is taken back at once, its
`taken-back` mark first, as any run Slurm will not start (`SlurmExecutor._take_back`), and its
job goes back to the queue (a NodeChange `unplace` naming it): never ran, nothing charged,
placed again where Slurm can start it. A pending run's GPUs never hide a leak (`holding`):
Slurm's `GresUsed` counts only jobs it has allocated."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ledger.cycle.executor import NodeChange
from ledger.engines.slurm.launching import mark_taken_back
from ledger.engines.slurm.tracked import Run
from ledger.engines.slurm.words import WAITING, SlurmJob

if TYPE_CHECKING:
    from ledger.engines.slurm.executor import SlurmExecutor

log = logging.getLogger("gpuledger.slurm")


def pending(r: Run, view: Mapping[str, SlurmJob]) -> bool:
    """Pure: a submitted run Slurm lists waiting for its allocation, not started by the ledger."""
    j = view.get(r.slurm_id or "")
    return not r.started and j is not None and j.state in WAITING


def holding(runs: Iterable[Run], view: Mapping[str, SlurmJob]) -> dict[str, set[int]]:
    """Pure: the GPUs our submitted runs hold in Slurm's `GresUsed` (a recovered slurmctld may
    list a running job without its GPUs), by node: every run's but those still pending."""
    held: dict[str, set[int]] = {}
    for r in runs:
        if r.slurm_id is None or r.launch is None or pending(r, view):
            continue
        for sl in r.launch.slots:
            held.setdefault(sl.node, set()).update(sl.gpu_indices)
    return held


def on_leaks(
    runs: Iterable[Run], view: Mapping[str, SlurmJob], leaks: Mapping[str, frozenset[int]]
) -> list[tuple[Run, str, tuple[int, ...]]]:
    """Pure: the pending runs (`pending`) placed on a leaked GPU: (run, node, its GPUs there)."""
    out = []
    for r in runs:
        if r.launch is None or not pending(r, view):
            continue
        for sl in r.launch.slots:
            if bad := tuple(sorted(leaks.get(sl.node, frozenset()) & set(sl.gpu_indices))):
                out.append((r, sl.node, bad))
                break
    return out


def unplace_leaked(ex: SlurmExecutor, now: float) -> list[NodeChange]:
    """Take back the pending runs placed on leaked GPUs (`on_leaks`): their `taken-back` mark,
    then `scancel` (a deposed leader does neither); their jobs back to the queue."""
    out = []
    for r, node, gpus in on_leaks(ex._runs.values(), ex.view, ex._leaks.held):
        why = (f"Slurm counts GPU {','.join(map(str, gpus))} allocated with no job holding it "
               "(GresUsed): nothing starts there until Slurm frees it")  # fmt: skip
        log.warning("job %s run %s (Slurm job %s) waits on %s %s; taking it back to the queue",
                    r.job_id, r.run, r.slurm_id, node, why)  # fmt: skip
        out.append(take_back(ex, r, node, why, now))
    return out


def take_back(ex: SlurmExecutor, r: Run, node: str, why: str, now: float) -> NodeChange:
    """Take run `r`, which never started, back to the queue (`why`): its `taken-back` mark (a
    late landing of its `sbatch` ends before anything of the job's), its `scancel` (a deposed
    leader does neither), and the `unplace` of its job on `node`."""
    run_dir = ex._checkpoint_file(r.job_id, r.run).parent
    if ex.may_act() and run_dir.is_dir() and not mark_taken_back(run_dir):
        log.warning("job %s run %s: cannot mark %s taken back", r.job_id, r.run, run_dir)
    if r.slurm_id is not None:
        ex._signal(r.slurm_id, now)  # it never ran: scancel at once
    del ex._runs[r.job_id]
    return NodeChange(node, "unplace", why, jobs=(r.job_id,))
