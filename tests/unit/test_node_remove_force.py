"""`node remove` and the runs a node may still hold (atk51-23 F1, F2).

F1: a job `placed` on a node (its agent may have launched it, unheard: `up` killed -9 right
after the launch) that a `node lost` ended left nothing behind, so `node remove` was accepted
and its processes lived on a node no agent watched. Now the node keeps it (`Node.placed_lost`)
and the removal is refused, as for a stopping run, until the node returns (its agent is back)
or `--force`. No decision reads it.

F2: `node remove --force` forgot only the runs a `node lost` stopped: a cancelled (or
preempted) run there stayed `stopping` for a day, holding its GPUs on a node re-added under
that name, its `afterany` dependents and its singleton. Now the removal records the end of
every stopped run on the node (`JobRunEnded`, its note saying it was forgotten), so the fold of
an old log, which holds no such end, is unchanged.
"""

from __future__ import annotations

import pytest

from ledger.core.nodes import FORGOTTEN
from ledger.cycle.dispatcher import Dispatcher
from ledger.cycle.executor import Orders, Start
from ledger.dispatch.policy import Fifo
from ledger.reads.explain import explain_history
from ledger.store.application import Ledger
from ledger.store.clock import SimClock
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidTransition
from tests.unit.test_stopping_held import H100, Engine, NoRanks, submit, tick, where


class Unheard(Engine):
    """An engine whose launches are never heard to start: its jobs stay `placed`."""

    def carry_out(self, orders: Orders, now: float) -> tuple[Start, ...]:
        super().carry_out(orders, now)
        return ()


def _placed_on_n1(ledger: Ledger, clock: SimClock, d: Dispatcher, **kw: object) -> int:
    job = submit(ledger, 8, grace_s=60, **kw)
    tick(clock)
    d.cycle(clock.now())
    assert where(ledger, job) == (("n1", tuple(range(8))),)
    assert ledger.state.jobs[job].status == "placed"
    return job


@pytest.mark.parametrize("resumable", [False, True])
def test_a_node_lost_while_a_job_was_placed_there_is_not_removed_until_it_returns(
    org_ledger: Ledger, clock: SimClock, resumable: bool
) -> None:
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), Unheard())  # type: ignore[arg-type]
    a = _placed_on_n1(org_ledger, clock, d, resumable=resumable)
    org_ledger.execute(c.MarkNodeLost(actor="root", node="n1", reason="dead"))
    assert org_ledger.state.stopped_runs == {}  # never recorded started: no stopped run
    assert org_ledger.state.nodes["n1"].placed_lost == ((a, 0),)
    # the old code removed it: its launch, if it ran, lived on with no agent (atk51-23 F1)
    with pytest.raises(
        InvalidTransition, match=rf"job {a} \(run 0, placed when the node was lost\)"
    ):
        org_ledger.execute(c.RemoveNode(actor="root", node="n1"))
    org_ledger.execute(c.ReturnNode(actor="root", node="n1"))  # its agent is back
    assert org_ledger.state.nodes["n1"].placed_lost == ()
    org_ledger.execute(c.DrainNode(actor="root", node="n1", reason="retire"))
    if resumable:  # requeued, and placed again on n1: drain it away
        return
    org_ledger.execute(c.RemoveNode(actor="root", node="n1"))
    assert org_ledger.state.nodes["n1"].state == "removed"


def test_force_removes_a_node_lost_with_a_placed_job_and_a_new_node_of_its_name_is_clear(
    org_ledger: Ledger, clock: SimClock
) -> None:
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), Unheard())  # type: ignore[arg-type]
    _placed_on_n1(org_ledger, clock, d)
    org_ledger.execute(c.MarkNodeLost(actor="root", node="n1", reason="dead"))
    org_ledger.execute(c.RemoveNode(actor="root", node="n1", force=True))
    org_ledger.execute(c.RegisterNode(actor="root", node="n1", gpu_type=H100, gpus=8))
    assert org_ledger.state.nodes["n1"].placed_lost == ()


def test_force_forgets_a_cancelled_run_so_its_dependents_and_the_new_nodes_gpus_are_free(
    org_ledger: Ledger, clock: SimClock
) -> None:
    engine = Engine()
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    a = submit(org_ledger, 8, grace_s=120, job_name="x")
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, a) == (("n1", tuple(range(8))),)
    org_ledger.execute(c.CancelJob(actor="alice", job_id=a))  # stopping: 120 s of grace
    org_ledger.execute(c.DrainNode(actor="root", node="n1", reason="dead"))
    with pytest.raises(InvalidTransition, match=rf"still has runs stopping: job {a} \(run 0\)"):
        org_ledger.execute(c.RemoveNode(actor="root", node="n1"))
    out = org_ledger.execute(c.RemoveNode(actor="root", node="n1", force=True))
    (ended,) = [ev for ev in out.events if isinstance(ev, e.JobRunEnded)]
    assert (ended.job_id, ended.run) == (a, 0)
    assert ended.note == FORGOTTEN.format(node="n1")
    # the old code kept it stopping for a day (`ENDS_KEPT_S`): held all below
    assert org_ledger.state.stopped_runs == {}
    org_ledger.execute(c.RegisterNode(actor="root", node="n1", gpu_type=H100, gpus=8))
    org_ledger.execute(c.DrainNode(actor="root", node="n2", reason="busy"))  # n1 alone
    after = submit(org_ledger, 8, dependency=(e.Dependency(kind="afterany", job_ids=(a,)),))
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, after) == (("n1", tuple(range(8))),)
    # a later report of the run records nothing: the first end stands
    engine.gone = [a]
    tick(clock)
    d.cycle(clock.now())
    assert org_ledger.state.run_ends[(a, 0)] == ended.at
    # and nothing is left to refuse a plain removal of the new node
    org_ledger.execute(c.CancelJob(actor="alice", job_id=after))
    org_ledger.execute(c.DrainNode(actor="root", node="n1", reason="retire"))
    forced = org_ledger.execute(c.RemoveNode(actor="root", node="n1", force=True))
    assert [type(ev) for ev in forced.events] == [e.NodeRemoved, e.JobRunEnded]  # `after`'s run


def test_a_node_lost_with_a_placed_run_is_removed_once_its_agent_reports_the_run_gone(
    org_ledger: Ledger, clock: SimClock
) -> None:
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), Unheard())  # type: ignore[arg-type]
    a = _placed_on_n1(org_ledger, clock, d)
    org_ledger.execute(c.MarkNodeLost(actor="root", node="n1", reason="dead"))
    with pytest.raises(InvalidTransition):
        org_ledger.execute(c.RemoveNode(actor="root", node="n1"))
    done = c.ConfirmRunEnded(actor="@executor", job_id=a, engine="agent", engine_job_id=f"{a}.1")
    org_ledger.execute(done)  # its agent, back, stopped the launch it had made: gone
    assert org_ledger.state.nodes["n1"].placed_lost == ()
    org_ledger.execute(c.RemoveNode(actor="root", node="n1"))


def test_explain_of_the_first_cancel_of_a_node_lost_failed_job_does_not_say_again(
    org_ledger: Ledger, clock: SimClock
) -> None:
    """atk51-23 (wording): a job a `node lost` failed, whose run is stopping, cancelled once,
    read `cancelled again by ...` with no cancel before it."""
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), Engine())  # type: ignore[arg-type]
    a = submit(org_ledger, 8, grace_s=60)
    tick(clock)
    d.cycle(clock.now())
    org_ledger.execute(c.MarkNodeLost(actor="root", node="n1", reason="dead"))
    tick(clock)
    org_ledger.execute(c.CancelJob(actor="alice", job_id=a))
    history = [ev for _, ev in org_ledger.read(0, 100_000) if getattr(ev, "job_id", None) == a]
    said = " ".join(explain_history(org_ledger.state.jobs[a], history, {}, clock.now(), 30))
    assert "cancelled again" not in said, said
    assert "cancelled by alice after it had ended (node_lost): its run 0 in its grace" in said
