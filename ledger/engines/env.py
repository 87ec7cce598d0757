"""The environment of one job part. Pure: the inputs are parameters.

Rendezvous variables follow what PyTorch's launcher (torchrun) and MPI wrappers expect, with one
process per node part: NODE_RANK = RANK = the part's index in the placement's slot order,
WORLD_SIZE = NNODES = the number of parts.
"""

from __future__ import annotations

from collections.abc import Mapping

from ledger.cycle.executor import Launch

MASTER_PORT_BASE = 20_000


def master_port(job_id: int) -> int:
    """Pure: a port per job, stable across relaunches (20000-29999)."""
    return MASTER_PORT_BASE + job_id % 10_000


def job_env(
    base: Mapping[str, str],
    job: Launch,
    rank: int,
    *,
    checkpoint_file: str,
    master_addr: str,
    job_token: str | None = None,
) -> dict[str, str]:
    """Pure: `base` plus the job's variables for part `rank` (slot `job.slots[rank]`)."""
    slot = job.slots[rank]
    nodes = [sl.node for sl in job.slots]
    env = dict(base)
    env.update(
        CUDA_VISIBLE_DEVICES=",".join(str(i) for i in slot.gpu_indices),
        GPULEDGER_JOB_ID=str(job.job_id),
        GPULEDGER_USER=job.user,
        GPULEDGER_LAUNCH=str(job.run + 1),
        GPULEDGER_ACCOUNT=job.account,
        GPULEDGER_CHECKPOINT_FILE=checkpoint_file,
        GPULEDGER_NODE=slot.node,
        GPULEDGER_NODES=",".join(nodes),
        GPULEDGER_NODELIST=",".join(nodes),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port(job.job_id)),
        WORLD_SIZE=str(len(nodes)),
        NNODES=str(len(nodes)),
        NODE_RANK=str(rank),
        RANK=str(rank),
    )
    if job_token is not None:
        env["GPULEDGER_JOB_TOKEN"] = job_token
    else:
        env.pop("GPULEDGER_JOB_TOKEN", None)
    return env
