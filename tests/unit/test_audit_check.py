"""The invariant checker, pure: histories built as event lists, each with one seeded violation
(or an allowed exception), and the exact line the checker reports."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.history.audit import check, check_history
from schemas import commands as c
from schemas import events as e

T0 = 1_000.0
Slot = e.GpuSlot


def ids() -> Callable[[], str]:
    n = itertools.count(1)
    return lambda: f"e{next(n)}"


def history(cmds: list[tuple[float, c.AnyCommand]]) -> list[e.AnyEvent]:
    """Events the real domain decides for `cmds` (a valid history to start from)."""
    state, new_id, out = State(), ids(), []
    for at, cmd in cmds:
        for ev in decide(state, cmd, at, new_id):
            evolve(state, ev)
            out.append(ev)
    return out


ORG: list[tuple[float, c.AnyCommand]] = [
    (T0, c.InitLedger(actor="root", admin="root")),
    (T0, c.OpenAccount(actor="root", path="ai2", kind="program")),
    (T0, c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=3)),
    (T0, c.OpenAccount(actor="root", path="ai2/tulu", kind="project", shares=1)),
    (T0, c.AddMember(actor="root", user="alice", project="ai2/olmo")),
    (T0, c.AddMember(actor="root", user="dan", project="ai2/tulu")),
    (T0, c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8)),
    (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=4, min_runtime_s=3_600)),
    (T0, c.SubmitJob(actor="dan", account="ai2/tulu", gpus=4, min_runtime_s=0)),
]


def base() -> list[e.AnyEvent]:
    return history(ORG)


def placed(job: int, gpus: tuple[int, ...], at: float = T0, node: str = "n1") -> e.JobPlaced:
    return e.JobPlaced(
        event_id=f"p{job}-{at}",
        at=at,
        actor="@dispatcher",
        job_id=job,
        slots=(Slot(node=node, gpu_indices=gpus),),
        cycle_id="c",
        based_on=1,
    )


def preempted(
    job: int, at: float, actor: str = "@dispatcher", reason: str = "fairness", note: str = ""
) -> e.JobPreempted:
    return e.JobPreempted(
        event_id=f"x{job}-{at}",
        at=at,
        actor=actor,
        job_id=job,
        reason=reason,  # type: ignore[arg-type]
        note=note,
    )


def decided(
    actor: str = "@dispatcher", at: float = T0, decided_at: float | None = None
) -> e.CycleDecided:
    return e.CycleDecided(
        event_id=f"d-{actor}-{at}",
        at=at,
        actor=actor,
        cycle_id="c",
        based_on=1,
        policy_version="x",
        decided_at=decided_at,
    )


def lines(events: list[e.AnyEvent]) -> list[str]:
    return [v.line() for v in check_history(events)]


def test_a_history_the_domain_decided_is_clean() -> None:
    events = history(
        [
            *ORG,
            (
                T0,
                c.ApplyDecision(
                    actor="@dispatcher",
                    decision=c.DecisionBody(
                        cycle_id="c1",
                        based_on=9,
                        policy_version="x",
                        placements=(
                            e.Placement(
                                job_id=1, slots=(Slot(node="n1", gpu_indices=(0, 1, 2, 3)),)
                            ),
                            e.Placement(
                                job_id=2, slots=(Slot(node="n1", gpu_indices=(4, 5, 6, 7)),)
                            ),
                        ),
                    ),
                ),
            ),
            (T0 + 10, c.PreemptJob(actor="root", job_id=1, note="disk full")),
            (
                T0 + 4_000,
                c.ApplyDecision(
                    actor="@dispatcher",
                    decision=c.DecisionBody(
                        cycle_id="c2",
                        based_on=20,
                        policy_version="x",
                        preemptions=(e.Preemption(job_id=2, reason="fairness"),),
                    ),
                ),
            ),
            (T0 + 4_000, c.SetShares(actor="root", account="ai2/tulu", shares=2)),
        ]
    )
    report = check(events)
    assert report.violations == ()
    admin = next(i for i, ev in enumerate(events, 1) if isinstance(ev, e.JobPreempted))
    assert [n.line() for n in report.noted] == [
        f"position {admin}: ADMIN_PREEMPTED_IN_CONTRACT: job 1 preempted (admin) by 'root' 3590 s "
        "before its contract ends: admin preemption, reason: disk full"
    ]


def test_a_node_lost_inside_contracts_is_clean() -> None:
    """A node lost under a funded resumable job inside its contract and an unfunded one: the
    requeue and the failure break no contract, the GPUs are free again, and the node returns."""
    events = history(
        [
            *ORG,
            (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=4, resumable=True)),
            (
                T0,
                c.ApplyDecision(
                    actor="@dispatcher",
                    decision=c.DecisionBody(
                        cycle_id="c1",
                        based_on=9,
                        policy_version="x",
                        placements=(
                            e.Placement(
                                job_id=3, slots=(Slot(node="n1", gpu_indices=(0, 1, 2, 3)),)
                            ),
                            e.Placement(
                                job_id=2, slots=(Slot(node="n1", gpu_indices=(4, 5, 6, 7)),)
                            ),
                        ),
                    ),
                ),
            ),
            (T0 + 5, c.StartJob(actor="@slurm", job_id=2, engine="slurm", engine_job_id="7")),
            (T0 + 10, c.MarkNodeLost(actor="@slurm", node="n1", reason="slurm: DOWN")),
            (T0 + 20, c.ReturnNode(actor="@slurm", node="n1")),
            (
                T0 + 20,
                c.ApplyDecision(
                    actor="@dispatcher",
                    decision=c.DecisionBody(
                        cycle_id="c2",
                        based_on=20,
                        policy_version="x",
                        placements=(
                            e.Placement(
                                job_id=3, slots=(Slot(node="n1", gpu_indices=(4, 5, 6, 7)),)
                            ),
                            e.Placement(
                                job_id=1, slots=(Slot(node="n1", gpu_indices=(0, 1, 2, 3)),)
                            ),
                        ),
                    ),
                ),
            ),
        ]
    )
    assert [type(ev) for ev in events if ev.at == T0 + 10] == [
        e.NodeLost,
        e.JobFinished,
        e.JobEngineEnded,
        e.JobPreempted,
        e.JobRequeued,
    ]
    report = check(events)
    assert report.violations == () and report.noted == ()


CASES: dict[str, tuple[list[e.AnyEvent], list[str]]] = {
    "a GPU given to a second job": (
        [placed(1, (0, 1, 2, 3)), placed(2, (3, 4, 5, 6))],
        ["position {2}: GPU_HELD_TWICE: GPU 3 of node 'n1' given to job 2 while job 1 holds it"],
    ),
    "a job placed while it holds GPUs": (
        [placed(1, (0, 1, 2, 3)), placed(1, (4, 5, 6, 7), T0 + 1)],
        ["position {2}: GPU_HELD_TWICE: job 1 is placed again while it still holds GPUs"],
    ),
    "a GPU freed by a finish can be given again": (
        [
            placed(1, (0, 1, 2, 3)),
            e.JobFinished(
                event_id="f",
                at=T0 + 5,
                actor="@executor",
                job_id=1,
                outcome="completed",
                reason="completed",
            ),
            placed(2, (0, 1, 2, 3), T0 + 5),
        ],
        [],
    ),
    "a dispatcher preemption inside the contract": (
        [placed(1, (0, 1, 2, 3)), preempted(1, T0 + 600)],
        [
            "position {2}: PREEMPTED_IN_CONTRACT: job 1 preempted (fairness) by '@dispatcher' "
            "3000 s before its contract ends"
        ],
    ),
    "a preemption at the contract's end": ([placed(1, (0, 1, 2, 3)), preempted(1, T0 + 3_600)], []),
    "an unfunded job preempted at once": ([placed(2, (0, 1, 2, 3)), preempted(2, T0)], []),
    "an admin preemption without a reason": (
        [placed(1, (0, 1, 2, 3)), preempted(1, T0 + 1, actor="root", reason="admin")],
        [
            "position {2}: PREEMPTED_IN_CONTRACT: job 1 preempted (admin) by 'root' 3599 s before "
            "its contract ends"
        ],
    ),
    "a non-admin preemption with a reason": (
        [placed(1, (0, 1, 2, 3)), preempted(1, T0 + 1, actor="alice", reason="admin", note="mine")],
        [
            "position {2}: PREEMPTED_IN_CONTRACT: job 1 preempted (admin) by 'alice' 3599 s before "
            "its contract ends"
        ],
    ),
    "a placement on a draining node": (
        [
            e.NodeDrainRequested(event_id="d", at=T0, actor="root", node="n1", reason="fw"),
            placed(1, (0, 1, 2, 3)),
        ],
        ["position {2}: PLACED_ON_INACTIVE_NODE: job 1 placed on node 'n1', which is draining"],
    ),
    "a placement on an unknown node": (
        [placed(1, (0,), node="n9")],
        ["position {1}: PLACED_ON_INACTIVE_NODE: job 1 placed on node 'n9', which is unknown"],
    ),
    "shares set by a member": (
        [e.SharesSet(event_id="s", at=T0, actor="alice", account="ai2/olmo", shares=9)],
        [
            "position {1}: NOT_AUTHORISED: 'alice' may not set the shares of 'ai2/olmo': "
            "it needs a manager of 'ai2' or an admin"
        ],
    ),
    "a member added by someone who manages another project": (
        [
            e.ManagerGranted(event_id="g", at=T0, actor="root", user="mgr", account="ai2/tulu"),
            e.MemberAdded(event_id="m", at=T0, actor="mgr", user="eve", project="ai2/olmo"),
        ],
        [
            "position {2}: NOT_AUTHORISED: 'mgr' may not add members to 'ai2/olmo': "
            "it needs a manager of 'ai2/olmo' or an admin"
        ],
    ),
    "a top-level account opened by a manager": (
        [
            e.ManagerGranted(event_id="g", at=T0, actor="root", user="pm", account="ai2"),
            e.AccountOpened(event_id="o", at=T0, actor="pm", path="x", parent=None, kind="program"),
        ],
        ["position {2}: NOT_AUTHORISED: 'pm' may not open 'x': only admins may"],
    ),
    "a node registered by a member": (
        [
            e.NodeRegistered(
                event_id="n",
                at=T0,
                actor="alice",
                cluster="default",
                node="n2",
                gpu_type="h100",
                gpus=8,
            )
        ],
        ["position {1}: NOT_AUTHORISED: 'alice' may not register nodes: only admins may"],
    ),
    "a node-failure preemption by a person on a node that is not lost": (
        [placed(1, (0, 1, 2, 3)), preempted(1, T0 + 1, actor="alice", reason="node_failure")],
        [
            "position {2}: PREEMPTED_IN_CONTRACT: job 1 preempted (node_failure) by 'alice' "
            "3599 s before its contract ends"
        ],
    ),
    "a requeue because the engine says the run ended with its node": (
        [placed(1, (0, 1, 2, 3)), preempted(1, T0 + 1, actor="@slurm", reason="node_failure")],
        [],
    ),
    "a node marked lost by a member": (
        [e.NodeLost(event_id="l", at=T0, actor="alice", node="n1", reason="gone")],
        [
            "position {1}: NOT_AUTHORISED: 'alice' may not mark nodes lost: only the dispatcher, "
            "executors and admins may"
        ],
    ),
    "a drain and a return by an execution engine": (
        [
            e.NodeDrainRequested(event_id="d", at=T0, actor="@slurm", node="n1", reason="x"),
            e.NodeReturned(event_id="r", at=T0, actor="@slurm", node="n1"),
        ],
        [],
    ),
    # atk34-26 F2: a decision and a placement "by alice" passed; only the dispatcher decides
    "a placement by a person": (
        [msgspec.structs.replace(placed(1, (0, 1, 2, 3)), actor="alice")],
        [
            "position {1}: NOT_AUTHORISED: 'alice' may not apply dispatcher decisions: only the "
            "dispatcher may"
        ],
    ),
    "a decision recorded by an admin": (
        [decided("root")],
        [
            "position {1}: NOT_AUTHORISED: 'root' may not apply dispatcher decisions: only the "
            "dispatcher may"
        ],
    ),
    "a placement by a node's token": (
        [msgspec.structs.replace(placed(1, (0, 1, 2, 3)), actor="@node:n1")],
        [
            "position {1}: NOT_AUTHORISED: '@node:n1' may not apply dispatcher decisions: only "
            "the dispatcher may"
        ],
    ),
    "decisions by the dispatcher and the simulator": ([decided(), decided("@sim")], []),
    # atk34-26 F2: a record an hour before its neighbours passed
    "a decision recorded an hour before the previous one": (
        [decided(at=T0 + 3_600, decided_at=T0), decided(at=T0, decided_at=T0 + 1)],
        [
            "position {2}: DECIDED_BACKWARDS: c is recorded at 1000.000, 3600 s before the "
            "previous decision record (4600.000)"
        ],
    ),
    "a decision decided an hour before the previous one": (
        [decided(at=T0 + 3_600), decided(at=T0)],
        [
            "position {2}: DECIDED_BACKWARDS: c is decided at 1000.000, 3600 s before the "
            "previous decision record (4600.000)"
        ],
    ),
    "decisions within a clock step of each other": (
        [
            decided(at=T0 + 0.5),
            decided(at=T0),
            decided(at=T0 + 0.2, decided_at=T0 + 0.7),
            decided(at=T0, decided_at=T0 + 3_600),  # a harness deciding ahead of its clock
        ],
        [],
    ),
    "a second initialisation": (
        [e.LedgerInitialised(event_id="i", at=T0, actor="root", admin="root")],
        ["position {1}: INCONSISTENT: the ledger is initialised a second time"],
    ),
    "an event about a job that does not exist": (
        [e.JobStarted(event_id="s", at=T0, actor="@executor", job_id=99)],
        ["position {1}: INCONSISTENT: job.started.v1 refers to unknown 99"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_seeded_violation_is_reported_in_one_line(case: str) -> None:
    extra, want = CASES[case]
    n = len(base())
    assert lines([*base(), *extra]) == [
        w.replace("{1}", str(n + 1)).replace("{2}", str(n + 2)) for w in want
    ]


def test_authority_is_judged_at_the_moment_of_the_change() -> None:
    grant = e.ManagerGranted(event_id="g", at=T0, actor="root", user="mgr", account="ai2/olmo")
    revoke = e.ManagerRevoked(event_id="r", at=T0, actor="root", user="mgr", account="ai2/olmo")

    def add(n: int) -> e.MemberAdded:
        return e.MemberAdded(event_id=f"m{n}", at=T0, actor="mgr", user=f"u{n}", project="ai2/olmo")

    events = [*base(), add(1), grant, add(2), revoke, add(3)]
    n = len(base())
    assert [v.position for v in check_history(events)] == [n + 1, n + 5]


def test_positions_can_be_given_with_the_events() -> None:
    events = [*base(), e.SharesSet(event_id="s", at=T0, actor="eve", account="ai2", shares=2)]
    pairs = [(100 + i, ev) for i, ev in enumerate(events)]
    (v,) = check_history(pairs)
    assert v.position == 100 + len(events) - 1 and v.code == "NOT_AUTHORISED"


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from([(0, 1, 2, 3), (4, 5, 6, 7), (2, 3, 4, 5)]), min_size=1, max_size=6)
)
def test_double_booking_is_found_exactly_when_placements_overlap(
    placements: list[tuple[int, ...]],
) -> None:
    """Placements of distinct jobs, never released: a violation iff two share a GPU."""
    events = base()
    for i, gpus in enumerate(placements):
        job = 10 + i
        events.append(
            e.JobSubmitted(
                event_id=f"s{job}",
                at=T0,
                actor="alice",
                job_id=job,
                account="ai2/olmo",
                user="alice",
                gpus=4,
                min_runtime_s=60,
            )
        )
        events.append(placed(job, gpus))
    held: set[int] = set()
    clash = False
    for gpus in placements:
        clash |= bool(held & set(gpus))
        held |= set(gpus)
    codes = {v.code for v in check_history(events)}
    assert ("GPU_HELD_TWICE" in codes) == clash


# --- runs as their engines reported them ------------------------------------------------------


def _linked(job: int, run: int, start: float, gpus: tuple[int, ...]) -> e.JobEngineLinked:
    return e.JobEngineLinked(
        event_id=f"l{job}.{run}", at=start, actor="@executor", job_id=job, engine="agent",
        engine_job_id=f"{job}.{run + 1}", run=run, started_at=start,
        gpus=(Slot(node="n1", gpu_indices=gpus),),
    )  # fmt: skip


def _run_ended(job: int, run: int, end: float, at: float) -> e.JobRunEnded:
    return e.JobRunEnded(
        event_id=f"r{job}.{run}", at=at, actor="@executor", job_id=job, engine="agent",
        engine_job_id=f"{job}.{run + 1}", run=run, ended_at=end,
    )  # fmt: skip


def _engine_ended(job: int, run: int, end: float) -> e.JobEngineEnded:
    return e.JobEngineEnded(
        event_id=f"x{job}.{run}", at=end + 1, actor="@executor", job_id=job, engine="agent",
        engine_job_id=f"{job}.{run + 1}", reason="exited", ended_at=end,
    )  # fmt: skip


def test_a_gpu_held_by_two_live_runs_is_a_violation_however_late_the_end_is_reported() -> None:
    # job 1's stopped run lived on GPU 0 until T0 + 20; job 2's run started there at T0 + 10
    events = [*base(), _linked(1, 0, T0 + 1, (0, 1)), _linked(2, 0, T0 + 10, (0, 5)),
              _run_ended(1, 0, T0 + 20, T0 + 30)]  # fmt: skip
    [v] = check_history(events)
    assert v.code == "RUN_GPU_HELD_TWICE" and v.job_id == 2
    assert v.message == (
        "GPU 0 of node 'n1' held by job 2 (run 0) while job 1 (run 0) still ran on it, 10.000 s"
    )


def test_runs_one_after_the_other_on_a_gpu_and_a_run_without_a_reported_end_are_clean() -> None:
    events = [*base(), _linked(1, 0, T0 + 1, (0,)), _run_ended(1, 0, T0 + 9, T0 + 12),
              _linked(2, 0, T0 + 10, (0,)), _linked(1, 1, T0 + 11, (3,))]  # fmt: skip
    assert check_history(events) == []


def test_a_job_alive_in_two_launches_is_a_violation() -> None:
    events = [*base(), _linked(1, 0, T0 + 1, (0,)), _linked(1, 1, T0 + 5, (4,)),
              _run_ended(1, 0, T0 + 8, T0 + 9), _engine_ended(1, 1, T0 + 50)]  # fmt: skip
    [v] = check_history(events)
    assert v.code == "JOB_RUN_TWICE" and v.job_id == 1
    assert "job 1's run 1 started while its run 0 was alive" in v.message


def test_the_later_of_two_reported_ends_counts() -> None:
    # the ledger settled run 1 at T0 + 3 (its node was lost); its node said later it ran to T0 + 7
    events = [*base(), _linked(1, 0, T0 + 1, (0,)), _engine_ended(1, 0, T0 + 3),
              _run_ended(1, 0, T0 + 7, T0 + 40), _linked(2, 0, T0 + 5, (0,))]  # fmt: skip
    assert [v.code for v in check_history(events)] == ["RUN_GPU_HELD_TWICE"]


def _leak_take_back(started: bool, recorded_before: bool = False) -> list[e.AnyEvent]:
    """Alice's job (1 h contract) placed on n1; the Slurm executor takes it back at T0 + 2 as a
    leaked GPU's take-back does (`unplace_commands`: an `UnplaceJob` by @executor; a
    `RequeueJob` as it was recorded before, `recorded_before`, or of a started run), its run
    started first or not."""
    from ledger.cycle.executor import NodeChange
    from ledger.cycle.record import unplace_commands

    place = c.ApplyDecision(
        actor="@dispatcher",
        decision=c.DecisionBody(
            cycle_id="c1",
            based_on=9,
            policy_version="x",
            placements=(e.Placement(job_id=1, slots=(Slot(node="n1", gpu_indices=(0, 1, 2, 3)),)),),
        ),
    )
    cmds: list[tuple[float, c.AnyCommand]] = [*ORG, (T0, place)]
    if started:
        cmds.append((T0 + 1, c.StartJob(actor="@executor", job_id=1)))
    state, new_id, out = State(), ids(), []
    for at, cmd in cmds:
        for ev in decide(state, cmd, at, new_id):
            evolve(state, ev)
            out.append(ev)
    why = "Slurm counts GPU 3 allocated with no job holding it (GresUsed)"
    requeue: c.AnyCommand = c.RequeueJob(
        actor="@executor", job_id=1, reason=f"node n1 cannot run it: {why}"
    )
    if not started and not recorded_before:  # the executor's own, as it records a take-back
        [requeue] = unplace_commands(NodeChange("n1", "unplace", why, jobs=(1,)), state)
    for ev in decide(state, requeue, T0 + 2, new_id):
        evolve(state, ev)
        out.append(ev)
    return out


def test_an_executors_take_back_of_a_run_that_never_started_breaks_no_contract() -> None:
    """atk46-s F3: a run placed on a GPU Slurm leaked, taken back (back to the queue) before it
    started, was flagged PREEMPTED_IN_CONTRACT: a placement never started has run none of its
    contract. A started run requeued inside its contract still is a violation."""
    for before in (False, True):  # a log written before `job.unplaced` reads as it did
        report = check(_leak_take_back(started=False, recorded_before=before))
        assert report.violations == () and report.noted == ()
    events = _leak_take_back(started=True)
    pos = next(i for i, ev in enumerate(events, 1) if isinstance(ev, e.JobPreempted))
    assert [v.line() for v in check(events).violations] == [
        f"position {pos}: PREEMPTED_IN_CONTRACT: job 1 preempted (admin) by '@executor' 3598 s "
        "before its contract ends"
    ]


def test_audit_preemptions_does_not_call_a_never_started_take_back_inside_its_contract() -> None:
    """atk46-s F3, `audit preemptions` (the projection's `inside_contract`): the same rule as
    `check` for the take-back of a run that never started; a started run's is inside."""
    from projections.history import dicts, preemptions
    from projections.projector import Projector
    from projections.source import ListSource, LogRecord
    from projections.store import Store
    from schemas import codec
    from schemas.events import tag_of

    def inside(events: list[e.AnyEvent]) -> list[bool]:
        records = [
            LogRecord(i, tag_of(type(ev)), codec.encode(ev)) for i, ev in enumerate(events, 1)
        ]
        with Store(":memory:") as store:
            Projector(store, ListSource(records)).catch_up()
            return [r["inside_contract"] for r in dicts(store.con, preemptions(None, None))]

    assert inside(_leak_take_back(started=False)) == []  # `job.unplaced`: no preemption
    assert inside(_leak_take_back(started=False, recorded_before=True)) == [False]
    assert inside(_leak_take_back(started=True)) == [True]
