"""A run stopped while its job was `placed` on node agents may live: its launch may have run
unheard (atk51-23 F3: `up` killed -9 right after its agent launched the job, then a cancel).
No stopped run was kept: its GPU read free at once, the next job was placed on it with no
reason while the processes lived, and the restarted agent gave them a new grace (SIGKILL at
the restart plus the grace, not the cancel plus the grace).

Now such a run is in `State.stopped_runs` (`StoppedRun.placed`) until its agent reports its end
or a list without it: its GPUs are held, its job holds its dependents, every read says
`stopping` with its SIGKILL from the cancel. What the dispatcher places changes, so the rule is
recorded (`CycleDecided.placed_held`): a decision recorded before replays by the old rule, byte
for byte, and one recorded now by the new.
"""

from __future__ import annotations

import msgspec
import pytest

from ledger.cycle.dispatcher import Dispatcher
from ledger.cycle.executor import Orders, Start
from ledger.cycle.inputs import snapshot_from_state, stopping_gpus
from ledger.dispatch import decide
from ledger.dispatch.policy import Fifo
from ledger.history.replay import replay_decisions
from ledger.reads.preview import _holding_rows
from ledger.store.application import Ledger
from ledger.store.clock import SimClock
from ledger.store.embedded import EmbeddedSource
from schemas import commands as c
from schemas import events as e
from schemas import views as v
from schemas.errors import LedgerError
from schemas.policy import FifoConfig
from tests.unit.test_node_lost_stopping import _decode
from tests.unit.test_stopping_held import Engine, NoRanks, submit, tick, where


class Unheard(Engine):
    """Node agents whose launches' starts are not heard (yet): the jobs stay `placed`."""

    def carry_out(self, orders: Orders, now: float) -> tuple[Start, ...]:
        super().carry_out(orders, now)
        return ()


def _on_agents(ledger: Ledger, executor: str = "agents") -> None:
    cmd = c.ConfigureService(
        actor="root", policy=FifoConfig(), interval_s=1.0, executor=executor, grace_s=30
    )
    ledger.execute(cmd)


def _placed_on_n1(ledger: Ledger, clock: SimClock, d: Dispatcher) -> int:
    job = submit(ledger, 8, grace_s=60)
    tick(clock)
    d.cycle(clock.now())
    assert where(ledger, job) == (("n1", tuple(range(8))),)
    assert ledger.state.jobs[job].status == "placed"
    return job


def test_a_cancelled_placed_run_holds_its_gpus_and_dependents_until_its_end_is_reported(
    org_ledger: Ledger, clock: SimClock
) -> None:
    _on_agents(org_ledger)
    engine = Unheard()
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    a = _placed_on_n1(org_ledger, clock, d)
    cancelled_at = clock.now()
    org_ledger.execute(c.CancelJob(actor="alice", job_id=a))
    (sr,) = org_ledger.state.stopped_runs.values()
    assert (sr.job_id, sr.run, sr.placed, sr.why, sr.at) == (a, 0, True, "cancelled", cancelled_at)
    assert sr.kill_at(30) == cancelled_at + 60  # from the cancel: a restart gives no new grace
    assert stopping_gpus(org_ledger.state) == {"n1": frozenset(range(8))}
    assert stopping_gpus(org_ledger.state, placed=False) == {}  # the old rule: free
    after = submit(org_ledger, 1, dependency=(e.Dependency(kind="afterany", job_ids=(a,)),))
    big = submit(org_ledger, 8)
    tick(clock)
    d.cycle(clock.now())
    # nothing beside its possible processes: the 8-GPU job goes to n2, the dependent waits
    assert where(org_ledger, big) == (("n2", tuple(range(8))),)
    assert org_ledger.state.jobs[after].status == "pending"
    rows = _holding_rows(org_ledger.state, v.QueueFilter(state="running"), clock.now(), 100)
    (row,) = [r for r in rows if r.job_id == a]
    assert row.state == "stopping" and row.kill_at == cancelled_at + 60, row
    engine.gone = [a]  # its agent reports its end (or a list without it)
    tick(clock)
    d.cycle(clock.now())
    assert org_ledger.state.stopped_runs == {}
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, after) == (("n1", (0,)),)


def test_other_executors_fold_a_placed_jobs_cancel_as_before(
    org_ledger: Ledger, clock: SimClock
) -> None:
    """The local executor starts what it launches in the same cycle (and a log with no
    service recorded names none): a placed job's cancel leaves nothing stopping."""
    for executor in ("", "local"):
        if executor:
            _on_agents(org_ledger, executor)
        d = Dispatcher(org_ledger, NoRanks(), Fifo(), Unheard())  # type: ignore[arg-type]
        a = _placed_on_n1(org_ledger, clock, d)
        org_ledger.execute(c.CancelJob(actor="alice", job_id=a))
        assert org_ledger.state.stopped_runs == {}


def test_a_record_made_before_the_placed_rule_replays_by_it_and_one_made_after_by_the_new(
    org_ledger: Ledger, clock: SimClock, home: object
) -> None:
    """One log holds a decision made as before s52 (the placed run's GPUs free, `placed_held`
    False) and one made now: each replays identically; read by the other rule, each differs."""
    _on_agents(org_ledger)
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), Unheard())  # type: ignore[arg-type]
    a = _placed_on_n1(org_ledger, clock, d)
    org_ledger.execute(c.CancelJob(actor="alice", job_id=a))
    old = submit(org_ledger, 8)
    tick(clock)
    now = clock.now()
    snap = snapshot_from_state(org_ledger.state, {}, now, hold_stopping=True, hold_lost=True)
    cmd = decide(snap, Fifo(), now).to_command(
        "@dispatcher",
        "c-old",
        decided_at=now,
        policy=FifoConfig(),
        stopping_held=True,
        lost_held=True,
    )  # fmt: skip  (as a cycle before s52 decided)
    org_ledger.execute(cmd)
    assert where(org_ledger, old) == (("n1", tuple(range(8))),)  # beside a's possible launch
    org_ledger.execute(c.CancelJob(actor="alice", job_id=old))  # placed too: stopping
    new = submit(org_ledger, 8)
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, new) == (("n2", tuple(range(8))),)
    assert a in {sr.job_id for sr in org_ledger.state.stopped_runs.values()}
    with EmbeddedSource(home) as source:  # type: ignore[arg-type]
        decisions = [
            (r.position, ev)
            for r in source.read(0, 10_000)
            if isinstance(ev := _decode(r.data), e.CycleDecided)
        ]
        assert [ev.placed_held for _, ev in decisions] == [True, False, True]
        results = list(replay_decisions(source, decisions))
        assert [r.headline() for r in results if not r.identical] == []
        flipped = [(p, msgspec.structs.replace(ev, placed_held=not ev.placed_held))
                   for p, ev in decisions[1:]]  # fmt: skip
        assert not any(r.identical for r in replay_decisions(source, flipped))


def test_a_stopped_placed_run_its_agent_never_had_ends_at_its_report(org_ledger: Ledger) -> None:
    """Its agent never had it (never launched): a report whose list lacks it records its end,
    so its GPUs are not `stopping` for a day; while a report lists it, it is not ended."""
    from ledger.cycle.record import stopped_commands
    from ledger.engines.agents import AgentExecutor
    from schemas import agent as a

    led = org_ledger
    _on_agents(led)
    job = submit(led, 1)
    slot = e.GpuSlot(node="n1", gpu_indices=(0,))
    led.execute(c.ApplyDecision(actor="@dispatcher", decision=c.DecisionBody(
        cycle_id="c1", based_on=0, policy_version="test",
        placements=(c.Placement(job_id=job, slots=(slot,)),))))  # fmt: skip
    led.execute(c.CancelJob(actor="alice", job_id=job))
    assert (job, 0) in led.state.stopped_runs
    ex = AgentExecutor(led, node_lost_after_s=60.0, grace_s=30.0)
    now = led.clock.now()
    listed = (a.PartRun(job_id=job, run=0),)
    ex.receive(a.Report(node="n1", running=listed), now)
    ex.receive(a.Report(node="n2", running=()), now)  # not its node
    assert ex.observe(now, dict(led.state.nodes)).stopped == ()
    ex.receive(a.Report(node="n1", running=()), now + 1)
    stopped = ex.observe(now + 1, dict(led.state.nodes)).stopped
    assert [(x.job_id, x.run) for x in stopped] == [(job, 0)]
    led.execute_all(stopped_commands(stopped, "agents"))
    assert led.state.stopped_runs == {}
    (end,) = [ev for _, ev in led.read(0, 1_000_000) if isinstance(ev, e.JobRunEnded)]
    assert end.note == "it never started: n1's agent reports no such run" and end.started_at is None


@pytest.mark.parametrize("said", ["started", "stopped_while_running"])
def test_a_stopped_placed_run_that_ran_says_its_start_with_its_end(
    org_ledger: Ledger, said: str
) -> None:
    """atk52-23 F4 / atk54-23 F3: a placed job cancelled while its launch ran unheard: its
    agent's word of the part's start (after the cancel, or before it, while the run was still
    the ledger's) comes with the stopped run's end (`started_at`), so the run is charged from
    its own start and `jobs` names where it ran, as Slurm accounts a cancelled job from its
    start. Before: no start, not charged, and `jobs` named an earlier launch's nodes."""
    from ledger.cycle.record import stopped_commands
    from ledger.engines.agents import AgentExecutor
    from schemas import agent as a

    led = org_ledger
    _on_agents(led)
    job = submit(led, 1)
    slot = e.GpuSlot(node="n1", gpu_indices=(0,))
    led.execute(c.ApplyDecision(actor="@dispatcher", decision=c.DecisionBody(
        cycle_id="c1", based_on=0, policy_version="test",
        placements=(c.Placement(job_id=job, slots=(slot,)),))))  # fmt: skip
    ex = AgentExecutor(led, node_lost_after_s=60.0, grace_s=30.0)
    now = led.clock.now()
    began = a.PartStarted(job_id=job, run=0, started_at=now - 4, pid=7)
    if said == "stopped_while_running":  # its run is the executor's when the start is heard
        ex.adopt({job: 0}, now)
        ex.receive(a.Report(node="n1", started=(began,)), now)
        ex.observe(now, dict(led.state.nodes))  # its start, unrecorded (a restart loses it)
        ex._stop(job, now)
    led.execute(c.CancelJob(actor="alice", job_id=job))
    assert (job, 0) in led.state.stopped_runs and led.state.stopped_runs[(job, 0)].placed
    started = () if said == "stopped_while_running" else (began,)
    gone = a.PartStopped(job_id=job, run=0, ended_at=now + 1, exit_code=143)
    ex.receive(a.Report(node="n1", started=started, stopped=(gone,), running=()), now + 2)
    stopped = ex.observe(now + 2, dict(led.state.nodes)).stopped
    assert [(x.job_id, x.run, x.started_at) for x in stopped] == [(job, 0, now - 4)], stopped
    led.execute_all(stopped_commands(stopped, "agents"))
    (end,) = [ev for _, ev in led.read(0, 1_000_000) if isinstance(ev, e.JobRunEnded)]
    assert (end.exit_code, end.started_at) == (143, now - 4), end


def test_audit_flags_a_placement_on_a_gpu_its_decision_says_it_held(
    org_ledger: Ledger, clock: SimClock, home: object
) -> None:
    """`audit check` had no rule for a placement on a stopping run's GPUs: a decision recorded
    as holding them (`placed_held`) that placed there is flagged; the same placement by a
    record of the rule before (`placed_held` False) is not, nor are the dispatcher's."""
    from ledger.history.audit import check_history

    _on_agents(org_ledger)
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), Unheard())  # type: ignore[arg-type]
    a = _placed_on_n1(org_ledger, clock, d)
    org_ledger.execute(c.CancelJob(actor="alice", job_id=a))
    new = submit(org_ledger, 8)
    tick(clock)
    d.cycle(clock.now())  # the dispatcher's: n2
    assert where(org_ledger, new) == (("n2", tuple(range(8))),)
    for held, cycle in ((False, "c-old"), (True, "c-wrong")):
        job = submit(org_ledger, 8)
        tick(clock)
        now = clock.now()
        snap = snapshot_from_state(org_ledger.state, {}, now, hold_stopping=True, hold_lost=True)
        cmd = decide(snap, Fifo(), now).to_command(
            "@dispatcher",
            cycle,
            decided_at=now,
            policy=FifoConfig(),
            stopping_held=True,
            lost_held=True,
            placed_held=held,
        )  # fmt: skip  (a snapshot without the placed run: n1 free)
        org_ledger.execute(cmd)
        assert where(org_ledger, job) == (("n1", tuple(range(8))),)
        org_ledger.execute(c.CancelJob(actor="alice", job_id=job))  # placed: stopping too
    with EmbeddedSource(home) as source:  # type: ignore[arg-type]
        events = [(r.position, _decode(r.data)) for r in source.read(0, 10_000)]
    flagged = [vi for vi in check_history(events) if vi.code == "PLACED_ON_STOPPING_GPU"]
    assert [(vi.job_id, "c-wrong" in vi.message) for vi in flagged] == [(job, True)], flagged


def test_a_placed_run_on_a_node_lost_then_returned_holds_its_gpus_until_its_end_is_reported(
    org_ledger: Ledger, clock: SimClock
) -> None:
    """atk52-23 F1: `up` killed -9 right after its agent launched a job, the node marked lost,
    then returned. The return cleared the placed-lost run: its GPUs read free and the next job
    was placed on them while its processes lived (and a restarted agent gave them a new grace).
    Now the loss keeps it as a stopped run (`placed`, `node_lost`), as a cancel does: the return
    changes nothing of it, only its agent's report ends it."""
    _on_agents(org_ledger)
    engine = Unheard()
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    a = _placed_on_n1(org_ledger, clock, d)
    lost_at = clock.now()
    org_ledger.execute(c.MarkNodeLost(actor="root", node="n1", reason="dead"))
    org_ledger.execute(c.ReturnNode(actor="root", node="n1"))
    (sr,) = org_ledger.state.stopped_runs.values()
    assert (sr.job_id, sr.placed, sr.why, sr.at) == (a, True, "node_lost", lost_at), sr
    assert stopping_gpus(org_ledger.state) == {"n1": frozenset(range(8))}
    assert stopping_gpus(org_ledger.state, placed=False) == {}  # decisions recorded before
    big = submit(org_ledger, 8)
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, big) == (("n2", tuple(range(8))),)  # not beside its processes
    with pytest.raises(LedgerError):  # the loss's run may live: no remove forgets it
        org_ledger.execute(c.RemoveNode(actor="root", node="n1"))
    engine.gone = [a]  # its agent, back, reports its end
    tick(clock)
    d.cycle(clock.now())
    assert org_ledger.state.stopped_runs == {}
