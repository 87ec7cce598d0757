"""Recording an engine's observation (`ledger.cycle.record`): node changes, starts, checkpoints
and samples, exits, in that order, each against the ledger as the ones before it left it."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence

import pytest

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.cycle.executor import Exit, NodeChange, Observed, Sample, Start
from ledger.cycle.record import Recorded, node_command, record
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidTransition, LedgerError
from schemas.events import GpuSlot
from tests.conftest import T0

EX = "@executor"


class FakeLedger:
    """The pure domain behind the two ways to append: `execute_all` is all or nothing. Keeps
    the batches it was given, and refuses the commands `refuse` names (a ledger that moved on)."""

    def __init__(
        self,
        state: State,
        ids: Callable[[], str],
        refuse: Callable[[c.AnyCommand], bool] = lambda cmd: False,
    ) -> None:
        self.state = state
        self.ids = ids
        self.refuse = refuse
        self.batches: list[list[c.AnyCommand]] = []
        self.events: list[e.AnyEvent] = []

    def execute(self, cmd: c.AnyCommand) -> None:
        self.execute_all([cmd])

    def execute_all(self, cmds: Sequence[c.AnyCommand]) -> None:
        self.batches.append(list(cmds))
        state = copy.deepcopy(self.state)
        events: list[e.AnyEvent] = []
        for cmd in cmds:
            if self.refuse(cmd):
                raise InvalidTransition(f"refused: {cmd}")
            for ev in decide(state, cmd, T0, self.ids):
                evolve(state, ev)
                events.append(ev)
        self.state = state
        self.events += events


@pytest.fixture
def ledger(org_state: State, counter_ids: Callable[[], str]) -> FakeLedger:
    """The organisation with job 1 (alice, resumable, 8 GPUs) running on n1 and job 2 (carol,
    4 GPUs, not resumable) placed on n2."""
    led = FakeLedger(org_state, counter_ids)
    led.execute_all(
        [
            c.SubmitJob(actor="alice", account="ai2/olmo", gpus=8, min_runtime_s=0, resumable=True),
            c.SubmitJob(actor="carol", account="ai2/tulu", gpus=4, min_runtime_s=0),
        ]
    )
    place(led, 1, "n1", 8)
    place(led, 2, "n2", 4)
    led.execute(c.StartJob(actor=EX, job_id=1))
    led.batches.clear()
    return led


def place(led: FakeLedger, job_id: int, node: str, gpus: int) -> None:
    idx = tuple(range(gpus))
    led.execute(
        c.ApplyDecision(
            actor="@dispatcher",
            decision=c.DecisionBody(
                cycle_id=f"cycle-{job_id}",
                based_on=led.state.events,
                policy_version="test",
                placements=(
                    e.Placement(job_id=job_id, slots=(GpuSlot(node=node, gpu_indices=idx),)),
                ),
            ),
        )
    )


def kinds(led: FakeLedger) -> list[list[str]]:
    return [[type(cmd).__name__ for cmd in batch] for batch in led.batches]


@pytest.mark.parametrize(
    ("change", "want"),
    [
        (
            NodeChange("n1", "lost", "no word"),
            c.MarkNodeLost(actor=EX, node="n1", reason="no word"),
        ),
        (
            NodeChange("n1", "drain", "slurm: DRAIN"),
            c.DrainNode(actor=EX, node="n1", reason="slurm: DRAIN"),
        ),
        (NodeChange("n1", "return"), c.ReturnNode(actor=EX, node="n1")),
    ],
    ids=lambda v: v.change if isinstance(v, NodeChange) else None,
)
def test_each_node_change_is_one_command(change: NodeChange, want: c.AnyCommand) -> None:
    assert node_command(change) == want


def test_a_run_that_ended_with_its_lost_node_is_requeued_not_failed(ledger: FakeLedger) -> None:
    """The node's loss is recorded first: the resumable job goes back to the queue, and the
    engine's word that its run ended (node failure) is then about a job the ledger moved past."""
    seen = Observed(
        exits=(Exit(1, -1, T0, "node_failure", "77", "NODE_FAIL"),),
        nodes=(NodeChange("n1", "lost", "slurm: DOWN"),),
    )
    assert record(ledger, seen, "slurm") == Recorded(started=0, finished=0)
    assert kinds(ledger) == [["MarkNodeLost"]]
    assert ledger.state.nodes["n1"].state == "lost"
    assert ledger.state.jobs[1].status == "pending"


def test_a_run_that_began_and_ended_since_the_last_look_starts_first(ledger: FakeLedger) -> None:
    seen = Observed(
        starts=(Start(2, "2.1", logs=("/l",)),), exits=(Exit(2, 3, T0, "exited", "2.1"),)
    )
    assert record(ledger, seen, "agent") == Recorded(started=1, finished=1)
    assert kinds(ledger) == [["StartJob"], ["FinishJob"]]
    start, finish = (batch[0] for batch in ledger.batches)
    assert start == c.StartJob(
        actor=EX, job_id=2, engine="agent", engine_job_id="2.1", logs=("/l",)
    )
    assert finish == c.FinishJob(
        actor=EX, job_id=2, exit_code=3, engine="agent", engine_job_id="2.1", reason="exited",
        ended_at=T0,
    )  # fmt: skip
    assert [ev.outcome for ev in ledger.events if isinstance(ev, e.JobFinished)] == ["failed"]


def test_an_unnamed_engine_records_no_engine_words(ledger: FakeLedger) -> None:
    """...but how the run ended and when: a local time limit is a time limit."""
    seen = Observed(
        starts=(Start(2, "2.1", run=0, logs=("/l",)),),
        exits=(Exit(1, 0, T0 - 5, "time_limit", "x"),),
    )
    record(ledger, seen, "")
    assert ledger.batches == [
        [c.StartJob(actor=EX, job_id=2, logs=("/l",))],
        [c.FinishJob(actor=EX, job_id=1, exit_code=0, reason="time_limit", ended_at=T0 - 5)],
    ]


def test_progress_is_one_batch_after_the_starts_and_only_of_running_jobs(
    ledger: FakeLedger,
) -> None:
    seen = Observed(
        starts=(Start(2),),
        checkpoints=(1, 2, 9),  # job 2 is not resumable; job 9 does not exist
        samples=(Sample(1, (50.0,) * 8), Sample(2, (1.0,)), Sample(2, (5.0,) * 4)),
    )
    record(ledger, seen, "")
    assert ledger.batches == [
        [c.StartJob(actor=EX, job_id=2)],
        [
            c.ReportCheckpoint(actor=EX, job_id=1),
            c.SampleUtilisation(actor=EX, job_id=1, gpu_utilisation=(50.0,) * 8),
            c.SampleUtilisation(actor=EX, job_id=2, gpu_utilisation=(5.0,) * 4),
        ],
    ]


def test_what_the_ledger_moved_past_is_dropped_and_one_refusal_hides_nothing(
    ledger: FakeLedger, caplog: pytest.LogCaptureFixture
) -> None:
    ledger.refuse = lambda cmd: isinstance(cmd, c.ReportCheckpoint | c.ReturnNode)
    seen = Observed(
        nodes=(NodeChange("n2", "return"), NodeChange("a1", "drain", "slurm: DRAIN")),
        starts=(Start(1), Start(7)),  # job 1 runs already; job 7 does not exist
        checkpoints=(1,),
        samples=(Sample(1, (10.0,) * 8),),
        exits=(Exit(7, 0, T0), Exit(2, 0, T0)),
    )
    with caplog.at_level(logging.INFO, logger="gpuledger.dispatcher"):
        assert record(ledger, seen, "") == Recorded(started=0, finished=1)
    assert kinds(ledger) == [
        ["ReturnNode"],  # refused: logged, the drain is still recorded
        ["DrainNode"],
        ["ReportCheckpoint", "SampleUtilisation"],  # the batch fails: each on its own
        ["ReportCheckpoint"],
        ["SampleUtilisation"],
        ["FinishJob"],  # job 2's; job 7's exit is dropped
    ]
    assert ledger.state.nodes["a1"].state != "active"
    assert "node n2 not marked return" in caplog.text
    assert "report not recorded" in caplog.text


def test_an_exit_the_ledger_refuses_is_logged_and_the_next_recorded(
    ledger: FakeLedger, caplog: pytest.LogCaptureFixture
) -> None:
    ledger.refuse = lambda cmd: isinstance(cmd, c.FinishJob) and cmd.job_id == 1
    seen = Observed(exits=(Exit(1, 0, T0), Exit(2, 0, T0)))
    with caplog.at_level(logging.INFO, logger="gpuledger.dispatcher"):
        assert record(ledger, seen, "").finished == 1
    assert "exit of job 1 not recorded" in caplog.text
    finished = [(ev.job_id, ev.outcome) for ev in ledger.events if isinstance(ev, e.JobFinished)]
    assert finished == [(2, "completed")]


def test_starts_are_one_batch_that_fails_loudly(ledger: FakeLedger) -> None:
    """A start the ledger refuses is a bug between engine and ledger, not a stale report."""
    ledger.refuse = lambda cmd: isinstance(cmd, c.StartJob)
    with pytest.raises(LedgerError):
        record(ledger, Observed(starts=(Start(2),)), "")


def test_an_exit_with_its_start_of_a_run_requeued_while_placed_ends_the_job(
    ledger: FakeLedger,
) -> None:
    """atk54-23 F1: a requeue lands between the placement and the engine's first word of the
    run, whose command has exited 0 by itself meanwhile: the start and the exit seen together
    are the run's end, by itself, charged from its start, and the job completes (before: both
    dropped, the job placed again ran its whole command a second time)."""
    ledger.execute(c.RequeueJob(actor="root", job_id=2))
    assert ledger.state.jobs[2].status == "pending"
    seen = Observed(
        starts=(Start(2, "88", 0, started_at=T0 - 5),),
        exits=(Exit(2, 0, T0 - 1, "exited", "88", "COMPLETED", run=0),),
    )
    record(ledger, seen, "slurm")
    job = ledger.state.jobs[2]
    assert (job.status, job.outcome, job.exit_code) == ("finished", "completed", 0)
    (ended,) = [ev for ev in ledger.events if isinstance(ev, e.JobRunEnded)]
    assert (ended.run, ended.by_itself, ended.started_at) == (0, True, T0 - 5)
