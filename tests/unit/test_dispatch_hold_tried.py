"""A reservation tried and not made is tried once per job traits while nothing moves (atk53-29
F2): each of a long queue's large jobs asked again for the nodes it could have soonest, most of
the what-if's time at 9,000 pending. The decisions are those of asking every job."""

from __future__ import annotations

import functools

import msgspec
import pytest

from ledger.dispatch import decide, engine
from ledger.dispatch.ordering import enc_hook
from ledger.dispatch.registry import default_config, policy_from_config
from ledger.dispatch.snapshot import Snapshot
from tests.unit.test_dispatch_fairshare2 import NOW, node, pend, run, world
from tests.unit.test_dispatch_fairshare8 import _Plain

LARGE = 300
"""Large jobs waiting behind nodes their own team holds with no time limit: no set of nodes
ever frees for them (a reservation needs a finite time)."""


def blocked_queue() -> Snapshot:
    nodes = [node(f"n{i}") for i in range(1, 5)]
    mine = [run(10 + i, {f"n{i}": range(8)}, "lab/a") for i in range(1, 5)]  # their own team's
    large = [pend(1000 + i, 8, "lab/a") for i in range(LARGE)]
    gangs = [pend(2000 + i, 16, "lab/a") for i in range(20)]
    small = [pend(3000 + i, 1, "lab/a", funded=False) for i in range(20)]
    return world(nodes, mine, [*large, *gangs, *small])


def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    tried: list[int] = []
    real = engine.soonest

    def soonest(job, *args, **kwargs):  # type: ignore[no-untyped-def]
        tried.append(job.job_id)
        return real(job, *args, **kwargs)

    monkeypatch.setattr(engine, "soonest", soonest)
    return tried


@pytest.mark.parametrize("version", ["fairshare-7", "fairshare-8", "fairshare-11", "fairshare-13"])
def test_a_reservation_not_made_is_tried_once_per_traits_and_decides_as_asking_every_job(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = policy_from_config(default_config(version))
    snap = blocked_queue()
    tried = counted(monkeypatch)
    fast = decide(snap, policy, NOW)
    assert fast.hold is None and len(fast.waiting) == LARGE + 40, fast
    assert len(tried) <= 4, f"{len(tried)} reservations tried: {tried[:8]} ..."  # before: 300+
    tried.clear()
    slow = decide(snap, _Plain(policy), NOW)  # type: ignore[arg-type]
    if version == "fairshare-7":  # every large job may reserve (later: the oldest alone)
        assert len(tried) >= LARGE  # every job asked: the reference
    encode = functools.partial(msgspec.msgpack.encode, enc_hook=enc_hook)
    assert encode(fast) == encode(slow)
