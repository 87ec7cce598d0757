"""A run's files and handles, as the supervised executor and its supervisors leave them. An
edge: reads the run directories (see `ledger.engines.supervised` for the layout).

`Handle` and `Part` are what the state file keeps of each launch; `PartEnd` what a supervisor
writes when a part's process tree is empty; `live_processes` finds every part still alive from
the run directories alone (the audit's view of the host), and `handled_jobs` the runs a state
file still holds.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import msgspec

from ledger.engines.proc import alive, write_atomic
from ledger.engines.supervise import record_says_started, tree_of
from schemas.commands import RunEnd

STATE_VERSION = 1
StopReason = Literal["ledger", "time_limit", "part_failed", "drain"]


class Part(msgspec.Struct, kw_only=True):
    """One process of a job: its node's GPUs, its supervisor, and its end once known."""

    rank: int
    node: str
    gpu_indices: tuple[int, ...]
    rundir: str
    log: str
    pid: int | None = None
    """The supervisor's pid (the job's pid and process group are in `rundir/job`)."""
    pid_start: int | None = None
    """The supervisor's start time in /proc (clock ticks since boot): pid reuse is detected."""
    exit_code: int | None = None
    lost: bool = False
    signalled: bool = False
    """SIGTERM reached it (its process tree, or its supervisor, which passes it on)."""
    cgroup: str = ""
    """The part's group under `<cgroup mount>/gpuledger/` ("": its session holds it)."""
    ended_at: float | None = None
    """When its process tree was empty, as its supervisor (or the leader's record) says."""
    note: str = ""
    """Why it could not start, or what had to be killed when its leader ended."""
    launch_failed: bool = False
    marks_start: bool = False
    """Its leader writes `started` in its record once the command is about to run (past the
    working directory and output files): it is running only then. False for a part an older
    version launched (running once its process exists)."""
    fenced: bool = False
    """Its node's fence stopped it (`supervise.wait_leader`)."""
    left_since: float | None = None
    """Its supervisor is gone and its leader ended with processes left: since when (they get
    the grace, then SIGKILL, as the supervisor would have done)."""
    leader_ended_at: float | None = None
    """When its command (the leader) ended, as its supervisor's clock (`PartEnd`) or the
    leader's record says; None: not known (a part an older supervisor ended). A part whose
    command ended before the ledger's stop reached it ended by itself (`run_ends.ended_first`)."""


class Handle(msgspec.Struct, kw_only=True):
    job_id: int
    launch: int
    launched_at: float
    time_limit_s: float | None
    grace_s: float
    parts: list[Part]
    stop_at: float | None = None
    stop_reason: StopReason | None = None
    termed_at: float | None = None
    """When its stop's SIGTERM was sent (`stop_at` is when the stop was due: a time limit's
    moment): a limit's SIGKILL comes no sooner than `reads.stopping.limit_sigkill_at` says."""
    killed: bool = False
    failed_code: int | None = None
    start_reported: bool = False
    checkpoint_mtime: float = 0.0
    started_at: float | None = None
    """When its command started (the latest of its parts' recorded starts), once every part
    has: its time limit counts from it (`limit_from`)."""

    @property
    def gpus(self) -> set[tuple[str, int]]:
        return {(p.node, i) for p in self.parts for i in p.gpu_indices}

    @property
    def done(self) -> bool:
        return all(p.exit_code is not None for p in self.parts)


def stopping_gpus(handles: Iterable[Handle]) -> dict[str, frozenset[int]]:
    """Pure: the GPUs (node -> indices) of the runs the ledger stopped whose parts have not all
    ended (their grace): nothing starts on them before (`Observed.stopping`)."""
    out: dict[str, set[int]] = {}
    for h in handles:
        for p in h.parts if h.stop_reason == "ledger" else ():
            if p.exit_code is None:
                out.setdefault(p.node, set()).update(p.gpu_indices)
    return {n: frozenset(i) for n, i in out.items()}


class AgentState(msgspec.Struct, kw_only=True):
    version: int = STATE_VERSION
    jobs: list[Handle] = []
    containment: str = ""
    """How job processes are held here (`Containment.describe`), for `agent status`."""


class PartEnd(msgspec.Struct, kw_only=True):
    """A part's end as its supervisor wrote it (`RUNDIR/exit`, see supervise.py)."""

    code: int
    ended_at: float | None = None
    leader_ended_at: float | None = None
    left: int = 0
    killed: bool = False
    launch_failed: str = ""
    fenced: bool = False
    """Its node's fence stopped it: the lease ran out (no word from the server)."""

    def note(self) -> str:
        if self.launch_failed:
            return self.launch_failed
        if self.fenced:
            return "stopped by its node's fence: no word from the server past the lease"
        if self.left:
            how = "killed after the grace" if self.killed else "stopped with SIGTERM"
            return f"{self.left} process(es) its leader left behind were {how}"
        return ""


def read_identity(path: Path) -> tuple[int, int] | None:
    try:
        pid, started = path.read_text().split()[:2]
        return int(pid), int(started)
    except (FileNotFoundError, ValueError):
        return None


def part_alive(p: Part) -> bool:
    """A part not known to have ended whose supervisor, or its job's leader, runs as the same
    process it recorded (pid and /proc start time): proof that the host did not reboot since
    (`ledger.agent.identity.Boot.not_rebooted`)."""
    if p.exit_code is not None:
        return False
    job = read_identity(Path(p.rundir) / "job")
    return alive(p.pid, p.pid_start) or (job is not None and alive(*job))


def spec_log(spec: dict[str, object]) -> str:
    """Pure: where a part's output goes, as its spec says: the file the job named, else the
    engine's log ("" when neither)."""
    return str(spec.get("stdout") or spec.get("log") or "")


def part_log(rundir: Path) -> str:
    """Where the part in `rundir` writes its output, from its spec ("" when it cannot be read):
    what a start first reported after a restart names, as its launch did (atk36-23 F4)."""
    try:
        spec = json.loads((rundir / "spec.json").read_bytes())
    except (OSError, ValueError):
        return ""
    return spec_log(spec) if isinstance(spec, dict) else ""


def read_started(path: Path) -> float | None:
    """When the leader started (its identity file's third field; older files have none)."""
    try:
        return float(path.read_text().split()[2])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def limit_from(h: Handle) -> float:
    """When a run's time limit starts: its command's own start as its parts recorded it (as
    Slurm's from StartTime); the launch bookkeeping only while a part has not started (so the
    limit still stops one that hangs starting). Counted from the launch, jobs ran 0.25-0.35 s
    short of `-t` (atk46-23 F3). Keeps the start in `h` once every part has one."""
    if h.started_at is None:
        began = [read_started(Path(p.rundir) / "job") for p in h.parts]
        if not h.parts or None in began:
            return h.launched_at
        h.started_at = max(b for b in began if b is not None)
    return h.started_at


def read_exit(rundir: Path) -> PartEnd | None:
    try:
        raw = (rundir / "exit").read_bytes()
    except FileNotFoundError:
        return None
    try:
        return msgspec.json.decode(raw, type=PartEnd)
    except msgspec.DecodeError:
        pass
    try:  # an older supervisor wrote the bare code
        return PartEnd(code=int(raw))
    except ValueError:
        return None


def run_name(job_id: int, launch: int) -> str:
    """Pure: the engine's id of a run, as JobEngineLinked/JobEngineEnded record it."""
    return f"{job_id}.{launch}"


def handled_jobs(state_dir: Path) -> list[int]:
    """The jobs whose runs the state file of `state_dir` still holds (running, or ended and not
    yet recorded): work that only an executor on this state directory can finish."""
    try:
        state = msgspec.json.decode((state_dir / "state.json").read_bytes(), type=AgentState)
    except (FileNotFoundError, msgspec.DecodeError):
        return []
    return sorted(h.job_id for h in state.jobs)


class LiveProcess(msgspec.Struct, frozen=True, kw_only=True):
    """A job process really alive on this host, and the GPUs it was given."""

    job_id: int
    launch: int
    node: str
    gpu_indices: tuple[int, ...]
    pid: int
    """The leader's pid (or, once it ended, one of the processes it left)."""
    pids: tuple[int, ...] = ()
    """Every live process of the part's tree."""
    tree: str = ""


def live_processes(state_dir: Path) -> list[LiveProcess]:
    """Every job part with a live process under `state_dir/runs`, found from the supervisors'
    own files (not from the state file), so a process the handles forgot is counted too. A part
    is alive while its process tree is not empty (a child its leader left counts)."""
    out = []
    for rundir in sorted((state_dir / "runs").glob("*/*")):
        ident = read_identity(rundir / "job")
        if ident is None or read_exit(rundir) is not None:
            continue
        try:
            spec = json.loads((rundir / "spec.json").read_bytes())
            env = spec["env"]
            pids = tree_of(spec, ident[0]).pids() if spec.get("cgroup") else set()
            if not alive(*ident) and not pids:
                pids = tree_of(spec, ident[0]).pids()
            if not alive(*ident) and not pids:
                continue
            gpus = env.get("CUDA_VISIBLE_DEVICES", "")
            out.append(
                LiveProcess(
                    job_id=int(env["GPULEDGER_JOB_ID"]),
                    launch=int(env.get("GPULEDGER_LAUNCH", 1)),
                    node=env["GPULEDGER_NODE"],
                    gpu_indices=tuple(int(i) for i in gpus.split(",") if i),
                    pid=ident[0] if alive(*ident) else min(pids),
                    pids=tuple(sorted(pids | ({ident[0]} if alive(*ident) else set()))),
                    tree=str(spec.get("cgroup") or f"session {ident[0]}"),
                )
            )
        except (FileNotFoundError, KeyError, ValueError):
            continue
    return out


STOP_FILE = "stopped"
"""In a part's run directory: why the agent itself stopped the run (a drain, its time limit),
written when it sent SIGTERM. A restarted agent that finds the run's end with no handle tells
the end with that reason (a drained resumable job is requeued), not as a plain exit (atk36-23
F5: an agent killed after `--drain` stopped a job, before its report was taken, made the next
agent report the drained checkpoint-and-exit-0 as `completed`)."""

STOPS_KEPT: dict[str, RunEnd] = {"drain": "drained", "time_limit": "time_limit"}


def keep_stop(rundirs: Iterable[Path], why: str) -> None:
    """Write why the agent stops a run beside each of its parts, when it is one kept."""
    if why in STOPS_KEPT:
        for rundir in rundirs:
            with contextlib.suppress(OSError):
                write_atomic(rundir / STOP_FILE, why.encode(), sync=False)


def kept_stop(rundirs: Iterable[Path]) -> RunEnd | None:
    """The end reason of a run the agent stopped itself, as `keep_stop` kept it (a drain
    before a time limit); None when it did not."""
    kept = set()
    for rundir in rundirs:
        with contextlib.suppress(OSError):
            kept.add((rundir / STOP_FILE).read_text().strip())
    for why in ("drain", "time_limit"):
        if why in kept:
            return STOPS_KEPT[why]
    return None


def recorded_end(runs: Path) -> PartEnd | None:
    """The end its supervisors wrote for a launch (`runs`: its directory) no handle remembers
    (the service stopped between reading it and recording it), if every part wrote one: the
    first non-zero code, the last end time, every note."""
    ends = [read_exit(d) for d in sorted(runs.glob("*")) if d.is_dir()]
    known = [x for x in ends if x is not None]
    if not ends or len(known) < len(ends):
        return None
    times = [x.ended_at for x in known if x.ended_at is not None]
    return PartEnd(
        code=next((x.code for x in known if x.code), 0),
        ended_at=max(times) if times else None,
        launch_failed="; ".join(x.launch_failed for x in known if x.launch_failed),
        left=sum(x.left for x in known),
        killed=any(x.killed for x in known),
    )


def checkpoint_mtime(rundirs: Iterable[Path]) -> float:
    """The latest change of the parts' checkpoint files (`GPULEDGER_CHECKPOINT_FILE`), 0: none.
    The name itself, never what a link there points to: the job's user may put a link in its
    `work/`, and the service (root) following it would tell the job when a file it may not
    even stat changed, and record those changes as its checkpoints (atk43 F9), as the Slurm
    executor reads it (`tracked.touched`)."""
    best = 0.0
    for rundir in rundirs:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            best = max(best, os.lstat(rundir / "work" / "checkpoint").st_mtime)
    return best


def failed_launch(h: Handle) -> bool:
    """A part could not start its command (no working directory, output file, account): the
    job never ran, and no start is reported for it."""
    for p in h.parts:
        if p.launch_failed:
            return True
        if p.marks_start and not record_says_started(Path(p.rundir)):
            end = read_exit(Path(p.rundir))
            if end is not None and end.launch_failed:
                return True
    return False
