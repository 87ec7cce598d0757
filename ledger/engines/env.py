"""The environment of one job part. Pure: the inputs are parameters.

A job gets the environment it was submitted with (`Launch.env`: the submitter's, after
`--export`), never the service's: with none, only `PATH` (`DEFAULT_PATH`), as Slurm's
`--export=NONE` would. On top come the account it runs as (`HOME`, `USER`, `LOGNAME`, `SHELL`),
what the service hands every job (`extra`: its URL or data directory, so `gpuledger checkpoint`
works inside) and the ledger's variables, which always win.

Rendezvous variables follow what PyTorch's launcher (torchrun) and MPI wrappers expect, with one
process per node part: NODE_RANK = RANK = the part's index in the placement's slot order,
WORLD_SIZE = NNODES = the number of parts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ledger.cycle.executor import Launch

MASTER_PORT_BASE = 20_000
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
NEVER_INHERITED = ("GPULEDGER_JOB_TOKEN", "GPULEDGER_NODE_TOKEN")
"""Tokens a job gets only from the ledger (its own job token), never from a submitted
environment."""


@dataclass(frozen=True)
class Account:
    """The OS account a job part runs as, as the executor looked it up."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str


def master_port(job_id: int) -> int:
    """Pure: a port per job, stable across relaunches (20000-29999)."""
    return MASTER_PORT_BASE + job_id % 10_000


def ledger_vars(
    job: Launch, rank: int, *, checkpoint_file: str, master_addr: str
) -> dict[str, str]:
    """Pure: the ledger's variables of part `rank` (slot `job.slots[rank]`)."""
    slot = job.slots[rank]
    nodes = [sl.node for sl in job.slots]
    out = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in slot.gpu_indices),
        "GPULEDGER_JOB_ID": str(job.job_id),
        "GPULEDGER_USER": job.user,
        "GPULEDGER_LAUNCH": str(job.run + 1),
        "GPULEDGER_ACCOUNT": job.account,
        "GPULEDGER_CHECKPOINT_FILE": checkpoint_file,
        "GPULEDGER_NODE": slot.node,
        "GPULEDGER_NODES": ",".join(nodes),
        "GPULEDGER_NODELIST": ",".join(nodes),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port(job.job_id)),
        "WORLD_SIZE": str(len(nodes)),
        "NNODES": str(len(nodes)),
        "NODE_RANK": str(rank),
        "RANK": str(rank),
    }
    if job.job_name:
        out["GPULEDGER_JOB_NAME"] = job.job_name
    if job.array_job_id is not None:
        out["GPULEDGER_ARRAY_JOB_ID"] = str(job.array_job_id)
    if job.array_task_id is not None:
        out["GPULEDGER_ARRAY_TASK_ID"] = str(job.array_task_id)
    return out


def job_env(
    extra: Mapping[str, str],
    job: Launch,
    rank: int,
    *,
    checkpoint_file: str,
    master_addr: str,
    job_token: str | None = None,
    account: Account | None = None,
) -> dict[str, str]:
    """Pure: the environment of part `rank` (module doc): the submitted environment (or `PATH`
    alone), the account's identity, `extra`, then the ledger's variables."""
    env = dict(job.env)
    for name in NEVER_INHERITED:
        env.pop(name, None)
    env.setdefault("PATH", DEFAULT_PATH)
    if account is not None:
        env.update(HOME=account.home, USER=account.name, LOGNAME=account.name, SHELL=account.shell)
    env.update(extra)
    env.update(ledger_vars(job, rank, checkpoint_file=checkpoint_file, master_addr=master_addr))
    if job_token is not None:
        env["GPULEDGER_JOB_TOKEN"] = job_token
    return env
