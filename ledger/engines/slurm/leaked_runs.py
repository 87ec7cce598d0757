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
from ledger.engines.slurm.launching import TAKEN_BACK_WHY, mark_taken_back
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


def placed_on(r: Run) -> str:
    """Pure: the node of the run's first GPUs; "" for a run adopted after a restart (the ledger
    knows where it placed it: `record.unplace_commands`)."""
    return r.launch.slots[0].node if r.launch is not None and r.launch.slots else ""


def take_back(ex: SlurmExecutor, r: Run, node: str, why: str, now: float) -> NodeChange:
    """Take run `r`, which never started, back to the queue (`why`): its `taken-back` mark (a
    late landing of its `sbatch` ends before anything of the job's), its `scancel` (a deposed
    leader does neither), and the `unplace` of its job on `node` ("": wherever it is placed)."""
    run_dir = ex._checkpoint_file(r.job_id, r.run).parent
    if ex.may_act() and run_dir.is_dir() and not mark_taken_back(run_dir):
        log.warning("job %s run %s: cannot mark %s taken back", r.job_id, r.run, run_dir)
    if r.slurm_id is not None and pending(r, ex.view):
        ex._signal(r.slurm_id, now)  # it never ran: scancel at once
    del ex._runs[r.job_id]
    return NodeChange(node, "unplace", why, jobs=(r.job_id,))


DOUBTED = (
    "taken back by the executor before the service restarted (its taken-back mark), not yet "
    "back in the queue: it never ran"
)


def doubted(ex: SlurmExecutor, r: Run, j: SlurmJob, now: float) -> bool:
    """A run adopted with its `taken-back` mark (`Run.taken_back`): the last service began its
    take-back (the mark, before its `scancel` and the record of it) and was killed before the
    record (atk61-slurm F1). Before, the run stayed placed, its script ended at the mark once
    Slurm started it, and its job ended `launch_failed` for good, though it never ran. Now the
    take-back is finished whether the partition is paused or UP again: cancelled while Slurm
    keeps it pending, its job back in the queue (`unplace`) once Slurm ended it unrun; its
    next run runs once. True when taken back (a run Slurm runs is read as any: its script ends
    at the mark, or it had begun before the mark and runs)."""
    if not r.taken_back or r.started:
        return False
    if not pending(r, ex.view) and not (j.ended and ex._never_ran(r, j) == TAKEN_BACK_WHY):
        return False
    log.warning("job %s run %s (Slurm job %s): %s; back to the queue", r.job_id, r.run,
                r.slurm_id, DOUBTED)  # fmt: skip
    ex._unplaced.append(take_back(ex, r, placed_on(r), DOUBTED, now))
    return True
