"""fairshare-17: the free tier oldest first and taken back from its newest arrivals, a node kept
for a waiting debug job; fairshare-7 and fairshare-16 decide as before."""

from __future__ import annotations

import msgspec

from ledger.dispatch import decide
from ledger.dispatch.fairshare7 import FairShare7
from ledger.dispatch.fairshare16 import FairShare16
from ledger.dispatch.fairshare17 import FairShare17
from ledger.dispatch.registry import config_of, default_config, policy_from_config
from tests.unit.test_dispatch_fairshare2 import NOW, node, pend, preempted, run, world


def test_fairshare_17_round_trips_with_its_settings() -> None:
    seventeen = policy_from_config(default_config("fairshare-17"))
    assert type(seventeen) is FairShare17 and seventeen.version == "fairshare-17"
    assert (seventeen.free_order, seventeen.free_age_price, seventeen.debug_hold) == (
        "user_share",  # built today since s63-policy3 (a record without it: "oldest")
        1.0,
        True,
    )
    assert (seventeen.takeback_price_s, seventeen.funded_takeback_price_s) == (0.0, 0.0)
    assert seventeen.takeback_limit == 3
    odd = FairShare17(free_order="team", free_age_price=0.5, debug_hold=False, takeback_limit=2)
    assert policy_from_config(config_of(odd)) == odd
    assert not FairShare7().free_oldest and not FairShare16().free_oldest


def test_the_free_tier_goes_by_submit_time_alone() -> None:
    # job 1 (team a) was taken back once; 2 (team c) and 3 (team a) never ran; 4 is funded.
    # fairshare-7: funded, then the free tier's fresh jobs by team (lab/a first), the job that
    # ran last; fairshare-17: funded, then the free tier by submit time (1, 2, 3)
    ran = msgspec.structs.replace(pend(1, 8, "lab/a", funded=False), runs=1)
    fresh_c = pend(2, 8, "lab/c", funded=False)
    fresh_a = pend(3, 8, "lab/a", funded=False)
    funded = pend(4, 8, "lab/c")
    snap = world([node("n1")], [], [ran, fresh_c, fresh_a, funded])
    assert [j.job_id for _, j in FairShare7().order(snap)] == [4, 3, 2, 1]
    assert [j.job_id for _, j in FairShare17().order(snap)] == [4, 1, 2, 3]
    assert [j.job_id for _, j in FairShare17(free_order="team").order(snap)] == [4, 3, 2, 1]


def _unfunded(job_id: int, node_name: str, submitted_at: float, lost_s: float):  # type: ignore[no-untyped-def]
    r = run(job_id, {node_name: range(8)}, "lab/b", min_runtime_s=0, lost_s=lost_s)
    return msgspec.structs.replace(r, submitted_at=submitted_at)


def test_funded_work_takes_back_the_free_tiers_newest_arrival() -> None:
    # n1: an unfunded job submitted 3 days ago, re-placed 10 minutes ago; n2: one submitted an
    # hour ago that has run 50 minutes. fairshare-7 takes the cheaper work (the old job, again);
    # fairshare-17 the newest arrival
    old = _unfunded(10, "n1", NOW - 3 * 86_400, lost_s=600.0)
    new = _unfunded(11, "n2", NOW - 3_600, lost_s=3_000.0)
    snap = world([node("n1"), node("n2")], [old, new], [pend(1, 8)])
    assert preempted(snap, FairShare7()) == [10]
    assert preempted(snap, FairShare16()) == [10]
    assert preempted(snap, FairShare17()) == [11]
    assert preempted(snap, FairShare17(free_age_price=0.0)) == [10]


def test_a_waiting_debug_job_keeps_the_node_a_funded_job_frees() -> None:
    # n1: a funded non-resumable job past its contract on 6 GPUs whose declared limit ends in
    # 30 min, 2 free; n2: one on all 8 with none. A debug job asking 4 may preempt neither.
    # fairshare-7 places the funded 2-GPU job 2 on n1's free GPUs; fairshare-17 keeps n1 for
    # the debug job (it frees within the window; n2 never), so job 2 waits and the GPUs n1's
    # job frees go to the debug job (no limit: no node kept, test_dispatch_fairshare17_bounds)
    blocker = run(10, {"n1": range(6)}, "lab/b", resumable=False)
    blocker = msgspec.structs.replace(blocker, time_limit_s=9_000)  # placed 2 h ago
    full = run(11, {"n2": range(8)}, "lab/b", resumable=False)
    debug, small = pend(1, 4, debug=True), pend(2, 2, "lab/c")
    snap = world([node("n1"), node("n2")], [blocker, full], [debug, small])
    d7 = decide(snap, FairShare7(), NOW)
    assert [p.job_id for p in d7.placements] == [2] and not d7.preemptions
    d17 = decide(snap, FairShare17(), NOW)
    assert not d17.placements and not d17.preemptions
    assert {1, 2} <= set(d17.waiting)
    off = decide(snap, FairShare17(debug_hold=False), NOW)
    assert [p.job_id for p in off.placements] == [2]
    # an unfunded job may still use the kept GPUs (the debug job may preempt it)
    free = pend(3, 2, "lab/c", funded=False)
    snap = world([node("n1"), node("n2")], [blocker, full], [debug, free])
    assert [p.job_id for p in decide(snap, FairShare17(), NOW).placements] == [3]
    # once n1's job ends the debug job runs there
    snap = world([node("n1"), node("n2")], [full], [debug, small])
    placed = decide(snap, FairShare17(), NOW).placements
    assert placed[0].job_id == 1 and placed[0].slots[0].node == "n1"
