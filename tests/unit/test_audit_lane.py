"""The whole-log audits' lanes (F5 of the attack atk25c on issue 25): one `audit verify` and one
`audit check` at a time per lane, a busy lane answers 429 at once, and the admins' lane is not
the others' (a plain user looping verify never keeps an admin from verifying)."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from ledger.server.tables import _AuditLane
from schemas.errors import TooBusy


def test_a_busy_lane_refuses_at_once_and_the_admins_lane_is_apart() -> None:
    async def go() -> None:
        others, admins = _AuditLane(False), _AuditLane(True)
        async with others.hold("verify"):
            with pytest.raises(TooBusy, match="an audit verify is under way"):
                async with others.hold("verify"):
                    pass
            async with others.hold("check"):  # another kind, another lock
                pass
            async with admins.hold("verify"):  # the admins' own lane
                pass
        async with others.hold("verify"):  # free again once it ended
            pass

    asyncio.run(go())


def test_a_lanes_work_runs_on_its_own_thread_at_nice_10_or_lower() -> None:
    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def where() -> tuple[int, int]:
        tid = threading.get_native_id()
        return tid, os.getpriority(os.PRIO_PROCESS, tid)

    tid, nice = asyncio.run(_AuditLane(False).run(where))
    assert tid != threading.get_native_id() and nice >= max(here, _AuditLane.NICE)
