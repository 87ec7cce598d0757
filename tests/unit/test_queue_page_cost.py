"""A cold queue page's cost with held-back jobs (atk51-29 F5): the whole queue's estimated starts
walked every release in time order for each pending job (a sort of them all each time: ~1.7 s
of CPU at 1M events, 10,000 pending and ~1,000 releases), and each page showing a held-back
job computed them again. Now the releases are sorted once while they stay, with running sums,
and the whole queue's estimate is kept by the caller once per preview (`queue_page`'s `kept`).
Pure: `estimated_starts`, `queue_page`; the answers as before (`test_estimates_order.py`)."""

from __future__ import annotations

import types
from typing import Any

from ledger.core.jobs import blocked
from ledger.core.state import State
from ledger.cycle.inputs import snapshot_from_state
from ledger.dispatch.engine import decide as dispatch
from ledger.dispatch.registry import build
from ledger.reads import estimates
from ledger.reads import preview as previews
from ledger.reads.estimates import blocked_keys, estimated_starts
from schemas import commands as c
from schemas import views as v
from schemas.events import Dependency
from schemas.policy import FifoConfig
from tests.unit.test_estimates_order import _place, _run

RUNNING = 120
PENDING = 300


def _queue() -> State:
    """`RUNNING` 1-GPU jobs on 15 nodes of 8, every other one running to a limit (200 s
    apart), the rest with none; then `PENDING` pending: every tenth one of 2 GPUs (they start
    at releases), the rest of 100 GPUs (more than the limits free: no start known); then a
    3-GPU job and 20 array tasks `afterok` on it."""
    state = State()
    _run(state, 0.0,
         c.InitLedger(actor="root", admin="root"),
         c.OpenAccount(actor="root", path="p", kind="program"),
         c.OpenAccount(actor="root", path="p/q", kind="project"),
         c.AddMember(actor="root", user="u", project="p/q"),
         c.ConfigureService(actor="root", policy=FifoConfig(), interval_s=2.0, executor="agents"),
         *(c.RegisterNode(actor="root", node=f"n{i}", gpu_type="h100", gpus=8) for i in range(15)),
         *(c.SubmitJob(actor="u", account="p/q", gpus=1,
                       time_limit_s=100 * (i + 1) if i % 2 == 0 else None)
           for i in range(RUNNING)))  # fmt: skip
    _place(state, 0.0)
    _run(state, 1.0, *(
        c.SubmitJob(actor="u", account="p/q", gpus=2 if i % 10 == 0 else 100, time_limit_s=50)
        for i in range(PENDING)
    ))  # fmt: skip
    _run(state, 2.0, c.SubmitJob(actor="u", account="p/q", gpus=3, time_limit_s=50))
    anchor = max(state.jobs)
    after = (Dependency(kind="afterok", job_ids=(anchor,)),)
    _run(state, 2.0, c.SubmitJob(actor="u", account="p/q", gpus=1, time_limit_s=50,
                                 array=tuple(range(20)), dependency=after))  # fmt: skip
    return state


def test_the_whole_queues_estimate_sorts_the_releases_once_while_they_stay(
    monkeypatch: object,
) -> None:
    state = _queue()
    now = 3.0
    snap = snapshot_from_state(state, {}, now)
    policy = build("fifo")
    decision = dispatch(snap, policy, now)
    assert not decision.placements and len(snap.running) == RUNNING
    keys = blocked_keys(state, snap, policy, blocked(state))
    calls = [0]
    when = estimates._when

    def counted(r: object, until: float | None) -> float:
        calls[0] += 1
        return when(r, until)  # type: ignore[arg-type]

    setattr(estimates, "_when", counted)  # noqa: B010
    try:
        starts = estimated_starts(state, snap, decision, now, blocked=keys)
    finally:
        setattr(estimates, "_when", when)  # noqa: B010
    found = sorted(at for at in starts.values() if at is not None)
    assert len(found) == PENDING // 10 + 1 + 20 and found[0] > now, found[:3]
    # was one look at each release for each pending job: 300 x ~120 = 36,000+
    assert calls[0] < PENDING * RUNNING // 10, calls[0]


def test_pages_showing_held_back_jobs_share_one_estimate_of_the_whole_queue() -> None:
    state = _queue()
    now = 3.0
    snap = snapshot_from_state(state, {}, now)
    policy = build("fifo")
    decision = dispatch(snap, policy, now)
    held = previews.held_back(state, snap, policy)
    assert len(held.waits) == 20
    live: Any = types.SimpleNamespace(state=state)
    store: Any = None  # not read: the preview is given
    made: list[dict[int, float | None]] = []

    def kept(compute: object) -> dict[int, float | None]:
        if not made:
            made.append(compute())  # type: ignore[operator]
        return made[0]

    asked = [0]
    whole = previews._starts

    def counted(*args: object, **kwargs: object) -> dict[int, float | None]:
        asked[0] += 1
        return whole(*args, **kwargs)  # type: ignore[arg-type]

    asks = (("WAIT_DEPENDENCY", 0, "order"), (None, 295, "order"),
            ("WAIT_DEPENDENCY", 5, "job"), ("WAIT_DEPENDENCY", 10, "user"))  # fmt: skip
    page = v.QueueFilter(limit=10)
    shared: Any = {"preview": (snap, decision), "held": held}
    previews._starts = counted  # type: ignore[assignment]
    try:
        pages = [
            previews.queue_page(
                live,
                store,
                policy,
                now,
                page,
                code=code,
                offset=offset,
                sort=sort,
                kept=kept,
                **shared,
            )
            for code, offset, sort in asks
        ]
        again = previews.queue_page(
            live, store, policy, now, page, code="WAIT_DEPENDENCY", **shared
        )
    finally:
        previews._starts = whole  # type: ignore[assignment]
    assert asked[0] == 1 + 1, asked  # the kept one, once; the page without `kept`, its own
    assert pages[0] == again  # the same page either way
    assert [r.code for r in pages[0].rows] == ["WAIT_DEPENDENCY"] * 10
    assert all(r.estimated_start_at is not None for r in pages[0].rows)
