"""A leader whose own lease ran out while its store hangs, before a failed statement says the
store away (`Leadership.unreachable`): its renewal had no answer and nothing answered since, so
it knows of no election and names no leader; a write is answered at once, 503 with the store
away and why (stop 58's CI: it waited `TAKEOVER_WAIT_S` as for an election, or named itself the
leader from the row it last read, then said "this server is a standby"). docs/ha.md, "A
server's own link to the store"."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ledger.server.ha import Leadership
from ledger.server.ha_front import HAFront
from ledger.server.store_seen import lapsed
from ledger.store.lease import Holder


@pytest.mark.parametrize(
    ("case", "deadline", "renewing", "answered_at", "want"),
    [
        ("holds no lease", 0.0, 95.0, 90.0, None),
        ("the lease runs", 101.0, 99.5, 99.0, None),
        ("ran out, its renewal unanswered for 4 s, nothing answered since", 99.0, 96.0, 98.0,
         "its renewal of this server's lease has had no answer for 4.0 s; the lease ran out "
         "1.0 s ago"),
        ("ran out, its renewal failed (no answer)", 99.5, 97.0, 97.0,
         "its renewal of this server's lease has had no answer for 3.0 s; the lease ran out "
         "0.5 s ago"),
        ("ran out with no renewal under way (paused, or starved)", 99.0, None, 98.0, None),
        ("ran out, a statement answered since (it reads the row)", 99.0, 96.0, 99.5, None),
        ("ran out, its renewal sent a moment ago (a pause just ended)", 99.0, 99.8, 98.0, None),
    ],
)  # fmt: skip
def test_a_lease_that_ran_out_unanswered_is_the_store_away(
    case: str, deadline: float, renewing: float | None, answered_at: float, want: str | None
) -> None:
    assert lapsed(100.0, deadline, renewing, answered_at, 1.0) == want, case


class HungLease:
    """The lease of a leader whose store stopped answering: its deadline passed with its last
    renewal unanswered; the row as it last read it names itself, not yet expired in the
    database's clock."""

    epoch, lease_s, answer_s, address, holder, node = 4, 3.0, 1.0, "http://me:1", "me", None

    def __init__(self) -> None:
        now = time.monotonic()
        self.deadline, self.renewing, self.answered_at = now - 0.1, now - 2.0, now - 1.5

    def may_act(self) -> bool:
        return time.monotonic() < self.deadline


@pytest.mark.parametrize("expires_in_s", [0.5, -0.5], ids=["row-held", "row-expired"])
def test_a_write_to_a_leader_whose_lease_ran_out_unanswered_is_refused_at_once(
    expires_in_s: float,
) -> None:
    """The row as last read still held (it named itself the leader: "this server is a standby;
    the leader is" itself) or expired (it waited for an election that it cannot see)."""
    ha = Leadership(HungLease())  # type: ignore[arg-type]
    ha.leading = True  # the worker has not stepped down yet
    ha.leader = Holder(4, "me", "http://me:1", expires_in_s, 3.0)
    ha._leader_read_at = time.monotonic()
    assert ha.unreachable is None and ha.role == "standby"
    sent: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("taken")

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b"{}"}

    scope = {"type": "http", "method": "POST", "path": "/v1/commands/submit", "query_string": b"",
             "headers": [(b"authorization", b"Bearer x")]}  # fmt: skip
    began = time.monotonic()
    asyncio.run(HAFront(app, ha, lambda: 0)(scope, receive, send))
    assert time.monotonic() - began < 0.5  # no wait as for an election
    assert sent[0]["status"] == 503
    headers = dict(sent[0]["headers"])
    assert headers[b"x-gpuledger-store"] == b"away"
    assert b"x-gpuledger-leader" not in headers  # itself no longer, nobody known
    body = sent[1]["body"].decode()
    assert (
        "the store does not answer (its renewal of this server's lease has had no answer "
        "for 2.0 s; the lease ran out 0.1 s ago): no write is taken until it does" in body
    ), body
    assert ha.leader_address() == ""
