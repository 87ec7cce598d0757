"""fairshare-13: fairshare-12's reservation, drained only of unfunded work and the reserved job's
own team's resumable work (another team's funded work is never preempted for it), with debug-lane
jobs let onto the held nodes."""

from __future__ import annotations

import msgspec

from ledger.dispatch import decide
from ledger.dispatch.fairshare12 import FairShare12
from ledger.dispatch.fairshare13 import FairShare13
from ledger.dispatch.registry import config_of, default_config, policy_from_config, with_knobs
from ledger.dispatch.snapshot import Snapshot
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, run, world
from tests.unit.test_dispatch_fairshare12 import OWED, owed


def own_and_other() -> Snapshot:
    """Four 8-GPU nodes, each running a resumable job past its 1 h contract: n1 and n2 lab/b's
    (over its share: fairshare-12 drains them), n3 and n4 lab/c's (under its share: fairshare-12
    spares them). lab/c waits with a 16-GPU job, the oldest large one: its reservation."""
    nodes = [node("n1"), node("n2"), node("n3"), node("n4")]
    running = [
        run(10, {"n1": range(8)}, "lab/b", lost_s=H),
        run(11, {"n2": range(8)}, "lab/b", lost_s=H),
        run(12, {"n3": range(8)}, "lab/c", lost_s=H),
        run(13, {"n4": range(8)}, "lab/c", lost_s=H),
    ]
    return owed(world(nodes, running, [pend(6, 16, "lab/c")]))


def test_the_reservation_drains_only_the_reserved_jobs_own_team() -> None:
    snap = own_and_other()
    # fairshare-12 drains lab/b's work (over its share) for lab/c's job
    twelve = decide(snap, FairShare12(), NOW)
    assert sorted(p.job_id for p in twelve.preemptions) == [10, 11]
    d = decide(snap, FairShare13(), NOW)
    assert sorted(p.job_id for p in d.preemptions) == [12, 13]  # lab/c's own work alone
    assert all(p.reason == "fairness" and p.for_job == 6 for p in d.preemptions)
    (placed,) = d.placements
    assert placed.job_id == 6 and {s.node for s in placed.slots} == {"n3", "n4"}
    # hold_drain "over" is fairshare-12's rule
    over = decide(snap, FairShare13(hold_drain="over"), NOW)
    assert sorted(p.job_id for p in over.preemptions) == [10, 11]


def test_another_teams_work_without_a_limit_is_never_counted_free() -> None:
    # only one node of the reserved job's team: no pair of nodes frees in finite time, so no
    # reservation, no preemption; fairshare-12 preempts lab/b's jobs on n1 and n3 (it never
    # counts the work of a team under its share, lab/c's own)
    nodes = [node("n1"), node("n2"), node("n3")]
    running = [
        run(10, {"n1": range(8)}, "lab/b", lost_s=H),
        run(11, {"n2": range(8)}, "lab/c", lost_s=H),
        run(12, {"n3": range(8)}, "lab/b", lost_s=H),
    ]
    snap = owed(world(nodes, running, [pend(6, 16, "lab/c")]))
    assert sorted(p.job_id for p in decide(snap, FairShare12(), NOW).preemptions) == [10, 12]
    d = decide(snap, FairShare13(), NOW)
    assert not d.preemptions and not d.placements and d.hold is None
    # "fair": lab/b's jobs count too, as fair share offers them to lab/c (4x its share)
    fair = decide(snap, FairShare13(hold_drain="fair"), NOW)
    assert sorted(p.job_id for p in fair.preemptions) == [10, 11]
    assert [p.job_id for p in fair.placements] == [6]


def test_unfunded_work_of_any_team_drains_for_the_reservation() -> None:
    nodes = [node("n1"), node("n2")]
    running = [
        run(10, {"n1": range(8)}, "lab/a", min_runtime_s=0, lost_s=H),
        run(11, {"n2": range(8)}, "lab/c", lost_s=H),
    ]
    snap = owed(world(nodes, running, [pend(6, 16, "lab/c")]))
    d = decide(snap, FairShare13(), NOW)
    assert sorted(p.job_id for p in d.preemptions) == [10, 11]
    assert [p.job_id for p in d.placements] == [6]


def held_soon() -> Snapshot:
    """Two 8-GPU nodes: n1 free, n2 running a resumable lab/c job whose contract ends in 5 min.
    lab/c's 16-GPU job reserves both until then; a funded debug job of lab/a (4 GPUs, 10-min
    limit) waits: its limit ends after the reservation's time, so fairshare-7's backfill rule
    keeps it off n1."""
    nodes = [node("n1"), node("n2")]
    running = [run(11, {"n2": range(8)}, "lab/c", placed_ago_s=H - 300.0, lost_s=0.0)]
    return owed(world(nodes, running, [pend(6, 16, "lab/c"), pend(7, 4, "lab/a", debug=True)]))


def test_debug_jobs_use_the_held_nodes() -> None:
    snap = held_soon()
    off = decide(snap, FairShare13(hold_debug=False), NOW)
    assert not off.placements
    assert off.hold is not None and off.hold.nodes == frozenset({"n1", "n2"})
    assert off.hold.until == NOW + 300.0
    assert off.waiting[7].code == "WAIT_PRIORITY"  # it fitted on n1, which is held
    d = decide(snap, FairShare13(), NOW)
    (placed,) = d.placements
    assert placed.job_id == 7 and {s.node for s in placed.slots} == {"n1"}
    assert d.hold is not None and d.hold.job_id == 6 and d.hold.until == NOW + 300.0


def test_a_debug_job_may_preempt_on_the_held_nodes_as_its_lane_allows() -> None:
    # n1 runs unfunded work (free for the reservation at once), n2 lab/c's job inside its
    # contract for 5 more minutes: the reservation holds both and waits; the debug job may
    # preempt the unfunded job on n1 only when the held nodes are offered to it
    nodes = [node("n1"), node("n2")]
    running = [
        run(10, {"n1": range(8)}, "lab/a", min_runtime_s=0, lost_s=H),
        run(11, {"n2": range(8)}, "lab/c", placed_ago_s=H - 300.0, lost_s=0.0),
    ]
    snap = owed(world(nodes, running, [pend(6, 16, "lab/c"), pend(7, 4, "lab/a", debug=True)]))
    off = decide(snap, FairShare13(hold_debug=False), NOW)
    assert not off.preemptions and not off.placements
    assert off.hold is not None and off.hold.nodes == frozenset({"n1", "n2"})
    d = decide(snap, FairShare13(), NOW)
    assert [(p.job_id, p.reason) for p in d.preemptions] == [(10, "debug")]
    assert [p.job_id for p in d.placements] == [7]


def test_fairshare_13_is_registered_with_its_settings() -> None:
    thirteen = policy_from_config(default_config("fairshare-13"))
    assert type(thirteen) is FairShare13
    assert thirteen.hold_drain == "own" and thirteen.hold_debug and thirteen.hold_start
    assert thirteen.hold_team_fs == 0.0 and thirteen.hold_binds
    other = FairShare13(hold_drain="over", hold_debug=False)
    assert policy_from_config(config_of(other)) == other
    knobbed = policy_from_config(
        with_knobs(default_config("fairshare-13"), {"hold_drain": "over", "hold_debug": "false"})
    )
    assert isinstance(knobbed, FairShare13)
    assert knobbed.hold_drain == "over" and not knobbed.hold_debug
    assert OWED["lab/c"] > 1.0  # lab/c is under its share in these worlds
    assert msgspec.structs.asdict(FairShare13())["version"] == "fairshare-13"
