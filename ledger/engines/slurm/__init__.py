"""Slurm as the execution engine: gpu-ledger decides, a Slurm partition runs the processes.

`words` reads and writes Slurm's words (pure), `executor` is the edge that runs the commands
(`SlurmExecutor`), `opening` opens it (the partition checked, its nodes registered), `stops`
says how a run is stopped and what its end was, `shares` turns Slurm's association shares into
a budget file. What the ledger owns and what Slurm owns is in docs/slurm.md.
"""

from ledger.engines.slurm.executor import ENGINE, SlurmExecutor
from ledger.engines.slurm.opening import ledger_id, open_executor
from ledger.engines.slurm.script import batch_script
from ledger.engines.slurm.shares import SACCTMGR_ARGS, parse_sacctmgr_shares, shares_toml
from ledger.engines.slurm.words import (
    DRAIN_PREFIX,
    SbatchUser,
    SlurmJob,
    SlurmNode,
    check_config,
    end_reason,
    exit_code,
    expand_hostlist,
    gpus_of,
    gres_indices,
    job_environment,
    node_changes,
    node_down,
    node_unavailable,
    parse_jobs,
    parse_nodes,
    pinned_types,
    register_commands,
    sbatch_args,
    slurm_time,
)

__all__ = [
    "DRAIN_PREFIX",
    "ENGINE",
    "SACCTMGR_ARGS",
    "SbatchUser",
    "SlurmExecutor",
    "SlurmJob",
    "SlurmNode",
    "batch_script",
    "check_config",
    "end_reason",
    "exit_code",
    "expand_hostlist",
    "gpus_of",
    "gres_indices",
    "job_environment",
    "ledger_id",
    "node_changes",
    "node_down",
    "node_unavailable",
    "open_executor",
    "parse_jobs",
    "parse_nodes",
    "parse_sacctmgr_shares",
    "pinned_types",
    "register_commands",
    "sbatch_args",
    "shares_toml",
    "slurm_time",
]
