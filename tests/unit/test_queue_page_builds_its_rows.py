"""A cold Queue page builds what it shows (issue 29: the page at 10,000 pending, <= 300 ms cold):
of the whole queue it needs each job's place, wait code and counts, but the sort keys of its
own rows alone (the order's keys of every job were built, and a job id -> wait mapping twice,
for a page of 100). The same rows in the same order as read from every key and wait.
Pure: `queue_page` over a given preview."""

from __future__ import annotations

import itertools
import types
from typing import Any

from ledger.cycle.inputs import snapshot_from_state
from ledger.dispatch.engine import decide as dispatch
from ledger.dispatch.ordering import Ordered
from ledger.dispatch.registry import build
from ledger.reads import preview as previews
from schemas import views as v
from tests.unit.test_queue_page_cost import _queue

NOW = 3.0


def _preview(policy: Any) -> tuple[Any, Any, Any, Any]:
    state = _queue()
    snap = snapshot_from_state(state, {}, NOW)
    decision = dispatch(snap, policy, NOW)
    return state, snap, decision, previews.held_back(state, snap, policy)


def test_a_queue_page_builds_the_sort_keys_of_its_rows_alone() -> None:
    policy = build("fairshare")
    state, snap, decision, held = _preview(policy)
    assert isinstance(decision.order, Ordered) and len(decision.order) > 300
    live: Any = types.SimpleNamespace(state=state)
    page = previews.queue_page(
        live, None, policy, NOW, v.QueueFilter(limit=10), preview=(snap, decision), held=held
    )  # type: ignore[arg-type]
    assert decision.order._pairs is None  # no key built but its rows' (every one before)
    keys = {j.job_id: k for k, j in decision.order}
    waiting = decision.waiting
    assert [r.order for r in page.rows] == list(range(1, 11))
    for r in page.rows:
        assert r.sort_key == list(keys[r.job_id])
        wait = waiting.get(r.job_id)
        assert r.code == (wait.code if wait else "NEXT_CYCLE")


def test_every_page_is_the_same_whether_the_keys_were_built_or_not() -> None:
    policy = build("fairshare")
    state, snap, lazy, held = _preview(policy)
    _, snap2, built, held2 = _preview(policy)
    built.order.pairs()  # every key built first: what every page read before
    live: Any = types.SimpleNamespace(state=state)
    for job_state, sort, descending, offset, code in itertools.product(
        ("queued", "pending", "all"),
        ("order", "job", "code", "submitted"),
        (False, True),
        (0, 7, 290, 330),
        (None, "WAIT_RESOURCES", "WAIT_DEPENDENCY", "NEXT_CYCLE"),
    ):
        f = v.QueueFilter(state=job_state, limit=25)
        ask = {"code": code, "sort": sort, "descending": descending, "offset": offset}
        got = previews.queue_page(
            live, None, policy, NOW, f, preview=(snap, lazy), held=held, **ask
        )  # type: ignore[arg-type]
        want = previews.queue_page(
            live, None, policy, NOW, f, preview=(snap2, built), held=held2, **ask
        )  # type: ignore[arg-type]
        assert got == want, (job_state, sort, descending, offset, code)
