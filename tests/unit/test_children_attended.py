"""A child's run for a request (`children.attended`) ends when its client leaves or the server
stops, in one 503 line, the work cancelled (its child killed: `children.run`) within a step
(atk49-29 F11, F12); otherwise its result is the answer."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ledger.server import children
from schemas.errors import Unavailable


class Work:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.cancelled = False

    async def __call__(self) -> str:
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return "done"


def receiver(leave_after_s: float | None) -> Any:
    async def receive() -> dict[str, Any]:
        if leave_after_s is None:
            await asyncio.sleep(3600)
        await asyncio.sleep(leave_after_s or 0)
        return {"type": "http.disconnect"}

    return receive


def test_the_result_when_nobody_left() -> None:
    work = Work(0.05)
    got = asyncio.run(children.attended(receiver(None), lambda: False, work(), "what-if"))
    assert got == "done" and not work.cancelled


def test_a_client_that_left_stops_the_work_within_a_step() -> None:
    work = Work(30)
    began = time.monotonic()
    with pytest.raises(Unavailable) as err:
        asyncio.run(children.attended(receiver(0.1), lambda: False, work(), "what-if"))
    assert time.monotonic() - began < 1.0 and work.cancelled
    assert err.value.line() == "the what-if was stopped: its caller left"


def test_a_stopping_server_stops_the_work_within_a_step() -> None:
    work = Work(30)
    began = time.monotonic()
    stop_at = began + 0.1
    with pytest.raises(Unavailable) as err:
        asyncio.run(
            children.attended(receiver(None), lambda: time.monotonic() > stop_at, work(), "replay")
        )
    assert time.monotonic() - began < 0.1 + 2 * children.WATCH_S + 0.5 and work.cancelled
    assert err.value.message == "the server stopped before the replay ended"
    assert err.value.hint == "retry once it is back"
