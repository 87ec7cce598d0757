"""The least-loss planners weigh the next plans after a refused one (`plans_tried`, s58): a
victim search found the one plan of least loss, and when `weigh` refused it (it loses more
funded work than the job gains) the job waited, though a plan elsewhere that loses less funded
work would have been taken. Bounded: at most `plans_tried` plans, each a search of the job's
budget. A versioned field: a record without it decodes to 1 (one plan, as before)."""

from __future__ import annotations

import msgspec

from ledger.dispatch import registry
from ledger.dispatch.engine import decide
from ledger.dispatch.snapshot import RunningJob, Snapshot
from schemas.policy import AnyPolicyConfig, FairShare17Config
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, preempted, run, world


def _short(job_id: int, where: str) -> RunningJob:
    """lab/c's funded non-resumable 8-GPU run, placed 6 min ago past its 1-minute contract: a
    dearer class than a resumable run, but it loses 0.8 GPU-h only."""
    return run(job_id, {where: range(8)}, "lab/c", min_runtime_s=60, resumable=False,
               placed_ago_s=0.1 * H, lost_s=0.1 * H)  # fmt: skip


def _two_nodes() -> Snapshot:
    """n1: lab/b's resumable run that checkpointed 3 h ago (24 GPU-h lost: the cheaper class,
    the first plan, refused: more than the 8-GPU job's gain); n2: `_short`."""
    running = [run(10, {"n1": range(8)}, "lab/b", lost_s=3 * H), _short(11, "n2")]
    return world([node("n1"), node("n2")], running, [pend(1, 8)])


def test_a_refused_plan_is_followed_by_the_next_one_that_weigh_takes() -> None:
    built = registry.build("fairshare-17", {})
    assert built.plans_tried == 4  # type: ignore[attr-defined]
    snap = _two_nodes()
    one = msgspec.structs.replace(built, plans_tried=1)  # type: ignore[type-var]
    d = decide(snap, one, NOW)  # type: ignore[arg-type]
    assert not d.preemptions and "would lose 24.00 GPU-h of funded work" in d.waiting[1].reason
    assert preempted(snap, built) == [11]


def test_a_gang_plan_refused_is_followed_by_one_clearing_other_nodes() -> None:
    # a 16-GPU gang: n1 and n2 hold resumable runs that lose 24 GPU-h each (the cheapest class,
    # refused); n3 and n4 hold `_short` runs (0.8 GPU-h each): with the node of the refused
    # plan's dearest victim left out, the next plan of least loss is n3 + n4, taken
    running = [run(10, {"n1": range(8)}, "lab/b", lost_s=3 * H),
               run(11, {"n2": range(8)}, "lab/b", lost_s=3 * H),
               _short(12, "n3"), _short(13, "n4")]  # fmt: skip
    snap = world([node(f"n{i}") for i in range(1, 5)], running, [pend(1, 16)])
    built = registry.build("fairshare-17", {})
    assert preempted(snap, msgspec.structs.replace(built, plans_tried=1)) == []  # type: ignore[type-var]
    assert sorted(preempted(snap, msgspec.structs.replace(built, plans_tried=2))) == [12, 13]  # type: ignore[type-var]


def test_plans_tried_is_bounded_by_the_setting() -> None:
    # three nodes of refused plans before the one taken: 3 plans are not enough, 4 are
    running = [run(10 + i, {f"n{i}": range(8)}, "lab/b", lost_s=(3 + i) * H) for i in range(3)]
    snap = world([node(f"n{i}") for i in range(4)], [*running, _short(20, "n3")], [pend(1, 8)])
    built = registry.build("fairshare-17", {})
    assert preempted(snap, msgspec.structs.replace(built, plans_tried=3)) == []  # type: ignore[type-var]
    assert preempted(snap, built) == [20]


def test_a_record_without_plans_tried_decodes_to_one_plan() -> None:
    config = registry.default_config("fairshare-17")
    assert isinstance(config, FairShare17Config) and config.plans_tried == 4
    raw = msgspec.json.decode(msgspec.json.encode(config))
    del raw["plans_tried"]  # a record made before
    old = msgspec.json.decode(msgspec.json.encode(raw), type=AnyPolicyConfig)
    assert isinstance(old, FairShare17Config) and old.plans_tried == 1
    assert preempted(_two_nodes(), registry.policy_from_config(old)) == []
