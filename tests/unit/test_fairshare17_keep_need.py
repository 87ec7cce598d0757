"""fairshare-17's `takeback_keep_need_s` and `takeback_keep_per_pool` (s56-keep2, atk56-26 F1,
F2): the yield share lets only jobs of 1/8 of the pool take a kept run back, so a gang just under
it (28 GPUs of 256) or a single-node job on a node two kept 4-GPU runs share waited 71 h. With
the need rule a funded non-debug job that has waited `takeback_keep_need_s` is offered the kept
runs after every other victim: it takes one only when nothing else places it. And the keep's
room is per pool, so a small pool is not kept whole."""

from __future__ import annotations

import msgspec

from ledger.dispatch import registry
from ledger.dispatch.fairshare17 import FairShare17
from ledger.dispatch.snapshot import RunningJob
from schemas.policy import AnyPolicyConfig, FairShare17Config
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, preempted, run, world
from tests.unit.test_dispatch_fairshare17_bounds import _free

NODES = [node(f"n{i:02}") for i in range(16)]
"""128 GPUs: the keep's room (1/16) is one 8-GPU node, the yield's bar (1/8) 16 GPUs."""


def _funded(job_id: int, where: str) -> RunningJob:
    """A funded non-resumable 8-GPU run of lab/c on `where`, inside its contract."""
    return run(job_id, {where: range(8)}, "lab/c", min_runtime_s=100 * 3600, resumable=False)


def _busy(first: int) -> list[RunningJob]:
    return [_funded(20 + i, f"n{i:02}") for i in range(first, 16)]


def _half(job_id: int, gpus: range) -> RunningJob:
    """A free-tier 4-GPU run on n00 that lab/c's funded work took back 3 times (kept)."""
    r = run(job_id, {"n00": gpus}, "lab/b", min_runtime_s=0, placed_ago_s=H, lost_s=H)
    taken = tuple(("lab/c", NOW - 10 * H + i) for i in range(3))
    return msgspec.structs.replace(r, runs=3, takebacks=taken, submitted_at=float(job_id))


def _s56(policy: object) -> object:
    return msgspec.structs.replace(policy, takeback_keep_need_s=0.0)  # type: ignore[type-var]


def test_a_gang_under_the_yield_share_that_needs_the_kept_node_takes_it_after_a_wait() -> None:
    # W28 in small: n00 free, n01 held by a kept free-tier run, the rest by funded work inside
    # its contract. A 12-GPU gang (under 1/8 of 128) needs two whole nodes: under s56's yield
    # it waited the keep's 72 h out; a policy built today takes the kept run once it waited
    built = registry.build("fairshare-17", {})
    kept = _free(10, "n01", by="lab/c", placed_ago_s=H)
    snap = world(NODES, [kept, *_busy(2)], [pend(1, 12)])
    assert built.kept_runs(snap, NOW) == frozenset({10})  # type: ignore[attr-defined]
    assert preempted(snap, _s56(built)) == []
    assert preempted(snap, built) == [10]
    # just submitted: the keep holds until the job has waited `takeback_keep_need_s`
    young = msgspec.structs.replace(pend(1, 12), submitted_at=NOW - 60)
    assert preempted(world(NODES, [kept, *_busy(2)], [young]), built) == []


def test_a_kept_run_is_taken_only_when_nothing_else_places_the_job() -> None:
    # the same gang with another free-tier run (not kept, n02) whose node it can have: it
    # takes that one, and the kept run keeps its node
    built = registry.build("fairshare-17", {})
    kept = _free(10, "n01", by="lab/c", placed_ago_s=H)
    other = _free(11, "n02", by="lab/c", times=0, placed_ago_s=H, submitted_at=5.0)
    snap = world(NODES, [kept, other, *_busy(3)], [pend(1, 12)])
    assert preempted(snap, built) == [11]


def test_a_node_job_takes_back_two_kept_runs_sharing_its_node() -> None:
    # K16 in small: two kept 4-GPU free-tier runs share n00 (8 GPUs = the room), every other
    # node held by funded work: a single-node 8-GPU job waited 71 h under s56; now it takes both
    built = registry.build("fairshare-17", {})
    halves = [_half(10, range(4)), _half(11, range(4, 8))]
    snap = world(NODES, [*halves, *_busy(1)], [pend(1, 8)])
    assert built.kept_runs(snap, NOW) == frozenset({10, 11})  # type: ignore[attr-defined]
    assert preempted(snap, _s56(built)) == []
    assert sorted(preempted(snap, built)) == [10, 11]


def test_the_room_is_each_pools_share() -> None:
    # atk56-26 F2: 4 a100 nodes (32 GPUs) and 60 h100 nodes (480): 1/16 of the cluster is 32
    # GPUs, every a100 node; per pool the a100 room is 2 GPUs, no 8-GPU run
    a100 = [msgspec.structs.replace(node(f"a{i}"), gpu_type="a100") for i in range(4)]
    h100 = [node(f"h{i:02}") for i in range(60)]
    kept = [_free(10 + i, f"a{i}", by="lab/c", submitted_at=float(i)) for i in range(4)]
    busy = [
        run(100 + i, {f"h{i:02}": range(8)}, "lab/c", min_runtime_s=100 * 3600, resumable=False)
        for i in range(60)
    ]
    job = msgspec.structs.replace(pend(1, 3), gpu_type="a100")
    snap = world(a100 + h100, kept + busy, [job])
    built = registry.build("fairshare-17", {})
    assert built.kept_runs(snap, NOW) == frozenset()  # type: ignore[attr-defined]
    assert preempted(snap, built) == [13]
    whole = msgspec.structs.replace(built, takeback_keep_per_pool=False, takeback_keep_need_s=0.0)  # type: ignore[type-var]
    assert whole.kept_runs(snap, NOW) == frozenset({10, 11, 12, 13})  # type: ignore[attr-defined]
    assert preempted(snap, whole) == []


def test_the_need_and_the_pool_room_are_off_in_older_records() -> None:
    config = registry.default_config("fairshare-17")
    assert isinstance(config, FairShare17Config)
    assert config.takeback_keep_need_s == 7200.0 and config.takeback_keep_per_pool is True
    raw = msgspec.to_builtins(config)
    del raw["takeback_keep_need_s"], raw["takeback_keep_per_pool"]  # a record made before
    old = msgspec.convert(raw, AnyPolicyConfig)
    assert isinstance(old, FairShare17Config)
    assert old.takeback_keep_need_s == 0.0 and old.takeback_keep_per_pool is False
    assert FairShare17().takeback_keep_need_s == 0.0
