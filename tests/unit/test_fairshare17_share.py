"""fairshare-17's free tier ordered as `slurm-lab-2` orders its scavenger tier (s63-policy2,
issue 26): `free_order` "user_share" sorts unfunded jobs by the multifactor priority, the user
leaf's Fair Tree factor weighted 10,000 against age's 1,000 (age capped at 7 days), so the tier's
long waits fall on its heaviest users' jobs; "team_share" places the team by its share of the
whole tree instead; `free_victims_by_share` takes back the free tier's runs in that order read
backwards (the heaviest user's newest run first). Each a versioned field, off in a record
without it. Pure dispatch on small worlds."""

from __future__ import annotations

import msgspec
import pytest

from ledger.dispatch import decide, registry
from ledger.dispatch.fairshare17 import SLURM_MAX_AGE_S, share_age
from ledger.dispatch.snapshot import PendingJob, RunningJob
from schemas.policy import AnyPolicyConfig, FairShare17Config
from tests.unit.test_dispatch_fairshare2 import LEVEL_FS, NOW, H, node, pend, preempted, run, world

# RANKS (test_dispatch_fairshare2): lab/a/u 0, lab/a/v 1, lab/b/u 2, lab/c/u 3 (N = 4)


def _free(job_id: int, account: str, submitted_ago_s: float, user: str = "u") -> PendingJob:
    return msgspec.structs.replace(
        pend(job_id, 8, account, user=user, funded=False), submitted_at=NOW - submitted_ago_s
    )


def _built(**settings: object) -> object:
    """`fairshare-17` built today with the free tier's order as before s63-policy3 (oldest,
    no share settings), then `settings`."""
    before = {"free_order": "oldest", "takeback_keep_need_fs": 0.0, "free_share_large": 0.0,
              "free_share_large_head": False}  # fmt: skip
    built = registry.build("fairshare-17", {})
    return msgspec.structs.replace(built, **{**before, **settings})  # type: ignore[type-var]


def test_user_share_orders_the_free_tier_by_the_users_fair_share_then_age() -> None:
    # lab/c/u (rank 3 of 4) submitted 6 days ago, lab/a/u (rank 0) an hour ago: oldest first
    # places lab/c's, the share order lab/a's (a rank is 2,500 points, a week of age 1,000)
    heavy = _free(1, "lab/c", 6 * 24 * H)
    light = _free(2, "lab/a", H)
    snap = world([node("n1")], [], [heavy, light])
    oldest, share = _built(), _built(free_order="user_share")
    assert [j.job_id for _, j in oldest.order(snap)] == [1, 2]  # type: ignore[attr-defined]
    assert [j.job_id for _, j in share.order(snap)] == [2, 1]  # type: ignore[attr-defined]
    assert [p.job_id for p in decide(snap, share, NOW).placements] == [2]  # type: ignore[arg-type]
    assert [p.job_id for p in decide(snap, oldest, NOW).placements] == [1]  # type: ignore[arg-type]
    # one user's jobs go oldest first; funded work still goes before the whole tier
    older = _free(3, "lab/a", 2 * H)
    funded = pend(4, 8, "lab/c")
    both = world([node("n1")], [], [heavy, light, older, funded])
    assert [j.job_id for _, j in share.order(both)] == [4, 3, 2, 1]  # type: ignore[attr-defined]


def test_team_share_places_the_team_by_its_share_of_the_whole_tree() -> None:
    # lab/a's user v (rank 1) against lab/b's u (rank 2): the user order puts v first; by team
    # share lab/b (1.0) is behind lab/a (4.0) too, but lab/a/v and lab/a/u are one team: age
    v = _free(1, "lab/a", 3 * H, user="v")
    u = _free(2, "lab/a", H)
    b = _free(3, "lab/b", 5 * H)
    snap = msgspec.structs.replace(
        world([node("n1")], [], [b, u, v]), level_fs={**LEVEL_FS, "lab": 1.0}
    )
    by_user, by_team = _built(free_order="user_share"), _built(free_order="team_share")
    assert [j.job_id for _, j in by_user.order(snap)] == [2, 1, 3]  # type: ignore[attr-defined]
    assert [j.job_id for _, j in by_team.order(snap)] == [1, 2, 3]  # type: ignore[attr-defined]


def _free_run(job_id: int, where: str, account: str, submitted_ago_s: float) -> RunningJob:
    """An unfunded 8-GPU run placed an hour ago (an hour of work lost if taken back)."""
    r = run(job_id, {where: range(8)}, account, min_runtime_s=0, placed_ago_s=H, lost_s=H)
    return msgspec.structs.replace(r, submitted_at=NOW - submitted_ago_s)


def test_victims_by_share_take_back_the_heaviest_users_run_first() -> None:
    # lab/a/u's run (rank 0) is the newest (2 h), lab/c/u's (rank 3) the oldest (50 h): by age
    # funded work takes back lab/a's; by share lab/c's, though older
    light = _free_run(10, "n1", "lab/a", 2 * H)
    heavy = _free_run(11, "n2", "lab/c", 50 * H)
    snap = world([node("n1"), node("n2")], [light, heavy], [pend(1, 8, "lab/b")])
    assert preempted(snap, _built(free_order="user_share")) == [10]
    assert preempted(snap, _built(free_order="user_share", free_victims_by_share=True)) == [11]
    # inside one user's runs, the newest first still
    newer = _free_run(12, "n1", "lab/c", 2 * H)
    snap = world([node("n1"), node("n2")], [newer, heavy], [pend(1, 8, "lab/b")])
    assert preempted(snap, _built(free_order="user_share", free_victims_by_share=True)) == [12]


def test_share_age_reads_the_priority_as_seconds_of_age() -> None:
    r = _free_run(10, "n1", "lab/a", 2 * H)
    assert share_age(r, 0, 4, NOW) == pytest.approx(
        SLURM_MAX_AGE_S * 10 + 2 * H
    )  # the best of four users
    assert share_age(r, 3, 4, NOW) == pytest.approx(SLURM_MAX_AGE_S * 2.5 + 2 * H)
    old = msgspec.structs.replace(r, submitted_at=NOW - 30 * 24 * H)
    assert share_age(old, 4, 4, NOW) == SLURM_MAX_AGE_S  # age capped at 7 days


def test_a_record_without_the_settings_decodes_to_them_off() -> None:
    config = registry.default_config("fairshare-17")
    assert isinstance(config, FairShare17Config)
    raw = msgspec.to_builtins(config)
    for key in ("free_victims_by_share", "free_order"):
        raw.pop(key, None)  # a record made before
    old = msgspec.convert(raw, AnyPolicyConfig)
    assert isinstance(old, FairShare17Config)
    assert old.free_victims_by_share is False and old.free_order == "oldest"
    for order in ("user_share", "team_share"):
        made = msgspec.convert({**raw, "free_order": order}, AnyPolicyConfig)
        assert isinstance(made, FairShare17Config) and made.free_order == order
    built = registry.build("fairshare-17", {"free_victims_by_share": "true"})
    assert built.free_victims_by_share is True  # type: ignore[attr-defined]
