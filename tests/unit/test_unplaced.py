"""atk60-slurm F5: a run its engine took back before it ever started (Slurm's partition an admin
paused, a leaked GPU, a node the partition does not list) was recorded as an admin preemption
(`job.preempted.v1` "requeued by @executor: ..." and `job.requeued.v1`): `explain` said
"preempted for admin ... inside its contract", `jobs --json` `preemptions: 1`, and `report
preemptions` counted it suffered, so a long pause added one preemption per placed job to every
team. Now it is `job.unplaced.v1`: the job pending again, its next placement a new run, no
preemption counted, nothing charged. The domain, the projection's SQL and its reference fold,
the usage fold, the report, `explain` and the audit agree; a log written before reads as it
did."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import Job, State
from ledger.cycle.executor import NodeChange
from ledger.cycle.record import unplace_commands
from ledger.history.audit import check
from ledger.reads import layer
from ledger.reads.explain import explain_history
from projections import fairshare as fs
from projections import queries
from projections.projector import Projector
from projections.source import ListSource, LogRecord
from projections.store import Store
from projections.testing.compare import REFERENCE_TABLES, differences, dump, reference_dump
from projections.testing.reference import fold
from projections.usage import UsageFold
from schemas import codec
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidTransition, NotAuthorised

T0 = 1_796_172_000.0
WHY = "Slurm's partition gpuledger is DOWN (an admin's pause): nothing starts on it until it is UP"
Slot = e.GpuSlot


def ids() -> Callable[[], str]:
    n = itertools.count(1)
    return lambda: f"e{next(n)}"


ORG: list[tuple[float, c.AnyCommand]] = [
    (T0, c.InitLedger(actor="root", admin="root")),
    (T0, c.OpenAccount(actor="root", path="ai2", kind="program")),
    (T0, c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=1)),
    (T0, c.AddMember(actor="root", user="alice", project="ai2/olmo")),
    (T0, c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8)),
    (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=3600)),
]


def place(cycle: str, at_gpus: tuple[int, ...] = (0, 1)) -> c.ApplyDecision:
    return c.ApplyDecision(
        actor="@dispatcher",
        decision=c.DecisionBody(
            cycle_id=cycle, based_on=1, policy_version="fairshare-7",
            placements=(e.Placement(job_id=1, slots=(Slot(node="n1", gpu_indices=at_gpus),)),),
        ),
    )  # fmt: skip


def decided(cmds: list[tuple[float, c.AnyCommand]]) -> tuple[State, list[e.AnyEvent]]:
    state, new_id, out = State(), ids(), []
    for at, cmd in cmds:
        for ev in decide(state, cmd, at, new_id):
            evolve(state, ev)
            out.append(ev)
    return state, out


def taken_back(recorded_before: bool = False, then_runs: bool = True) -> list[e.AnyEvent]:
    """Alice's job (1 h contract) placed on n1 at T0 + 1; the Slurm executor takes its run back
    at T0 + 5, never started (the partition paused): as it records it now (`unplace_commands`),
    or as it did before (`recorded_before`: a `RequeueJob` by @executor). Then (`then_runs`)
    it is placed again at T0 + 60, starts at T0 + 61 and completes at T0 + 121."""
    state, out = decided([*ORG, (T0 + 1, place("c1"))])
    change = NodeChange("n1", "unplace", WHY, jobs=(1,))
    if recorded_before:
        back: c.AnyCommand = c.RequeueJob(
            actor="@executor", job_id=1, reason=f"node n1 cannot run it: {WHY}"
        )
    else:
        [back] = unplace_commands(change, state)
    rest: list[tuple[float, c.AnyCommand]] = [(T0 + 5, back)]
    if then_runs:
        rest += [
            (T0 + 60, place("c2", (2, 3))),
            (T0 + 61, c.StartJob(actor="@executor", job_id=1)),
            (T0 + 121, c.FinishJob(actor="@executor", job_id=1, exit_code=0)),
        ]
    new_id = ids()
    for _ in out:
        new_id()
    for at, cmd in rest:
        for ev in decide(state, cmd, at, new_id):
            evolve(state, ev)
            out.append(ev)
    return out


def test_the_executors_take_back_is_recorded_as_a_run_unplaced_not_a_preemption() -> None:
    events = taken_back(then_runs=False)
    kinds = [type(ev).__name__ for ev in events[-1:]]
    assert kinds == ["JobUnplaced"]  # before: JobPreempted (admin), JobRequeued
    (ev,) = [x for x in events if isinstance(x, e.JobUnplaced)]
    assert (ev.job_id, ev.run, ev.actor) == (1, 0, "@executor")
    assert ev.reason == f"node n1 cannot run it: {WHY}"
    assert not any(isinstance(x, e.JobPreempted | e.JobRequeued) for x in events)
    state = State()
    for x in events:
        evolve(state, x)
    job = state.jobs[1]
    assert (job.status, job.slots, job.placed_at, job.preemptions, job.run) == (
        "pending", (), None, 0, 1
    )  # fmt: skip
    assert state.free_gpus("n1") == tuple(range(8))


def test_its_next_placement_is_a_new_run_that_runs_once() -> None:
    state, _ = decided([])
    for ev in taken_back():
        evolve(state, ev)
    job = state.jobs[1]
    assert (job.status, job.outcome, job.preemptions, job.run) == ("finished", "completed", 0, 1)


def test_after_a_preemption_the_run_taken_back_is_numbered_after_it() -> None:
    """Runs count every placement: a job preempted once (run 0) then placed and taken back
    unstarted has its run 1 taken back, and its next placement is run 2."""
    state, _ = decided([
        *ORG[:-1],
        (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=0,
                         resumable=True)),
        (T0 + 1, place("c1")),
        (T0 + 2, c.PreemptJob(actor="root", job_id=1, note="drain")),
        (T0 + 3, place("c2")),
    ])  # fmt: skip
    [cmd] = unplace_commands(NodeChange("n1", "unplace", WHY), state)
    assert (cmd.job_id, cmd.run) == (1, 1)
    for ev in decide(state, cmd, T0 + 4, ids()):
        evolve(state, ev)
    assert (state.jobs[1].preemptions, state.jobs[1].unplaced, state.jobs[1].run) == (1, 1, 2)


@pytest.mark.parametrize("actor", ["alice", "@node:n1"])
def test_only_an_engine_takes_a_run_back(actor: str) -> None:
    """Its owner may not (a requeue of hers is one), nor a node's agent (it reports its runs);
    an engine may, and an admin, as every engine's report (`authz._require_system`)."""
    state, _ = decided([*ORG, (T0 + 1, place("c1"))])
    with pytest.raises(NotAuthorised):
        decide(state, c.UnplaceJob(actor=actor, job_id=1, run=0, reason="x"), T0 + 2, ids())


def test_a_started_run_or_another_run_is_not_taken_back() -> None:
    state, _ = decided([*ORG, (T0 + 1, place("c1"))])
    with pytest.raises(InvalidTransition):  # not its current run
        decide(state, c.UnplaceJob(actor="@executor", job_id=1, run=1), T0 + 2, ids())
    for ev in decide(state, c.StartJob(actor="@executor", job_id=1), T0 + 2, ids()):
        evolve(state, ev)
    with pytest.raises(InvalidTransition):  # started: a requeue is a preemption
        decide(state, c.UnplaceJob(actor="@executor", job_id=1, run=0), T0 + 3, ids())


def _projected(tmp_path: Path, events: list[e.AnyEvent], batch: int | None = None) -> Any:
    records = [LogRecord(i, e.tag_of(type(ev)), codec.encode(ev)) for i, ev in enumerate(events, 1)]
    path = tmp_path / f"p{len(list(tmp_path.iterdir()))}.duckdb"
    with Store(path) as store:
        kw = {} if batch is None else {"batch_size": batch}
        Projector(store, ListSource(records), **kw).catch_up()  # type: ignore[arg-type]
        tables = dump(store, REFERENCE_TABLES)
        at = T0 + 3600
        usage = {
            p.charge: queries.usage(store, at, by="user", policy=p)
            for p in (fs.UsagePolicy(), fs.UsagePolicy(charge=fs.CHARGE_RUN),
                      fs.UsagePolicy(charge=fs.CHARGE_PLACEMENT))
        }  # fmt: skip
        report = layer.preemption_report(store.con, None, "both", None, None)
        (row,) = layer.jobs(store, _every_job(), at, None)
    return tables, {k: {r.name: r.gpu_seconds for r in v} for k, v in usage.items()}, report, row


def _every_job() -> Any:
    from schemas import views as v

    return v.JobFilter(job_ids=(1,))


@pytest.mark.parametrize("batch", [None, 1])
def test_the_projection_counts_no_preemption_and_charges_only_the_run_that_ran(
    tmp_path: Path, batch: int | None
) -> None:
    """`jobs --json` (`preemptions` 0, `placements` 2), the intervals (the first ends
    `unplaced`, never started), `report preemptions` (nothing suffered), the usage (the run
    that ran, 2 GPUs x 60 s; fairtree-1 from each placement), row for row the reference fold's
    whatever the batch boundaries."""
    events = taken_back()
    tables, usage, report, row = _projected(tmp_path, events, batch)
    assert differences(tables, reference_dump(fold(enumerate(events, 1)))) == []
    assert (row.status, row.outcome, row.placements, row.preemptions) == (
        "finished", "completed", 2, 0
    )  # fmt: skip
    first, second = tables["job_intervals"]
    assert (first["end_reason"], first["run_start_at"]) == ("unplaced", None)
    assert second["end_reason"] == "completed"
    assert tables["preemptions"] == []
    assert (report.suffered, report.caused, report.rows) == (0, 0, [])
    assert usage == {
        "real": {"alice": 2 * 60.0},
        "run": {"alice": 2 * 60.0},
        "placement": {"alice": 2 * 4.0 + 2 * 61.0},
    }
    for policy in (fs.UsagePolicy(), fs.UsagePolicy(charge=fs.CHARGE_RUN)):
        folded = UsageFold(policy)
        folded.apply_all(events)
        assert folded.usage(T0 + 3600) == {"ai2/olmo/alice": 2 * 60.0}


def test_a_log_written_before_reads_as_it_did(tmp_path: Path) -> None:
    """A take-back recorded before `job.unplaced` (a `job.preempted.v1` by @executor, then
    `job.requeued.v1`) still projects as a preemption, as it did: the log is history."""
    events = taken_back(recorded_before=True)
    assert [type(ev).__name__ for ev in events if isinstance(ev, e.JobPreempted)] == [
        "JobPreempted"
    ]
    tables, _, report, row = _projected(tmp_path, events)
    assert differences(tables, reference_dump(fold(enumerate(events, 1)))) == []
    assert (row.placements, row.preemptions, report.suffered) == (2, 1, 1)
    assert check(events).violations == ()  # outside its contract, as atk46-s F3 judged it


def test_the_same_log_projects_the_same_bytes(tmp_path: Path) -> None:
    """Replay: a log holding a run taken back projects the same rows however it is batched."""
    events = taken_back()
    assert any(isinstance(ev, e.JobUnplaced) for ev in events)
    assert _projected(tmp_path, events)[0] == _projected(tmp_path, events, 1)[0]


def test_explain_says_the_run_was_taken_back_before_it_started_not_preempted() -> None:
    events = taken_back(then_runs=False)
    state, _ = decided([])
    for ev in events:
        evolve(state, ev)
    job: Job = state.jobs[1]
    mine = [ev for ev in events if getattr(ev, "job_id", None) == 1]
    lines = explain_history(job, mine, {}, T0 + 10, 30.0)
    said = "\n".join(lines)
    assert "preempt" not in said.replace("not a preemption", ""), said
    assert (
        f"its run 0 taken back by @executor before it started: node n1 cannot run it: {WHY}; "
        "never ran, nothing charged, not a preemption: back in the queue, same job id."
    ) in said, said


def test_the_audit_finds_nothing_to_flag_or_note() -> None:
    """`audit check` over a run taken back: no contract cut, no GPU held twice, nothing
    charged outside a run, who took it back allowed."""
    events = taken_back()
    assert [type(ev).__name__ for ev in events if isinstance(ev, e.JobUnplaced)] == ["JobUnplaced"]
    report = check(events)
    assert (report.violations, report.noted) == ((), ())
