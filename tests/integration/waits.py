"""The one way integration tests wait for a real process to reach a state."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    what: str, cond: Callable[[], T], timeout: float = 60, why: Callable[[], str] = str
) -> T:
    """Poll `cond` until it returns something true and return that; after `timeout` seconds fail
    naming `what`, with `why()` (what the processes said) to show the cause."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{why()}")
        time.sleep(0.1)
