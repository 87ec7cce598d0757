"""The queue preview made from the last one's (issue 29: the cold Queue page at 10,000 pending,
<= 300 ms): each cold read built every pending job's view and the fair-share order afresh at
its position; now, as a dispatcher cycle does, only what changed since the last preview (at any
earlier position) is looked at again, and every answer is the same byte for byte: the
snapshot, the decision's record, its order with every key and the queue's pages.
Pure: `preview_carried` over copies of one state moved by commands (as the server's views)."""

from __future__ import annotations

import itertools
import types
from typing import Any

import msgspec
import pytest

from ledger.cycle import inputs
from ledger.cycle.dispatcher import preview, preview_carried
from ledger.dispatch.fairshare2 import FairShare2
from ledger.dispatch.registry import build
from ledger.reads import preview as previews
from schemas import commands as c
from schemas import views as v
from tests.unit.test_estimates_order import _run
from tests.unit.test_queue_page_cost import PENDING, _queue


class _Ranks:
    """A rank source of fixed ranks (no usage): what the preview reads of the projection."""

    usage_policy = None
    read_position = None

    def ranks(self, now: float, position: int) -> tuple[dict[str, int], dict[str, float]]:
        return {"p/q/u": 1, "p/q": 1}, {}


def _live(state: Any) -> Any:
    copy = state.copy()  # the server's view: a copy of the live state at a position
    return types.SimpleNamespace(state=copy, catch_up=lambda: copy.events)


def _same(policy: Any, got: Any, want: Any) -> None:
    (snap, decision), (snap2, decision2) = got, want
    assert msgspec.json.encode(snap) == msgspec.json.encode(snap2)
    at = {"decided_at": 5.0}
    assert msgspec.json.encode(decision.to_command("d", "c", **at)) == msgspec.json.encode(
        decision2.to_command("d", "c", **at)
    )
    assert list(decision.order) == list(decision2.order)  # every job's key, in order
    assert decision.waiting == decision2.waiting


def test_a_preview_made_from_the_last_one_is_the_same_and_builds_only_what_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = build("fairshare")
    state = _queue()
    made = [0]
    view_of = inputs.pending_view

    def counted(job: Any) -> Any:
        made[0] += 1
        return view_of(job)

    monkeypatch.setattr(inputs, "pending_view", counted)
    afresh = [0]
    ordered = FairShare2._afresh

    def fresh(self: Any, snapshot: Any) -> Any:
        afresh[0] += 1
        return ordered(self, snapshot)

    monkeypatch.setattr(FairShare2, "_afresh", fresh)
    first = max(state.jobs) - PENDING  # a pending job of the 100-GPU kind
    moves: list[tuple[c.AnyCommand, ...]] = [
        (),
        (c.HoldJob(actor="u", job_id=first),),
        (c.ReleaseJob(actor="u", job_id=first),),
        (c.SubmitJob(actor="u", account="p/q", gpus=2, time_limit_s=50),),
        (c.CancelJob(actor="u", job_id=first + 3), c.HoldJob(actor="u", job_id=first + 5)),
    ]
    carried = None
    for i, move in enumerate(moves):
        _run(state, 4.0 + i, *move)
        now = 10.0 + i
        made[0] = afresh[0] = 0
        snap, decision, carried = preview_carried(_live(state), _Ranks(), policy, now, carried)
        built, orders = made[0], afresh[0]
        want = preview(_live(state), _Ranks(), policy, now)
        _same(policy, (snap, decision), want)
        if i >= 2:  # from the second on, only the jobs that came or changed (was: every one)
            assert built <= 2, (i, built)
        assert orders == (1 if i == 0 else 0), (i, orders)  # the fair-share order: once
        live: Any = types.SimpleNamespace(state=state)
        held = previews.held_back(state, snap, policy)
        held2 = previews.held_back(state, want[0], policy)
        for job_state, sort, offset in itertools.product(
            ("queued", "pending"), ("order", "job", "code"), (0, 290)
        ):
            f = v.QueueFilter(state=job_state, limit=25)
            ask = {"sort": sort, "offset": offset}
            got = previews.queue_page(
                live, None, policy, now, f, preview=(snap, decision), held=held, **ask
            )  # type: ignore[arg-type]
            page = previews.queue_page(live, None, policy, now, f, preview=want, held=held2, **ask)  # type: ignore[arg-type]
            assert got == page, (i, job_state, sort, offset)


def test_previews_started_from_one_carried_at_once_change_nothing_it_holds() -> None:
    """Two reads at two positions may start from the same kept preview on two threads: the
    second made from it after the first is the same as made from nothing."""
    policy = build("fairshare")
    state = _queue()
    _, _, carried = preview_carried(_live(state), _Ranks(), policy, 10.0, None)
    first = max(state.jobs) - PENDING
    _run(state, 11.0, c.HoldJob(actor="u", job_id=first))
    _, _, carried = preview_carried(_live(state), _Ranks(), policy, 11.0, carried)
    before = _live(state)
    _run(state, 12.0, c.CancelJob(actor="u", job_id=first + 1))
    after = _live(state)
    one = preview_carried(after, _Ranks(), policy, 12.0, carried)  # the later position first
    two = preview_carried(before, _Ranks(), policy, 12.5, carried)
    _same(policy, one[:2], preview(after, _Ranks(), policy, 12.0))
    _same(policy, two[:2], preview(before, _Ranks(), policy, 12.5))


def test_the_servers_shared_preview_is_made_from_the_last_one_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`CopiedHandles.live_preview` at a new position (a read after the log moved) starts from
    the preview the server's cache kept at the last one, under the same policy: one new view
    for one job changed (every pending job's view was built again, 300 here; the jobs a
    dependency holds back are viewed by `held_back` at each position, as before)."""
    from ledger.server.cache import ReadCache
    from ledger.server.copied import CopiedHandles, Copy, CursorStore, Frozen
    from projections.store import PROJECTION, Store

    made = [0]
    view_of = inputs.pending_view

    ids: list[int] = []

    def counted(job: Any) -> Any:
        made[0] += 1
        ids.append(job.spec.job_id)
        return view_of(job)

    monkeypatch.setattr(inputs, "pending_view", counted)
    state = _queue()
    cache = ReadCache()
    with Store(":memory:") as store:  # the projection as far as the log (nothing but its place)
        store.con.execute("UPDATE tracking SET position = ? WHERE projection = ?",
                          [1 << 40, PROJECTION])  # fmt: skip

        def read(at: float) -> Any:
            copy = Copy(ledger=Frozen(state.copy(), state.events), moment=at, foreign={})
            return CopiedHandles(copy, store.con.cursor(), cache).live_preview()

        read(10.0)
        assert made[0] > PENDING - 10
        first = max(state.jobs) - PENDING
        _run(state, 11.0, c.HoldJob(actor="u", job_id=first))
        _run(state, 11.0, c.ReleaseJob(actor="u", job_id=first))
        made[0] = 0
        got = read(12.0)
        # the changed job's, and the 20 array tasks `held_back` views at each position
        assert made[0] <= 1 + 20, (made[0], ids[-made[0] :])
        fresh = Frozen(state.copy(), state.events)  # made from nothing, as before
        want = previews.live(fresh, CursorStore(store.con.cursor()), build(state.policy), 12.0, {})
        _same(build(state.policy), got.live, want)
