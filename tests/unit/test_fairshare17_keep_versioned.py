"""fairshare-17's keep settings are versioned fields (atk55-26 F3): a record written by
fairshare-17 as first merged (s54's d46c2db) has no `takeback_keep_*` keys, and that code kept a
run for ever with no share bound; it decodes to exactly that, so its decisions replay as made.
A policy built today gets s55's 72 h and 1/16."""

from __future__ import annotations

import msgspec

from ledger.dispatch import registry
from ledger.dispatch.fairshare17 import FairShare17
from schemas.policy import NO_BOUND, AnyPolicyConfig, FairShare17Config
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, world
from tests.unit.test_dispatch_fairshare17_bounds import _free

D46C2DB = (
    b'{"version":"fairshare-17","team_depth":2,"margin":0.1,"min_rank_gap":1,'
    b'"gain_horizon_s":1800.0,"spare_ratio":5.0,"squat_after_s":3600.0,"squat_util_pct":10.0,'
    b'"search_budget":32,"debug_lane":true,"debug_search_budget":8,"debug_victim_ratio":2.0,'
    b'"debug_reserve_per":0,"requeued_last":true,"relaunch_cost_s":300.0,"hold_share":0.125,'
    b'"hold_expect_s":0.0,"gain_aging":0.0,"takeback_price_s":0.0,"takeback_limit":3,'
    b'"takeback_grace_s":0.0,"funded_takeback_price_s":0.0,"takeback_spread":true,'
    b'"requeued_first":false,"free_order":"oldest","free_age_price":1.0,"debug_hold":true}'
)
"""The `policy` of a `cycle.decided.v4` that d46c2db's fairshare-17 wrote (the attacker's L4
log, cycle-42), byte for byte."""


def test_a_record_without_the_keep_settings_decodes_to_the_code_that_wrote_it() -> None:
    config = msgspec.json.decode(D46C2DB, type=AnyPolicyConfig)
    assert isinstance(config, FairShare17Config)
    assert (config.takeback_keep_s, config.takeback_keep_share) == (NO_BOUND, NO_BOUND)
    # and it decides as that code did: 16 nodes of free-tier jobs taken back 3 times by lab/c,
    # placed four days ago, are all kept (s55's defaults keep none of them; 1/16 would keep one)
    nodes = [node(f"n{i:02}") for i in range(16)]
    jobs = [_free(10 + i, f"n{i:02}", by="lab/c", submitted_at=float(i), placed_ago_s=96 * H)
            for i in range(16)]  # fmt: skip
    snap = world(nodes, jobs, [pend(1, 8)])
    policy = registry.policy_from_config(config)
    assert isinstance(policy, FairShare17)
    assert policy.kept_runs(snap, NOW) == frozenset(range(10, 26))
    assert registry.build("fairshare-17").kept_runs(snap, NOW) == frozenset()  # type: ignore[attr-defined]


def test_a_policy_built_today_gets_72_h_and_one_gpu_in_sixteen() -> None:
    config = registry.default_config("fairshare-17")
    assert isinstance(config, FairShare17Config)
    assert (config.takeback_keep_s, config.takeback_keep_share) == (259_200.0, 0.0625)
    policy = registry.build("fairshare-17", {"takeback_keep_s": "21600"})
    assert (policy.takeback_keep_s, policy.takeback_keep_share) == (21_600.0, 0.0625)  # type: ignore[attr-defined]
    # what a policy built today records it decodes back to, unchanged
    assert msgspec.json.decode(msgspec.json.encode(config), type=AnyPolicyConfig) == config
