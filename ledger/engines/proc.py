"""Process identity from /proc, and atomic file writes. An edge: reads the OS.

A pid alone is not an identity (pids are reused); a pid plus its start time (clock ticks since
boot, field 22 of /proc/PID/stat) is.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


def start_time(pid: int, *, child: bool = False) -> int | None:
    """The start time of live process `pid`, or None when it is gone or a zombie. `child`: the
    caller's own child, not reaped yet, whose start time counts even once it is a zombie (the
    pid cannot be reused before the caller waits for it): a job that ended before its
    supervisor wrote its identity was named `PID None`, and every reader lost its tree (CI of
    stop 58: a child it left on the GPU was not counted live)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name (field 2) may hold spaces and ')': fields are counted after the last ')'
    fields = raw[raw.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X") and not child:
        return None
    return int(fields[19])


def alive(pid: int | None, started: int | None) -> bool:
    """True when `pid` runs and is the same process that started at `started`."""
    if pid is None or started is None:
        return False
    return start_time(pid) == started


def write_atomic(path: Path, data: bytes, *, sync: bool = True, mode: int = 0o666) -> None:
    """Write `data` so readers see the old content or the new, never a part (rename is atomic);
    `sync`: on disk before the rename (fsync), so a crash of the machine keeps it too; `mode`:
    the file's mode (less the umask) from its creation on, never wider for an instant."""
    # one temporary name per thread: an agent's threads renew its lease at once (a name per
    # process made one thread's rename fail on another's unlinked file: the agent died, atk39-25 F5)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # a leftover of a crash keeps its mode: made anew
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
