"""The per-job supervisor: `python -m ledger.engines.supervise RUNDIR`.

Like slurmstepd, one small process per job part is the job's parent, so the service (or a node
agent) can stop, crash or restart without touching the job. It detaches (a new session, then a
fork whose parent exits at once, so init adopts it), starts
the job in its own process group (pgid = the job's pid) with the environment, user and log named
in `RUNDIR/spec.json`, and when the job ends writes its exit code to `RUNDIR/exit` (atomically;
negative = killed by that signal). Files it writes:

    RUNDIR/supervisor   "PID START" of the supervisor (START: /proc start time)
    RUNDIR/job          "PID START" of the job (its process group id is PID)
    RUNDIR/exit         the job's exit code

SIGTERM, SIGINT and SIGHUP sent to the supervisor are passed on to the job's process group.
It imports only the standard library and `ledger.engines.proc`: it is started once per job part.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from ledger.engines.proc import start_time, write_atomic

CANNOT_START = 127


def _identity(pid: int) -> bytes:
    return f"{pid} {start_time(pid)}\n".encode()


def _as_user(spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """Popen arguments that run the job as `spec["user"]` (only when we are root)."""
    name = spec.get("user")
    if not name:
        return {}
    pw = pwd.getpwnam(name)
    env.update(USER=pw.pw_name, LOGNAME=pw.pw_name, HOME=pw.pw_dir)
    return {
        "user": pw.pw_uid,
        "group": pw.pw_gid,
        "extra_groups": os.getgrouplist(pw.pw_name, pw.pw_gid),
    }


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


def run(rundir: Path) -> int:
    spec = json.loads((rundir / "spec.json").read_bytes())
    env: dict[str, str] = dict(spec["env"])
    job: subprocess.Popen[bytes] | None = None
    early: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if job is None:
            early.append(signum)  # passed on as soon as the job exists
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signum)

    # handlers (not SIG_IGN): ignored signals would be inherited by the job across exec
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    with open(spec["log"], "ab") as log:
        try:
            user = _as_user(spec, env)
            job = subprocess.Popen(
                spec["command"],
                env=env,
                cwd=spec.get("cwd") or None,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
                **user,
            )
        except (OSError, KeyError, subprocess.SubprocessError) as e:
            why = e.strerror if isinstance(e, OSError) else str(e)
            log.write(f"gpuledger: cannot start {spec['command'][0]!r}: {why}\n".encode())
            code = CANNOT_START
        else:
            write_atomic(rundir / "job", _identity(job.pid))
            for signum in early:
                forward(signum, None)
            code = job.wait()
    write_atomic(rundir / "exit", f"{code}\n".encode())
    return 0


if __name__ == "__main__":
    sys.exit(detach(Path(sys.argv[1])))
