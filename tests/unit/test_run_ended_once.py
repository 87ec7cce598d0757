"""A stopped run's end is recorded once (issue 24): an engine that reports it again (a node
agent resends a report whose answer it did not get) records no second `job.run_ended.v1`; the
first report stands. A log written before, holding such duplicates, folds as it did."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import msgspec

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.cycle.record import stopped_commands
from ledger.engines.agents import AgentExecutor
from ledger.store import snapshots
from ledger.store.application import Ledger
from schemas import agent as a
from schemas import commands as c
from schemas import events as e


def _running_then_cancelled(do: Callable[[c.AnyCommand], list[e.AnyEvent]]) -> int:
    """A 1-GPU job placed on n1 GPU 0, started by the `agent` engine, then cancelled."""
    (sub,) = [ev for ev in do(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1))
              if isinstance(ev, e.JobSubmitted)]  # fmt: skip
    job = sub.job_id
    slot = e.GpuSlot(node="n1", gpu_indices=(0,))
    do(c.ApplyDecision(actor="@dispatcher", decision=c.DecisionBody(
        cycle_id=f"c{job}", based_on=0, policy_version="test",
        placements=(c.Placement(job_id=job, slots=(slot,)),))))  # fmt: skip
    do(c.StartJob(actor="@executor", job_id=job, engine="agent", engine_job_id=f"{job}.1", run=0))
    do(c.CancelJob(actor="alice", job_id=job))
    return job


def test_a_resent_agent_report_records_the_runs_end_once(org_ledger: Ledger) -> None:
    """The agent's report of the stopped run's end, received twice (its first answer lost):
    one `job.run_ended.v1`, the first report's."""
    led = org_ledger
    job = _running_then_cancelled(lambda cmd: led.execute(cmd).events)
    assert (job, 0) in led.state.stopped_runs
    ex = AgentExecutor(led, node_lost_after_s=60.0, grace_s=30.0)
    now = led.clock.now()
    for sent, ended_at in enumerate((now - 2.0, now - 1.0)):
        gone = a.PartStopped(job_id=job, run=0, ended_at=ended_at, exit_code=143, killed=True)
        ex.receive(a.Report(node="n1", stopped=(gone,)), now + sent)
        stopped = ex.observe(now + sent, dict(led.state.nodes)).stopped
        assert len(stopped) == 1  # the engine reports it each time
        led.execute_all(stopped_commands(stopped, "agent"))
    ends = [ev for _, ev in led.read(0, 1_000_000) if isinstance(ev, e.JobRunEnded)]
    assert [(ev.job_id, ev.run, ev.ended_at, ev.killed) for ev in ends] == [
        (job, 0, now - 2.0, True)
    ]
    assert led.state.run_ends == {(job, 0): ends[0].at} and led.state.stopped_runs == {}


def test_a_second_report_of_a_runs_end_decides_nothing(org_state: State) -> None:
    ids = (lambda n: lambda: f"s{next(n)}")(itertools.count(1))
    clock = itertools.count(1000)
    s = org_state

    def run(cmd: c.AnyCommand) -> list[e.AnyEvent]:
        events = decide(s, cmd, float(next(clock)), ids)
        for ev in events:
            evolve(s, ev)
        return events

    job = _running_then_cancelled(run)
    end = c.ConfirmRunEnded(actor="@executor", job_id=job, engine="agent",
                            engine_job_id=f"{job}.1", run=0, ended_at=1003.0)  # fmt: skip
    (first,) = run(end)
    assert isinstance(first, e.JobRunEnded)
    assert run(end) == [] and run(msgspec.structs.replace(end, ended_at=1009.0)) == []
    assert s.run_ends == {(job, 0): first.at}


def test_an_old_log_with_a_duplicate_end_folds_as_it_did(org_state: State) -> None:
    """Logs written before hold duplicates: they fold (state, and the stopped runs awaited)
    as the log without the duplicate does, the first end kept as the recorded one."""
    ids = (lambda n: lambda: f"s{next(n)}")(itertools.count(1))
    log: list[e.AnyEvent] = []
    scratch = org_state.copy()
    clock = itertools.count(1000)

    def run(cmd: c.AnyCommand) -> list[e.AnyEvent]:
        events = decide(scratch, cmd, float(next(clock)), ids)
        for ev in events:
            evolve(scratch, ev)
        log.extend(events)
        return events

    job = _running_then_cancelled(run)
    (first,) = run(c.ConfirmRunEnded(actor="@executor", job_id=job, engine="agent",
                                     engine_job_id=f"{job}.1", run=0, ended_at=1003.0))  # fmt: skip
    dup = msgspec.structs.replace(first, event_id="dup", at=first.at + 5, ended_at=1008.0)
    with_dup, without = org_state.copy(), org_state.copy()
    for ev in [*log, dup]:
        evolve(with_dup, ev)
    for ev in log:
        evolve(without, ev)
    assert with_dup.jobs == without.jobs and with_dup.stopped_runs == without.stopped_runs == {}
    assert with_dup.run_ends == without.run_ends == {(job, 0): first.at}
    assert with_dup.events == without.events + 1


def test_a_snapshot_keeps_the_recorded_ends_and_an_older_one_still_verifies(
    org_state: State,
) -> None:
    s = org_state
    s.run_ends = {(3, 0): 1000.0, (4, 1): 1001.0}
    live = s.copy()
    live.live_only = True
    live.jobs = {k: j for k, j in live.jobs.items() if j.active}
    data = msgspec.msgpack.encode(snapshots.folded(live))
    back = snapshots.unfolded(msgspec.msgpack.decode(data, type=snapshots.Folded))
    assert back.run_ends == live.run_ends and snapshots.same(back, live)
    older = snapshots.unfolded(msgspec.structs.replace(snapshots.folded(live), run_ends=None))
    assert older.run_ends == {} and snapshots.same(older, live)  # made before they were kept
    other = live.copy()
    other.run_ends = {}
    assert not snapshots.same(back, other)
