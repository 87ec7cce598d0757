"""The one thread that touches the ledger, the projection and the executor in `serve`.

HTTP handlers hand it tasks and await the answer. It batches every write that is waiting into
one store transaction (group commit: `Ledger.execute_each`, each command still decided and
rejected on its own), runs reads in order, and runs a dispatcher cycle whenever one is due.
Nothing is acknowledged before its transaction has committed.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ledger.application import Appended
from ledger.loop import ServiceLoop, wait_time
from schemas.commands import AnyCommand
from schemas.errors import LedgerError, Unavailable

log = logging.getLogger("gpuledger.server")


@dataclass
class _Task:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    command: AnyCommand | None = None
    call: Callable[[], Any] | None = None


@dataclass
class Worker:
    service: ServiceLoop
    tick_s: float = 2.0
    max_batch: int = 256
    accepting: bool = True
    _queue: queue.SimpleQueue[_Task | None] = field(default_factory=queue.SimpleQueue)
    quiet_s: float = 0.05
    """How long the log must stay still before `idle` hooks run (not between a burst's writes)."""
    idle: list[Callable[[], bool | None]] = field(default_factory=list)
    """Run on the worker thread once the log has moved and then stayed still for `quiet_s`
    (the read cache computes the queue preview ahead of the first read); a hook that returns
    True has more to do and is called again after the next `quiet_s`."""
    _thread: threading.Thread | None = None
    _next_cycle: float = 0.0
    _moved_at: float | None = None

    # --- the HTTP side ---------------------------------------------------------------------------

    async def execute(self, command: AnyCommand) -> Appended:
        """Append one command (group-committed with whatever else is waiting)."""
        if not self.accepting:
            raise Unavailable("the server is stopping and takes no more writes", hint="retry")
        return await self._submit(_Task(*self._future(), command=command))  # type: ignore[no-any-return]

    async def call(self, fn: Callable[[], Any], *, write: bool = False) -> Any:
        """Run `fn` on the worker thread (reads, and atomic batches when `write`)."""
        if write and not self.accepting:
            raise Unavailable("the server is stopping and takes no more writes", hint="retry")
        return await self._submit(_Task(*self._future(), call=fn))

    def _future(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]:
        loop = asyncio.get_running_loop()
        return loop, loop.create_future()

    async def _submit(self, task: _Task) -> Any:
        self._queue.put(task)
        return await task.future

    # --- the thread ------------------------------------------------------------------------------

    def start(self) -> None:
        self._moved_at = time.monotonic()  # what the reads build on is computed ahead at start
        self._thread = threading.Thread(target=self._run, name="ledger-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Finish what is queued and the current cycle, then end the thread."""
        self.accepting = False
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        self._next_cycle = time.monotonic()
        stopping = False
        while not stopping:
            wake = self._next_cycle
            if self._moved_at is not None:
                wake = min(wake, self._moved_at + self.quiet_s)
            timeout = max(0.0, wake - time.monotonic())
            tasks: list[_Task] = []
            try:
                first = self._queue.get(timeout=timeout)
            except queue.Empty:
                first = None
                timeout = -1.0
            if first is None and timeout >= 0:
                stopping = True
            elif first is not None:
                tasks.append(first)
            elif self._moved_at is not None and time.monotonic() >= self._moved_at + self.quiet_s:
                self._when_idle()
            while len(tasks) < self.max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                    continue
                tasks.append(more)
            self._handle(tasks)
            if time.monotonic() >= self._next_cycle or stopping:
                self._cycle()

    def _when_idle(self) -> None:
        self._moved_at = None
        for hook in self.idle:
            try:
                more = hook()
            except Exception:  # ahead-of-time work only: the read that needs it will say why
                log.exception("idle work failed")
                continue
            if more:
                self._moved_at = time.monotonic()
            if not self._queue.empty():
                self._moved_at = time.monotonic()
                break  # requests first; the rest at the next idle moment

    def _handle(self, tasks: list[_Task]) -> None:
        writes = [t for t in tasks if t.command is not None]
        if tasks:  # writes, and calls that may write (batches, agents' reports)
            self._moved_at = time.monotonic()
        if writes:
            try:
                results: list[Any] = list(
                    self.service.ledger.execute_each([t.command for t in writes])  # type: ignore[misc]
                )
            except Exception as err:  # the store failed: nobody is acknowledged
                log.exception("group commit failed")
                results = [err] * len(writes)
            _resolve_all(list(zip(writes, results, strict=True)))
        for t in tasks:
            if t.call is not None:
                try:
                    result = t.call()
                except Exception as err:
                    if not isinstance(err, LedgerError):
                        log.exception("read failed")
                    result = err
                _resolve_all([(t, result)])

    def _cycle(self) -> None:
        self._moved_at = time.monotonic()
        clock = self.service.clock
        try:
            result = self.service.step(clock.now())
        except LedgerError as err:
            log.error("cycle failed: %s", err.line())
            self._next_cycle = time.monotonic() + self.tick_s
            return
        except Exception:
            log.exception("cycle failed")
            self._next_cycle = time.monotonic() + self.tick_s
            return
        self._next_cycle = time.monotonic() + wait_time(result, self.tick_s, clock.now())


def _resolve_all(done: list[tuple[_Task, Any]]) -> None:
    """Hand the results to the HTTP side: one wake-up of each event loop for the whole batch
    (a group commit of 8 answers 8 requests with one call, not 8)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Task, Any]]] = {}
    for task, result in done:
        by_loop.setdefault(task.loop, []).append((task, result))
    for loop, settled in by_loop.items():
        loop.call_soon_threadsafe(_settle, settled)


def _settle(settled: list[tuple[_Task, Any]]) -> None:
    for task, result in settled:
        if task.future.done():
            continue
        if isinstance(result, BaseException):
            task.future.set_exception(result)
        else:
            task.future.set_result(result)
