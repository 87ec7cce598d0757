"""The simulation kernel's executor: virtual execution with progress, for `simulate` and `whatif`.

Pure apart from its own state: no clock (every call takes `now`), no I/O.

- A job runs until its work is done: `work[job_id]` when given (the what-if knows each job's
  remaining work at the start of its period), else the launch's `duration_s`; None runs until
  stopped. Exits come in (time, job id) order.
- Checkpoints keep work: a resumable job relaunched after a preemption runs only the work left
  after its last checkpoint (`checkpoint`); a non-resumable one starts over (the ledger ends it;
  the loop may resubmit it as a new job).
- The signal contract: a job for which `on_sigterm(job_id)` is true checkpoints when it is
  stopped (SIGTERM, within the grace period), so a preemption costs it no work.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping

from ledger.executors import Exit, Launch


def _never(job_id: int) -> bool:
    return False


class KernelExecutor:
    """The one simulated executor (see the module docstring)."""

    def __init__(
        self,
        work: Mapping[int, float | None] | None = None,
        on_sigterm: Callable[[int], bool] = _never,
    ) -> None:
        self.work: dict[int, float | None] = dict(work or {})
        """Job -> its total work in seconds, where the launch's duration is not it."""
        self.on_sigterm = on_sigterm
        self.saved: dict[int, float] = {}
        """Seconds of work kept by a job's checkpoints (survives a preemption)."""
        self._live: dict[int, tuple[int, float, float]] = {}
        """Running job -> (launch number, launched at, work saved at launch)."""
        self._ends: list[tuple[float, int, int]] = []
        """(end time, job id, launch number): a stopped job's old end is stale."""
        self._launches = 0

    def launch(self, job: Launch, now: float) -> None:
        self._launches += 1
        saved = self.saved.get(job.job_id, 0.0)
        self._live[job.job_id] = (self._launches, now, saved)
        total = self.work.get(job.job_id, job.duration_s)
        if total is not None:
            heapq.heappush(self._ends, (now + max(0.0, total - saved), job.job_id, self._launches))

    def checkpoint(self, job_id: int, at: float) -> None:
        live = self._live.get(job_id)
        if live is not None:
            self.saved[job_id] = live[2] + (at - live[1])

    def stop(self, job_id: int, now: float) -> None:
        if self.on_sigterm(job_id):
            self.checkpoint(job_id, now)
        self._live.pop(job_id, None)

    def poll(self, now: float) -> list[Exit]:
        out = []
        while self._ends and self._ends[0][0] <= now:
            at, job_id, launch = heapq.heappop(self._ends)
            live = self._live.get(job_id)
            if live is not None and live[0] == launch:
                del self._live[job_id]
                self.saved.pop(job_id, None)
                out.append(Exit(job_id, 0, at))
        return out

    def running(self) -> set[int]:
        return set(self._live)

    def next_event_at(self) -> float | None:
        while self._ends:
            _, job_id, launch = self._ends[0]
            live = self._live.get(job_id)
            if live is not None and live[0] == launch:
                return self._ends[0][0]
            heapq.heappop(self._ends)
        return None
