"""A resumable job's next launch waits for its stopped run's end, not only for its node's word
that the run is gone (atk55-23 F1). Job 98's command exited 0 just before an admin preemption;
the job was placed again on another node, held there (`Fence`) while its first run's leftover
lived out its grace; then a report of the first node no longer listed the run but did not yet
carry its end: the held launch was handed out, and the end in the next report completed the
job while its command ran again elsewhere (charged, killed at the end of its grace)."""

from __future__ import annotations

import itertools
from typing import Any

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.cycle.executor import launch_of
from ledger.engines.agents import AgentExecutor
from schemas import agent as a
from schemas import commands as c
from schemas import events as e

LOST, FENCE, GRACE = 10.0, 20.0, 5.0
T = 5000.0


class FakeLedger:
    """The executor's view of the ledger: the state, folded through the pure domain."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.clock = itertools.count(int(T))
        self.ids = (lambda n: lambda: f"x{next(n)}")(itertools.count(1))

    def execute(self, cmd: Any) -> list[e.AnyEvent]:
        events = decide(self.state, cmd, float(next(self.clock)), self.ids)
        for ev in events:
            evolve(self.state, ev)
        return events

    def execute_all(self, cmds: Any) -> None:
        for cmd in cmds:
            self.execute(cmd)

    def place(self, job: int, node: str, run: int) -> None:
        slot = e.GpuSlot(node=node, gpu_indices=(0,))
        self.execute(c.ApplyDecision(actor="@dispatcher", decision=c.DecisionBody(
            cycle_id=f"c{job}.{run}", based_on=0, policy_version="test",
            placements=(c.Placement(job_id=job, slots=(slot,)),))))  # fmt: skip


def preempted_and_placed_again(org_state: State) -> tuple[FakeLedger, AgentExecutor, int]:
    """Run 0 started on n1 and was preempted (its leftover in its grace there); run 1 placed on
    n2 and held by the executor until n1 says run 0 is gone."""
    led = FakeLedger(org_state)
    (sub,) = [ev for ev in led.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1,
                                                   min_runtime_s=0, resumable=True))
              if isinstance(ev, e.JobSubmitted)]  # fmt: skip
    job = sub.job_id
    ex = AgentExecutor(led, node_lost_after_s=LOST, node_fence_s=FENCE, grace_s=GRACE)
    led.place(job, "n1", 0)
    ex.carry_out(c_orders(launches=(launch_of(job, led.state.jobs[job], "alice"),)), T)
    ex.receive(a.Report(node="n1", started=(a.PartStarted(job_id=job, run=0),)), T)
    ex.observe(T, led.state.nodes)
    led.execute(c.StartJob(actor="@executor", job_id=job, engine="agent",
                           engine_job_id=f"{job}.1", run=0))  # fmt: skip
    led.execute(c.PreemptJob(actor="root", job_id=job, reason="admin", note="race"))
    assert (job, 0) in led.state.stopped_runs
    ex.carry_out(c_orders(stops=(job,)), T + 1)
    led.place(job, "n2", 1)
    ex.carry_out(c_orders(launches=(launch_of(job, led.state.jobs[job], "alice"),)), T + 2)
    assert job in ex._held and not parts_on(ex, "n2")
    return led, ex, job


def c_orders(**kw: Any) -> Any:
    from ledger.cycle.executor import Orders

    return Orders(**kw)


def parts_on(ex: AgentExecutor, node: str) -> list[tuple[int, int]]:
    return [(p.job_id, p.run) for p in ex.board.current(node)[1]]


def test_a_report_saying_the_run_gone_without_its_end_does_not_release_the_next_launch(
    org_state: State,
) -> None:
    led, ex, job = preempted_and_placed_again(org_state)
    version = ex.board.version("n1")
    # n1's agent no longer has run 0, and its end is not in this report (an agent before s55)
    ex.receive(a.Report(node="n1", version=version, running=()), T + 3)
    assert not parts_on(ex, "n2"), "launched before the ledger knew how run 0 ended"
    # the next report: run 0 exited 0 by itself before the stop reached it
    end = a.PartExited(job_id=job, run=0, exit_code=0, reason="exited", ended_at=T + 0.5)
    ex.receive(a.Report(node="n1", version=version, exited=(end,), running=()), T + 4)
    assert not parts_on(ex, "n2")
    seen = ex.observe(T + 4, led.state.nodes)
    assert [(x.job_id, x.by_itself) for x in seen.stopped] == [(job, True)]
    assert not parts_on(ex, "n2")


def test_an_end_that_never_comes_holds_the_launch_only_until_grace_and_lost_timeout(
    org_state: State,
) -> None:
    led, ex, job = preempted_and_placed_again(org_state)
    sr = led.state.stopped_runs[(job, 0)]
    bound = sr.at + sr.grace(GRACE) + LOST  # its stop, its grace, the node-lost timeout
    ex.receive(a.Report(node="n1", version=ex.board.version("n1"), running=()), T + 3)
    ex.observe(bound - 0.5, led.state.nodes)
    assert not parts_on(ex, "n2")
    ex.observe(bound + 0.5, led.state.nodes)
    assert parts_on(ex, "n2") == [(job, 1)]
