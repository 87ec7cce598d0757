"""The baseline policies (`slurm`, `legacy`) on hand-made snapshots, through the real `decide()`."""

from __future__ import annotations

import msgspec
import pytest

from ledger.dispatch import NodeView, PendingJob, RunningJob, Snapshot, decide
from ledger.dispatch.baselines import (
    LegacyCaps,
    SlurmLab,
    SlurmMultifactor,
    in_cap_usage,
    team_of,
)
from schemas.events import GpuSlot
from schemas.policy import LegacyConfig, settings

NOW = 1_000_000.0
H = 3600.0


def node(name: str, free: tuple[int, ...] = ()) -> NodeView:
    return NodeView(name=name, cluster="c", gpu_type="h100", gpus=8, free=free)


def pending(job_id: int, account: str, gpus: int, *, funded: bool = True, age: float = 0.0,
            user: str = "u", priority: int = 0) -> PendingJob:  # fmt: skip
    return PendingJob(
        job_id=job_id,
        account=account,
        user=user,
        gpus=gpus,
        min_runtime_s=3600 if funded else 0,
        submitted_at=NOW - age,
        priority=priority,
    )


def running(job_id: int, account: str, gpus: int, node_name: str, first: int, *,
            funded: bool = True, placed_h_ago: float = 2.0) -> RunningJob:  # fmt: skip
    return RunningJob(
        job_id=job_id,
        account=account,
        user="u",
        gpus=gpus,
        slots=(GpuSlot(node=node_name, gpu_indices=tuple(range(first, first + gpus))),),
        placed_at=NOW - placed_h_ago * H,
        min_runtime_s=3600 if funded else 0,
        resumable=True,
    )


def test_slurm_orders_by_tier_then_fair_share_then_age() -> None:
    ranks = {"lab/a/u": 0, "lab/b/u": 1, "lab/c/u": 2}
    snap = Snapshot(
        position=1,
        taken_at=NOW,
        nodes=(node("n1"),),
        pending=(
            pending(1, "lab/c", 1, age=7 * 86_400),  # worst share, a week old: +1000
            pending(2, "lab/a", 1),  # best share
            pending(3, "lab/b", 1),
            pending(4, "lab/a", 1, funded=False),  # unfunded: lower tier, whatever its share
        ),
        ranks=ranks,
    )
    order = [j.job_id for _, j in SlurmMultifactor().order(snap)]
    # factors: a 1.0, b 2/3, c 1/3 (+ age 1.0 * 1000 / 10000)
    assert order == [2, 3, 1, 4]
    p = SlurmMultifactor().priority(snap.pending[0], ranks, 3, NOW)
    assert p == pytest.approx(10_000 / 3 + 1_000)


def test_slurm_preempts_only_the_lower_tier() -> None:
    snap = Snapshot(
        position=1,
        taken_at=NOW,
        nodes=(node("n1"),),
        running=(
            running(10, "lab/b", 4, "n1", 0),  # funded, past its contract, worse share
            running(11, "lab/b", 4, "n1", 4, funded=False),
        ),
        pending=(pending(1, "lab/a", 4), pending(2, "lab/a", 4)),
        ranks={"lab/a/u": 0, "lab/b/u": 1},
    )
    d = decide(snap, SlurmMultifactor(), NOW)
    assert [(p.job_id, p.for_job) for p in d.preemptions] == [(11, 1)]
    assert [p.job_id for p in d.placements] == [1]
    assert d.waiting[2].code == "WAIT_RESOURCES"


@pytest.mark.parametrize(
    ("case", "caps", "want_used", "want_overflow"),
    [
        ("all inside", {"lab/a": 8}, {"lab/a": 8}, set()),
        ("the later placement overflows", {"lab/a": 4}, {"lab/a": 4}, {21}),
        ("no cap: everything overflows", {}, {"lab/a": 0}, {20, 21}),
    ],
)
def test_in_cap_usage(
    case: str, caps: dict[str, int], want_used: dict[str, int], want_overflow: set[int]
) -> None:
    jobs = [
        running(20, "lab/a/sub", 4, "n1", 0, placed_h_ago=3),
        running(21, "lab/a", 4, "n1", 4, placed_h_ago=1),
        running(22, "lab/b", 8, "n2", 0, funded=False),
    ]
    used, overflow = in_cap_usage(jobs, caps)
    assert (used, overflow) == (want_used, want_overflow), case
    assert team_of("lab/a/sub") == "lab/a"


@pytest.mark.parametrize(
    ("case", "gpus", "want_preempted"),
    [
        ("inside its cap: takes the overflow of another team", 4, [31]),
        ("beyond its cap: only idle GPUs, preempts nothing", 8, []),
    ],
)
def test_legacy_caps(case: str, gpus: int, want_preempted: list[int]) -> None:
    caps = {"lab/a": 4, "lab/b": 4}
    snap = Snapshot(
        position=1,
        taken_at=NOW,
        nodes=(node("n1"),),
        running=(
            running(30, "lab/b", 4, "n1", 0, placed_h_ago=3),  # b inside its cap
            running(31, "lab/b", 4, "n1", 4, placed_h_ago=2),  # b overflow
        ),
        pending=(pending(1, "lab/a", gpus),),
    )
    d = decide(snap, LegacyCaps(caps=caps), NOW)
    assert [p.job_id for p in d.preemptions] == want_preempted, case
    assert [p.job_id for p in d.placements] == ([1] if want_preempted else [])


def test_legacy_orders_by_static_priority_across_teams() -> None:
    snap = Snapshot(
        position=1,
        taken_at=NOW,
        pending=(
            pending(1, "lab/a", 1, age=100),
            pending(2, "lab/b", 1, priority=2),
            pending(3, "lab/a", 1, funded=False, priority=9),
        ),
    )
    assert [j.job_id for _, j in LegacyCaps().order(snap)] == [2, 1, 3]
    assert settings(LegacyConfig(caps={"x": 1}))["caps"] == "x=1"  # as v1 and v2 records wrote it


# --- slurm-lab: Slurm as a lab configures it ------------------------------------------------------


def nodes(n: int, free_on: tuple[str, ...] = ()) -> tuple[NodeView, ...]:
    return tuple(
        node(f"n{i:02d}", tuple(range(8)) if f"n{i:02d}" in free_on else ())
        for i in range(1, n + 1)
    )


def test_slurm_lab_orders_debug_qos_then_normal_then_scavenger() -> None:
    ranks = {"lab/a/u": 0, "lab/b/u": 1}
    debug = msgspec.structs.replace(pending(3, "lab/b", 1), debug=True, time_limit_s=900)
    snap = Snapshot(
        position=1,
        taken_at=NOW,
        nodes=(node("n1"),),
        pending=(pending(1, "lab/a", 1, funded=False), pending(2, "lab/b", 1), debug),
        ranks=ranks,
    )
    assert [j.job_id for _, j in SlurmLab().order(snap)] == [3, 2, 1]


def test_slurm_lab_keeps_a_debug_partition_that_scavenger_jobs_borrow() -> None:
    """16 nodes, one in 32 of them (at least one: n16) is the debug partition: a funded job may
    not start there, an unfunded (scavenger) job may, and a debug job preempts it."""
    free = nodes(16, free_on=("n16",))
    waiting = (pending(1, "lab/a", 8), pending(2, "lab/a", 8, funded=False))
    snap = Snapshot(position=1, taken_at=NOW, nodes=free, pending=waiting)
    d = decide(snap, SlurmLab(backfill=False), NOW)
    assert [p.job_id for p in d.placements] == [2]
    assert d.idle.reserve == 0 and d.idle.funded_waiting == 1
    busy = Snapshot(
        position=2,
        taken_at=NOW,
        nodes=nodes(16),
        running=(running(20, "lab/a", 8, "n16", 0, funded=False),),
        pending=(msgspec.structs.replace(pending(3, "lab/b", 2), debug=True, time_limit_s=600),),
    )
    d = decide(busy, SlurmLab(), NOW)
    assert [p.job_id for p in d.preemptions] == [20]
    assert [(p.job_id, p.slots[0].node) for p in d.placements] == [(3, "n16")]


def test_slurm_lab_backfill_holds_nodes_for_the_top_job() -> None:
    """Four nodes. n01 and n02 hold jobs that end (by the default time limit) in 1 h and 2 h,
    n03 one that ends in 3 days, n04 is free. The top job asks 16 GPUs (two whole nodes): it
    is held n04 and n01, from 1 h on. The next job (8 GPUs, no time limit: three days) may not
    take n04; a 2-hour job may not either (it would end after the reservation starts), a
    30-minute one may."""
    limit = 3 * 86_400
    snap = Snapshot(
        position=1,
        taken_at=NOW,
        nodes=nodes(4, free_on=("n04",)),
        running=(
            running(10, "lab/b", 8, "n01", 0, placed_h_ago=limit / H - 1),
            running(11, "lab/b", 8, "n02", 0, placed_h_ago=limit / H - 2),
            running(12, "lab/b", 8, "n03", 0, placed_h_ago=1.0),
        ),
        pending=(
            pending(1, "lab/a", 16, age=100.0),
            pending(2, "lab/a", 8, age=50.0),
            msgspec.structs.replace(pending(3, "lab/a", 8, age=40.0), time_limit_s=2 * 3600),
            msgspec.structs.replace(pending(4, "lab/a", 8, age=30.0), time_limit_s=1800),
        ),
        ranks={"lab/a/u": 0, "lab/b/u": 1},
    )
    d = decide(snap, SlurmLab(debug_nodes_per=0), NOW)
    assert d.hold is not None
    assert (d.hold.job_id, sorted(d.hold.nodes), d.hold.until) == (1, ["n01", "n04"], NOW + H)
    assert [p.job_id for p in d.placements] == [4]
    assert d.wake_at == NOW + H
    assert d.idle.held == 0  # job 4 backfilled the free node
    no_backfill = decide(snap, SlurmLab(debug_nodes_per=0, backfill=False), NOW)
    assert no_backfill.hold is None
    assert [p.job_id for p in no_backfill.placements] == [2]  # the top job is overtaken


def test_slurm_lab_counts_scavenger_jobs_as_gone_for_its_reservation() -> None:
    """The top job may preempt scavenger jobs: a node that holds only one is free for it now;
    one held by a funded job is free when that job's time limit ends."""
    snap = Snapshot(
        position=1,
        taken_at=NOW,
        nodes=nodes(3),
        running=(
            running(10, "lab/b", 8, "n01", 0, placed_h_ago=1.0),
            running(11, "lab/b", 4, "n02", 0, funded=False),
            running(12, "lab/b", 4, "n02", 4, placed_h_ago=70.0),
            running(13, "lab/b", 8, "n03", 0, funded=False),
        ),
        pending=(pending(1, "lab/a", 24),),
        ranks={"lab/a/u": 0, "lab/b/u": 1},
    )
    d = decide(snap, SlurmLab(debug_nodes_per=0, preempt_unfunded=False), NOW)
    # without preemption every job ends by its (default) time limit: job 10 in 71 h
    assert d.hold is not None and d.hold.until == NOW + 71 * H
    snap = msgspec.structs.replace(snap, pending=(pending(1, "lab/a", 16),))
    d = decide(snap, SlurmLab(debug_nodes_per=0), NOW)
    # n03 is free for it now (a scavenger job), n02 when job 12 ends at 72 h (in 2 h)
    assert d.hold is not None and (sorted(d.hold.nodes), d.hold.until) == (
        ["n02", "n03"],
        NOW + 2 * H,
    )
