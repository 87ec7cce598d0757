"""The batch script's check that Slurm gave the run the GPUs the ledger placed it on, before
anything of the job's runs (atk40-24 F2: Slurm 22.05 requeues a launch that failed on a node
whose slurmd had just died and starts it again with no GRES at all, `JOB_GRES=(null)`, no
`CUDA_VISIBLE_DEVICES`: the command ran on GPUs the ledger may have given another job, and
its run was charged from before its real start). Pure: words out."""

from __future__ import annotations

import shlex
from collections.abc import Collection, Sequence

from schemas.events import GpuSlot


def gpus_check(slots: Sequence[GpuSlot], pinned: Collection[str], mark: str) -> list[str]:
    """Pure: the line that checks, on the node the batch script runs on (`SLURMD_NODENAME`),
    that Slurm's `SLURM_JOB_GPUS` (the node's indices of the GPUs it gave, whatever
    `ConstrainDevices` makes of `CUDA_VISIBLE_DEVICES`) are exactly the placement's there on a
    node whose GPUs are pinned (each its own GRES type), and as many elsewhere (Slurm picks
    the lowest free ones: `words.gpus_differ` logs a difference); else it says so, leaves
    `mark` and ends with 127, its command never run. [] for a placement of no GPUs, or of
    several nodes (what Slurm says there of the other nodes' GPUs is not checked yet)."""
    want: dict[str, set[int]] = {}
    for sl in slots:
        want.setdefault(sl.node, set()).update(sl.gpu_indices)
    if len(want) != 1 or not any(want.values()):
        return []
    arms = []
    for node, idx in want.items():
        exact = ",".join(str(i) for i in sorted(idx))
        test = (
            f'[ "${{SLURM_JOB_GPUS-}}" = {exact} ]'
            if node in pinned
            else f'[ "$gpuledger_n" = {len(idx)} ]'
        )
        arms.append(f"{shlex.quote(node)}) {test} ;;")
    touch = f" {{ : > {shlex.quote(mark)}; }} 2>/dev/null;" * bool(mark)
    return [
        'IFS=, read -ra gpuledger_g <<< "${SLURM_JOB_GPUS-}"; gpuledger_n=${#gpuledger_g[@]}',
        f'case "${{SLURMD_NODENAME-}}" in {" ".join(arms)} *) false ;; esac || {{ echo'
        ' "gpuledger: Slurm started this run without the GPUs the ledger placed it on'
        ' (SLURM_JOB_GPUS=${SLURM_JOB_GPUS-none} on ${SLURMD_NODENAME-?}): it does not run" >&2;'
        f"{touch} exit 127; }}",
    ]
