"""A job over the engine's longest time limit (Slurm's partition MaxTime) waits for it, and the
reads say so (atk60-slurm F4): `queue` gave it `NEXT_CYCLE` with an estimated start 25 s ahead
and `explain` "It would be placed in the next cycle" for as long as it waited, the reads'
preview not knowing the limit the dispatcher leaves it out by. Pure: the reads over a preview
made with `longest_s`, as the server's shared one is (`copied.CopiedHandles.live_preview`)."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from ledger.core.state import State
from ledger.cycle.inputs import snapshot_from_state
from ledger.dispatch.engine import decide as dispatch
from ledger.dispatch.registry import build
from ledger.reads import preview as previews
from ledger.reads.explain_job import explain_now
from schemas import commands as c
from schemas import views as v
from tests.conftest import T0
from tests.unit.test_fence import _run

MAX_TIME_S = 180.0
"""The partition's MaxTime: three minutes (`scontrol update PartitionName=P MaxTime=3`); a job
of one minute fits with its 30 s grace and a minute (atk62b G2: not one of MaxTime's length)."""
NO_STORE: Any = object()
"""The projection, never read: the preview is given."""


def _reads(state: State, longest_s: float | None) -> tuple[Any, Any, Any, Any]:
    policy = build("fairshare")
    snap = snapshot_from_state(state, {}, T0, longest_s=longest_s, hold_grace=True)
    decision = dispatch(snap, policy, T0)
    held = previews.held_back(state, snap, policy, longest_s)
    return policy, (snap, decision), held, types.SimpleNamespace(state=state)


def _submitted(state: State, ids: Callable[[], str]) -> None:
    """Job 1 of 10 minutes (`-t 10`), job 2 of 181 s (four of Slurm's minutes), job 3 of one."""
    for limit in (600, 181, 60):
        _run(state, ids, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1,
                                     time_limit_s=limit), T0)  # fmt: skip


def test_a_job_over_the_partitions_max_time_has_a_code_of_its_own_and_no_estimated_start(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    s = org_state
    _submitted(s, counter_ids)
    policy, preview, held, live = _reads(s, MAX_TIME_S)
    f = v.QueueFilter()
    rows = {r.job_id: r for r in previews.queue(live, NO_STORE, policy, T0, f, preview, MAX_TIME_S)}
    assert [rows[j].code for j in (1, 2, 3)] == [
        "PARTITION_TIME_LIMIT", "PARTITION_TIME_LIMIT", "NEXT_CYCLE",
    ]  # fmt: skip
    for job in (1, 2):
        assert rows[job].estimated_start_at is None, rows[job]
        assert rows[job].order is None, rows[job]
    assert "time limit (10m) is over the partition's MaxTime (3m)" in rows[1].reason, rows[1]
    assert "(181s, 4m in Slurm's whole minutes)" in rows[2].reason, rows[2]
    page = previews.queue_page(live, NO_STORE, policy, T0, f, preview=preview, held=held,
                               longest_s=MAX_TIME_S)  # fmt: skip
    assert {r.job_id: r.code for r in page.rows} == {j: r.code for j, r in rows.items()}
    assert page.codes == {"PARTITION_TIME_LIMIT": 2, "NEXT_CYCLE": 1}
    assert all(r.estimated_start_at is None for r in page.rows if r.job_id != 3), page.rows
    codes = previews.queue_codes(s, preview[0], preview[1], MAX_TIME_S)
    assert sorted(code for _, code in codes) == ["NEXT_CYCLE", *["PARTITION_TIME_LIMIT"] * 2]


def test_explain_names_the_partitions_max_time_and_the_jobs_limit(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    s = org_state
    _submitted(s, counter_ids)
    policy, preview, _, live = _reads(s, MAX_TIME_S)
    now = explain_now(live, None, s.jobs[1], policy, T0, preview, MAX_TIME_S)
    assert now.code == "PARTITION_TIME_LIMIT" and now.start is None, now
    assert now.after == (
        "It may not run yet (the partition's MaxTime): its time limit (10m) is over the "
        "partition's MaxTime (3m): Slurm would never start it (PartitionTimeLimit), so it is "
        "not placed until an admin raises MaxTime.",
    ), now
    assert now.lines is None  # its told history, then that line: not "the next cycle"
    fits = explain_now(live, NO_STORE, s.jobs[3], policy, T0, preview, MAX_TIME_S)
    assert fits.code == "NEXT_CYCLE" and fits.start == T0, fits


def test_once_max_time_is_raised_the_job_is_next_again(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    s = org_state
    _submitted(s, counter_ids)
    policy, preview, _, live = _reads(s, None)  # UNLIMITED
    rows = previews.queue(live, NO_STORE, policy, T0, v.QueueFilter(), preview, None)
    assert {r.code for r in rows} == {"NEXT_CYCLE"}, rows
    now = explain_now(live, NO_STORE, s.jobs[1], policy, T0, preview, None)
    assert now.code == "NEXT_CYCLE" and now.start == T0, now
