"""While slurmctld does not answer (an outage, docs/slurm.md "Restarts"): the executor asks it
again every few seconds on a thread of its own, so the service's thread never waits on a
controller that does not answer (each call costs about 9 s of the Slurm client's retries, which
reads and submits would wait for). An edge: it starts a thread."""

from __future__ import annotations

import threading
from collections.abc import Callable

from schemas.errors import EngineError


class Probe:
    """Asks Slurm (`ask`, which raises `EngineError` when it does not answer) once per
    `every_s` during an outage, each time on a new daemon thread."""

    def __init__(self, ask: Callable[[], object], every_s: float = 5.0) -> None:
        self.ask = ask
        self.every_s = every_s
        self.at: float | None = None
        """When to ask Slurm again during an outage (None: not in one)."""
        self.thread: threading.Thread | None = None
        self._answered = False

    @property
    def away(self) -> bool:
        """In an outage (Slurm did not answer the last read)."""
        return self.at is not None

    def begin(self, now: float) -> None:
        """Slurm did not answer at `now`: ask again `every_s` later."""
        self.at = now + self.every_s

    def end(self) -> None:
        """Slurm answered a read."""
        self.at = None

    def over(self, now: float) -> bool:
        """In an outage: True once a probe got Slurm's answer; else starts one when due."""
        if self.thread is not None and self.thread.is_alive():
            return False
        self.thread = None
        if self._answered:
            self._answered = False
            return True
        if self.at is not None and now < self.at:
            return False
        self.at = now + self.every_s
        self.thread = threading.Thread(target=self._probe, name="slurm-probe", daemon=True)
        self.thread.start()
        return False

    def _probe(self) -> None:
        try:
            self.ask()
        except EngineError:
            return
        self._answered = True
