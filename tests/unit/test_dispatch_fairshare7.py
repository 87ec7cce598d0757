"""fairshare-7: debug work preempts the free tier of any size, a preempted job ranks like any
other, restarts priced, a reservation for large funded gangs; fairshare-6 decides as before."""

from __future__ import annotations

import msgspec

from ledger.dispatch import decide
from ledger.dispatch.fairshare2 import FairShare2
from ledger.dispatch.fairshare7 import FairShare7, pool_gpus
from ledger.dispatch.registry import config_of, default_config, policy_from_config
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, preempted, run, world


def test_fairshare_7_is_the_default_and_fairshare_6_is_unchanged() -> None:
    assert policy_from_config(default_config()) == FairShare7(gain_horizon_s=1800.0)
    six = policy_from_config(default_config("fairshare-6"))
    assert type(six) is FairShare2 and six.debug_reserve_per == 16 and six.fresh_first
    seven = FairShare7(
        requeued_last=False,
        hold_share=0.5,
        relaunch_cost_s=60.0,
        hold_expect_s=60.0,
        gain_aging=1.0,
    )
    assert policy_from_config(config_of(seven)) == seven


def test_a_debug_job_preempts_an_unfunded_job_of_any_size_but_not_big_funded_ones() -> None:
    unfunded = [run(12, {"n1": range(8), "n2": range(8)}, "lab/a", min_runtime_s=0)]
    snap = world([node("n1"), node("n2")], unfunded, [pend(2, 2, "lab/c", debug=True)])
    assert preempted(snap, FairShare2(debug_reserve_per=0)) == []  # 16 GPUs > 2 x 2
    seven = FairShare7()
    d = decide(snap, seven, NOW)
    assert [(p.job_id, p.reason, p.for_job) for p in d.preemptions] == [(12, "debug", 2)]
    assert "debug lane: unfunded, 16 GPUs" in d.preemptions[0].note
    funded = [run(13, {"n1": range(8), "n2": range(8)}, "lab/a")]  # resumable, past contract
    snap = world([node("n1"), node("n2")], funded, [pend(2, 2, "lab/c", debug=True)])
    assert preempted(snap, seven) == []


def test_a_preempted_unfunded_job_goes_after_fresh_ones_unless_told_otherwise() -> None:
    ran = msgspec.structs.replace(pend(1, 8, "lab/a", funded=False), runs=1)
    fresh = pend(2, 8, "lab/c", funded=False)
    requeued_funded = msgspec.structs.replace(pend(3, 8, "lab/c"), runs=2)
    snap = world([node("n1")], [], [ran, fresh, requeued_funded])
    assert [j.job_id for _, j in FairShare7().order(snap)] == [3, 2, 1]
    assert [j.job_id for _, j in FairShare7(requeued_last=False).order(snap)] == [3, 1, 2]


def test_the_restart_overhead_of_funded_victims_is_priced() -> None:
    # the victim loses 3 GPU-h of work; the gain is 4 GPU-h (8 GPUs x 30 min): fairshare-6
    # preempts, fairshare-7 counts 8 GPUs x 10 min of restart on top (4.33 GPU-h) and does not
    snap = world([node("n1")], [run(10, {"n1": range(8)}, lost_s=1350)], [pend(1, 8)])
    assert preempted(snap, policy_from_config(default_config("fairshare-6"))) == [10]
    priced = FairShare7(gain_horizon_s=1800.0, relaunch_cost_s=600.0)
    d = decide(snap, priced, NOW)
    assert not d.preemptions
    assert "3.00 GPU-h of funded work and 1.33 GPU-h of restarts, more than the 4.00" in (
        d.waiting[1].reason
    )
    assert preempted(snap, FairShare7(gain_horizon_s=1800.0, relaunch_cost_s=0.0)) == [10]
    # a gain that grows with the wait: job 1 has waited NOW - 1 s; 0.01 s per s adds ~1000 s
    aging = FairShare7(gain_horizon_s=1800.0, relaunch_cost_s=600.0, gain_aging=0.01)
    (p,) = decide(snap, aging, NOW).preemptions
    assert p.job_id == 10


def test_a_large_funded_gang_holds_the_nodes_that_free_first_and_only_the_free_tier_backfills() -> (
    None
):
    nodes = [node(f"n{i}") for i in range(1, 9)]  # 64 GPUs; 1/8 is 8
    # n1: a funded job of the better team, inside its contract for 1 h more (not a victim
    # before then); n2: free; n3..n8 funded jobs of its own team (never its victims)
    inside = run(10, {"n1": range(8)}, "lab/b", placed_ago_s=0.0, lost_s=0.0, min_runtime_s=3600)
    own = [run(20 + i, {f"n{i}": range(8)}, "lab/a") for i in range(3, 9)]
    big = pend(1, 16, "lab/a")
    small = pend(2, 8, "lab/c")
    free_tier = pend(3, 8, "lab/c", funded=False)
    snap = world(nodes, [inside, *own], [big, small, free_tier])
    assert pool_gpus(snap, big) == 64
    d = decide(snap, FairShare7(), NOW)
    assert d.hold is not None
    assert (d.hold.job_id, sorted(d.hold.nodes), d.hold.until) == (1, ["n1", "n2"], NOW + H)
    # the funded small job may not take n2 (it would outlast the reservation); the free tier may
    assert [p.job_id for p in d.placements] == [3] and 2 in d.waiting
    assert {s.node for p in d.placements for s in p.slots} == {"n2"}
    # no reservation below the share, or with hold_share 0
    assert decide(snap, FairShare7(hold_share=0.5), NOW).hold is None
    assert decide(snap, FairShare7(hold_share=0.0), NOW).hold is None
    assert {p.job_id for p in decide(snap, FairShare7(hold_share=0.0), NOW).placements} == {2}


def test_a_reservation_expects_jobs_it_may_not_preempt_to_end_only_when_told() -> None:
    nodes = [node(f"n{i}") for i in range(1, 9)]
    # every node holds a funded job of the waiting job's own team (never its victims), placed
    # 2 h ago with a 1 h contract; n1's and n2's jobs started later (contract ends in 1 h)
    own = [run(20 + i, {f"n{i}": range(8)}, "lab/a") for i in range(3, 9)]
    late = [run(10 + i, {f"n{i}": range(8)}, "lab/a", placed_ago_s=0.0, lost_s=0.0) for i in (1, 2)]
    snap = world(nodes, [*late, *own], [pend(1, 16, "lab/a")])
    assert decide(snap, FairShare7(), NOW).hold is None  # no end known: nothing to hold
    d = decide(snap, FairShare7(hold_expect_s=6 * H), NOW)
    assert d.hold is not None
    # the jobs placed 2 h ago are expected 6 h after their 1 h contract: in 5 h
    assert (sorted(d.hold.nodes), d.hold.until) == (["n3", "n4"], NOW + 5 * H)


_ASKED: list[int] = []


class _Counting(FairShare7, frozen=True, kw_only=True):
    """FairShare7 that notes every job it is asked victims for."""

    def victims(self, job, candidates, snapshot, now):  # type: ignore[no-untyped-def]
        _ASKED.append(job.job_id)
        return super().victims(job, candidates, snapshot, now)


def test_a_reservation_reads_the_victims_its_group_already_has_this_cycle() -> None:
    """The gang job's search (contracts counted out), its estimate (contracts counted) and its
    reservation ask for victims; the reservation reads the estimate's answer, one per victim
    group, constraints and contract mode in a cycle (the code before asked a third time), and
    decides as it did."""
    nodes = [node(f"n{i}") for i in range(1, 9)]
    inside = run(10, {"n1": range(8)}, "lab/b", placed_ago_s=0.0, lost_s=0.0, min_runtime_s=3600)
    own = [run(20 + i, {f"n{i}": range(8)}, "lab/a") for i in range(3, 9)]
    snap = world(nodes, [inside, *own], [pend(1, 16, "lab/a")])
    _ASKED.clear()
    d = decide(snap, _Counting(), NOW)
    assert _ASKED == [1, 1]
    assert d == decide(snap, FairShare7(), NOW)
    assert d.hold is not None and (sorted(d.hold.nodes), d.hold.until) == (["n1", "n2"], NOW + H)
