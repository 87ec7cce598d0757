"""The agent's last check before it starts a launch (`POST /v1/agent/confirm`): the server says
whether the launch is still its job's current placement on the node. A launch carried out from
a poll answer the ledger had since moved past started a command after its job had ended
(atk55-23 F1); the agent now starts only what the server confirms, within `FRESH_S`."""

from __future__ import annotations

from ledger.agent.checks import CONFIRM_AGAIN_S, FRESH_S, LastChecks
from ledger.core.state import State
from ledger.cycle.executor import launch_of
from ledger.engines.agents import AgentExecutor
from schemas import agent as a
from schemas import commands as c
from schemas import events as e
from tests.unit.test_agents_next_launch_waits_end import (
    FENCE,
    GRACE,
    LOST,
    FakeLedger,
    T,
    c_orders,
    preempted_and_placed_again,
)


def placed(org_state: State) -> tuple[FakeLedger, AgentExecutor, int, a.Part]:
    led = FakeLedger(org_state)
    (sub,) = [ev for ev in led.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1,
                                                   min_runtime_s=0))
              if isinstance(ev, e.JobSubmitted)]  # fmt: skip
    job = sub.job_id
    ex = AgentExecutor(led, node_lost_after_s=LOST, node_fence_s=FENCE, grace_s=GRACE)
    led.place(job, "n1", 0)
    ex.carry_out(c_orders(launches=(launch_of(job, led.state.jobs[job], "alice"),)), T)
    (part,) = ex.board.current("n1")[1]
    return led, ex, job, part


def check(ex: AgentExecutor, node: str, part: a.Part, token: str | None = None,
          run: int | None = None) -> tuple[list[int], list[str]]:  # fmt: skip
    got = ex.confirm(a.Confirm(node=node, launches=(a.LaunchCheck(
        job_id=part.job_id, run=part.run if run is None else run,
        job_token=part.job_token if token is None else token),)), T + 1)  # fmt: skip
    return [o.job_id for o in got.ok], [r.why for r in got.refused]


def test_the_current_placement_is_confirmed_and_nothing_else(org_state: State) -> None:
    _led, ex, job, part = placed(org_state)
    assert part.job_token
    assert check(ex, "n1", part) == ([job], [])
    ok, why = check(ex, "n1", part, token="another")
    assert not ok and "handed out again" in why[0], why
    ok, why = check(ex, "n1", part, run=1)
    assert not ok and "no longer its placement" in why[0], why
    ok, why = check(ex, "n2", part)
    assert not ok, why


def test_a_launch_the_ledger_stopped_since_the_poll_is_refused(org_state: State) -> None:
    led, ex, job, part = placed(org_state)
    led.execute(c.CancelJob(actor="alice", job_id=job))
    ex.carry_out(c_orders(stops=(job,)), T + 0.5)
    ok, why = check(ex, "n1", part)  # the agent still holds the answer that listed it
    assert not ok and why, why


def test_a_launch_refused_while_the_ledger_no_longer_runs_the_job(org_state: State) -> None:
    """The executor still lists it (the stop not carried out yet): the ledger's word counts."""
    led, ex, job, part = placed(org_state)
    led.execute(c.CancelJob(actor="alice", job_id=job))
    ok, why = check(ex, "n1", part)
    assert not ok and "no longer runs job" in why[0], why


def test_a_held_next_launch_is_not_confirmed(org_state: State) -> None:
    _led, ex, job = preempted_and_placed_again(org_state)
    got = ex.confirm(a.Confirm(node="n2", launches=(a.LaunchCheck(job_id=job, run=1),)), T + 3)
    assert not got.ok and got.refused


def test_the_agents_checks_start_a_launch_only_on_a_fresh_word() -> None:
    ch = LastChecks()
    key = (7, 0, "tok")
    assert ch.ask(key, 100.0) and not ch.ask(key, 100.1)  # asked once
    assert ch.asking() == [key]
    ch.answered([key], {(7, 0)}, 100.2)
    assert not ch.fresh(key, 100.2 + FRESH_S + 0.1)  # too old: asked again
    assert ch.ask(key, 103.0)
    ch.answered([key], {(7, 0)}, 103.1)
    assert ch.fresh(key, 103.2) and not ch.fresh(key, 103.3)  # used once


def test_a_refused_or_unanswered_launch_waits_before_it_is_asked_again() -> None:
    ch = LastChecks()
    key = (7, 0, "tok")
    ch.ask(key, 100.0)
    ch.answered([key], set(), 100.1)  # refused
    assert not ch.fresh(key, 100.2) and not ch.ask(key, 100.2)
    assert ch.ask(key, 100.1 + CONFIRM_AGAIN_S)
    ch.failed([key], 200.0, unsupported=False)
    assert not ch.ask(key, 201.0) and not ch.unsupported
    ch.keep(set())  # no longer listed: forgotten
    assert not ch.waits and not ch.pending
