"""Opening the Slurm executor: the ledger's name in Slurm's comments, the partition checked
and its GPU nodes registered (`open_executor`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ledger.engines.accounts import RunAs
from ledger.engines.slurm.executor import SlurmExecutor
from ledger.engines.slurm.stops import grace_in
from ledger.engines.slurm.words import name_of, register_commands
from ledger.store.application import Ledger
from schemas.errors import EngineError, InvalidCommand

log = logging.getLogger("gpuledger.slurm")


def ledger_id(ledger: Ledger) -> str:
    """This ledger's name in Slurm comments: 12 hex digits of its first event's id."""
    first = ledger.read(0, 1)
    return name_of(first[0][1] if first else None)


def open_executor(
    ledger: Ledger,
    partition: str | None,
    log_dir: Path,
    grace_s: float,
    actor: str,
    run_as: RunAs = "submitter",
    may_act: Callable[[], bool] | None = None,
) -> SlurmExecutor:
    """The executor of `partition`, after checking Slurm lets gpu-ledger own it, with the
    partition's GPU nodes registered in the ledger by `actor` (an admin). One clear error when
    the partition is missing, cannot be owned or has no GPU node; nothing appended then."""
    if not partition:
        raise InvalidCommand(
            "the Slurm executor needs the partition gpu-ledger owns",
            hint="pass --partition P (serve: `partition` in the config file)",
        )
    slurm = SlurmExecutor(
        partition, ledger_id(ledger), log_dir, grace_s=grace_s, run_as=run_as, may_act=may_act
    )
    slurm.check()
    slurm.job_grace = lambda job_id: grace_in(ledger.state, job_id)
    if log_dir.is_dir() and log_dir.stat().st_mode & 0o022:  # an older version's 1777
        log.warning("%s was writable by others: made 0755 (the service's own directory)", log_dir)
        log_dir.chmod(0o755)
    found = slurm.nodes()
    if not found:
        raise EngineError(
            f"Slurm partition {partition!r} has no nodes with GPUs (Gres=gpu:...)",
            hint="see docs/slurm.md",
        )
    cmds = register_commands(found, ledger.state.nodes, actor)
    if cmds:
        ledger.execute_all(cmds)
    return slurm
