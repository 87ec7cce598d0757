"""fairshare-16: the free tier's takebacks priced in the victim choice and bounded, requeued
unfunded jobs before fresh ones; fairshare-7 decides as before."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from ledger.core.state import State
from ledger.cycle.inputs import snapshot_from_state
from ledger.dispatch import decide
from ledger.dispatch.fairshare7 import FairShare7
from ledger.dispatch.fairshare16 import FairShare16
from ledger.dispatch.registry import config_of, default_config, policy_from_config
from ledger.reads.keyparts import key_parts
from tests.conftest import T0
from tests.unit.test_contract_from_start import _placed
from tests.unit.test_dispatch_fairshare2 import NOW, node, pend, preempted, run, world


def _taken(job_id: int, where: dict[str, range], runs: int, lost_s: float = 600.0):  # type: ignore[no-untyped-def]
    """An unfunded running job taken back `runs` times before, `lost_s` since its checkpoint."""
    r = run(job_id, where, "lab/b", min_runtime_s=0, lost_s=lost_s)
    return msgspec.structs.replace(r, runs=runs)


def test_fairshare_16_round_trips_and_fairshare_7_is_still_the_default() -> None:
    assert type(policy_from_config(default_config())) is FairShare7
    sixteen = policy_from_config(default_config("fairshare-16"))
    assert type(sixteen) is FairShare16 and sixteen.version == "fairshare-16"
    assert (sixteen.takeback_price_s, sixteen.funded_takeback_price_s) == (3600.0, 1800.0)
    assert sixteen.fresh_first and not sixteen.ran_first and not FairShare7().ran_first
    odd = FairShare16(takeback_price_s=60.0, takeback_limit=3, requeued_first=True)
    assert policy_from_config(config_of(odd)) == odd
    assert odd.ran_first and odd.fresh_first


def test_among_the_free_tier_the_job_taken_back_fewest_times_is_taken() -> None:
    # n1: an unfunded job taken back 3 times that lost 10 min since its checkpoint; n2: one
    # never taken back that lost 50 min. fairshare-7 takes the cheaper work (n1's job again),
    # fairshare-16 prices the takebacks before (3 x 1 h) and takes n2's
    again = _taken(10, {"n1": range(8)}, runs=3, lost_s=600.0)
    fresh = _taken(11, {"n2": range(8)}, runs=0, lost_s=3000.0)
    snap = world([node("n1"), node("n2")], [again, fresh], [pend(1, 8)])
    assert preempted(snap, FairShare7()) == [10]
    assert preempted(snap, FairShare16()) == [11]
    assert preempted(snap, FairShare16(takeback_price_s=0.0)) == [10]


def test_a_free_tier_job_taken_back_often_enough_keeps_its_gpus_against_funded_work() -> None:
    again = _taken(10, {"n1": range(8)}, runs=2)
    snap = world([node("n1")], [again], [pend(1, 8)])
    assert preempted(snap, FairShare16()) == [10]  # no bound by default
    bounded = FairShare16(takeback_limit=2)
    d = decide(snap, bounded, NOW)
    assert not d.preemptions and 1 in d.waiting
    assert preempted(snap, FairShare16(takeback_limit=3)) == [10]
    # a debug job may still take it back (it runs at most 15 minutes)
    snap = world([node("n1")], [again], [pend(2, 8, debug=True)])
    assert preempted(snap, bounded) == [10]


def test_a_requeued_unfunded_job_goes_before_fresh_ones_when_told() -> None:
    ran = msgspec.structs.replace(pend(1, 8, "lab/a", funded=False), runs=1)
    fresh = pend(2, 8, "lab/c", funded=False)
    requeued_funded = msgspec.structs.replace(pend(3, 8, "lab/c"), runs=2)
    snap = world([node("n1")], [], [ran, fresh, requeued_funded])
    assert [j.job_id for _, j in FairShare7().order(snap)] == [3, 2, 1]
    assert [j.job_id for _, j in FairShare16().order(snap)] == [3, 2, 1]  # off by default
    turned = FairShare16(requeued_first=True)
    assert [j.job_id for _, j in turned.order(snap)] == [3, 1, 2]
    key = next(k for k, j in turned.order(snap) if j.job_id == 2)
    part = key_parts("fairshare-16", key)[2]
    assert (
        part.name == "unfunded_step" and "with requeued_first: one that never ran" in part.meaning
    )


def test_a_free_tier_job_placed_a_moment_ago_is_given_grace() -> None:
    # placed 10 min ago (its checkpoint is its placement): no victim under a 1 h grace
    just = msgspec.structs.replace(
        run(10, {"n1": range(8)}, "lab/b", min_runtime_s=0, placed_ago_s=600.0, lost_s=600.0),
        runs=1,
    )
    snap = world([node("n1")], [just], [pend(1, 8)])
    assert preempted(snap, FairShare16()) == [10]
    assert preempted(snap, FairShare16(takeback_grace_s=3600.0)) == []
    assert preempted(snap, FairShare16(takeback_grace_s=300.0)) == [10]
    debug = world([node("n1")], [just], [pend(2, 8, debug=True)])
    assert preempted(debug, FairShare16(takeback_grace_s=3600.0)) == [10]


def test_the_takebacks_before_of_a_funded_victim_are_priced() -> None:
    # the funded victim loses 30 min of 8 GPUs (4 GPU-h) plus 5 min of restart (0.67 GPU-h);
    # the gain is 8 GPUs x 1 h (8 GPU-h): taken, unless its 3 takebacks before are priced
    # at 1,800 s each (8 x 1.5 h = 12 GPU-h more)
    victim = msgspec.structs.replace(run(10, {"n1": range(8)}, "lab/b"), runs=3)
    snap = world([node("n1")], [victim], [pend(1, 8)])
    assert preempted(snap, FairShare7()) == [10]
    assert preempted(snap, FairShare16(funded_takeback_price_s=0.0)) == [10]
    priced = FairShare16()  # 1,800 s a takeback by default
    d = decide(snap, priced, NOW)
    assert not d.preemptions and "12.67 GPU-h of restarts" in d.waiting[1].reason
    first = world([node("n1")], [run(10, {"n1": range(8)}, "lab/b")], [pend(1, 8)])
    assert preempted(first, priced) == [10]  # never taken back before: as fairshare-7


def test_a_running_jobs_view_says_how_often_it_was_taken_back(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    _placed(org_state, counter_ids)
    [first] = snapshot_from_state(org_state, {}, T0 + 1).running
    assert first.runs == 0
    org_state.jobs[1] = msgspec.structs.replace(org_state.jobs[1], preemptions=2)
    [again] = snapshot_from_state(org_state, {}, T0 + 2).running
    assert again.runs == 2
