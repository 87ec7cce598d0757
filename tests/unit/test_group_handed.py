"""The commands one event loop gathers for a group commit reach the worker thread as one item
of its queue (`Worker._commit`): one wake-up of the thread, and the whole group in its next
turn (a put per command was a tenth of the event loop's time under bench_pg, and the thread,
woken by the first, could take a part of the group)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from ledger.server.worker import Worker
from schemas.commands import HoldJob


class Acting:
    """A leader's lease far from its end."""

    def __init__(self) -> None:
        self.lease = SimpleNamespace(deadline=time.monotonic() + 600)

    def away(self) -> None:
        return None

    def acting(self) -> bool:
        return True


def test_a_gathered_group_is_one_item_of_the_workers_queue() -> None:
    worker = Worker(service=None)  # type: ignore[arg-type]
    worker.ha = Acting()  # type: ignore[assignment]
    command = HoldJob(actor="alice", job_id=1)

    async def gather() -> list[Any]:
        writes = [asyncio.ensure_future(worker.execute(command)) for _ in range(5)]
        for _ in range(20):  # the event loop's turns: the group gathered, then handed on
            await asyncio.sleep(0)
        items = []
        while not worker._queue.empty():
            items.append(worker._queue.get_nowait())
        for w in writes:
            w.cancel()
        await asyncio.gather(*writes, return_exceptions=True)
        return items

    items = asyncio.run(gather())
    assert len(items) == 1
    assert [t.command for t in items[0]] == [command] * 5
