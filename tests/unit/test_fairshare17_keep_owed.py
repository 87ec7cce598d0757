"""fairshare-17's `takeback_keep_owed_fs` (s58, atk56-26 F1): the need bound (2 h) still held a
team that got nothing out of a kept node for 2 h at every turn (W28's team 52.5%). With the
owed rule a funded non-debug job whose team holds no GPU and has used at most 1/X of its share of
the whole tree is offered the kept runs at once, after every other victim; a team that runs
work, or has had its share, is held out as before. A versioned field: 0 (never) in a record
without it."""

from __future__ import annotations

import msgspec

from ledger.dispatch import registry
from ledger.dispatch.snapshot import Snapshot
from schemas.policy import AnyPolicyConfig, FairShare17Config
from tests.unit.test_dispatch_fairshare2 import NOW, pend, preempted, world
from tests.unit.test_dispatch_fairshare17_bounds import _free
from tests.unit.test_fairshare17_keep_need import NODES, _busy


def _young_gang(team_fs: float, holds: bool = False) -> Snapshot:
    """W28 in small: n00 free, n01 held by a kept free-tier run, the rest by lab/c's funded
    work inside its contract (n15 by lab/a's when it `holds`); a 12-GPU gang of lab/a (under
    the yield share) submitted a minute ago, lab/a's share of the whole tree `team_fs`."""
    kept = _free(10, "n01", by="lab/c", placed_ago_s=3600.0)
    young = msgspec.structs.replace(pend(1, 12), submitted_at=NOW - 60)
    busy = _busy(2)
    if holds:
        busy[-1] = msgspec.structs.replace(busy[-1], account="lab/a")
    snap = world(NODES, [kept, *busy], [young])
    levels = {**snap.level_fs, "lab": 1.0, "lab/a": team_fs}
    return msgspec.structs.replace(snap, level_fs=levels)


def test_a_team_that_got_nothing_takes_the_kept_run_at_once() -> None:
    built = registry.build("fairshare-17", {})
    owed = msgspec.structs.replace(built, takeback_keep_owed_fs=2.0)  # type: ignore[type-var]
    assert preempted(_young_gang(4.0), built) == []  # the need bound: it waits 2 h
    assert preempted(_young_gang(4.0), owed) == [10]  # used 1/4 of its share: owed it now
    assert preempted(_young_gang(1.5), owed) == []  # used 2/3 of it: the keep holds
    assert preempted(_young_gang(4.0, holds=True), owed) == []  # it runs work: the keep holds


def test_a_record_without_the_owed_rule_decodes_to_never() -> None:
    config = registry.default_config("fairshare-17")
    assert isinstance(config, FairShare17Config)
    raw = msgspec.json.decode(msgspec.json.encode(config))
    del raw["takeback_keep_owed_fs"]
    old = msgspec.json.decode(msgspec.json.encode(raw), type=AnyPolicyConfig)
    assert isinstance(old, FairShare17Config) and old.takeback_keep_owed_fs == 0.0
