"""atk53-23 F5: a job past its time limit, in that limit's grace (its engine stopping it), then
preempted (by the dispatcher, an admin or its node's drain) was recorded `preempted`, and a
resumable one requeued to run again; a time limit's end it is, as a cancel in that grace
already said (`cancels._timed_out`): `time_limit` (outcome `failed`), never run again; the
preemption only cuts its grace. `explain` counted the contract of a preempted job from its
placement; the ledger counts it from its real start (`Job.contract_ends_at`)."""

from __future__ import annotations

import pytest

from ledger.core.state import State
from ledger.reads.explain import explain_history
from ledger.reads.stopping import DEFAULT_GRACE_S
from schemas import commands as c
from schemas import events as e
from schemas.policy import FairShareConfig
from tests.unit.test_jobs_world import World


@pytest.fixture
def w(org_state: State) -> World:
    return World(org_state)


def _running(w: World, gpu: int = 0, **kw: object) -> int:
    (job,) = w.submit(command=("t",), resumable=True, **kw)  # type: ignore[arg-type]
    w.place(job.job_id, "n1", gpu)
    w.run(c.StartJob(actor="@executor", job_id=job.job_id, engine="agent",
                     engine_job_id=f"{job.job_id}.1"))  # fmt: skip
    return job.job_id


def _by_dispatcher(w: World, job_id: int) -> list[e.AnyEvent]:
    p = c.Preemption(job_id=job_id, reason="fairness")
    body = c.DecisionBody(cycle_id=f"p{job_id}", based_on=w.state.events, policy_version="test",
                          preemptions=(p,))  # fmt: skip
    return w.run(c.ApplyDecision(actor="@dispatcher", decision=body))


def _service(w: World, executor: str) -> None:
    w.run(c.ConfigureService(actor="root", policy=FairShareConfig(), interval_s=1.0,
                             executor=executor))  # fmt: skip


@pytest.mark.parametrize("by", ["the dispatcher", "an admin"])
def test_a_job_preempted_in_its_time_limits_grace_ends_time_limit_not_requeued(
    w: World, by: str
) -> None:
    _service(w, "agents")
    job_id = _running(w, time_limit_s=5, grace_s=60, min_runtime_s=0)
    inside = _running(w, 1, time_limit_s=3600, grace_s=60, min_runtime_s=0)
    w.now += 30  # past the first's limit, in its grace
    ends = {}
    for j in (job_id, inside):
        if by == "an admin":
            got = w.run(c.PreemptJob(actor="root", job_id=j, note="maintenance"))
        else:
            got = _by_dispatcher(w, j)
        assert any(isinstance(ev, e.JobPreempted) for ev in got)
        ends[j] = [ev for ev in got if isinstance(ev, (e.JobFinished, e.JobRequeued))]
    (end,) = ends[job_id]
    assert isinstance(end, e.JobFinished)
    assert (end.outcome, end.reason) == ("failed", "time_limit")
    assert "its time limit passed at" in end.note and "in its grace" in end.note
    assert w.state.jobs[job_id].status == "finished" and job_id not in w.state.active
    assert (job_id, 0) in w.state.stopped_runs  # its run's end is awaited, as a cancel's
    # inside its limit: preempted as before, a resumable job requeued
    assert w.state.jobs[inside].status == "pending"


@pytest.mark.parametrize(
    ("case", "executor"),
    [("no service recorded (the simulator's kernel lets runs outlive their limits)", None),
     ("an engine that stops nothing at a limit", "none")],
)  # fmt: skip
def test_where_no_engine_stops_jobs_at_their_limits_a_preemption_requeues_as_before(
    w: World, case: str, executor: str | None
) -> None:
    if executor is not None:
        _service(w, executor)
    job_id = _running(w, time_limit_s=5, grace_s=60, min_runtime_s=0)
    w.now += 30
    _by_dispatcher(w, job_id)
    assert w.state.jobs[job_id].status == "pending", case


def test_explain_counts_a_preempted_jobs_contract_from_its_start(w: World) -> None:
    (job,) = w.submit(command=("t",), resumable=True, min_runtime_s=600)
    slot = e.GpuSlot(node="n1", gpu_indices=(0,))
    placed = w.run(c.ApplyDecision(actor="@dispatcher", decision=c.DecisionBody(
        cycle_id="c1", based_on=w.state.events, policy_version="test",
        placements=(c.Placement(job_id=job.job_id, slots=(slot,)),))))  # fmt: skip
    w.now += 100  # it starts 100 s after its placement (its launch held)
    started = w.run(c.StartJob(actor="@executor", job_id=job.job_id))
    assert w.state.jobs[job.job_id].contract_ends_at() == w.now + 600
    w.now += 550  # 650 s after its placement, 550 s after its start: inside its contract
    got = w.run(c.PreemptJob(actor="root", job_id=job.job_id, note="maintenance"))
    said = explain_history(w.state.jobs[job.job_id], [*placed, *started, *got], {}, w.now,
                           DEFAULT_GRACE_S)  # fmt: skip
    text = "\n".join(said)
    assert "inside its contract" in text and "had expired" not in text, text
