"""fairshare-17's free tier by share with its gangs by age (s63-policy3, issue 26): with
`free_order` "user_share" an unfunded job asking at least `free_share_large` of its pool takes
the best place's fair-share factor, so the free tier's gangs go by age ahead of its small jobs
whoever their user; with `free_share_large_head` its oldest gang alone (on the large-mix corner
the large-job wait p90 is the free tier's gangs', and the share order left a heavy user's 32-GPU
gang unplaced for 103 h). Versioned fields, off in a record without them. Pure dispatch on
small worlds."""

from __future__ import annotations

import msgspec

from ledger.dispatch import registry
from ledger.dispatch.fairshare17 import gang_place
from ledger.dispatch.snapshot import PendingJob
from schemas.policy import AnyPolicyConfig, FairShare17Config
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, world
from tests.unit.test_fairshare17_share import _built

# RANKS (test_dispatch_fairshare2): lab/a/u 0, lab/a/v 1, lab/b/u 2, lab/c/u 3 (N = 4)


def _free(job_id: int, gpus: int, account: str, submitted_ago_s: float) -> PendingJob:
    return msgspec.structs.replace(
        pend(job_id, gpus, account, funded=False), submitted_at=NOW - submitted_ago_s
    )


def test_gang_place_is_the_best_for_a_job_of_the_large_share() -> None:
    gang = _free(1, 32, "lab/c", H)
    small = _free(2, 8, "lab/c", H)
    assert gang_place(gang, 3, 256, 0.125) == 0  # 32 of 256: a large job
    assert gang_place(small, 3, 256, 0.125) == 3
    assert gang_place(gang, 3, 256, 0.0) == 3  # off
    assert gang_place(gang, 3, 0, 0.125) == 3  # no pool


def test_the_free_tiers_gangs_go_by_age_ahead_of_its_small_jobs() -> None:
    # 64 GPUs: lab/c/u (rank 3) has an 8-GPU gang from 3 days ago and a 4-GPU job; lab/b/u
    # (rank 2) a gang from 10 h ago; lab/a/u (rank 0) a 4-GPU job an hour ago and a gang 2 h
    # ago. By share lab/a's go first; with the gangs' best place the gangs go first by age,
    # then the share order; with `free_share_large_head` only the oldest gang goes first
    nodes = [node(f"n{i}") for i in range(8)]
    heavy_gang = _free(1, 8, "lab/c", 72 * H)
    heavy_small = _free(2, 4, "lab/c", 80 * H)
    light_small = _free(3, 4, "lab/a", H)
    light_gang = _free(4, 8, "lab/a", 2 * H)
    funded = pend(5, 8, "lab/c")
    b_gang = _free(6, 8, "lab/b", 10 * H)
    snap = world(nodes, [], [heavy_gang, heavy_small, light_small, light_gang, funded, b_gang])
    share = _built(free_order="user_share")
    gangs = _built(free_order="user_share", free_share_large=0.125)
    head = _built(free_order="user_share", free_share_large=0.125, free_share_large_head=True)
    assert [j.job_id for _, j in share.order(snap)] == [5, 4, 3, 6, 2, 1]  # type: ignore[attr-defined]
    assert [j.job_id for _, j in gangs.order(snap)] == [5, 1, 6, 4, 3, 2]  # type: ignore[attr-defined]
    assert [j.job_id for _, j in head.order(snap)] == [5, 1, 4, 3, 6, 2]  # type: ignore[attr-defined]
    # the oldest order is not touched by the settings
    oldest = _built(free_share_large=0.125, free_share_large_head=True)
    assert [j.job_id for _, j in oldest.order(snap)] == [5, 2, 1, 6, 4, 3]  # type: ignore[attr-defined]


def test_a_record_without_the_setting_decodes_to_it_off() -> None:
    config = registry.default_config("fairshare-17")
    assert isinstance(config, FairShare17Config)
    raw = msgspec.to_builtins(config)
    raw.pop("free_share_large", None)  # a record made before
    raw.pop("free_share_large_head", None)
    raw.pop("free_order", None)
    old = msgspec.convert(raw, AnyPolicyConfig)
    assert isinstance(old, FairShare17Config) and old.free_share_large == 0.0
    assert old.free_share_large_head is False
    built = registry.build("fairshare-17", {"free_share_large": "0.125"})
    assert built.free_share_large == 0.125  # type: ignore[attr-defined]
