"""What the Slurm executor keeps of each run it carries out (one per job: its current run), and
when it began to stop a run, on disk (`note_stop`), so a restart of the service gives that run
only what is left of its grace."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from ledger.cycle.executor import Launch
from ledger.engines.proc import write_atomic


def note_stop(log_dir: Path, slurm_id: str, since: float) -> None:
    """Keep when the stop of Slurm job `slurm_id` began (`<log_dir>/stops/<id>`, the service's
    alone): a restart reads it back (`noted_stop`). Best effort: without it, a restart gives
    the run its whole grace again."""
    stops = log_dir / "stops"
    with contextlib.suppress(OSError):
        stops.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(stops / slurm_id, repr(since).encode(), sync=False, mode=0o600)


def noted_stop(log_dir: Path, slurm_id: str) -> float | None:
    """When the stop of `slurm_id` began, as `note_stop` kept it (None: not noted)."""
    try:
        return float((log_dir / "stops" / slurm_id).read_text())
    except (OSError, ValueError):
        return None


def forget_stop(log_dir: Path, slurm_id: str) -> None:
    """The stop of `slurm_id` is over (its run has ended)."""
    with contextlib.suppress(OSError):
        (log_dir / "stops" / slurm_id).unlink()


@dataclass
class Run:
    job_id: int
    run: int
    launch: Launch | None
    slurm_id: str | None = None
    """None while the launch waits for its GPUs to be free in Slurm (a victim still stopping)."""
    started: bool = False
    missing_since: float | None = None
    """When a read of Slurm first lacked this run (None while Slurm lists it)."""
    submitted_at: float | None = None
    """When it was handed to Slurm (its start is awaited from then on)."""
    started_at: float | None = None
    """Slurm's StartTime of the run (its exact limit counts from it)."""
    limited: bool = False
    """The executor stopped it at its limit (it keeps every limit: Slurm's is a backstop)."""
    logs: tuple[str, ...] = ()
    """Its output (and error) file."""
    checkpoint_mtime: float = 0.0
    """When the job last touched its checkpoint file (`GPULEDGER_CHECKPOINT_FILE`)."""
    running_seen: float | None = None
    """When a read first showed Slurm running it (its start waits for its script: `_launched`)."""
    node_failed: bool = False
    """Slurm ended it NODE_FAIL and the executor waits to know how it really ended (`ends`)."""
    seen_running_at: float | None = None
    """The last read that showed it running while Slurm's view was current (not in an outage's
    settle period): its end cannot be earlier."""
