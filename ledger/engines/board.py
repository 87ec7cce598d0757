"""What each node's agent should run (`Board`), as the node agents' executor
(`ledger.engines.agents`) publishes it and the agent API (`ledger.server.agent_api`) serves it to
long-polls. An edge (threads and the event loop)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from schemas import agent as a

if TYPE_CHECKING:
    from ledger.core.state import StoppedRun


class Board:
    """What each node's agent should run, published by the worker thread and read by the HTTP
    threads: a version per node that changes with the list, and long-polls woken on change."""

    def __init__(self) -> None:
        self.epoch = secrets.token_hex(4)
        """Versions of another server process never match ours."""
        self._lock = threading.Lock()
        self._lists: dict[str, tuple[int, tuple[a.Part, ...]]] = {}
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}
        self._kills: dict[str, tuple[a.PartRun, ...]] = {}
        """Node -> the stopped runs there to kill at once (`Assignment.kill`), sent with its
        list from its next publish on."""

    def order_kills(self, node: str, kills: tuple[a.PartRun, ...]) -> None:
        with self._lock:
            if kills:
                self._kills[node] = kills
            else:
                self._kills.pop(node, None)

    def order_all_kills(self, kills: dict[str, tuple[a.PartRun, ...]]) -> set[str]:
        """Every node's kill list made `kills` (`kills_by_node`; a node not in it: none); the
        nodes whose list changed (to publish)."""
        changed: set[str] = set()
        for node in sorted(kills.keys() | self.killing()):
            if self.kills(node) != kills.get(node, ()):
                self.order_kills(node, kills.get(node, ()))
                changed.add(node)
        return changed

    def kills(self, node: str) -> tuple[a.PartRun, ...]:
        with self._lock:
            return self._kills.get(node, ())

    def killing(self) -> set[str]:
        """The nodes with runs to kill."""
        with self._lock:
            return set(self._kills)

    def version(self, node: str) -> str:
        with self._lock:
            return f"{self.epoch}.{self._lists.get(node, (0, ()))[0]}"

    def number(self, node: str) -> int:
        """The node's list version number (the part after the epoch)."""
        with self._lock:
            return self._lists.get(node, (0, ()))[0]

    def publish(self, node: str, parts: tuple[a.Part, ...]) -> None:
        with self._lock:
            n = self._lists.get(node, (0, ()))[0] + 1
            self._lists[node] = (n, parts)
            waiters = self._waiters.pop(node, [])
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_settle, fut)

    def current(self, node: str) -> tuple[str, tuple[a.Part, ...]]:
        with self._lock:
            n, parts = self._lists.get(node, (0, ()))
            return f"{self.epoch}.{n}", parts

    async def wait(self, node: str, since: str, timeout_s: float) -> tuple[str, tuple[a.Part, ...]]:
        """The node's list once its version differs from `since`, or after `timeout_s`."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            n, parts = self._lists.get(node, (0, ()))
            if f"{self.epoch}.{n}" != since or timeout_s <= 0:
                return f"{self.epoch}.{n}", parts
            self._waiters.setdefault(node, []).append((loop, fut))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(fut, timeout_s)
        with self._lock:
            waiting = self._waiters.get(node, [])
            if (loop, fut) in waiting:
                waiting.remove((loop, fut))
        return self.current(node)


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def kills_by_node(
    stopped: Mapping[tuple[int, int], StoppedRun],
    jobs: Iterable[int],
    now: float,
    default_grace_s: float,
) -> dict[str, tuple[a.PartRun, ...]]:
    """Pure: the stopped runs of `jobs` (`Orders.kills`) to SIGKILL now (`StoppedRun.kill_due`:
    a second cancel ordered it, or their grace from the recorded stop has passed), listed per
    node they hold GPUs on (`Assignment.kill`)."""
    want = set(jobs)
    kills: dict[str, list[a.PartRun]] = {}
    for (job_id, run), sr in sorted(stopped.items()):
        if job_id in want and sr.kill_due(now, default_grace_s):
            for node in dict.fromkeys(sl.node for sl in sr.slots):
                kills.setdefault(node, []).append(a.PartRun(job_id=job_id, run=run))
    return {node: tuple(runs) for node, runs in kills.items()}
