"""Executors run what the dispatcher placed. An edge: processes, signals, a virtual clock.

The ledger is the truth; an executor only reports what happened to the processes it runs
(`poll` returns exits). The service reconciles: a job the ledger no longer counts as running
(preempted, cancelled) is stopped here.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from schemas.events import GpuSlot


@dataclass(frozen=True)
class Launch:
    job_id: int
    slots: tuple[GpuSlot, ...]
    command: tuple[str, ...]
    duration_s: float | None
    user: str
    account: str


@dataclass(frozen=True)
class Exit:
    job_id: int
    exit_code: int
    at: float


class Executor(Protocol):
    def launch(self, job: Launch, now: float) -> None: ...

    def stop(self, job_id: int, now: float) -> None:
        """Stop a job the ledger no longer runs (preempted, cancelled); its exit goes unreported."""

    def poll(self, now: float) -> list[Exit]: ...

    def running(self) -> set[int]: ...

    def next_event_at(self) -> float | None:
        """When something will happen without outside input (a simulated job ending), if known."""


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


@dataclass
class _Proc:
    popen: subprocess.Popen[bytes]
    stop_requested_at: float | None = None


class LocalExecutor:
    """Runs each job's command as a subprocess on this host with CUDA_VISIBLE_DEVICES set to its
    GPU indices. On stop: SIGTERM to the process group, SIGKILL after `grace_s`. Output goes to
    `<log_dir>/job-<id>.log`."""

    def __init__(self, log_dir: Path, grace_s: float = 30.0) -> None:
        self.log_dir = log_dir
        self.grace_s = grace_s
        self._procs: dict[int, _Proc] = {}
        self._stopping: dict[int, _Proc] = {}

    def launch(self, job: Launch, now: float) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for sl in job.slots for i in sl.gpu_indices)
        env["GPULEDGER_JOB_ID"] = str(job.job_id)
        env["GPULEDGER_NODES"] = ",".join(sl.node for sl in job.slots)
        env["GPULEDGER_ACCOUNT"] = job.account
        command = list(job.command) or ["true"]
        with open(self.log_dir / f"job-{job.job_id}.log", "ab") as out:
            try:
                popen = subprocess.Popen(
                    command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            except OSError as e:
                out.write(f"gpuledger: cannot start {command[0]!r}: {e.strerror}\n".encode())
                popen = subprocess.Popen(["sh", "-c", "exit 127"], stdout=out, stderr=out)
        self._procs[job.job_id] = _Proc(popen)

    def stop(self, job_id: int, now: float) -> None:
        proc = self._procs.pop(job_id, None)
        if proc is None:
            return
        proc.stop_requested_at = now
        self._signal(proc, signal.SIGTERM)
        self._stopping[job_id] = proc

    def _signal(self, proc: _Proc, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, sig)

    def poll(self, now: float) -> list[Exit]:
        exits = []
        for job_id, proc in list(self._procs.items()):
            code = proc.popen.poll()
            if code is not None:
                del self._procs[job_id]
                exits.append(Exit(job_id, code, now))
        for job_id, proc in list(self._stopping.items()):
            if proc.popen.poll() is not None:
                del self._stopping[job_id]
            elif (
                proc.stop_requested_at is not None and now - proc.stop_requested_at >= self.grace_s
            ):
                self._signal(proc, signal.SIGKILL)
        return sorted(exits, key=lambda x: x.job_id)

    def running(self) -> set[int]:
        return set(self._procs)

    def next_event_at(self) -> float | None:
        return None

    def shutdown(self, now: float) -> list[Exit]:
        """Stop everything (service exit): TERM, KILL what is left after the grace period, and
        return the exits of the jobs that were still running, so the ledger records them."""
        running = dict(self._procs)
        for job_id in list(self._procs):
            self.stop(job_id, now)
        for proc in self._stopping.values():
            try:
                proc.popen.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
                proc.popen.wait()
        self._stopping.clear()
        return [Exit(job_id, p.popen.returncode, now) for job_id, p in sorted(running.items())]
