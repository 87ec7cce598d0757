"""Executors run what the dispatcher placed. An edge: processes, signals, a virtual clock.

The ledger is the truth; an executor only carries out its decisions and reports what really
happened. One interface, three engines: `SimExecutor` (virtual time), `LocalExecutor` (processes
on this host) and `ledger.slurm.SlurmExecutor` (a Slurm partition):

- `launch` a placement with all its parts (every slot of a gang);
- `stop` a run the ledger no longer counts as running (preempted, cancelled): signal, the grace,
  then kill; its exit goes unreported;
- `starts` and `poll` report the runs that began and the runs that ended (exit code and reason);
- `running` lists what really runs in the engine for the ledger, and `adopt` (services) compares
  the ledger with the engine after a restart: the service reconciles from facts, never guesses.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from schemas.events import EndReason, GpuSlot


@dataclass(frozen=True)
class Launch:
    job_id: int
    slots: tuple[GpuSlot, ...]
    command: tuple[str, ...]
    duration_s: float | None
    user: str
    account: str
    run: int = 0
    """Which placement of the job this is (its preemptions so far): names the engine's run."""
    time_limit_s: int | None = None


@dataclass(frozen=True)
class Exit:
    job_id: int
    exit_code: int
    at: float
    reason: EndReason = "exited"
    engine_job_id: str = ""
    """The engine's id of the run (Slurm job id); empty for engines that do not name runs."""
    engine_state: str = ""


@dataclass(frozen=True)
class Start:
    job_id: int
    engine_job_id: str = ""
    run: int = 0
    gpus: tuple[GpuSlot, ...] = ()
    """The GPUs the engine says the run got (engines that say)."""


class Executor(Protocol):
    engine: str
    """The engine's name in JobEngineLinked/JobEngineEnded ("" records neither: sim, local)."""

    def launch(self, job: Launch, now: float) -> None:
        """Carry out a placement: every slot of it, on exactly the nodes and GPUs it names."""

    def stop(self, job_id: int, now: float) -> None:
        """Stop a job the ledger no longer runs (preempted, cancelled): signal, then kill after
        the grace; its exit goes unreported."""

    def starts(self, now: float) -> list[Start]:
        """Launched runs that began running since the last call, in launch order."""

    def poll(self, now: float) -> list[Exit]:
        """Runs that ended since the last call, with exit code and reason."""

    def running(self) -> set[int]:
        """Jobs that really have a run in the engine (launched and not yet reported ended)."""

    def next_event_at(self) -> float | None:
        """When something will happen without outside input (a simulated job ending), if known."""


class ServiceExecutor(Executor, Protocol):
    """An executor a long-running service owns: it can be restarted under running work."""

    relaunch_placed: bool
    """After a restart, a job the ledger placed that the engine never received is launched
    again (True: the engine keeps runs across our restarts, so "unknown" means "never sent"), or
    recorded as lost (False: runs die with the service)."""

    def adopt(self, runs: Mapping[int, int], now: float) -> set[int]:
        """After a restart: `runs` maps each job the ledger holds GPUs for to its current run.
        Take over the engine's runs that match, stop the engine's runs of ours that the ledger no
        longer runs, and return the job ids the engine really has."""

    def shutdown(self, now: float) -> list[Exit]:
        """The service stops: the exits to record (runs this executor ends with the service)."""


@dataclass
class SimExecutor:
    """Virtual execution: a job ends `duration_s` after it starts (exit 0); none means it runs
    until stopped. Deterministic: exits come in (time, job id) order."""

    _ends: list[tuple[float, int, int]] = field(default_factory=list)
    """(end time, job id, launch number): a stopped and relaunched job's old end is stale."""
    _live: dict[int, int] = field(default_factory=dict)
    """Running job id -> its launch number."""
    _launches: int = 0
    _new: list[int] = field(default_factory=list)
    engine: str = ""

    def launch(self, job: Launch, now: float) -> None:
        self._launches += 1
        self._new.append(job.job_id)
        self._live[job.job_id] = self._launches
        if job.duration_s is not None:
            heapq.heappush(self._ends, (now + job.duration_s, job.job_id, self._launches))

    def stop(self, job_id: int, now: float) -> None:
        self._live.pop(job_id, None)

    def _current(self, job_id: int, launch: int) -> bool:
        return self._live.get(job_id) == launch

    def starts(self, now: float) -> list[Start]:
        """Every launch starts at once."""
        out, self._new = [Start(j) for j in self._new], []
        return out

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
    `<log_dir>/job-<id>.log`. Processes end with the service (`shutdown`), so after a restart
    the ledger's runs here are lost, never adopted."""

    engine = ""
    relaunch_placed = False

    def __init__(self, log_dir: Path, grace_s: float = 30.0) -> None:
        self.log_dir = log_dir
        self.grace_s = grace_s
        self._procs: dict[int, _Proc] = {}
        self._stopping: dict[int, _Proc] = {}
        self._new: list[int] = []

    def starts(self, now: float) -> list[Start]:
        out, self._new = [Start(j) for j in self._new], []
        return out

    def adopt(self, runs: Mapping[int, int], now: float) -> set[int]:
        return set(self._procs) & set(runs)

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
        self._new.append(job.job_id)

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
