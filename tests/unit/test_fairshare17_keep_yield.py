"""fairshare-17's `takeback_keep_yield_share` (s56, atk55-26 F1): the keep bounds how many GPUs
are kept, not which jobs they block, so one kept 8-GPU run (exactly 1/16) held a 32-GPU gang
out for 71 h. With the setting, a funded non-debug job asking at least that share of its pool
takes kept runs back like any other unfunded run; a smaller one still may not."""

from __future__ import annotations

import msgspec

from ledger.dispatch import registry
from ledger.dispatch.fairshare17 import FairShare17
from schemas.policy import AnyPolicyConfig, FairShare17Config
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, preempted, run, world
from tests.unit.test_dispatch_fairshare17_bounds import _free


def _funded(job_id: int, where: str):  # type: ignore[no-untyped-def]
    """A funded non-resumable 8-GPU run of lab/c on `where`, inside its contract."""
    return run(job_id, {where: range(8)}, "lab/c", min_runtime_s=100 * 3600, resumable=False)


def _gang(gpus: int):  # type: ignore[no-untyped-def]
    """A funded job of lab/a asking `gpus` on four 8-GPU nodes: n1 free, n2 held by a free-tier
    run of lab/b that lab/c's funded work took back 3 times (kept), n3 and n4 by lab/c's funded
    work inside its contract."""
    kept = _free(10, "n2", by="lab/c", placed_ago_s=H)
    nodes = [node("n1"), node("n2"), node("n3"), node("n4")]
    return world(nodes, [kept, _funded(20, "n3"), _funded(21, "n4")], [pend(1, gpus)])


def test_a_funded_job_asking_the_yield_share_takes_a_kept_run_back() -> None:
    keep = dict(takeback_keep_share=1.0)
    yields = FairShare17(**keep, takeback_keep_yield_share=0.5)  # type: ignore[arg-type]
    assert preempted(_gang(16), yields) == [10]  # 16 of 32 GPUs: the kept run yields
    # off (0, what a log written before holds): kept however large the gang
    off = FairShare17(**keep, takeback_keep_yield_share=0.0)  # type: ignore[arg-type]
    assert preempted(_gang(16), off) == []
    # a smaller job of the pool (12 of 32 < half) still may not take the kept run
    assert preempted(_gang(12), yields) == []


def test_the_kept_run_yields_to_the_large_job_after_a_small_one_of_its_team_asked() -> None:
    # a small and a large funded job of one team in one cycle: the small one asks first (it is
    # older) and takes back the newest free-tier run (11, on n3); the large one (16 GPUs,
    # whole nodes) must get the kept run (10, n2) and the other free run (12, n4), though a
    # team's jobs share their victims (`victim_group`): the yield splits the group
    kept = _free(10, "n2", by="lab/c", placed_ago_s=H)
    f1 = msgspec.structs.replace(_free(11, "n3", by="lab/b", times=0), submitted_at=NOW - H)
    f2 = msgspec.structs.replace(_free(12, "n4", by="lab/b", times=0), submitted_at=NOW - 2 * H)
    small = msgspec.structs.replace(pend(1, 8), submitted_at=NOW - 5 * H)
    large = msgspec.structs.replace(pend(2, 16), submitted_at=NOW - 4 * H)
    nodes = [node("n1"), node("n2"), node("n3"), node("n4")]
    busy = _funded(20, "n1")
    snap = world(nodes, [busy, kept, f1, f2], [small, large])
    policy = FairShare17(takeback_keep_share=1.0, takeback_keep_yield_share=0.5)
    assert sorted(preempted(snap, policy)) == [10, 11, 12]


def test_the_defaults_let_a_gang_of_an_eighth_take_the_kept_run_back() -> None:
    # world Q in small (atk55-26 F1): 16 nodes, 12 held by funded work inside its contract, 3
    # free, one by a free-tier 8-GPU run lab/c took back 3 times (1/16 of the GPUs: kept). A
    # 32-GPU gang of lab/a needs four whole nodes: under the s55 keep it waited the keep's 72 h
    # out; a policy built today (yield share 0.125, `hold_share`'s) takes the kept run back,
    # and a funded 8-GPU job still may not
    nodes = [node(f"n{i:02}") for i in range(16)]
    busy = [_funded(20 + i, f"n{i:02}") for i in range(4, 16)]
    kept = _free(10, "n03", by="lab/c", placed_ago_s=H)
    built = registry.build("fairshare-17", {})
    # (s56-keep2's need rule off: `test_fairshare17_keep_need.py` has it)
    built = msgspec.structs.replace(built, takeback_keep_need_s=0.0)  # type: ignore[type-var]
    s55 = msgspec.structs.replace(built, takeback_keep_yield_share=0.0)  # type: ignore[type-var]
    gang = world(nodes, [kept, *busy], [pend(1, 32)])
    assert built.kept_runs(gang, NOW) == frozenset({10})  # type: ignore[attr-defined]
    assert preempted(gang, s55) == []
    assert preempted(gang, built) == [10]
    full = [_funded(30 + i, f"n{i:02}") for i in range(3)]
    small = world(nodes, [*full, kept, *busy], [pend(1, 8)])
    assert preempted(small, built) == []


def test_the_yield_is_off_in_older_records() -> None:
    config = registry.default_config("fairshare-17")
    assert isinstance(config, FairShare17Config) and config.takeback_keep_yield_share == 0.125
    raw = msgspec.to_builtins(config)
    del raw["takeback_keep_yield_share"]  # a record made before the setting existed
    old = msgspec.convert(raw, AnyPolicyConfig)
    assert isinstance(old, FairShare17Config) and old.takeback_keep_yield_share == 0.0
    policy = registry.build("fairshare-17", {"takeback_keep_yield_share": "0.25"})
    assert policy.takeback_keep_yield_share == 0.25  # type: ignore[attr-defined]
