"""The GPUs of a run the ledger stopped (a cancel, a preemption, a requeue) are not free while it
lives out its grace (atk47-23 F8): as Slurm does not count a COMPLETING job's GPUs free, the
dispatcher places nothing on them until its engine reports the run's end (`State.stopped_runs`).
Before, a new job was placed on the very GPU a cancelled job was still stopping on, other GPUs
idle, and waited out the whole grace; a requeued job was placed on its own old run's GPU.

Replay: the rule is recorded (`CycleDecided.stopping_held`): a record written before it (its
cycle counted those GPUs free) replays by the old rule, byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ledger.core.state import Node
from ledger.cycle.dispatcher import Dispatcher
from ledger.cycle.executor import Observed, Orders, Start
from ledger.cycle.inputs import snapshot_from_state, stopping_gpus
from ledger.dispatch import decide
from ledger.dispatch.policy import Fifo
from ledger.history.replay import replay_decisions
from ledger.reads.stopping import stopping_note
from ledger.store.application import Ledger
from ledger.store.clock import SimClock
from ledger.store.embedded import EmbeddedSource
from schemas import commands as c
from schemas import events as e
from schemas.policy import FifoConfig
from schemas.units import when

H100 = "h100"


class Engine:
    """An engine whose runs start at once and never end by themselves, and whose stopped runs
    stay in their grace until the test says they are gone (`gone`)."""

    engine = "agent"
    relaunch_placed = False

    def __init__(self) -> None:
        self.launched: list[tuple[int, tuple[e.GpuSlot, ...]]] = []
        self.gone: list[int] = []

    def observe(self, now: float, nodes: Mapping[str, Node]) -> Observed:
        from ledger.cycle.executor import Exit

        ended = tuple(Exit(j, -15, now, "exited", engine_job_id=f"{j}.1", run=0) for j in self.gone)
        self.gone = []
        return Observed(stopped=ended)

    def carry_out(self, orders: Orders, now: float) -> tuple[Start, ...]:
        self.launched += [(la.job_id, la.slots) for la in orders.launches]
        return tuple(
            Start(la.job_id, engine_job_id=f"{la.job_id}.{la.run + 1}", run=la.run)
            for la in orders.launches
        )

    def adopt(self, runs: Mapping[int, int], now: float) -> set[int]:
        return set(runs)

    def shutdown(self, now: float) -> list[object]:
        return []

    def heard_from(self) -> Mapping[str, float]:
        return {}

    def next_event_at(self) -> float | None:
        return None


class NoRanks:
    usage_policy = None
    read_position = None
    computed_by = ""

    def ranks(self, now: float, position: int) -> tuple[dict[str, int], dict[str, float]]:
        return {}, {}


def tick(clock: SimClock) -> None:
    clock.advance_to(clock.now() + 1)


def submit(ledger: Ledger, gpus: int, **kw: object) -> int:
    cmd = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=gpus, gpu_type=H100, **kw)  # type: ignore[arg-type]
    (sub,) = [ev for ev in ledger.execute(cmd).events if isinstance(ev, e.JobSubmitted)]
    return sub.job_id


def where(ledger: Ledger, job: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((sl.node, sl.gpu_indices) for sl in ledger.state.jobs[job].slots)


def full_n1(org_ledger: Ledger, clock: SimClock, d: Dispatcher) -> tuple[int, int]:
    """Job a on n1 GPU 0 and job b on n1 GPUs 1-7, both running (n2 idle)."""
    a = submit(org_ledger, 1, grace_s=60)
    tick(clock)
    d.cycle(clock.now())
    b = submit(org_ledger, 7)
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, a) == (("n1", (0,)),)
    assert where(org_ledger, b) == (("n1", (1, 2, 3, 4, 5, 6, 7)),)
    return a, b


def test_a_new_job_is_not_placed_on_the_gpu_a_cancelled_run_is_stopping_on(
    org_ledger: Ledger, clock: SimClock
) -> None:
    engine = Engine()
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    a, _ = full_n1(org_ledger, clock, d)
    org_ledger.execute(c.CancelJob(actor="alice", job_id=a))  # its run lives out 60 s of grace
    kill_at = clock.now() + 60
    assert stopping_gpus(org_ledger.state) == {"n1": frozenset({0})}
    new = submit(org_ledger, 1)
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, new) == (("n2", (0,)),)  # was n1 GPU 0 (best fit), n2 idle
    assert org_ledger.state.jobs[new].status == "running"
    # with no other GPU it waits until the stopped run's end is recorded
    filler = submit(org_ledger, 7)
    tick(clock)
    d.cycle(clock.now())
    waiting = submit(org_ledger, 1)
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, filler) == (("n2", (1, 2, 3, 4, 5, 6, 7)),)
    assert org_ledger.state.jobs[waiting].status == "pending"
    now = clock.now()  # the queue and explain say what it waits for
    snap = snapshot_from_state(org_ledger.state, {}, now, hold_stopping=True)
    (mine,) = [p for p in snap.pending if p.job_id == waiting]
    wait = decide(snap, Fifo(), now).waiting[waiting]
    note = stopping_note(org_ledger.state, snap, mine, wait)
    assert wait.code == "WAIT_RESOURCES"
    assert note == (
        "; it waits for GPUs of stopped runs still in their grace, free once their processes "
        f"are gone: n1 GPUs 0 (job {a}'s SIGKILL by {when(kill_at)})"
    )
    engine.gone = [a]
    tick(clock)
    d.cycle(clock.now())
    assert org_ledger.state.stopped_runs == {}
    assert where(org_ledger, waiting) == (("n1", (0,)),)


def test_a_requeued_job_is_not_placed_on_the_gpu_its_own_old_run_is_stopping_on(
    org_ledger: Ledger, clock: SimClock
) -> None:
    engine = Engine()
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    a, _ = full_n1(org_ledger, clock, d)
    org_ledger.execute(c.RequeueJob(actor="alice", job_id=a))
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, a) == (("n2", (0,)),)  # was n1 GPU 0: its own old run's


def test_a_record_made_before_the_rule_replays_by_it_and_one_made_after_by_the_new(
    org_ledger: Ledger, clock: SimClock, home: Path
) -> None:
    """The same log holds a decision made as the old code made it (the stopping GPU counted
    free, `stopping_held` False) and one made now: each replays identically; read by the other
    rule, each differs."""
    engine = Engine()
    d = Dispatcher(org_ledger, NoRanks(), Fifo(), engine)  # type: ignore[arg-type]
    a, _ = full_n1(org_ledger, clock, d)
    org_ledger.execute(c.CancelJob(actor="alice", job_id=a))
    old = submit(org_ledger, 1)
    tick(clock)
    now = clock.now()
    snap = snapshot_from_state(org_ledger.state, {}, now)  # the old rule
    decision = decide(snap, Fifo(), now)
    cmd = decision.to_command("@dispatcher", "c-old", decided_at=now, policy=FifoConfig())
    org_ledger.execute(cmd)
    assert where(org_ledger, old) == (("n1", (0,)),)
    org_ledger.execute(c.CancelJob(actor="alice", job_id=old))  # never started: nothing awaited
    new = submit(org_ledger, 1)
    tick(clock)
    d.cycle(clock.now())
    assert where(org_ledger, new) == (("n2", (0,)),)
    with EmbeddedSource(home) as source:
        decisions = [
            (r.position, ev)
            for page in [source.read(0, 10_000)]
            for r in page
            if isinstance(ev := _decode(r.data), e.CycleDecided)
        ]
        assert [ev.stopping_held for _, ev in decisions] == [True, True, False, True]
        results = list(replay_decisions(source, decisions))
        assert [r.headline() for r in results if not r.identical] == []
        flipped = [(p, _flip(ev)) for p, ev in decisions[2:]]
        assert not any(r.identical for r in replay_decisions(source, flipped))


def _decode(data: bytes) -> object:
    from schemas import codec

    return codec.decode(data)


def _flip(ev: e.CycleDecided) -> e.CycleDecided:
    import msgspec

    return msgspec.structs.replace(ev, stopping_held=not ev.stopping_held)
