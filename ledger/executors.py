"""Executors run what the dispatcher placed. An edge: processes, signals, a virtual clock.

The ledger is the truth; an executor only reports what happened to the processes it runs
(`poll` returns exits). The service reconciles: a job the ledger no longer counts as running
(preempted, cancelled) is stopped here.

`SimExecutor` runs jobs on a virtual clock (simulation, what-if). Real processes run under
`ledger.agent.executor.SupervisedExecutor` (`gpuledger up`, node agents).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from schemas.events import FinishReason, GpuSlot


@dataclass(frozen=True)
class Launch:
    """One placement to run: a part per slot (node), each with only that node's GPUs."""

    job_id: int
    slots: tuple[GpuSlot, ...]
    command: tuple[str, ...]
    duration_s: float | None
    user: str
    account: str
    time_limit_s: float | None = None
    """Stop the job this long after it started (SIGTERM, grace, SIGKILL); None: no limit."""
    grace_s: float | None = None
    """SIGTERM-to-SIGKILL grace of this job; None: the executor's default."""
    launch: int = 1
    """1 for the first run, +1 for every relaunch after a requeue."""
    debug: bool = False


ExitReason = FinishReason


@dataclass(frozen=True)
class Exit:
    job_id: int
    exit_code: int
    at: float
    reason: ExitReason = "exit"
    """`exit`: the job ended by itself; `time_limit`: stopped at its limit; `lost`: its process
    vanished with no exit code recorded."""


@dataclass(frozen=True)
class Start:
    """Every part of a job has started (the job is running); where its output goes."""

    job_id: int
    logs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reports:
    """What an executor that runs real processes observed since it was last asked."""

    starts: list[Start] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    """Jobs that reported a checkpoint."""
    samples: list[tuple[int, tuple[float, ...]]] = field(default_factory=list)
    """(job, GPU utilisation % per GPU of the job)."""


class Executor(Protocol):
    def launch(self, job: Launch, now: float) -> None: ...

    def stop(self, job_id: int, now: float) -> None:
        """Stop a job the ledger no longer runs (preempted, cancelled); its exit goes unreported."""

    def poll(self, now: float) -> list[Exit]: ...

    def running(self) -> set[int]: ...

    def next_event_at(self) -> float | None:
        """When something will happen without outside input (a simulated job ending), if known."""


@runtime_checkable
class Reporting(Protocol):
    """An executor whose jobs start asynchronously (once the GPUs are really free) and that
    reports checkpoints and utilisation. Executors without it start jobs at `launch`."""

    def reports(self, now: float) -> Reports: ...


@dataclass
class SimExecutor:
    """Virtual execution: a job ends `duration_s` after it starts (exit 0); none means it runs
    until stopped. Deterministic: exits come in (time, job id) order."""

    _ends: list[tuple[float, int, int]] = field(default_factory=list)
    """(end time, job id, launch number): a stopped and relaunched job's old end is stale."""
    _live: dict[int, int] = field(default_factory=dict)
    """Running job id -> its launch number."""
    _launches: int = 0

    def launch(self, job: Launch, now: float) -> None:
        self._launches += 1
        self._live[job.job_id] = self._launches
        if job.duration_s is not None:
            heapq.heappush(self._ends, (now + job.duration_s, job.job_id, self._launches))

    def stop(self, job_id: int, now: float) -> None:
        self._live.pop(job_id, None)

    def _current(self, job_id: int, launch: int) -> bool:
        return self._live.get(job_id) == launch

    def poll(self, now: float) -> list[Exit]:
        out = []
        while self._ends and self._ends[0][0] <= now:
            at, job_id, launch = heapq.heappop(self._ends)
            if self._current(job_id, launch):
                del self._live[job_id]
                out.append(Exit(job_id, 0, at))
        return out

    def running(self) -> set[int]:
        return set(self._live)

    def next_event_at(self) -> float | None:
        while self._ends and not self._current(self._ends[0][1], self._ends[0][2]):
            heapq.heappop(self._ends)
        return self._ends[0][0] if self._ends else None
