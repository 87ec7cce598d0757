"""The per-job supervisor: `python -m ledger.engines.supervise RUNDIR`.

Like slurmstepd, one small process per job part is the job's parent, so the service (or a node
agent) can stop, crash or restart without touching the job. It detaches (a new session, then a
fork whose parent exits at once, so init adopts it), makes the part's process tree
(`ledger.engines.tree`: its cgroups, or its session), starts the job in it and, once the tree is
empty, writes the part's end to `RUNDIR/exit` (atomically).

The job's leader is a small POSIX shell (`WRAPPER`) running **as the job's user**, in the job's
session and groups, started in the working directory the user's opener opened (`open_workdir`:
never its name resolved again), it checks that the command can be started, runs it, and writes
the command's exit code to `RUNDIR/record` through a descriptor it inherited (the command itself
does not): the tree's own record, which survives a supervisor killed with -9. Its stdout and
stderr are the output and error files the user named, opened before by a child of the supervisor
running as the user (`open_outputs`: created by the user, with the user's rights, each opened
once and checked on the descriptor). Times are never the leader's word (it runs as the job's
user, with the job's PATH and environment): the end is the supervisor's own clock when the
leader exits, or, when the supervisor died, the record file's modification time (the kernel's
clock at the leader's write). A command it cannot start is recorded `launch_failed` with the
reason, never as a job that ran. The engine's defaults (the run's work directory, the log file
under the service's job directory) are entered and opened by the supervisor before it drops to
the user, as they are the service's paths.

When the leader ends and processes of the tree are left (children it did not wait for), they get
SIGTERM at once and SIGKILL after the job's grace; the part ends when the tree is empty, and the
record says how many were left and whether they had to be killed. Files it writes:

    RUNDIR/supervisor   "PID START" of the supervisor (START: /proc start time)
    RUNDIR/job          "PID START STARTED_AT" of the leader (its session and process group id
                        is PID; STARTED_AT: when it started, seconds since the epoch)
    RUNDIR/record       the leader's own record: "exit CODE", or "failed REASON" (its mtime is
                        when the leader wrote it)
    RUNDIR/exit         the part's end, JSON: code, ended_at, leader_ended_at, left, killed,
                        launch_failed (an older supervisor wrote the bare exit code)
    RUNDIR/reaping      the leader ended leaving processes, JSON: leader_ended_at, left, kill_at
                        (their SIGKILL at the latest), code (the leader's), written before
                        their SIGTERM
    RUNDIR/launch.log   what the supervisor said of a launch that failed (or the leader, with
                        no output file of the user's)
    RUNDIR/watchdog     "PID START" of the part's lease watchdog (`start_watchdog`)

Exit codes are the shell's: the command's status, or 128 + N when signal N killed it (Slurm's
convention); 127 with `launch_failed` when it could not start. SIGTERM, SIGINT and SIGHUP sent to
the supervisor are passed on to the whole tree. It imports only the standard library and
`ledger.engines.proc`/`tree`: it is started once per job part.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

from ledger.engines.job_paths import WORKDIR, Refused, open_outputs, umask_of
from ledger.engines.lease_file import NodeLease
from ledger.engines.proc import start_time, write_atomic
from ledger.engines.tree import Containment, Tree, wait_empty
from ledger.engines.ulimits import hard_limit, plan, setter

CANNOT_START = 127
FENCE_CHECK_S = 1.0
"""How often a part with a lease looks at it."""
FENCED_MARK = "fenced"
"""`RUNDIR/fenced`: left by whichever fence (the supervisor's or the watchdog's) signals the
tree first, before it signals: the exit then says `fenced` whatever the job's exit code (a job
that exits 0 on SIGTERM, as the signal contract asks, is never taken for a completion)."""
REAPING = "reaping"
"""`RUNDIR/reaping` (module doc)."""
SHELL = "/bin/sh"
WRAPPER = r"""wd=$1 job_mask=$2
shift 2
trap : TERM INT HUP
fail() { printf 'gpuledger: %s\n' "$1" >&2; printf 'failed %s\n' "$1" >&9; exit 127; }
if [ -n "$wd" ] && [ "$wd" -ef . ]; then PWD=$wd; export PWD; fi
if [ -n "$job_mask" ]; then umask "$job_mask"; fi
case $1 in
*/*) [ -f "$1" ] && [ -x "$1" ] || fail "cannot start $1: no such executable file" ;;
*) command -v -- "$1" >/dev/null 2>&1 || fail "cannot start $1: not found in PATH" ;;
esac
printf 'started\n' >&9
exec 8>&2 2>/dev/null
("$@" 2>&8 8>&- 9>&-)
code=$?
printf 'exit %s\n' "$code" >&9
exit "$code"
"""
"""The leader of every job part (module doc): $1-$2 are the working directory the user gave
("": the supervisor's) and the job's umask as submitted (four octal digits; "": none recorded),
then the command; fd 9 is the record, and its stdout and stderr are already the job's output and
error files (`open_outputs` opened them as the user, once). With a umask, the job runs with it;
without, it keeps the umask it inherited. The submitter's soft resource limits are set before
the leader starts, as the user (`ledger.engines.ulimits`).
The shell's own stderr is closed while the command runs (it would say "Terminated" of a job
that was stopped, in the job's own output)."""
RECORD_FD = 9


def _identity(pid: int, *extra: str) -> bytes:
    """A child's identity, written before it is waited for (it may have ended already)."""
    return " ".join([str(pid), str(start_time(pid, child=True)), *extra]).encode() + b"\n"


def detach(rundir: Path) -> int:
    """Fork the supervisor off and return at once: the supervisor is then nobody's child but
    init's, so the process that started it may exit or be killed at any time without a zombie
    or a signal reaching the job. Its identity is written before this returns."""
    with contextlib.suppress(PermissionError):  # already a session leader when started so
        os.setsid()
    pid = os.fork()
    if pid == 0:
        os._exit(run(rundir))
    write_atomic(rundir / "supervisor", _identity(pid))
    return 0


def code_of(returncode: int) -> int:
    """Pure: a Popen return code as the shell says it (-N, killed by signal N: 128 + N)."""
    return returncode if returncode >= 0 else 128 - returncode


def tree_of(spec: dict[str, Any], sid: int | None = None) -> Tree:
    """The part's tree as its spec names it (`sid`: the leader's pid, its session)."""
    containment = Containment.from_json(spec.get("containment"))
    return Tree(str(spec.get("cgroup") or ""), containment, sid)


class Record(NamedTuple):
    """What the leader recorded: its command's exit code, or why it could not start it; and
    when it wrote that (the file's mtime, the kernel's clock: never a time the job wrote)."""

    code: int | None = None
    ended_at: float | None = None
    failed: str = ""


def record_says_started(rundir: Path) -> bool:
    """Whether the leader got past its working directory and output files (`started` in its
    record): the job's command runs (a launch that failed before never says so)."""
    try:
        with open(rundir / "record", "rb") as f:
            return b"started\n" in f.read(2000)
    except OSError:
        return False


def read_record(rundir: Path) -> Record | None:
    """The leader's record (module doc), if it wrote one. Bounded, and only two numbers or a
    reason are read: the leader runs as the job's user."""
    try:
        with open(rundir / "record", "rb") as f:
            written = os.fstat(f.fileno()).st_mtime
            raw = f.read(2000)
    except OSError:
        return None
    for line in raw.decode(errors="replace").splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "failed":
            return Record(code=CANNOT_START, failed=rest.strip()[:1000])
        if kind == "exit":
            try:
                return Record(code=int(rest.split()[0]), ended_at=written)
            except (ValueError, IndexError):
                return None
    return None


def _user(spec: dict[str, Any]) -> dict[str, Any]:
    """Popen arguments that run the job as the spec's uid, gid and groups (the executor looked
    them up, and refused root on someone else's behalf)."""
    who = spec.get("account")
    if not who:
        return {}
    return {"user": who["uid"], "group": who["gid"], "extra_groups": who["groups"]}


JOB_NOFILE_VAR = "GPULEDGER_JOB_NOFILE"
"""The soft open-files limit its jobs get back, set by a `serve` that raised its own to fit its
connections (`server.run._fit_descriptors`): a job never inherits the server's (atk39-25)."""


def lower_files_limit(value: str | None) -> None:
    """The soft RLIMIT_NOFILE lowered to `value` (decimal) when it is below the current one."""
    import resource

    if not value or not value.isdigit():
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = int(value)
    if soft == resource.RLIM_INFINITY or want < soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def run(rundir: Path) -> int:
    lower_files_limit(os.environ.get(JOB_NOFILE_VAR))
    spec = json.loads((rundir / "spec.json").read_bytes())
    tree = tree_of(spec)
    grace_s = float(spec.get("grace_s") or 30.0)
    job: subprocess.Popen[bytes] | None = None
    early: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if job is None:
            early.append(signum)  # passed on as soon as the job exists
            return
        tree.signal(signum)

    # handlers (not SIG_IGN): ignored signals would be inherited by the job across exec
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    failed = ""
    try:
        job = _start(rundir, spec, tree)
    except Refused as why:
        failed = str(why)
        with _private(rundir / "launch.log") as said:
            said.write(f"gpuledger: {failed}\n".encode())
    except (OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
        command = (spec.get("command") or ["true"])[0]
        failed = f"cannot start {command!r}: " + (
            e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        )
        with _private(rundir / "launch.log") as said:
            said.write(f"gpuledger: {failed}\n".encode())
    if job is None:
        _write_exit(rundir, CANNOT_START, time.time(), launch_failed=failed)
        tree.remove()
        return 0
    tree.sid = job.pid
    write_atomic(rundir / "job", _identity(job.pid, f"{time.time():.6f}"))
    for signum in early:
        forward(signum, None)
    lease = str(spec.get("lease") or "")
    if lease:
        start_watchdog(rundir, tree, lease, grace_s)
    returncode, fenced = wait_leader(job, tree, lease, grace_s, rundir / FENCED_MARK)
    code = code_of(returncode)
    leader_ended = time.time()  # the supervisor's own clock, never the job's word (module doc)
    left, killed = end_of_tree(
        tree, grace_s,
        lambda n: _write_reaping(rundir, leader_ended, n, leader_ended + grace_s, code),
    )  # fmt: skip
    record = read_record(rundir) or Record()
    _write_exit(
        rundir,
        code,
        time.time() if left else leader_ended,
        leader_ended_at=leader_ended,
        left=left,
        killed=killed,
        launch_failed=record.failed,
        fenced=fenced,
    )
    tree.remove()
    return 0


def _private(path: Path) -> Any:
    """`path` opened to append, made 0600 (what a job says may name its paths)."""
    return open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")


def _start(rundir: Path, spec: dict[str, Any], tree: Tree) -> subprocess.Popen[bytes]:
    """The leader, born in the part's groups: the supervisor joins them for the fork only. It
    starts in the working directory the user's opener opened (`/proc/self/fd/N`: that
    directory, never its name resolved again)."""
    tree.create(spec.get("gpus", ()), constrain=bool(spec.get("constrain", True)))
    with contextlib.ExitStack() as files:
        named = open_outputs(spec)  # first: a refusal leaves nothing made
        for fd in named.values():
            files.callback(os.close, fd)
        wd = named.pop(WORKDIR, None)
        log = files.enter_context(open(spec["log"], "ab")) if spec.get("log") else None
        said = files.enter_context(_private(rundir / "launch.log"))
        out = named.get("output file", log or said)
        err = named.get("error file", out)
        record = os.open(rundir / "record", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        files.callback(os.close, record)
        if record != RECORD_FD:
            os.dup2(record, RECORD_FD)
            files.callback(os.close, RECORD_FD)
        limits, cut = plan(spec.get("ulimits") or {}, hard_limit)  # the submitter's (F12)
        for line in cut:  # said where the job's errors go, as slurmstepd says it
            os.write(err if isinstance(err, int) else err.fileno(), f"{line}\n".encode())
        before = tree.join()
        try:
            return subprocess.Popen(
                [SHELL, "-c", WRAPPER, "gpuledger-job", spec.get("workdir") or "",
                 umask_of(spec), *(spec["command"] or ["true"])],
                env=spec["env"],
                cwd=f"/proc/self/fd/{wd}" if wd is not None else spec.get("cwd") or None,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=(RECORD_FD,),
                start_new_session=True,
                preexec_fn=setter(limits) if limits else None,  # as the user: never above hard
                **_user(spec),
            )  # fmt: skip
        finally:
            tree.leave(before)


def wait_leader(
    job: subprocess.Popen[bytes], tree: Tree, lease: str, grace_s: float, mark: Path | None = None
) -> tuple[int, bool]:
    """Wait for the leader; (its return code, whether the node's fence stopped it). With a
    lease, the part's own fence: once the lease has run out (its agent has not reached the
    server for as long as the server waits before it may run the job elsewhere), the tree gets
    SIGTERM, and SIGKILL after the grace: a partitioned or abandoned node never runs a job the
    ledger may have started again elsewhere."""
    if not lease:
        return job.wait(), False
    fd = os.pidfd_open(job.pid)
    fenced_at: float | None = None
    node_lease = NodeLease(lease)
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], FENCE_CHECK_S)
            if ready:  # the watchdog may have signalled first: its mark says so
                return job.wait(), fenced_at is not None or (mark is not None and mark.exists())
            now = time.time()
            if fenced_at is None and node_lease.passed(now):
                fenced_at = now
                _mark_fenced(mark)
                tree.signal(signal.SIGTERM)
            elif fenced_at is not None and now >= fenced_at + grace_s:
                tree.kill()
    finally:
        os.close(fd)


def _mark_fenced(mark: Path | None) -> None:
    """Say the fence signalled, before it does (whichever fence comes first)."""
    if mark is not None:
        with contextlib.suppress(OSError):
            write_atomic(mark, f"{time.time():.6f}\n".encode(), sync=False)


def start_watchdog(rundir: Path, tree: Tree, lease: str, grace_s: float) -> None:
    """The part's second fence, which does not depend on the supervisor: a process of its own
    (init's child, outside the job's tree, `RUNDIR/watchdog`) that stops the tree once the node's
    lease has run out, as `wait_leader` does, and exits when the tree is empty. A supervisor
    killed with -9 (OOM killer, an operator, a job running as the service's user) then leaves
    the lease enforced: a node cut off from the server never runs a job past its fence."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)  # the middle process exits at once: init adopts the watchdog
        return
    code = 0
    try:
        if os.fork():
            return
        write_atomic(rundir / "watchdog", _identity(os.getpid()))
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the supervisor's tree signals are not for it
        watch_lease(tree, lease, grace_s, rundir / FENCED_MARK)
    except BaseException:  # the forked watchdog never returns into the caller
        code = 1
    finally:
        os._exit(code)


def watch_lease(tree: Tree, lease: str, grace_s: float, mark: Path | None = None) -> None:
    """Until the tree is empty: once the lease has run out, SIGTERM to the tree, SIGKILL after
    the grace (the watchdog's loop); `mark` is left before the SIGTERM (`FENCED_MARK`)."""
    fenced_at: float | None = None
    node_lease = NodeLease(lease)
    while not tree.empty():
        now = time.time()
        if fenced_at is None and node_lease.passed(now):
            fenced_at = now
            _mark_fenced(mark)
            tree.signal(signal.SIGTERM)
        elif fenced_at is not None and now >= fenced_at + grace_s:
            tree.kill()
        time.sleep(FENCE_CHECK_S)


def end_of_tree(
    tree: Tree, grace_s: float, said: Callable[[int], None] | None = None
) -> tuple[int, bool]:
    """The leader has ended: (processes it left, whether they had to be killed). They get
    SIGTERM now and SIGKILL after the grace; returns once the tree is empty. `said` is told
    how many were left before the SIGTERM (`RUNDIR/reaping`)."""
    left = len(tree.pids())
    if not left:
        return 0, False
    if said is not None:
        said(left)
    tree.signal(signal.SIGTERM)
    if wait_empty(tree, grace_s):
        return left, False
    while not tree.empty():
        tree.kill()
        wait_empty(tree, 1.0)
    return left, True


def _write_reaping(
    rundir: Path, leader_ended_at: float, left: int, kill_at: float, code: int
) -> None:
    """`RUNDIR/reaping`: the leader ended at `leader_ended_at` with `code` leaving `left`
    processes, which get SIGKILL at `kill_at` at the latest (its agent reports the job
    stopping: atk49-23 F4; and a command that exited 0 completed: atk52-23 F2)."""
    said = {"leader_ended_at": leader_ended_at, "left": left, "kill_at": kill_at, "code": code}
    with contextlib.suppress(OSError):
        write_atomic(rundir / REAPING, json.dumps(said).encode() + b"\n")


class Reaped(NamedTuple):
    """`RUNDIR/reaping` (module doc); `code`: the leader's exit code (None: an older supervisor
    wrote it)."""

    leader_ended_at: float
    left: int
    kill_at: float
    code: int | None = None


def read_reaping(rundir: Path) -> Reaped | None:
    """`RUNDIR/reaping`, if the supervisor wrote it."""
    try:
        said = json.loads((rundir / REAPING).read_bytes())
        code = said.get("code")
        return Reaped(float(said["leader_ended_at"]), int(said["left"]), float(said["kill_at"]),
                      None if code is None else int(code))  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_exit(rundir: Path, code: int, ended_at: float, **more: Any) -> None:
    record = {"code": code, "ended_at": ended_at, **more}
    write_atomic(rundir / "exit", json.dumps(record).encode() + b"\n")


class Forked:
    """A supervisor's starter made by forking this process: the child closes every inherited
    descriptor (the state directory's lock above all, so it never outlives us), then detaches
    the supervisor exactly as `python -m ledger.engines.supervise` does, and exits."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    @classmethod
    def start(cls, rundir: Path) -> Forked:
        pid = os.fork()
        if pid == 0:  # the starter: never returns into the caller's code
            code = 1
            try:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.closerange(3, 65536)
                code = detach(rundir)
            finally:
                os._exit(code)
        return cls(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


if __name__ == "__main__":
    sys.exit(detach(Path(sys.argv[1])))
