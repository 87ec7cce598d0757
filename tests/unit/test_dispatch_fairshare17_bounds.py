"""fairshare-17's two bounds (atk54-26): the takeback limit counts only another team's funded
takebacks, lapses, and keeps at most a share of the cluster (F1); a debug job's reservation
keeps only a node it can have within the window (F2). Pure dispatch on small worlds, and the
fold that records the takebacks."""

from __future__ import annotations

import msgspec

from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.dispatch import decide
from ledger.dispatch.fairshare17 import FairShare17
from ledger.dispatch.snapshot import RunningJob
from schemas import commands as c
from schemas import events as e
from tests.unit.test_audit_check import T0, history, placed
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, preempted, run, world


def _free(job_id: int, where: str, *, by: str, times: int = 3, placed_ago_s: float = H,
          submitted_at: float = 0.0) -> RunningJob:  # fmt: skip
    """An unfunded 8-GPU run on `where`, taken back `times` times by funded work of `by`."""
    r = run(job_id, {where: range(8)}, "lab/b", min_runtime_s=0, placed_ago_s=placed_ago_s,
            lost_s=placed_ago_s)  # fmt: skip
    taken = tuple((by, NOW - 10 * H + i) for i in range(times))
    return msgspec.structs.replace(r, runs=times, takebacks=taken, submitted_at=submitted_at)


ALL = FairShare17(takeback_keep_s=6 * H, takeback_keep_share=1.0, takeback_keep_yield_share=0.0)
"""No bound on the kept GPUs (one node's world), kept 6 h (s54-fs17fix's keep); no yield to
large jobs (s56: in these small worlds every job asks an eighth of the pool)."""


def test_only_another_teams_funded_takebacks_count() -> None:
    # a free-tier job of lab/b taken back 3 times by its own team's funded work (or, recorded
    # as none, by debug jobs) is no protected job: lab/a's funded job takes it back. Taken
    # back 3 times by lab/c's funded work it keeps its GPUs (placed an hour ago)
    own = _free(10, "n1", by="lab/b")
    assert preempted(world([node("n1")], [own], [pend(1, 8)]), ALL) == [10]
    other = _free(10, "n1", by="lab/c")
    assert preempted(world([node("n1")], [other], [pend(1, 8)]), ALL) == []
    twice = _free(10, "n1", by="lab/c", times=2)
    assert preempted(world([node("n1")], [twice], [pend(1, 8)]), ALL) == [10]


def test_the_protection_lapses_after_the_keep_time() -> None:
    # kept for `takeback_keep_s` (6 h) after it was placed, then a victim like any other
    fresh = _free(10, "n1", by="lab/c", placed_ago_s=5 * H)
    assert preempted(world([node("n1")], [fresh], [pend(1, 8)]), ALL) == []
    old = _free(10, "n1", by="lab/c", placed_ago_s=7 * H)
    assert preempted(world([node("n1")], [old], [pend(1, 8)]), ALL) == [10]
    assert (
        preempted(
            world([node("n1")], [old], [pend(1, 8)]),
            FairShare17(
                takeback_keep_s=8 * H, takeback_keep_share=1.0, takeback_keep_yield_share=0
            ),
        )
        == []
    )


def test_the_kept_runs_hold_at_most_a_share_of_the_cluster() -> None:
    # 8 nodes full of free-tier jobs each taken back 3 times by lab/c, all placed an hour ago:
    # 0.125 of 64 GPUs keeps one (the oldest submission, job 10); a funded job of lab/a takes
    # back one of the others (the newest arrival, job 17)
    nodes = [node(f"n{i}") for i in range(8)]
    jobs = [_free(10 + i, f"n{i}", by="lab/c", submitted_at=float(i)) for i in range(8)]
    snap = world(nodes, jobs, [pend(1, 8)])
    eighth = FairShare17(takeback_keep_share=0.125)
    assert eighth.kept_runs(snap, NOW) == frozenset({10})
    assert preempted(snap, eighth) == [17]
    assert FairShare17(takeback_keep_share=0.25).kept_runs(snap, NOW) == frozenset({10, 11})
    assert FairShare17(takeback_keep_share=1.0).kept_runs(snap, NOW) == frozenset(range(10, 18))
    # (the yield off: the 8-GPU job asks an eighth of this pool)
    all_kept = FairShare17(takeback_keep_share=1.0, takeback_keep_yield_share=0.0)
    assert preempted(snap, all_kept) == []


def test_the_defaults_keep_a_run_for_days_within_one_gpu_in_sixteen() -> None:
    # s55: a Philly free-tier job runs for days, so a 6-hour keep lapsed long before it ended
    # and the wait target was lost; the defaults keep a run 72 h after its placement, and the
    # kept runs hold at most 1/16 of the GPUs. 16 nodes full of free-tier jobs each taken back
    # 3 times by lab/c, placed two days ago: one (the oldest submission, job 10) is kept, a
    # funded job of lab/a takes back the newest arrival (job 25). Placed four days ago, none
    # is kept (before: a 6-hour keep, two jobs in an eighth)
    nodes = [node(f"n{i:02}") for i in range(16)]
    jobs = [_free(10 + i, f"n{i:02}", by="lab/c", submitted_at=float(i), placed_ago_s=48 * H)
            for i in range(16)]  # fmt: skip
    snap = world(nodes, jobs, [pend(1, 8)])
    assert FairShare17().kept_runs(snap, NOW) == frozenset({10})
    assert preempted(snap, FairShare17()) == [25]
    old = [msgspec.structs.replace(j, placed_at=NOW - 96 * H) for j in jobs]
    assert FairShare17().kept_runs(world(nodes, old, [pend(1, 8)]), NOW) == frozenset()


DEBUG = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=600, time_limit_s=600)


def test_the_fold_records_only_funded_non_debug_takebacks() -> None:
    # job 2 (dan, ai2/tulu, unfunded) is taken back for alice's funded job 1 (ai2/olmo), for
    # its own team's funded job 3 and for the debug job 4: two takebacks recorded (the debug
    # one not); the funded job 1 taken back records none
    events = history(
        [
            (T0, c.InitLedger(actor="root", admin="root")),
            (T0, c.OpenAccount(actor="root", path="ai2", kind="program")),
            (T0, c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=3)),
            (T0, c.OpenAccount(actor="root", path="ai2/tulu", kind="project", shares=1)),
            (T0, c.AddMember(actor="root", user="alice", project="ai2/olmo")),
            (T0, c.AddMember(actor="root", user="dan", project="ai2/tulu")),
            (T0, c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8)),
            (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=4, min_runtime_s=3_600)),
            (T0, c.SubmitJob(actor="dan", account="ai2/tulu", gpus=4, min_runtime_s=0)),
            (T0, c.SubmitJob(actor="dan", account="ai2/tulu", gpus=4, min_runtime_s=3_600)),
            (
                T0,
                c.SubmitJob(
                    actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=600, time_limit_s=600
                ),
            ),
        ]
    )
    state = State()
    for ev in events:
        evolve(state, ev)
    assert state.jobs[4].spec.debug
    t = T0
    for by in (1, 3, 4):
        t += 100
        evolve(state, placed(2, (0, 1, 2, 3), at=t))
        evolve(state, e.JobPreempted(event_id=f"x{t}", at=t + 1, actor="@dispatcher", job_id=2,
                                     reason="fairness", for_job=by))  # fmt: skip
    assert state.jobs[2].preemptions == 3
    assert state.jobs[2].takebacks == (("ai2/olmo", T0 + 101), ("ai2/tulu", T0 + 201))
    evolve(state, placed(1, (4, 5, 6, 7), at=t + 10))
    evolve(state, e.JobPreempted(event_id="y", at=t + 9_999, actor="@dispatcher", job_id=1,
                                 reason="fairness", for_job=3))  # fmt: skip
    assert state.jobs[1].takebacks == ()


def test_a_debug_job_keeps_no_node_it_could_not_have_within_the_window() -> None:
    # n1: a funded non-resumable job past its contract on 6 GPUs, no declared limit, 2 free;
    # n2: one on all 8. The debug job (4 GPUs) may preempt neither, and neither ends at a known
    # time: no node is kept, the funded 2-GPU job 2 runs on n1 (before: n1 kept for the
    # blocker's whole life). With a limit ending in 30 min n1 is kept; in 30 h it is not
    full = run(11, {"n2": range(8)}, "lab/b", resumable=False)
    blocker = run(10, {"n1": range(6)}, "lab/b", resumable=False)
    debug, small = pend(1, 4, debug=True), pend(2, 2, "lab/c")
    snap = world([node("n1"), node("n2")], [blocker, full], [debug, small])
    d = decide(snap, FairShare17(), NOW)
    assert [p.job_id for p in d.placements] == [2] and d.hold is None
    soon = msgspec.structs.replace(blocker, time_limit_s=int(2.5 * H))  # placed 2 h ago
    d = decide(world([node("n1"), node("n2")], [soon, full], [debug, small]), FairShare17(), NOW)
    assert not d.placements and d.hold is not None and d.hold.nodes == {"n1"}
    late = msgspec.structs.replace(blocker, time_limit_s=int(32 * H))
    d = decide(world([node("n1"), node("n2")], [late, full], [debug, small]), FairShare17(), NOW)
    assert [p.job_id for p in d.placements] == [2] and d.hold is None
