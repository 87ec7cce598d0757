"""A run an admin's `node lost` ended while its processes may still live is stopping (atk49-23
F3): `node lost n1; node return n1` ended the node's jobs at once (failed, or requeued), while
their processes lived out their grace on n1. The ledger had no word of them: an `afterany`
dependent ran 41 s beside them, a `%1` array's next task was placed on the GPU they held, a
singleton's name was free, `jobs` said finished with no SIGKILL time, and a cancel of the
requeued job ended it `finished`, a second cancel refused.

Now such a run is in `State.stopped_runs` (`why` `node_lost`) until its engine reports its end
or its node is removed: its GPUs are held, its job holds its dependents, its name and its
array's limit, every read says `stopping` with its SIGKILL, and a cancel kills it as any
stopping job's. What the dispatcher places changes, so the rule is recorded
(`CycleDecided.lost_held`): a decision recorded before replays by the old rule, byte for byte.
"""

from __future__ import annotations

import msgspec
import pytest

from ledger.core.state import NODE_LOST
from ledger.cycle.dispatcher import Dispatcher
from ledger.cycle.inputs import snapshot_from_state, stopping_gpus
from ledger.dispatch import decide
from ledger.dispatch.policy import Fifo
from ledger.history.replay import replay_decisions
from ledger.reads.explain import earlier_runs_said, explain_history
from ledger.reads.explain_job import _history_texts
from ledger.reads.layer import stopping_on
from ledger.reads.preview import _holding_rows
from ledger.reads.stopping import DEFAULT_GRACE_S
from ledger.store.application import Ledger
from ledger.store.clock import SimClock
from ledger.store.embedded import EmbeddedSource
from schemas import commands as c
from schemas import events as e
from schemas import views as v
from schemas.errors import InvalidTransition
from schemas.policy import FifoConfig
from schemas.units import when
from tests.unit.test_stopping_held import Engine, NoRanks, submit, tick, where


def _lost_and_back(ledger: Ledger, node: str = "n1") -> None:
    ledger.execute(c.MarkNodeLost(actor="root", node=node, reason="test"))
    ledger.execute(c.ReturnNode(actor="root", node=node))


def _running_on_n1(ledger: Ledger, clock: SimClock, d: Dispatcher, **kw: object) -> int:
    job = submit(ledger, 8, grace_s=60, **kw)
    tick(clock)
    d.cycle(clock.now())
    assert where(ledger, job) == (("n1", tuple(range(8))),)
    assert ledger.state.jobs[job].status == "running"
    return job


def test_a_node_lost_run_holds_its_gpus_dependents_and_name_until_its_end_is_reported(
    org_ledger: Ledger, clock: SimClock
) -> None:
    engine = Engine()
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    a = _running_on_n1(org_ledger, clock, d, job_name="rb")
    lost_at = clock.now()
    _lost_and_back(org_ledger)
    assert org_ledger.state.jobs[a].outcome == "failed"
    (sr,) = org_ledger.state.stopped_runs.values()
    assert (sr.job_id, sr.why, sr.at) == (a, NODE_LOST, lost_at)
    assert stopping_gpus(org_ledger.state) == {"n1": frozenset(range(8))}
    assert stopping_gpus(org_ledger.state, lost=False) == {}  # the old rule: free
    after = submit(org_ledger, 1, dependency=(e.Dependency(kind="afterany", job_ids=(a,)),))
    single = submit(org_ledger, 1, job_name="rb", dependency=(e.Dependency(kind="singleton"),))
    big = submit(org_ledger, 8)
    tick(clock)
    d.cycle(clock.now())
    # nothing beside its processes: the 8-GPU job goes to n2, the dependents wait
    assert where(org_ledger, big) == (("n2", tuple(range(8))),)
    assert org_ledger.state.jobs[after].status == "pending"
    assert org_ledger.state.jobs[single].status == "pending"
    # every read says stopping, with its SIGKILL (the stop plus its grace)
    now = clock.now()
    (row,) = [r for r in _holding_rows(org_ledger.state, v.QueueFilter(state="running"), now, 100)
              if r.job_id == a]  # fmt: skip
    assert row.state == "stopping" and row.kill_at == lost_at + 60, row
    engine.gone = [a]  # its agent reports it gone
    tick(clock)
    d.cycle(clock.now())
    assert org_ledger.state.stopped_runs == {}
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, after) == (("n1", (0,)),)  # placed once its end is recorded
    assert org_ledger.state.jobs[single].status == "running"


def test_a_cancel_of_a_requeued_job_whose_lost_run_lives_kills_it_as_any_stopping_jobs(
    org_ledger: Ledger, clock: SimClock
) -> None:
    engine = Engine()
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    a = _running_on_n1(org_ledger, clock, d, resumable=True)
    _lost_and_back(org_ledger)
    assert org_ledger.state.jobs[a].status == "pending"  # requeued, its old run stopping
    out = org_ledger.execute(c.CancelJob(actor="alice", job_id=a))
    # the first cancel kills the earlier run too (atk50b-23 F2: it took a second one)
    assert [type(ev) for ev in out.events] == [e.JobFinished, e.JobKillOrdered]
    assert org_ledger.state.jobs[a].outcome == "cancelled"
    (sr,) = org_ledger.state.stopped_runs.values()
    assert sr.kill
    now = clock.now()
    (row,) = [r for r in _holding_rows(org_ledger.state, v.QueueFilter(state="running"), now, 100)
              if r.job_id == a]  # fmt: skip
    assert row.state == "stopping"  # was gone from every read, `finished`
    try:
        org_ledger.execute(c.CancelJob(actor="alice", job_id=a))
    except InvalidTransition:
        pass  # a second cancel, once the kill is ordered, is refused as for any stopping job
    else:
        raise AssertionError("a second cancel was taken")


def test_a_removed_node_is_gone_and_a_fenced_loss_leaves_nothing_stopping(
    org_ledger: Ledger, clock: SimClock
) -> None:
    engine = Engine()
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    _running_on_n1(org_ledger, clock, d)
    org_ledger.execute(c.MarkNodeLost(actor="root", node="n1", reason="dead"))
    assert len(org_ledger.state.stopped_runs) == 1
    # refused while the run may live: its agent could never kill it (atk50b-23 F1)
    with pytest.raises(InvalidTransition, match=r"still has runs stopping: job \d+ \(run 0\)"):
        org_ledger.execute(c.RemoveNode(actor="root", node="n1"))
    assert len(org_ledger.state.stopped_runs) == 1
    org_ledger.execute(c.RemoveNode(actor="root", node="n1", force=True))
    assert org_ledger.state.stopped_runs == {}  # gone for good: nothing waits for it
    # a loss with a fence (the node-lost timeout) ends nothing at once: nothing stopping
    b = submit(org_ledger, 8, grace_s=60)
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, b) == (("n2", tuple(range(8))),)
    org_ledger.execute(c.MarkNodeLost(actor="@executor", node="n2", reason="silent", fence_s=30))
    assert org_ledger.state.stopped_runs == {}


def test_a_record_made_before_the_lost_rule_replays_by_it_and_one_made_after_by_the_new(
    org_ledger: Ledger, clock: SimClock, home: object
) -> None:
    """One log holds a decision made as before s50 (the lost run's GPUs free, `lost_held`
    False) and one made now: each replays identically; read by the other rule, each differs."""
    engine = Engine()
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    a = _running_on_n1(org_ledger, clock, d)
    _lost_and_back(org_ledger)
    old = submit(org_ledger, 8)
    tick(clock)
    now = clock.now()
    snap = snapshot_from_state(org_ledger.state, {}, now, hold_stopping=True)  # before s50
    cmd = decide(snap, Fifo(), now).to_command(
        "@dispatcher", "c-old", decided_at=now, policy=FifoConfig(), stopping_held=True
    )
    org_ledger.execute(cmd)
    assert where(org_ledger, old) == (("n1", tuple(range(8))),)  # beside a's processes
    org_ledger.execute(c.CancelJob(actor="alice", job_id=old))  # never started
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
        assert [ev.lost_held for _, ev in decisions] == [True, False, True]
        results = list(replay_decisions(source, decisions))
        assert [r.headline() for r in results if not r.identical] == []
        flipped = [(p, msgspec.structs.replace(ev, lost_held=not ev.lost_held))
                   for p, ev in decisions[1:]]  # fmt: skip
        assert not any(r.identical for r in replay_decisions(source, flipped))


def _decode(data: bytes) -> object:
    from schemas import codec

    return codec.decode(data)


def _said(ledger: Ledger, job_id: int, now: float) -> list[str]:
    history = [ev for _, ev in ledger.read(0, 100_000) if getattr(ev, "job_id", None) == job_id]
    return explain_history(ledger.state.jobs[job_id], history, {}, now, DEFAULT_GRACE_S)


def test_explain_says_a_failed_lost_jobs_charge_ended_with_it_and_names_the_cancel_that_killed(
    org_ledger: Ledger, clock: SimClock
) -> None:
    """atk50b-23 F3: a failed node-lost job is charged to the loss (its engine's end closes the
    interval `usage` and `jobs` read), yet `explain` said its GPUs were "held, and charged,
    until" its processes' real end; a requeued one is charged to the real end and says so.
    F2: the cancel that ends a requeued job and kills its earlier run reads as that cancel,
    not as a cancel "again"."""
    engine = Engine()
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    failed = _running_on_n1(org_ledger, clock, d)
    lost_at = clock.now()
    _lost_and_back(org_ledger)
    tick(clock)
    engine.gone = [failed]
    d.cycle(clock.now())
    said = " ".join(_said(org_ledger, failed, clock.now()))
    assert "its GPUs were held until then (charged until " in said, said
    assert when(lost_at) in said.partition("charged until ")[2], said
    resumable = _running_on_n1(org_ledger, clock, d, resumable=True)
    _lost_and_back(org_ledger)
    org_ledger.execute(c.CancelJob(actor="alice", job_id=resumable))
    tick(clock)
    engine.gone = [resumable]
    d.cycle(clock.now())
    said = " ".join(_said(org_ledger, resumable, clock.now()))
    assert "its earlier run 0, still in its grace, is killed at once (SIGKILL) by that" in said
    assert "cancelled again" not in said and "held, and charged, until then" in said, said


def test_a_requeued_jobs_earlier_run_still_stopping_is_named_by_node_list_and_explain(
    org_ledger: Ledger, clock: SimClock
) -> None:
    """atk50b-23 F5: a resumable job requeued by `node lost` whose old run lives out its grace
    read only `pending`; `node list` said its GPUs stopping but named no job for them."""
    engine = Engine()
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    a = _running_on_n1(org_ledger, clock, d, resumable=True)
    lost_at = clock.now()
    _lost_and_back(org_ledger)
    state, now = org_ledger.state, clock.now()
    assert state.jobs[a].status == "pending"
    assert stopping_on(state, now) == {"n1": [a]}  # was {}: only finished jobs were named
    (said,) = earlier_runs_said(state.jobs[a], state, now)
    assert said.startswith("Its earlier run 0 (node_lost) is still stopping on n1 GPUs 0,1,"), said
    assert f"SIGKILL at {when(lost_at + 60)} at the latest" in said, said
    assert earlier_runs_said(state.jobs[a], None, now) == []


def test_explains_history_pairs_each_event_with_its_sentence_after_a_kill(
    org_ledger: Ledger, clock: SimClock
) -> None:
    """A kill order is told (one sentence), so `explain --json`'s history pairs it and every
    later event with their own sentences (the run's end was paired with the kill's)."""
    engine = Engine()
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    a = _running_on_n1(org_ledger, clock, d, resumable=True)
    _lost_and_back(org_ledger)
    org_ledger.execute(c.CancelJob(actor="alice", job_id=a))
    tick(clock)
    engine.gone = [a]
    d.cycle(clock.now())
    history = [ev for _, ev in org_ledger.read(0, 100_000) if getattr(ev, "job_id", None) == a]
    told = explain_history(org_ledger.state.jobs[a], history, {}, clock.now(), DEFAULT_GRACE_S)
    pairs = dict((type(ev), text) for ev, text in _history_texts(history, told))
    assert "killed at once" in pairs[e.JobKillOrdered], pairs
    assert "really ended" in pairs[e.JobRunEnded], pairs
