"""fairshare-17's `takeback_keep_wait_s` (s55 candidate, off by default; atk55-26 F1): the keep
bounds how many GPUs are kept, not which jobs they block, so one kept 8-GPU run (exactly 1/16)
held a 32-GPU gang out for 71 h. With the setting, a funded non-debug job that has waited that
long since its submission takes kept runs back like any other unfunded run."""

from __future__ import annotations

import msgspec

from ledger.dispatch import registry
from ledger.dispatch.fairshare17 import FairShare17
from schemas.policy import AnyPolicyConfig, FairShare17Config
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, preempted, world
from tests.unit.test_dispatch_fairshare17_bounds import _free


def _gang(waited_s: float):  # type: ignore[no-untyped-def]
    """A funded 16-GPU job of lab/a submitted `waited_s` ago, on two nodes: one free, one held
    by a free-tier run of lab/b that lab/c's funded work took back 3 times (kept)."""
    kept = _free(10, "n2", by="lab/c", placed_ago_s=H)
    job = msgspec.structs.replace(pend(1, 16), submitted_at=NOW - waited_s)
    return world([node("n1"), node("n2")], [kept], [job])


def test_a_funded_job_that_waited_the_keep_wait_takes_a_kept_run_back() -> None:
    # (the yield to large jobs off: this 16-GPU job asks the whole two-node pool)
    wait = FairShare17(takeback_keep_share=1.0, takeback_keep_wait_s=6 * H,
                       takeback_keep_yield_share=0.0)  # fmt: skip
    assert preempted(_gang(5 * H), wait) == []  # kept: waited 5 h of 6
    assert preempted(_gang(6 * H), wait) == [10]  # waited 6 h: the keep lapses for it
    # off (the default): kept however long the job waited
    off = FairShare17(takeback_keep_share=1.0, takeback_keep_yield_share=0.0)
    assert preempted(_gang(70 * H), off) == []


def test_the_keep_wait_is_off_by_default_and_in_older_records() -> None:
    config = registry.default_config("fairshare-17")
    assert isinstance(config, FairShare17Config) and config.takeback_keep_wait_s == 0.0
    raw = msgspec.to_builtins(config)
    del raw["takeback_keep_wait_s"]  # a record made before the setting existed
    old = msgspec.convert(raw, AnyPolicyConfig)
    assert isinstance(old, FairShare17Config) and old.takeback_keep_wait_s == 0.0
    policy = registry.build("fairshare-17", {"takeback_keep_wait_s": "3600"})
    assert policy.takeback_keep_wait_s == 3600.0  # type: ignore[attr-defined]
