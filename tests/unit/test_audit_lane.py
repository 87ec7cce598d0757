"""The whole-log audits' lanes (F5 of the attack atk25c on issue 25): one `audit verify` and one
`audit check` at a time per lane, the people waiting served in turn, and the admins' lane is not
the others' (a plain user looping verify never keeps an admin from verifying)."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from ledger.server.audits import AuditLane
from schemas.errors import TooBusy


def test_people_wait_for_a_busy_lane_in_turn_and_the_admins_lane_is_apart() -> None:
    """atk44w F2: a busy lane answered 429 to whoever came, so four plain users rotating
    verify and check kept a fifth person's verify refused for good; now the people waiting are
    served in turn (the one served longest ago first), one of a person's at a time."""
    started: list[str] = []

    async def go() -> None:
        others, admins = AuditLane(False), AuditLane(True)

        async def audit(person: str, ends: asyncio.Event) -> None:
            async with others.hold("verify", person):
                started.append(person)
                await ends.wait()

        ends = {p: asyncio.Event() for p in ("ann", "bob", "dan", "ann2")}
        ann = asyncio.create_task(audit("ann", ends["ann"]))
        await asyncio.sleep(0)
        bob = asyncio.create_task(audit("bob", ends["bob"]))
        dan = asyncio.create_task(audit("dan", ends["dan"]))
        await asyncio.sleep(0.01)
        assert started == ["ann"]  # bob and dan wait: no 429
        with pytest.raises(TooBusy, match="an audit verify of yours is under way"):
            async with others.hold("verify", "ann"):
                pass
        async with others.hold("check", "ann"):  # another kind, another slot
            pass
        async with admins.hold("verify", "cat"):  # the admins' own lane
            pass
        ends["ann"].set()
        await ann
        await asyncio.sleep(0.01)
        again = asyncio.create_task(audit("ann", ends["ann2"]))  # she asks again at once
        await asyncio.sleep(0.01)
        ends["bob"].set()
        await bob
        await asyncio.sleep(0.01)
        assert started == ["ann", "bob", "dan"]  # dan before ann's second
        ends["dan"].set()
        ends["ann2"].set()
        await asyncio.gather(dan, again)
        assert started == ["ann", "bob", "dan", "ann"]

    asyncio.run(go())


def test_a_lanes_work_runs_on_its_own_thread_at_nice_10_or_lower() -> None:
    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def where() -> tuple[int, int]:
        tid = threading.get_native_id()
        return tid, os.getpriority(os.PRIO_PROCESS, tid)

    tid, nice = asyncio.run(AuditLane(False).run(where))
    assert tid != threading.get_native_id() and nice >= max(here, AuditLane.NICE)


def test_after_a_persons_audit_hers_rest_three_times_its_time_anothers_do_not() -> None:
    """atk44-25 F5: one person looping `audit verify` and `audit check` (whole-log walks on
    threads sharing the interpreter with the worker) slowed another's submits 2-2.5x; now after
    her audit of a kind that took t, hers of that kind wait 3t (429 with Retry-After), so each
    runs a quarter of the time at most; her other kind and another person's start at once."""
    now = [100.0]

    async def go() -> None:
        lane = AuditLane(False, clock=lambda: now[0])
        async with lane.hold("verify", "ann"):
            now[0] += 4.0  # her verify took 4 s
        with pytest.raises(TooBusy, match="'ann' ran an audit verify a moment ago") as got:
            async with lane.hold("verify", "ann"):
                pass
        assert got.value.fields["retry_after"] == 12, got.value.fields
        async with lane.hold("verify", "bob"):  # another person: at once
            pass
        async with lane.hold("check", "ann"):  # her other kind: at once (verify, then check)
            pass
        now[0] += 11.0
        with pytest.raises(TooBusy):
            async with lane.hold("verify", "ann"):
                pass
        now[0] += 1.0  # 12 s after hers ended
        async with lane.hold("verify", "ann"):
            pass

    asyncio.run(go())
