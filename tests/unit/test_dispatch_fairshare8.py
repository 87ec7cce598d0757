"""fairshare-8: the reservation goes to the oldest large funded job and stays with it, which is
considered first among funded jobs; fairshare-7 decides as before; the per-traits answers of a
cycle (`job_traits`) decide exactly as asking every job."""

from __future__ import annotations

import functools
import random
import sys
from pathlib import Path

import msgspec
import pytest

from ledger.dispatch import decide
from ledger.dispatch.fairshare7 import FairShare7
from ledger.dispatch.fairshare8 import FairShare8
from ledger.dispatch.ordering import enc_hook
from ledger.dispatch.registry import config_of, default_config, policy_from_config, with_knobs
from ledger.dispatch.snapshot import PendingJob, Snapshot
from schemas.errors import InvalidCommand
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, run, world


def big_queue() -> Snapshot:
    """64 GPUs, all held by lab/b inside their 1 h contracts, with declared time limits: n1/n2
    end in 1 h, n3..n8 in 5 h. Two large jobs wait: lab/a's (the team first in the order)
    submitted later, lab/c's earlier; and a small one of lab/b."""
    nodes = [node(f"n{i}") for i in range(1, 9)]
    busy = [
        msgspec.structs.replace(
            run(10 + i, {f"n{i}": range(8)}, "lab/b", placed_ago_s=0.0, lost_s=0.0),
            time_limit_s=3600 if i <= 2 else 5 * 3600,
        )
        for i in range(1, 9)
    ]
    young = msgspec.structs.replace(pend(5, 16, "lab/a"), submitted_at=NOW - H)
    old = msgspec.structs.replace(pend(6, 16, "lab/c"), submitted_at=NOW - 5 * H)
    return world(nodes, busy, [young, old, pend(7, 4, "lab/b")])


def test_fairshare_8_is_registered_with_its_settings_and_fairshare_7_is_unchanged() -> None:
    eight = policy_from_config(default_config("fairshare-8"))
    assert type(eight) is FairShare8 and eight.hold_pick == "oldest" and eight.hold_lift
    other = FairShare8(hold_pick="first", hold_lift=False, hold_share=0.25)
    assert policy_from_config(config_of(other)) == other
    assert type(policy_from_config(default_config("fairshare-7"))) is FairShare7
    with pytest.raises(InvalidCommand, match="hold_pick"):
        with_knobs(default_config("fairshare-8"), {"hold_pick": "newest"})


def test_the_reservation_goes_to_the_oldest_large_job_whatever_its_teams_place() -> None:
    snap = big_queue()
    seven = decide(snap, FairShare7(), NOW)
    assert seven.hold is not None and seven.hold.job_id == 5  # the first in the team order
    eight = decide(snap, FairShare8(), NOW)
    assert eight.hold is not None and eight.hold.job_id == 6  # the oldest
    assert sorted(eight.hold.nodes) == ["n1", "n2"] and eight.hold.until == NOW + H
    # "first" is fairshare-7's rule
    assert decide(snap, FairShare8(hold_pick="first", hold_lift=False), NOW).hold == seven.hold


def test_the_reserved_job_stays_the_same_when_the_teams_order_changes() -> None:
    snap = big_queue()
    flipped = msgspec.structs.replace(
        snap, ranks={**snap.ranks, "lab/c": -1, "lab/c/u": -1, "lab/a": 9, "lab/a/u": 9}
    )
    for s in (snap, flipped):
        d = decide(s, FairShare8(), NOW)
        assert d.hold is not None and d.hold.job_id == 6


def test_the_reserved_job_is_considered_first_among_funded_jobs_unless_told_otherwise() -> None:
    snap = big_queue()
    debug = pend(9, 1, "lab/b", debug=True)
    snap = msgspec.structs.replace(snap, pending=(*snap.pending, debug))
    lifted = [j.job_id for _, j in FairShare8().order(snap)]
    assert lifted[:2] == [9, 6]  # the debug lane, then the reserved job
    assert [j.job_id for _, j in FairShare8(hold_lift=False).order(snap)][:2] == [9, 5]
    keys = {j.job_id: k for k, j in FairShare8().order(snap)}
    assert keys[6][3] == 0 and keys[5][3] == 1  # the key part "reservation"


def test_room_for_one_large_job_goes_to_the_reserved_one() -> None:
    # two nodes free, two 16-GPU jobs: lab/a's ranks first, lab/c's is older
    young = msgspec.structs.replace(pend(5, 16, "lab/a"), submitted_at=NOW - H)
    old = msgspec.structs.replace(pend(6, 16, "lab/c"), submitted_at=NOW - 5 * H)
    nodes = [node(f"n{i}") for i in range(1, 9)]
    busy = [
        run(20 + i, {f"n{i}": range(8)}, "lab/a", placed_ago_s=0.0, lost_s=0.0) for i in range(3, 9)
    ]
    snap = world(nodes, busy, [young, old])
    assert [p.job_id for p in decide(snap, FairShare7(), NOW).placements] == [5]
    assert [p.job_id for p in decide(snap, FairShare8(), NOW).placements] == [6]


def test_no_large_job_no_reservation_and_small_jobs_order_as_fairshare_7() -> None:
    nodes = [node(f"n{i}") for i in range(1, 9)]  # 1/8 is 8 GPUs
    snap = world(nodes, [], [pend(1, 4, "lab/c"), pend(2, 4), pend(3, 8, funded=False)])
    assert FairShare8().reserved_job(snap) is None
    seven = [j.job_id for _, j in FairShare7().order(snap)]
    assert [j.job_id for _, j in FairShare8().order(snap)] == seven
    assert decide(snap, FairShare8(), NOW).placements == decide(snap, FairShare7(), NOW).placements


class _Plain:
    """A policy that answers every question itself: no `job_traits`."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        if name == "job_traits":
            raise AttributeError(name)
        return getattr(self._inner, name)


@pytest.mark.parametrize("version", ["fairshare-6", "fairshare-7", "fairshare-8", "fairshare-11"])
def test_answers_asked_once_per_traits_decide_as_asking_every_job(version: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from bench_dispatch import NOW as BNOW
    from bench_dispatch import world as bench_world

    policy = policy_from_config(default_config(version))
    for seed in (3, 4):
        snap = bench_world(2000, 64, seed=seed)
        rng = random.Random(seed)  # some large gangs, so that a reservation is made
        extra = [
            PendingJob(
                job_id=900_000 + i,
                account=rng.choice(["lab/p00", "lab/p03"]),
                user="u1",
                gpus=rng.choice((64, 96)),
                min_runtime_s=3600,
                submitted_at=BNOW - rng.uniform(0, 86400),
            )
            for i in range(5)
        ]
        snap = msgspec.structs.replace(snap, pending=(*snap.pending, *extra))
        fast = decide(snap, policy, BNOW)
        slow = decide(snap, _Plain(policy), BNOW)  # type: ignore[arg-type]
        encode = functools.partial(msgspec.msgpack.encode, enc_hook=enc_hook)
        assert encode(fast) == encode(slow)


def test_an_early_reservation_keeps_jobs_ahead_of_the_reserved_one_off_its_nodes() -> None:
    nodes = [node(f"n{i}") for i in range(1, 9)]  # n1, n2 free; n3..n8 busy for 5 h
    busy = [
        msgspec.structs.replace(
            run(10 + i, {f"n{i}": range(8)}, "lab/b", placed_ago_s=0.0, lost_s=0.0),
            time_limit_s=5 * 3600,
        )
        for i in range(3, 9)
    ]
    old = msgspec.structs.replace(pend(6, 16, "lab/c"), submitted_at=NOW - 5 * H)
    ahead = pend(7, 4, "lab/a")  # the team first in the order, no time limit
    short = msgspec.structs.replace(pend(8, 4, "lab/a"), time_limit_s=600)
    snap = world(nodes, busy, [old, ahead, short])
    late = decide(snap, FairShare8(hold_lift=False), NOW)
    assert [p.job_id for p in late.placements] == [7, 8] and 6 in late.waiting
    early = decide(snap, FairShare8(hold_lift=False, hold_early=True), NOW)
    # job 7 may not take the held nodes; job 8 ends before the hold's time (now) neither;
    # job 6 takes its own reservation, which ends with its start
    assert [p.job_id for p in early.placements] == [6]
    assert {s.node for s in early.placements[0].slots} == {"n1", "n2"}
    assert early.hold is None and {7, 8} <= set(early.waiting)


def test_a_job_larger_than_its_pool_does_not_take_the_reservation_from_the_others() -> None:
    snap = big_queue()
    huge = msgspec.structs.replace(pend(4, 128, "lab/c"), submitted_at=NOW - 9 * H)  # > 64
    snap = msgspec.structs.replace(snap, pending=(huge, *snap.pending))
    assert FairShare8().reserved_job(snap) == 6
    d = decide(snap, FairShare8(), NOW)
    assert d.hold is not None and d.hold.job_id == 6
