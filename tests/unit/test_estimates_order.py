"""Estimated starts put held jobs (a dependency, an array's `%N` limit) where the dispatcher will
place them, by their own sort key (atk33-23 F4), and a job waiting for a contract behind the
victim's grace, counted from its real start (F6). Pure: `estimated_starts`, `blocked_keys`."""

from __future__ import annotations

import msgspec

from ledger.core.jobs import blocked
from ledger.core.state import State
from ledger.cycle.inputs import snapshot_from_state
from ledger.dispatch.engine import decide as dispatch
from ledger.dispatch.registry import build
from ledger.reads.estimates import blocked_keys, estimated_starts
from schemas import commands as c
from schemas.events import Dependency
from tests.unit.domainkit import ONE_NODE
from tests.unit.domainkit import run as _run


def _place(state: State, at: float, policy: str = "fifo") -> None:
    decision = dispatch(snapshot_from_state(state, {}, at), build(policy), at)
    body = c.DecisionBody(cycle_id=f"c{at}", based_on=state.events, policy_version="x",
                          placements=tuple(decision.placements))  # fmt: skip
    _run(state, at, c.ApplyDecision(actor="@dispatcher", decision=body))
    for p in decision.placements:
        _run(state, at, c.StartJob(actor="@executor", job_id=p.job_id))


def test_held_jobs_are_estimated_at_their_place_in_the_dispatch_order() -> None:
    """F4 (node agents): n1 has 4 GPUs, n2 2 (job 1 held n2 while the array's first task was
    placed on n1, then was cancelled). Array task 2 (`-G 1 -t 60 -a 0-2%1`) runs on n1 until
    t=60; tasks 3 and 4 wait for it (%1). Then job 5 (4 GPUs, 60 s), job 6 (4 GPUs,
    afterany:5) and job 7 (4 GPUs). What happens when every job runs to its limit: task 3 and
    job 5 start at 60 (task 3 on n2, job 5 on all of n1), job 6 at 120 (it sorts ahead of job
    7 once job 5 has ended), task 4 at 120, job 7 at 180. The estimates said job 7 at 120 and
    job 6 at 180 (every held job behind the whole queue), and the tasks later than they ran."""
    state = State()
    _run(state, 0.0,
         c.InitLedger(actor="root", admin="root"),
         c.OpenAccount(actor="root", path="p", kind="program"),
         c.OpenAccount(actor="root", path="p/q", kind="project"),
         c.AddMember(actor="root", user="u", project="p/q"),
         c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=4),
         c.RegisterNode(actor="root", node="n2", gpu_type="h100", gpus=2),
         c.SubmitJob(actor="u", account="p/q", gpus=2),
         c.SubmitJob(actor="u", account="p/q", gpus=1, time_limit_s=60, array=(0, 1, 2),
                     array_limit=1))  # fmt: skip
    _place(state, 0.0)
    assert [state.jobs[j].slots[0].node for j in (1, 2)] == ["n2", "n1"]
    _run(state, 1.0, c.CancelJob(actor="u", job_id=1))
    after5 = (Dependency(kind="afterany", job_ids=(5,)),)
    _run(state, 3.0,
         c.SubmitJob(actor="u", account="p/q", gpus=4, time_limit_s=60),
         c.SubmitJob(actor="u", account="p/q", gpus=4, time_limit_s=60, dependency=after5),
         c.SubmitJob(actor="u", account="p/q", gpus=4, time_limit_s=60))  # fmt: skip
    now = 5.0
    snap = snapshot_from_state(state, {}, now)
    policy = build("fifo")
    decision = dispatch(snap, policy, now)
    assert not decision.placements  # job 5 needs a whole n1
    keys = blocked_keys(state, snap, policy, blocked(state))
    assert [j for _, j in keys] == [3, 4, 6]
    starts = estimated_starts(state, snap, decision, now, blocked=keys)
    assert starts == {3: 60.0, 4: 120.0, 5: 60.0, 6: 120.0, 7: 180.0}
    # up to a job: the same as in the whole answer for it and the jobs ahead of it
    assert estimated_starts(state, snap, decision, now, 5, blocked=keys) == {
        3: 60.0, 4: 120.0, 5: 60.0
    }  # fmt: skip


def test_a_dependent_that_sorts_before_what_it_waits_for_waits_for_its_estimate() -> None:
    """A dependent whose key comes first (higher priority) is estimated once the job it waits
    for has an estimate, not "unknown"."""
    state = State()
    _run(state, 0.0,
         c.InitLedger(actor="root", admin="root"),
         c.OpenAccount(actor="root", path="p", kind="program"),
         c.OpenAccount(actor="root", path="p/q", kind="project"),
         c.AddMember(actor="root", user="u", project="p/q"),
         c.RegisterNode(actor="root", node="n", gpu_type="h100", gpus=4),
         c.SubmitJob(actor="u", account="p/q", gpus=4, time_limit_s=100,
                     min_runtime_s=60))  # fmt: skip
    _place(state, 0.0, "fairshare")
    after2 = (Dependency(kind="afterany", job_ids=(2,)),)  # job 3's priority: an admin's (F15)
    _run(state, 1.0,
         c.SubmitJob(actor="u", account="p/q", gpus=4, time_limit_s=100, min_runtime_s=60),
         c.SubmitJob(actor="root", user="u", account="p/q", gpus=4, time_limit_s=100,
                     min_runtime_s=60, priority=5, dependency=after2))  # fmt: skip
    now = 2.0
    snap = snapshot_from_state(state, {}, now)
    policy = build("fairshare")
    decision = dispatch(snap, policy, now)
    keys = blocked_keys(state, snap, policy, blocked(state))
    assert keys[0][0] < next(k for k, q in decision.order if q.job_id == 2)  # it sorts first
    assert estimated_starts(state, snap, decision, now, blocked=keys) == {2: 100.0, 3: 200.0}


def test_a_job_waiting_for_stopping_gpus_is_estimated_at_their_sigkill() -> None:
    """atk48-23 F3: n1 has 4 GPUs; job 1 (2 GPUs, grace 40 s) is cancelled at t=10 and lives
    out its grace on GPUs 0,1; job 2 (1 GPU, 10 min limit) runs on GPU 2; job 3 (2 GPUs) waits
    for job 1's GPUs, free by its SIGKILL at t=50 at the latest, which `explain` names; job 4
    takes GPU 3. The estimate said t=600 (job 2's limit), or "unknown" without it: the stopping
    GPUs had no release. Now: their SIGKILL plus the cycle that places on them (interval 2 s)."""
    from ledger.reads.stopping import stopped_kill_at

    state = State()
    _run(state, 0.0,
         *ONE_NODE,
         c.SubmitJob(actor="u", account="p/q", gpus=2, grace_s=40),
         c.SubmitJob(actor="u", account="p/q", gpus=1, time_limit_s=600))  # fmt: skip
    _place(state, 0.0)
    for j in (1, 2):
        state.jobs[j] = msgspec.structs.replace(state.jobs[j], engine="agent")
    _run(state, 10.0, c.CancelJob(actor="u", job_id=1))
    (sr,) = state.stopped_runs.values()
    assert stopped_kill_at(sr, state.grace_s) == 50.0
    _run(state, 11.0,
         c.SubmitJob(actor="u", account="p/q", gpus=2, time_limit_s=300),
         c.SubmitJob(actor="u", account="p/q", gpus=1, time_limit_s=300))  # fmt: skip
    now = 12.0
    snap = snapshot_from_state(state, {}, now, hold_stopping=True)
    decision = dispatch(snap, build("fifo"), now)
    assert [p.job_id for p in decision.placements] == [4]
    assert estimated_starts(state, snap, decision, now) == {3: 52.0, 4: now}
    # past its SIGKILL, its end not reported yet: from the next cycle
    assert estimated_starts(state, snap, decision, 60.0)[3] == 62.0
    # a snapshot that counted them free (an older record's rule) gets no second release
    free = snapshot_from_state(state, {}, now)
    assert estimated_starts(state, free, dispatch(free, build("fifo"), now), now) == {
        3: now, 4: now
    }  # fmt: skip


def test_what_a_stopping_job_holds_back_is_estimated_from_its_sigkill() -> None:
    """A job stopping in its grace holds back its `afterany` dependent and its `%1` array's
    next task (`jobs.blocked`, atk48-23 F5): their estimates start once it is gone, its SIGKILL
    at the latest plus a cycle, not now (they said "starts now" while the reads said why they
    waited)."""

    state = State()
    _run(state, 0.0,
         *ONE_NODE,
         c.SubmitJob(actor="u", account="p/q", gpus=1, grace_s=40),
         c.SubmitJob(actor="u", account="p/q", gpus=1, grace_s=60, array=(0, 1),
                     array_limit=1))  # fmt: skip
    _place(state, 0.0)
    assert sorted(j for j in state.jobs if state.jobs[j].status == "running") == [1, 2]
    for j in (1, 2):
        state.jobs[j] = msgspec.structs.replace(state.jobs[j], engine="agent")
    _run(state, 10.0, c.CancelJob(actor="u", job_id=1), c.CancelJob(actor="u", job_id=2),
         c.SubmitJob(actor="u", account="p/q", gpus=1,
                     dependency=(Dependency(kind="afterany", job_ids=(1,)),)))  # fmt: skip
    now = 12.0
    waits = blocked(state, hold_stopping=True)
    assert set(waits) == {3, 4}  # task 1 of the array, and the afterany job
    snap = snapshot_from_state(state, {}, now, hold_stopping=True)
    policy = build("fifo")
    decision = dispatch(snap, policy, now)
    keys = blocked_keys(state, snap, policy, waits)
    starts = estimated_starts(state, snap, decision, now, blocked=keys)
    assert (starts[3], starts[4]) == (10.0 + 60 + 2, 10.0 + 40 + 2)


def test_a_job_stopping_at_its_time_limit_frees_its_gpus_at_its_sigkill() -> None:
    """atk49-23 F5: n1 has 2 GPUs; job 1 runs to t=3600, job 2 (grace 40 s) passes its limit
    at t=1000 and lives out its grace (SIGKILL by 1040, as `queue` says); job 3 waits for a GPU.
    It was estimated at job 1's limit (3600): a job past its limit ended "now", a release no
    start is found at. Now: job 2's SIGKILL plus the cycle that places on its GPU."""
    from schemas.policy import FifoConfig

    state = State()
    _run(state, 0.0,
         c.InitLedger(actor="root", admin="root"),
         c.OpenAccount(actor="root", path="p", kind="program"),
         c.OpenAccount(actor="root", path="p/q", kind="project"),
         c.AddMember(actor="root", user="u", project="p/q"),
         c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=2),
         c.ConfigureService(actor="root", policy=FifoConfig(), interval_s=2.0, executor="agents",
                            grace_s=10),
         c.SubmitJob(actor="u", account="p/q", gpus=1, time_limit_s=3600),
         c.SubmitJob(actor="u", account="p/q", gpus=1, time_limit_s=1000, grace_s=40))  # fmt: skip
    _place(state, 0.0)
    _run(state, 5.0, c.SubmitJob(actor="u", account="p/q", gpus=1, time_limit_s=300))
    # past its SIGKILL, its end not reported yet: from the next cycle (as a stopped run)
    for now, want in ((900.0, 1000.0), (1010.0, 1042.0), (1041.0, 1043.0), (1050.0, 1052.0)):
        snap = snapshot_from_state(state, {}, now, hold_stopping=True)
        decision = dispatch(snap, build("fifo"), now)
        assert decision.placements == ()
        assert estimated_starts(state, snap, decision, now) == {3: want}, now
