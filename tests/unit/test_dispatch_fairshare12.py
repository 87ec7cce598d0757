"""fairshare-12: the reservation goes at once to a large funded job of a team under its share,
binds every job, counts unfunded and resumable jobs of any team free at their contracts' ends,
and, once every job left on its nodes is past its contract, starts the job by preempting them
(no cost-model refusal). Without an owed team's large job, fairshare-7's reservation."""

from __future__ import annotations

import msgspec
import pytest

from ledger.dispatch import decide
from ledger.dispatch.fairshare7 import FairShare7
from ledger.dispatch.fairshare11 import FairShare11
from ledger.dispatch.fairshare12 import FairShare12
from ledger.dispatch.registry import config_of, default_config, policy_from_config, with_knobs
from ledger.dispatch.snapshot import Snapshot
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, run, world

# lab/c uses less than its share (2.0); lab/a and lab/b more (0.8, 0.5)
OWED = {"lab": 1.0, "lab/a": 0.8, "lab/b": 0.5, "lab/c": 2.0}


def owed(snap: Snapshot, level_fs: dict[str, float] = OWED) -> Snapshot:
    return msgspec.structs.replace(snap, level_fs=dict(level_fs))


def past_contracts() -> Snapshot:
    """Three 8-GPU nodes: n1 and n2 run resumable lab/b jobs past their 1 h contracts, each
    checkpointed 1 h ago (8 GPU-h lost each, plus restarts); n3 a job inside its contract.
    lab/c (under its share) waits with a 16-GPU job: a fairness plan would lose 16 GPU-h of
    work and 1.33 GPU-h of restarts against 16 GPU-h gained (16 GPUs x 1 h), so the cost
    model refuses it."""
    nodes = [node("n1"), node("n2"), node("n3")]
    running = [
        run(10, {"n1": range(8)}, "lab/b", lost_s=H),
        run(11, {"n2": range(8)}, "lab/b", lost_s=H),
        run(12, {"n3": range(8)}, "lab/b", placed_ago_s=600.0, lost_s=600.0),
    ]
    return owed(world(nodes, running, [pend(6, 16, "lab/c")]))


def test_the_reserved_job_starts_by_preempting_what_is_past_its_contract_on_its_nodes() -> None:
    snap = past_contracts()
    seven = decide(snap, FairShare7(), NOW)
    assert not seven.placements and not seven.preemptions
    assert "more than the 16.00 GPU-h gained" in seven.waiting[6].reason  # the cost model
    d = decide(snap, FairShare12(), NOW)
    assert [p.job_id for p in d.preemptions] == [10, 11]
    assert all(p.reason == "fairness" and p.for_job == 6 for p in d.preemptions)
    assert "reservation: nodes n1, n2 held for job 6 (16 GPUs)" in d.preemptions[0].note
    assert "resumable, loses 8.00 GPU-h" in d.preemptions[0].note
    (placed,) = d.placements
    assert placed.job_id == 6 and {s.node for s in placed.slots} == {"n1", "n2"}
    assert d.hold is None  # spent
    # with hold_start off it waits as fairshare-11 would, holding n1 and n2
    off = decide(snap, FairShare12(hold_start=False), NOW)
    assert not off.placements and not off.preemptions
    assert off.hold is not None and off.hold.nodes == frozenset({"n1", "n2"})


def test_a_job_inside_its_contract_on_the_reserved_nodes_is_waited_for() -> None:
    # n1 and n2 are the reserved job's soonest nodes, but n2's job is 10 min into its contract
    nodes = [node("n1"), node("n2"), node("n3")]
    running = [
        run(10, {"n1": range(8)}, "lab/b"),
        run(11, {"n2": range(8)}, "lab/b", placed_ago_s=600.0, lost_s=600.0),
        run(12, {"n3": range(8)}, "lab/b", placed_ago_s=300.0, lost_s=300.0),
    ]
    snap = owed(world(nodes, running, [pend(6, 16, "lab/c")]))
    d = decide(snap, FairShare12(), NOW)
    assert not d.placements and not d.preemptions
    assert d.hold is not None and d.hold.nodes == frozenset({"n1", "n2"})
    assert d.hold.until == NOW + 3000.0 and d.wake_at == NOW + 3000.0


def drain_across_teams() -> Snapshot:
    """Three 8-GPU nodes: n1 runs a resumable job of lab/a (whose share, 4.0 here, is above
    lab/c's: lab/c may not preempt it for fairness) whose contract ends in 1 h; n2 is free; n3
    runs a lab/a job that is not resumable and declared no limit (it never frees for a
    reservation). lab/c (under its share) waits with a 16-GPU job; lab/a, ahead of it in the
    order, with an 8-GPU job that declared no limit."""
    nodes = [node("n1"), node("n2"), node("n3")]
    running = [
        run(10, {"n1": range(8)}, "lab/a", placed_ago_s=0.0, lost_s=0.0),
        run(11, {"n3": range(8)}, "lab/a", resumable=False),
    ]
    fs = {**OWED, "lab/a": 4.0}
    return owed(world(nodes, running, [pend(6, 16, "lab/c"), pend(7, 8, "lab/a")]), fs)


def test_the_reservation_counts_resumable_work_free_at_its_contracts_end() -> None:
    snap = drain_across_teams()
    # fairshare-7 and -11 see no node set that frees in finite time for job 6: job 7 takes n2
    for policy in (FairShare7(), FairShare11(hold_early_after_s=0)):
        d = decide(snap, policy, NOW)
        assert [p.job_id for p in d.placements] == [7], policy.version
        assert d.hold is None, policy.version
    # the default spares the work of a team using no more than its share (lab/a: 4.0)
    d = decide(snap, FairShare12(), NOW)
    assert [p.job_id for p in d.placements] == [7] and d.hold is None
    d = decide(snap, FairShare12(hold_victim_fs=0.0), NOW)  # any team's resumable work
    assert not d.placements  # job 7 (no limit) may not take n2: it is held for job 6
    assert d.hold is not None and d.hold.job_id == 6
    assert d.hold.nodes == frozenset({"n1", "n2"}) and d.hold.until == NOW + H
    assert d.waiting[7].code == "WAIT_PRIORITY"  # it fitted on n2, which is held
    # a reservation that binds no job names the same nodes, and job 7 takes n2 meanwhile
    loose = decide(snap, FairShare12(hold_victim_fs=0.0, hold_binds=False), NOW)
    assert [p.job_id for p in loose.placements] == [7]
    assert loose.hold is not None and loose.hold.nodes == frozenset({"n1", "n2"})


@pytest.mark.parametrize(
    ("case", "level_fs", "settings", "want_hold"),
    [
        ("the default: the oldest large job, whatever its team", {**OWED, "lab/c": 0.7}, {}, 6),
        ("lab/c is under its share: its job", OWED, {"hold_team_fs": 1.0}, 6),
        (
            "no team under its share: fairshare-7's (the first large job in the order)",
            {**OWED, "lab/a": 0.9, "lab/c": 0.7},
            {"hold_team_fs": 1.0},
            5,
        ),
        (
            "hold_team_fs 0: the oldest large job, whatever its team",
            {**OWED, "lab/a": 0.9, "lab/c": 0.7},
            {"hold_team_fs": 0.0},
            6,
        ),
        (
            "hold_by share: the most owed team's",
            {**OWED, "lab/a": 3.0},
            {"hold_team_fs": 1.0, "hold_by": "share"},
            5,
        ),
        (
            "hold_by oldest: the oldest of the owed teams'",
            {**OWED, "lab/a": 3.0},
            {"hold_team_fs": 1.0},
            6,
        ),
    ],
)
def test_whose_reservation(
    case: str, level_fs: dict[str, float], settings: dict[str, object], want_hold: int
) -> None:
    # every node busy inside its contract; lab/a's job 5 (16 GPUs) is newer than lab/c's job 6
    nodes = [node("n1"), node("n2"), node("n3")]
    running = [
        run(10 + i, {f"n{i}": range(8)}, "lab/b", placed_ago_s=600.0, lost_s=600.0)
        for i in (1, 2, 3)
    ]
    old = msgspec.structs.replace(pend(6, 16, "lab/c"), submitted_at=NOW - 5 * H)
    newer = msgspec.structs.replace(pend(5, 16, "lab/a"), submitted_at=NOW - 1 * H)
    snap = owed(world(nodes, running, [old, newer]), level_fs)
    d = decide(snap, FairShare12(**settings), NOW)  # type: ignore[arg-type]
    assert d.hold is not None and d.hold.job_id == want_hold, case


def test_fairshare_12_is_registered_with_its_settings_and_orders_as_fairshare_7() -> None:
    twelve = policy_from_config(default_config("fairshare-12"))
    assert type(twelve) is FairShare12
    assert twelve.hold_early and not twelve.hold_lift and twelve.hold_start
    assert twelve.hold_window_s == 0.0 and twelve.hold_early_after_s == 0.0
    assert twelve.hold_team_fs == 0.0 and twelve.hold_by == "oldest" and twelve.hold_binds
    assert twelve.hold_victim_fs == 1.0
    other = FairShare12(hold_team_fs=0.5, hold_by="share", hold_start=False)
    assert policy_from_config(config_of(other)) == other
    knobbed = policy_from_config(
        with_knobs(default_config("fairshare-12"), {"hold_start": "false"})
    )
    assert isinstance(knobbed, FairShare12) and not knobbed.hold_start
    snap = past_contracts()
    assert list(FairShare12().order(snap)) == list(FairShare7().order(snap))
