"""fairshare-14: fairshare-13 with a moment's victim-search budget carried into one cycle (the
budget renewed after a placement or preemption, `search_rounds` budgets at most), and the
simulator no longer cycling again at once when the searches ran out."""

from __future__ import annotations

import msgspec

from ledger.dispatch import decide
from ledger.dispatch.fairshare13 import FairShare13
from ledger.dispatch.fairshare14 import FairShare14
from ledger.dispatch.registry import config_of, default_config, policy_from_config, with_knobs
from ledger.dispatch.snapshot import Snapshot
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, run, world
from tests.unit.test_dispatch_fairshare12 import owed

SPENT = "WAIT_PRIORITY: the cycle's victim searches went to jobs ahead of it in the order"


def full(n: int, lost_s: float, shrink: bool = False) -> Snapshot:
    """`n` 8-GPU nodes, each running a resumable lab/b job past its contract, checkpointed
    `lost_s` ago; lab/c (under its share) waits with `n` jobs of 8 GPUs (`shrink`: 8, 7, ...
    GPUs, so that no failed search answers the next job's)."""
    nodes = [node(f"n{i}") for i in range(n)]
    running = [run(100 + i, {f"n{i}": range(8)}, "lab/b", lost_s=lost_s) for i in range(n)]
    pending = [pend(i + 1, 8 - i if shrink else 8, "lab/c") for i in range(n)]
    return owed(world(nodes, running, pending))


def test_a_spent_budget_is_renewed_after_a_placement_up_to_search_rounds() -> None:
    snap = full(10, lost_s=60.0)  # cheap victims: every plan is taken
    thirteen = decide(snap, FairShare13(search_budget=3), NOW)
    assert len(thirteen.placements) == 3 and thirteen.budget_spent
    assert thirteen.waiting[4].text() == SPENT
    d = decide(snap, FairShare14(search_budget=3), NOW)  # 4 budgets of 3: 10 searches
    assert sorted(p.job_id for p in d.placements) == list(range(1, 11))
    assert len(d.preemptions) == 10 and not d.budget_spent
    two = decide(snap, FairShare14(search_budget=3, search_rounds=2), NOW)
    assert len(two.placements) == 6 and two.budget_spent
    assert two.waiting[7].text() == SPENT
    one = decide(snap, FairShare14(search_budget=3, search_rounds=1), NOW)
    assert one.placements == thirteen.placements and one.runs == thirteen.runs


def test_a_budget_spent_on_refused_plans_is_not_renewed() -> None:
    # victims checkpointed an hour ago: each plan loses more than it gains, the cost model
    # refuses it; nothing placed or preempted, so the budget ends as fairshare-13's does
    snap = full(6, lost_s=H, shrink=True)
    thirteen = decide(snap, FairShare13(search_budget=2), NOW)
    d = decide(snap, FairShare14(search_budget=2), NOW)
    assert not d.placements and not d.preemptions
    assert d.runs == thirteen.runs and d.budget_spent
    assert d.waiting[6].text() == SPENT


def test_fairshare_14_is_registered_and_its_config_round_trips() -> None:
    config = default_config("fairshare-14")
    assert config.version == "fairshare-14"
    policy = policy_from_config(with_knobs(config, {"search_rounds": "2"}))
    assert isinstance(policy, FairShare14) and policy.search_rounds == 2
    assert config_of(policy) == with_knobs(config, {"search_rounds": 2})
    assert policy.carries_budget and not getattr(FairShare13(), "carries_budget", False)
    assert msgspec.json.decode(msgspec.json.encode(config), type=type(config)) == config
    assert default_config("fairshare").version == "fairshare-7"  # not the default
