"""The job page's replays in a process of their own (docs/security.md, row T6): a replay walks
the log from its start, in Python; on a thread of the server it would take the interpreter lock
from the thread that runs the dispatcher and the group commit (the cycle took three times as
long while one ran). Here it runs in a child process at a lower priority (nice 10), which dies
with the server.

`replay(home, decisions)` (the server side, async) sends the decisions to
`python -m ledger.server.replays` on its stdin and reads the replays back from its stdout, as
msgspec MessagePack; `main()` is the child.

An edge: a process, pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from pathlib import Path

import msgspec

from ledger.history.compare import CycleReplay
from schemas import events as e

NICE = ("nice", "-n", "10") if shutil.which("nice") else ()
"""The child starts at the lower priority, its imports included (`main` lowers it too)."""


class _Job(msgspec.Struct, frozen=True):
    home: str
    parent: int
    decisions: list[tuple[int, e.CycleDecided]]


async def replay(home: Path, decisions: list[tuple[int, e.CycleDecided]]) -> list[CycleReplay]:
    """The replays of `decisions` (in log order) of the log in `home`, from a child process."""
    job = msgspec.msgpack.encode(_Job(str(home), os.getpid(), decisions))
    proc = await asyncio.create_subprocess_exec(
        *NICE, sys.executable, "-m", "ledger.server.replays",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await proc.communicate(job)
    finally:
        if proc.returncode is None:  # the request was cancelled: the replay is not needed
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"replay exited with {proc.returncode}: {last[0]}")
    return msgspec.msgpack.decode(out, type=list[CycleReplay])


def main() -> None:
    """The child: read the job, replay, write the replays; die with the server."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: dies with the server
    with contextlib.suppress(OSError):
        os.nice(max(0, 10 - os.nice(0)))  # nice 10, whether `nice` started it or not
    job = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=_Job)
    if os.getppid() != job.parent:  # the server died before the line above
        sys.exit(1)
    from ledger.history import replay as rp
    from ledger.store.locate import open_source

    with open_source(Path(job.home)) as source:
        done = list(rp.replay_decisions(source, job.decisions))
    sys.stdout.buffer.write(msgspec.msgpack.encode(done))


if __name__ == "__main__":
    main()
