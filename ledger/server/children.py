"""Work the server hands to a child process of its own (the job page's replays, the budget
page's what-ifs): a walk of the log or a simulation in Python would take the interpreter lock
from the thread that runs the dispatcher and the group commit. The child always runs at a lower
priority than the server (`lowered`: 10 steps nicer, and below every nice level when the server
runs at nice 10 or more), dies with the server, and is killed at its time limit. The server's
priority is its lowest thread's (`server_priority`): a renice of its main thread alone leaves
the threads that do its work where they were (atk53-29 F4).

`run(module, payload, timeout_s)` (the server side, async) starts `python -m MODULE`, sends it
`payload` on its stdin and returns its stdout; `enter(parent)` is the child's first step.

An edge: a process, pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

STEPS = 10
"""A child runs this many nice levels below the server (`lowered`)."""

READER = b"gpuledger-reads"
"""The OS name (`comm`, 15 bytes at most) of the read pool's threads, which lower themselves to
serve reads below the service (`mark_reader`): not the server's working level, so
`server_priority` passes them by (they made every child `SCHED_IDLE` at 19: atk54-29 F1)."""


def mark_reader() -> None:
    """Name the calling thread `READER` (Linux `PR_SET_NAME`; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(READER))  # PR_SET_NAME: this thread's


def lowered(server_nice: int, server_idle: bool = False) -> tuple[int, bool]:
    """Pure: the nice level of a child of a server running at `server_nice`, `STEPS` above it
    (at most 19), and whether it is also `SCHED_IDLE` (below every nice level: it runs on what
    nothing else wants): when the cap leaves it fewer than `STEPS` levels below the server, or
    when the server runs `SCHED_IDLE` itself (`server_idle`; then at nice 19 too: no class is
    below `SCHED_IDLE`, so the child is the server's equal at best, which `_lowering` logs).
    At nice 10 whatever the server's, a child beside a server at nice 19 was the server's
    equal, and others' reads were ~3x slower while it ran (atk52-29 F2)."""
    if server_idle:
        return 19, True
    nice = min(19, server_nice + STEPS)
    return nice, nice - server_nice < STEPS


IDLE = getattr(os, "SCHED_IDLE", 5)


def server_priority(pid: int) -> tuple[int, bool]:
    """The lowest priority of any thread of process `pid`: the highest nice level among them,
    and whether any runs `SCHED_IDLE` (from `/proc/PID/task/*/stat`; the process's own where
    that cannot be read). Nice levels and scheduling classes are per thread on Linux: `renice
    -p PID` changes the main thread alone, and the child was set below it while nine of the
    server's threads stayed at 19, below the child at 10 (atk53-29 F4); a server under
    `SCHED_IDLE` had a child under `SCHED_OTHER`-derived rules read from its nice alone (F3)."""
    nices: list[int] = []
    idle = False
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            try:
                with open(os.path.join(task.path, "stat"), "rb") as f:
                    stat = f.read()
                fields = stat.rsplit(b")", 1)[1].split()
            except OSError:  # a thread that ended meanwhile
                continue
            if stat.split(b" (", 1)[1].rsplit(b")", 1)[0] == READER:
                continue  # a reader lowered on purpose (`READER`)
            nices.append(int(fields[16]))  # field 19 of proc(5): nice
            idle = idle or int(fields[38]) == IDLE  # field 41: policy
    if not nices:
        nices.append(os.getpriority(os.PRIO_PROCESS, pid))
        with contextlib.suppress(OSError, AttributeError):
            idle = os.sched_getscheduler(pid) == IDLE
    return max(nices), idle


_told_idle: list[bool] = []


def _lowering() -> tuple[str, ...]:
    """The command that starts a child at its priority (`lowered` of the server's now), its
    imports included (`enter` lowers it too, whether these started it or not)."""
    server_nice, server_idle = server_priority(os.getpid())
    if server_idle and not _told_idle:
        _told_idle.append(True)
        import logging

        logging.getLogger("gpuledger.server").warning(
            "the server runs under SCHED_IDLE: its what-if and replay children cannot run below "
            "it (no class is lower) and share the CPU with it as equals; run it under `nice -n "
            "19` instead, and its children run under SCHED_IDLE, below it"
        )
    _, idle = lowered(server_nice, server_idle)
    prefix: tuple[str, ...] = ("nice", "-n", str(STEPS)) if shutil.which("nice") else ()
    if idle and shutil.which("chrt"):
        prefix = ("chrt", "--idle", "0", *prefix)
    return prefix


class TimedOut(Exception):
    """The child ran past its time limit and was killed."""


PROGRESS = b"progress: "
"""A child's stderr line telling how far it is: `progress: DONE TOTAL` (`tell`)."""


async def run(
    module: str,
    payload: bytes,
    timeout_s: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> bytes:
    """The stdout of `python -m module` fed `payload`; RuntimeError (its last stderr line) when
    it fails, `TimedOut` when it runs past `timeout_s` (it is killed, as it is when the request
    is cancelled). `progress(done, total)`: called for each line the child `tell`s, as it comes."""
    proc = await asyncio.create_subprocess_exec(
        *_lowering(), sys.executable, "-m", module,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, limit=1 << 20,
    )  # fmt: skip
    try:
        talk = proc.communicate(payload) if progress is None else _told(proc, payload, progress)
        out, err = await asyncio.wait_for(talk, timeout_s)
    except TimeoutError as exc:
        raise TimedOut(module) from exc
    finally:
        if proc.returncode is None:  # cancelled or out of time: the answer is not needed
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"{module} exited with {proc.returncode}: {last[0]}")
    return out


async def _told(
    proc: Any, payload: bytes, progress: Callable[[int, int], None]
) -> tuple[bytes, bytes]:
    """`proc.communicate(payload)`, its stderr read line by line as it comes: the `tell`
    lines given to `progress`, the rest kept (the last says why it failed)."""
    kept: list[bytes] = []

    async def errors() -> None:
        async for line in proc.stderr:
            if not line.startswith(PROGRESS):
                kept.append(line)
                continue
            with contextlib.suppress(ValueError):
                done, total = (int(x) for x in line[len(PROGRESS) :].split())
                progress(done, total)

    proc.stdin.write(payload)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        await proc.stdin.drain()
    proc.stdin.close()
    out, _ = await asyncio.gather(proc.stdout.read(), errors())
    await proc.wait()
    return out, b"".join(kept)


def tell(done: int, total: int, said: list[int]) -> None:
    """In the child: `progress: DONE TOTAL` on stderr when the whole percent changed since the
    last said (`said`, kept by the caller): at most about a hundred lines."""
    percent = 100 * done // max(1, total)
    if said and said[-1] == percent:
        return
    said[:] = [percent]
    sys.stderr.buffer.write(PROGRESS + f"{done} {total}\n".encode())
    sys.stderr.flush()


WATCH_S = 0.25
"""How often `attended` looks whether the server stops."""


async def attended(
    receive: Callable[[], Awaitable[Mapping[str, Any]]],
    stopping: Callable[[], bool],
    work: Awaitable[T],
    what: str,
) -> T:
    """`work` (a child's `run`) for a request: cancelled (its child killed) once the client has
    gone (`receive` says `http.disconnect`) or the server stops (`stopping()`, looked at every
    `WATCH_S`), then Unavailable in one line. A what-if whose client left ran on to its end
    holding the what-if slot, and a stop held 10 s for uvicorn's graceful timeout, then answered
    a plain-text 500 and logged a traceback (atk49-29 F11, F12): as the audit walks do."""
    from schemas.errors import Unavailable

    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        while not task.done():
            await asyncio.wait({task, gone}, timeout=WATCH_S, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                break
            if gone.done():
                raise Unavailable(f"the {what} was stopped: its caller left")
            if stopping():
                raise Unavailable(
                    f"the server stopped before the {what} ended", hint="retry once it is back"
                )
        return task.result()
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task  # its child killed and waited for (`run`)


async def attended_turn(
    receive: Callable[[], Awaitable[Mapping[str, Any]]],
    stopping: Callable[[], bool],
    slot: Any,
    person: str,
    work: Callable[[], Awaitable[T]],
    what: str,
    about: Any = None,
) -> T:
    """`work()` in `person`'s turn of `slot` (a `fairlane.FairSlot`), the wait for the turn
    attended too: a request whose client leaves while it waits leaves the line at once (its
    place and its person's count freed), as one leaving while its work runs does. Waited
    unattended, an abandoned what-if kept its person's only what-if slot until every what-if
    ahead of it had run: her next question was refused 429 "a what-if of yours is under way"
    for 199 s (atk50-29 F1). `about`: what the work is about (`FairSlot.asked`)."""

    async def turn() -> T:
        async with slot.hold(person, about):
            return await work()

    return await attended(receive, stopping, turn(), what)


async def never() -> Mapping[str, Any]:
    """A `receive` that never says the client left: for work whose response watches it
    (a streamed answer, cancelled by the framework when its client leaves)."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def _disconnected(receive: Callable[[], Awaitable[Mapping[str, Any]]]) -> None:
    """Returns once the client has closed its connection (the request's body read first)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def enter(parent: int) -> None:
    """The child's first step once it knows the server's pid: die with the server, run below
    it (`lowered` of the server's nice, whether `_lowering` started it so or not); exit if the
    server is gone already."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: dies with the server
    with contextlib.suppress(OSError):
        nice, idle = lowered(*server_priority(parent))
        os.nice(max(0, nice - os.nice(0)))
        if idle:  # a process may always lower itself to SCHED_IDLE
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    if os.getppid() != parent:  # the server died before the lines above
        sys.exit(1)
