"""The whole-log audits through the server (`GET /v1/audit/verify`, `GET /v1/audit/check`):
their lanes, and each one under way as a `Walk` that ends when nobody waits for it.

A walk's time grows with the log (~60 s at a million events on a loaded 2-core machine), so no
fixed deadline of the client's fits it. Asked with `Accept: application/x-ndjson` (the CLI
does), the answer is streamed as `docker pull`'s is: a line with the walk's step at least every
`HEARTBEAT_S` while it runs (waiting for its turn, then each stage's events done of its total),
then one line with its result or its error (`api.AuditFrame`); the client's timeout is then the
longest silence between two lines, not the walk's length. Asked for plain JSON, the one answer
comes when the walk ends, as before.

Either way the walk stops at its next step (every 1,000 events at most, well under a second)
once its caller has gone (the connection closed: a Ctrl-C, a client's timeout) or the server
stops: a walk nobody waited for went on for a minute, kept its person's next one 429, and held
the server's exit 51-92 s after SIGTERM (atk47-29 F2, F10).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import msgspec
from litestar import Request
from litestar.response import Stream

from ledger.server.fairlane import FairSlot
from schemas import api
from schemas.errors import LedgerError, TooBusy, Unavailable

T = TypeVar("T")

NDJSON = "application/x-ndjson"

HEARTBEAT_S = 1.0
"""The longest a streamed audit stays silent: a line of its step at least this often."""

STEP_S = 0.25
"""How often a streamed audit's step is looked at (a line when it moved)."""


class Abandoned(Exception):
    """Raised on an audit's thread at its next step once nobody waits for it."""


class AuditLane:
    """One whole-log audit of each kind at a time, the people waiting served in turn (one of a
    person's under way or waiting, 16 waiting: past either 429), on one thread at nice 10;
    after a person's audit of a kind that took t (`FREE_S` or more), none of theirs of that
    kind starts before `REST` x t later: one person looping them keeps each walk busy a quarter
    of the time at most (their threads share the interpreter with the worker and the event
    loop: looped, they slowed another's submits 2-2.5x, atk44-25 F5)."""

    NICE = 10
    REST = 3.0
    FREE_S = 0.5
    """An audit shorter than this (a small ledger's) leaves no rest."""

    def __init__(self, admin: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.admin = admin
        self.clock = clock
        self.slots = {kind: FairSlot(f"an audit {kind}") for kind in ("verify", "check")}
        """One of each kind at a time, the people waiting served in turn (`FairSlot`): with a
        429 to whoever came while one ran, four plain users rotating them kept a fifth
        person's verify refused for good (atk44w F2)."""
        self.steps: dict[str, api.AuditStep] = {}
        """How far each audit under way is (`/v1/audit/progress`)."""
        self.rested: dict[str, float] = {}
        """When each person's rest after their last audit of a kind ends ("kind\0person")."""
        self._threads: ThreadPoolExecutor | None = None

    def refuse(self, kind: str, person: str) -> None:
        """TooBusy now when `person` may not start an audit of `kind` (resting, one of theirs
        under way or waiting, too many waiting): said before any answer is begun."""
        now, whose = self.clock(), f"{kind}\0{person}"
        self.rested = {p: t for p, t in self.rested.items() if t > now}
        if whose in self.rested:
            wait = math.ceil(self.rested[whose] - now)
            raise TooBusy(f"{person!r} ran an audit {kind} a moment ago: the next starts "
                          f"{self.REST:g} times its time later", hint=f"retry in {wait} s",
                          retry_after=wait)  # fmt: skip
        self.slots[kind].refuse(person)

    @contextlib.asynccontextmanager
    async def hold(self, kind: str, person: str = "") -> AsyncIterator[None]:
        self.refuse(kind, person)
        async with self.slots[kind].hold(person):
            began = self.clock()
            try:
                yield
            finally:
                self.steps.pop(kind, None)
                ended = self.clock()
                whose = f"{kind}\0{person}"
                if person and ended - began >= self.FREE_S:  # (unnamed: no rest)
                    self.rested[whose] = max(
                        self.rested.get(whose, 0.0), ended + self.REST * (ended - began)
                    )

    async def run(self, fn: Callable[[], T], walk: Walk | None = None) -> T:
        """`fn` on the lane's thread (nice 10). Cancelled meanwhile, `walk` is left (its next
        step raises `Abandoned`) and its thread waited for, so nothing of it runs on after."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(2, "audit", initializer=self._lower_priority)
        done = asyncio.get_running_loop().run_in_executor(self._threads, fn)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            if walk is not None:
                walk.left.set()
            with contextlib.suppress(BaseException):
                await done  # a step away: it raises Abandoned
            raise

    def _lower_priority(self) -> None:
        with contextlib.suppress(OSError):  # Linux: a thread's nice value is its own
            me = threading.get_native_id()
            # never above the server's own (root may raise it: a server under `nice 19` had
            # its audits at 10)
            os.setpriority(os.PRIO_PROCESS, me, max(self.NICE, os.getpriority(os.PRIO_PROCESS, me)))


class Walk:
    """One whole-log audit under way: where it is (`step`, told from its thread) and whether
    anyone still waits for it (`left`; `stopping`: the server stops)."""

    def __init__(self, kind: str, lane: AuditLane, stopping: Callable[[], bool]) -> None:
        self.kind = kind
        self.lane = lane
        self.stopping = stopping
        self.left = threading.Event()
        self.step = api.AuditStep(done=0, total=0, stage="waiting")
        self.task: asyncio.Task[Any] | None = None

    def told(self, stage: str, done: int, total: int) -> None:
        """On the audit's thread, at each step (`tamper.Steps`): where it is; `Abandoned` once
        nobody waits for it."""
        if self.left.is_set() or self.stopping():
            raise Abandoned(self.kind)
        # a whole Struct replaced at once: a reader on the loop sees one or the other
        self.step = api.AuditStep(done=done, total=max(total, done), stage=stage)
        self.lane.steps[self.kind] = self.step

    def leave(self) -> None:
        """Nobody waits for it any more: it stops at its next step (or where it waits)."""
        self.left.set()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def result_line(self) -> bytes:
        """The streamed answer's last line: the result, or the error it ended with."""
        assert self.task is not None and self.task.done()
        err: BaseException | None
        err = Unavailable("the audit was stopped") if self.task.cancelled() else None
        if err is None:
            err = self.task.exception()
        if err is None:
            return b'{"result":' + msgspec.json.encode(self.task.result()) + b"}\n"
        return msgspec.json.encode(api.AuditFrame(error=_problem(err))) + b"\n"


def start(
    request: Request[Any, Any, Any],
    lane: AuditLane,
    kind: str,
    person: str,
    admitted: contextlib.AbstractContextManager[Any],
    stopping: Callable[[], bool],
    work: Callable[[Walk], Awaitable[Any]],
) -> Awaitable[Any]:
    """Start `work` as `person`'s audit of `kind` in `lane`, once admitted (`admitted`, one of
    their reads) and in their turn; refused (429) before any answer is begun. Returns what the
    handler answers: a stream of `api.AuditFrame` lines when the caller accepts NDJSON, else
    the result when the walk ends. Either way the walk is left when its caller goes."""
    lane.refuse(kind, person)
    stack = contextlib.ExitStack()
    stack.enter_context(admitted)  # 429 past the person's reads, at once
    walk = Walk(kind, lane, stopping)

    async def run() -> Any:
        async with lane.hold(kind, person):
            if stopping():
                raise Unavailable("the server is stopping", hint="retry once it is back")
            try:
                return await work(walk)
            except Abandoned:
                raise Unavailable("the server stopped before the audit ended",
                                  hint="retry once it is back") from None  # fmt: skip

    walk.task = asyncio.ensure_future(run())
    # the read admitted is given back when the walk ends, however (cancelled before it began too)
    walk.task.add_done_callback(lambda _: stack.close())
    if NDJSON in request.headers.get("accept", ""):
        return _streamed(walk)
    return _awaited(request, walk)


async def _streamed(walk: Walk) -> Stream:
    # the header said outright: the handler's own media type (JSON) wins over a Stream's
    return Stream(_frames(walk), media_type=NDJSON, headers={"content-type": NDJSON})


async def _frames(walk: Walk) -> AsyncIterator[bytes]:
    """The walk's steps, a line when it moved or `HEARTBEAT_S` passed, then its end; left when
    the stream stops early (Litestar cancels it when the client disconnects)."""
    assert walk.task is not None
    loop = asyncio.get_running_loop()
    try:
        last, said = None, -math.inf
        while True:
            await asyncio.wait({walk.task}, timeout=STEP_S)
            if walk.task.done():
                break
            if walk.step != last or loop.time() - said >= HEARTBEAT_S:
                last, said = walk.step, loop.time()
                yield msgspec.json.encode(api.AuditFrame(step=last)) + b"\n"
        yield walk.result_line()
    finally:
        walk.leave()


async def _awaited(request: Request[Any, Any, Any], walk: Walk) -> Any:
    """The walk's result as the one answer; left (and its task waited for) when the client
    disconnects first or the handler is cancelled (the server's stop)."""
    assert walk.task is not None
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({walk.task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not walk.task.done():
            walk.leave()
    with contextlib.suppress(BaseException):
        await walk.task
    if walk.task.cancelled():  # the client has gone: nobody reads this
        raise Unavailable("the audit was stopped: its caller left")
    return walk.task.result()


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    """Returns once the client has closed its connection (a GET's body read first)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _problem(err: BaseException) -> api.Problem:
    from ledger.server.app import status_of

    if isinstance(err, LedgerError):
        return api.Problem(title=err.code, status=status_of(err), detail=err.line(),
                           code=err.code, message=err.message, hint=err.hint)  # fmt: skip
    return api.Problem(title="internal", status=500, detail=f"internal error: "
                       f"{type(err).__name__}", code="internal")  # fmt: skip
