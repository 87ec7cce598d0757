"""The queue's and `priority`'s names for `fairshare-17`'s sort keys: its own words, the free
tier's shorter keys named too (before: fairshare-16's words on funded keys, `part_N` on the
free tier's)."""

from __future__ import annotations

import msgspec

from ledger.dispatch.fairshare17 import FairShare17
from ledger.reads.keyparts import key_parts
from tests.unit.test_dispatch_fairshare2 import node, pend, world


def _parts(policy: FairShare17) -> dict[int, list[tuple[str, str]]]:
    ran = msgspec.structs.replace(pend(1, 8, "lab/a", funded=False), runs=1)
    snap = world([node("n1")], [], [ran, pend(2, 4, "lab/c", funded=False), pend(4, 8, "lab/c")])
    return {
        j.job_id: [(p.name, p.meaning) for p in key_parts(policy.version, k)]
        for k, j in policy.order(snap)
    }


def test_fairshare_17_keys_are_named_in_its_own_words() -> None:
    oldest = _parts(FairShare17())
    assert [n for n, _ in oldest[1]] == ["debug_lane", "funded_class", "submitted_at", "job_id"]
    assert "free tier" in oldest[1][1][1] and '"oldest"' in oldest[1][2][1]
    funded = oldest[4]
    assert funded[2][0] == "unfunded_step" and "0 for a funded job" in funded[2][1]
    assert "requeued_first" not in funded[2][1]  # fairshare-16's setting, not fairshare-17's
    smallest = _parts(FairShare17(free_order="smallest"))
    assert [n for n, _ in smallest[2]][2:] == ["gpus", "submitted_at", "job_id"]
    team = _parts(FairShare17(free_order="team"))
    assert [n for n, _ in team[1]][:3] == ["debug_lane", "funded_class", "unfunded_step"]
    assert not any(n.startswith("part_") for ks in (oldest, smallest, team) for k in ks.values()
                   for n, _ in k)  # fmt: skip
