"""A child's progress (`children.tell` on its stderr) reaches the server as it comes
(`children.run(..., progress=)`), at most about a hundred lines, and its other stderr lines
still say why it failed (the what-if's step of its steps: atk50-29 F3)."""

from __future__ import annotations

import asyncio

import pytest

from ledger.server import children

CHILD = "tests.unit.progress_child"


def test_the_steps_come_in_order_and_the_answer_after() -> None:
    told: list[tuple[int, int]] = []
    out = asyncio.run(children.run(CHILD, b"", 60, lambda d, t: told.append((d, t))))
    assert out == b"answered"
    assert told[0] == (0, 1000) and told[-1] == (1000, 1000) and len(told) == 101, told[:3]
    assert [d for d, _ in told] == sorted({d for d, _ in told})


def test_a_failure_says_its_last_line_not_a_step() -> None:
    with pytest.raises(RuntimeError, match="it went wrong"):
        asyncio.run(children.run(CHILD, b"fail", 60, lambda d, t: None))
    with pytest.raises(RuntimeError, match="it went wrong"):  # without progress: as before
        asyncio.run(children.run(CHILD, b"fail", 60))
