"""What the Slurm executor keeps of each run it submitted, on disk, in the service's own
directory (`<log_dir>/launches/<job>.<run>`, the service's alone: the run's marks are the job
user's): its Slurm job id and, once recorded started, Slurm's StartTime. A slurmctld that lost
its state may forget the job (a restart of the service then still knows the run: `adopt`),
or forget it before launching it (the run's nodes, noted at submission, and their runs' launch
marks tell a restarted service whether it would have seen its script's marks: atk44s F4),
rewind it to PENDING or start it again (its first start is the executor's word, not the user's:
`relaunch.restarted`), or hand its id to a later submission (`Notes.reused`: atk43s F5). An edge.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ledger.engines.proc import write_atomic

KEEP_S = 7 * 86400.0
"""Notes older than this are forgotten at a restart (`Notes.load`)."""


@dataclass
class Noted:
    slurm_id: str
    started: float | None = None
    """Slurm's StartTime when the executor recorded the run started (None: not yet)."""
    nodes: tuple[str, ...] = ()
    """The nodes it was submitted to (its placement's; () in notes made before the field)."""


@dataclass
class Notes:
    log_dir: Path
    by_run: dict[tuple[int, int], Noted] = field(default_factory=dict)
    loaded: bool = False

    @property
    def _dir(self) -> Path:
        return self.log_dir / "launches"

    def load(self) -> None:
        """Read every note once (after a restart)."""
        if self.loaded:
            return
        self.loaded = True
        with contextlib.suppress(OSError):
            for path in self._dir.iterdir():
                with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                    job, run = (int(w) for w in path.name.split("."))
                    got = json.loads(path.read_text())
                    start = None if got.get("started") is None else float(got["started"])
                    nodes = tuple(str(n) for n in got.get("nodes") or ())
                    self.by_run.setdefault((job, run), Noted(str(got["slurm_id"]), start, nodes))

    def forget_older(self, now: float) -> None:
        """Forget the notes older than `KEEP_S` (at a restart's adoption)."""
        with contextlib.suppress(OSError):
            for path in self._dir.iterdir():
                with contextlib.suppress(OSError):
                    if path.stat().st_mtime < now - KEEP_S:
                        path.unlink()

    def get(self, job_id: int, run: int) -> Noted | None:
        self.load()
        return self.by_run.get((job_id, run))

    def reused(self, slurm_id: str, job_id: int, run: int) -> tuple[int, int] | None:
        """The earlier run (job, run) the executor noted under `slurm_id`, if another's: Slurm
        gave the id again (a controller that lost its state forgets it handed it out)."""
        self.load()
        return next((k for k, n in self.by_run.items() if n.slurm_id == slurm_id and k != (job_id, run)), None)  # fmt: skip  # noqa: E501

    def note(self, job_id: int, run: int, slurm_id: str, started: float | None = None,
             nodes: tuple[str, ...] = ()) -> None:  # fmt: skip
        """Keep the run's Slurm id (and its first StartTime, the nodes it was submitted to).
        Best effort."""
        self.load()
        old = self.by_run.get((job_id, run))
        same = old is not None and old.slurm_id == slurm_id
        if old is not None and same and (started is None or old.started) and (not nodes or old.nodes):  # fmt: skip  # noqa: E501
            return
        if old is not None and same:
            started = old.started if old.started is not None else started
            nodes = old.nodes or nodes
        noted = self.by_run[(job_id, run)] = Noted(slurm_id, started, nodes)
        with contextlib.suppress(OSError):
            self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            body = json.dumps({"slurm_id": noted.slurm_id, "started": noted.started,
                               "nodes": list(noted.nodes)}).encode()  # fmt: skip
            write_atomic(self._dir / f"{job_id}.{run}", body, sync=False, mode=0o600)
