"""fairshare-17's `takeback_keep_need_fs` (s60-policy): the need rule (a funded non-debug job that
has waited `takeback_keep_need_s` is offered the kept runs) fired on Philly seed 2 mostly for the
one team asking 7.3 times its share (91 of the 130 kept runs it took back), whose jobs waited
by fairness, not by the keep. With the floor X the need rule offers the kept runs only to a job
whose team's share of the whole tree (allocated over decayed use) is at least X. A versioned
field: 0 (every team, as before) in a record without it."""

from __future__ import annotations

import msgspec

from ledger.dispatch import registry
from ledger.dispatch.snapshot import Snapshot
from schemas.policy import AnyPolicyConfig, FairShare17Config
from tests.unit.test_dispatch_fairshare2 import H, pend, preempted, world
from tests.unit.test_dispatch_fairshare17_bounds import _free
from tests.unit.test_fairshare17_keep_need import NODES, _busy


def _waited_gang(team_fs: float | None) -> Snapshot:
    """W28 in small: n00 free, n01 held by a kept free-tier run, the rest by lab/c's funded work
    inside its contract; a 12-GPU gang of lab/a (under the yield share) that waited past the
    need bound, lab/a's share of the whole tree `team_fs` (None: unknown)."""
    kept = _free(10, "n01", by="lab/c", placed_ago_s=H)
    snap = world(NODES, [kept, *_busy(2)], [pend(1, 12)])
    levels = {**snap.level_fs, "lab": 1.0}
    levels.pop("lab/a", None)
    if team_fs is not None:
        levels["lab/a"] = team_fs
    return msgspec.structs.replace(snap, level_fs=levels)


def test_the_need_rule_serves_only_a_team_within_its_share() -> None:
    built = registry.build("fairshare-17", {"takeback_keep_need_fs": "0"})  # s63-policy3 sets 1
    floor = msgspec.structs.replace(built, takeback_keep_need_fs=1.0)  # type: ignore[type-var]
    assert preempted(_waited_gang(0.5), built) == [10]  # no floor: every team that waited
    assert preempted(_waited_gang(0.5), floor) == []  # over its share: it waits by fairness
    assert preempted(_waited_gang(2.0), floor) == [10]  # used half its share: it needs the node
    assert preempted(_waited_gang(None), floor) == [10]  # a share unknown does not hold it out


def test_a_record_without_the_floor_decodes_to_every_team() -> None:
    config = registry.default_config("fairshare-17")
    assert isinstance(config, FairShare17Config)
    raw = msgspec.to_builtins(config)
    raw.pop("takeback_keep_need_fs", None)  # a record made before
    old = msgspec.convert(raw, AnyPolicyConfig)
    assert isinstance(old, FairShare17Config) and old.takeback_keep_need_fs == 0.0


def _gang_waited(waited_s: float, team_fs: float) -> Snapshot:
    """`_waited_gang` with the gang submitted `waited_s` ago."""
    snap = _waited_gang(team_fs)
    gang = msgspec.structs.replace(snap.pending[0], submitted_at=snap.taken_at - waited_s)
    return msgspec.structs.replace(snap, pending=[gang])


def test_by_share_a_team_over_its_share_waits_the_bound_over_its_share() -> None:
    # `takeback_keep_need_by_share`: the need bound (2 h) over the team's share when under 1,
    # at most the keep's 72 h; a team within its share waits 2 h as before
    built = registry.build("fairshare-17", {"takeback_keep_need_fs": "0"})  # s63-policy3 sets 1
    scaled = msgspec.structs.replace(built, takeback_keep_need_by_share=True)  # type: ignore[type-var]
    assert preempted(_gang_waited(3 * H, 0.25), built) == [10]  # 2 h: every team
    assert preempted(_gang_waited(3 * H, 0.25), scaled) == []  # 4x its share: 8 h
    assert preempted(_gang_waited(9 * H, 0.25), scaled) == [10]
    assert preempted(_gang_waited(3 * H, 2.0), scaled) == [10]  # within its share: 2 h
    assert preempted(_gang_waited(71 * H, 0.0), scaled) == []  # no share left: the keep's 72 h
    assert preempted(_gang_waited(73 * H, 0.0), scaled) == [10]


def test_a_record_without_the_scaled_bound_decodes_to_one_bound() -> None:
    config = registry.default_config("fairshare-17")
    assert isinstance(config, FairShare17Config)
    raw = msgspec.to_builtins(config)
    raw.pop("takeback_keep_need_by_share", None)  # a record made before
    old = msgspec.convert(raw, AnyPolicyConfig)
    assert isinstance(old, FairShare17Config) and old.takeback_keep_need_by_share is False
