"""fairshare-11: the oldest large funded job's reservation binds every job, but only when its
nodes all free within `hold_window_s` (Slurm's `bf_window`) and the job has waited
`hold_early_after_s`; otherwise it holds only when the cycle reaches it (fairshare-8 without the
lift). Its order is fairshare-7's."""

from __future__ import annotations

import msgspec
import pytest

from ledger.dispatch import decide
from ledger.dispatch.fairshare7 import FairShare7
from ledger.dispatch.fairshare8 import FairShare8
from ledger.dispatch.fairshare11 import FairShare11
from ledger.dispatch.registry import config_of, default_config, policy_from_config, with_knobs
from ledger.dispatch.snapshot import Snapshot
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, run, world


def draining() -> Snapshot:
    """Nine 8-GPU nodes: n9 free; n1 and n2 run lab/b jobs whose declared limits end in 2 h;
    n3..n8 lab/b jobs that end in 5 h (all inside their contracts). lab/c's 16-GPU job has
    waited 5 h (the oldest large job: its soonest nodes are n9 now and n1 in 2 h); lab/a, the
    team first in the order, has a 4-GPU job with no time limit and one that ends in 10 min."""
    nodes = [node(f"n{i}") for i in range(1, 10)]
    busy = [
        msgspec.structs.replace(
            run(10 + i, {f"n{i}": range(8)}, "lab/b", placed_ago_s=0.0, lost_s=0.0),
            time_limit_s=2 * 3600 if i <= 2 else 5 * 3600,
        )
        for i in range(1, 9)
    ]
    old = msgspec.structs.replace(pend(6, 16, "lab/c"), submitted_at=NOW - 5 * H)
    ahead = pend(7, 4, "lab/a")
    short = msgspec.structs.replace(pend(8, 4, "lab/a"), time_limit_s=600)
    return world(nodes, busy, [old, ahead, short])


def placed(snap: Snapshot, policy: FairShare7) -> list[int]:
    return [p.job_id for p in decide(snap, policy, NOW).placements]


W3H = 3 * 3600.0


@pytest.mark.parametrize(
    ("case", "settings", "want_placed", "want_bound"),
    [
        (
            "its nodes free within the window",
            {"hold_window_s": W3H, "hold_early_after_s": 0},
            [8],
            True,
        ),
        (
            "no window (fairshare-8's hold_early)",
            {"hold_window_s": 0, "hold_early_after_s": 0},
            [8],
            True,
        ),
        (
            "its nodes free after the window",
            {"hold_window_s": 3600, "hold_early_after_s": 0},
            [7, 8],
            False,
        ),
        (
            "waited less than hold_early_after_s",
            {"hold_window_s": W3H, "hold_early_after_s": 6 * H},
            [7, 8],
            False,
        ),
        (
            "waited more than hold_early_after_s",
            {"hold_window_s": W3H, "hold_early_after_s": 4 * H},
            [8],
            True,
        ),
        ("the defaults: a day's wait, a 1 h window", {}, [7, 8], False),
    ],
)
def test_the_oldest_large_jobs_reservation_binds_the_jobs_ahead_only_inside_the_window(
    case: str, settings: dict[str, float], want_placed: list[int], want_bound: bool
) -> None:
    snap = draining()
    d = decide(snap, FairShare11(**settings), NOW)  # type: ignore[arg-type]
    assert [p.job_id for p in d.placements] == want_placed, case
    assert d.hold is not None and d.hold.job_id == 6, case
    if want_bound:  # n9 held from the start: job 7 (no limit) may not take it, job 8 backfills
        assert d.hold.nodes == frozenset({"n9", "n1"}) and d.hold.until == NOW + 2 * H
        assert {s.node for s in d.placements[0].slots} == {"n9"}
    else:  # job 7 took n9 first; the reservation made when the cycle reached job 6 is later
        assert 7 in [p.job_id for p in d.placements]


def test_with_an_unbounded_window_it_decides_as_fairshare_8_early_without_the_lift() -> None:
    snap = draining()
    eight = FairShare8(hold_lift=False, hold_early=True)
    assert decide(snap, FairShare11(hold_window_s=0, hold_early_after_s=0), NOW).placements == (
        decide(snap, eight, NOW).placements
    )
    # and with the binding reservation off, as fairshare-8 without the lift
    late = decide(snap, FairShare8(hold_lift=False), NOW)
    assert decide(snap, FairShare11(hold_early=False), NOW).placements == late.placements


def test_its_order_is_fairshare_7s_unless_lifted() -> None:
    snap = draining()
    assert list(FairShare11().order(snap)) == list(FairShare7().order(snap))
    lifted = [j.job_id for _, j in FairShare11(hold_lift=True).order(snap)]
    assert lifted[0] == 6


def test_fairshare_11_is_registered_with_its_settings() -> None:
    eleven = policy_from_config(default_config("fairshare-11"))
    assert type(eleven) is FairShare11
    assert eleven.hold_early and not eleven.hold_lift and eleven.hold_pick == "oldest"
    assert eleven.hold_window_s == 3_600.0 and eleven.hold_early_after_s == 86_400.0
    other = FairShare11(hold_window_s=600.0, hold_early_after_s=3600.0)
    assert policy_from_config(config_of(other)) == other
    knobbed = policy_from_config(with_knobs(default_config("fairshare-11"), {"hold_window_s": "1"}))
    assert isinstance(knobbed, FairShare11) and knobbed.hold_window_s == 1.0
