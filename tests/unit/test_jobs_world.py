"""A job as sbatch takes it (`ledger.core.jobs`, `schemas.units.parse_job_time`): its time in
Slurm's forms, its world recorded with it, job arrays and their running limit, dependencies and
the jobs a failed parent makes unrunnable, and why every job ended (`FinishReason`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from ledger.core import jobs
from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import ENDS_KEPT_S, State
from ledger.cycle.executor import output_files
from ledger.cycle.inputs import snapshot_from_state
from ledger.store import snapshots
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidCommand, LedgerError
from schemas.units import parse_job_time

T0 = 1_000.0

# --- Slurm's time formats ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("90", 90 * 60),  # minutes, as in Slurm (not 90 seconds)
        ("0", 0),
        ("5:30", 5 * 60 + 30),  # MM:SS
        ("90:00", 90 * 60),
        ("1:00:00", 3600),  # HH:MM:SS
        ("26:00:00", 26 * 3600),
        ("2-12", 2 * 86400 + 12 * 3600),  # D-HH
        ("2-12:30", 2 * 86400 + 12 * 3600 + 30 * 60),  # D-HH:MM
        ("2-12:30:15", 2 * 86400 + 12 * 3600 + 30 * 60 + 15),  # D-HH:MM:SS
        ("0-00:00:45", 45),
        ("90s", 90),  # the ledger's own forms
        ("15m", 900),
        ("2h", 7200),
        ("1.5h", 5400),
        ("7d", 7 * 86400),
        ("1w", 7 * 86400),
        (" 10 ", 600),
    ],
)
def test_a_job_time_reads_every_slurm_form(text: str, want: int) -> None:
    assert parse_job_time(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("1:75:00", "75 is out of range"),
        ("1:00:60", "60 is out of range"),
        ("2-24", "24 is out of range"),
        ("2-1:60", "60 is out of range"),
        ("1:2:3:4", "invalid --time '1:2:3:4'"),
        ("-5", "invalid --time '-5'"),
        ("soon", "invalid --time 'soon'"),
        ("0.01", "a bare number is whole minutes"),
        ("1.5", "a bare number is whole minutes"),
        ("4000-00", "must be int <= 315360000"),
        ("1.5.5", "invalid --time"),
    ],
)
def test_what_is_no_job_time_is_one_clear_error(text: str, want: str) -> None:
    with pytest.raises(InvalidCommand) as err:
        parse_job_time(text)
    assert want in err.value.line()
    assert "D-HH:MM:SS" in err.value.line() or "must be int" in want  # the forms, or the bound


# --- arrays and dependencies as the CLI writes them --------------------------------------------


@pytest.mark.parametrize(
    ("text", "tasks", "limit"),
    [
        ("0-3", (0, 1, 2, 3), None),
        ("1,3,5", (1, 3, 5), None),
        ("0-15%4", tuple(range(16)), 4),
        ("0-6:2", (0, 2, 4, 6), None),
        ("5,0-2", (0, 1, 2, 5), None),
        ("7", (7,), None),
    ],
)
def test_an_array_reads_slurms_forms(text: str, tasks: tuple[int, ...], limit: int | None) -> None:
    assert jobs.parse_array(text) == (tasks, limit)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("3-1", "empty range"),
        ("a-b", "invalid --array"),
        ("0-3%0", "invalid --array limit"),
        ("0-3%x", "invalid --array limit"),
        ("0-20000", "over 10000 tasks"),
        ("", "invalid --array"),
    ],
)
def test_a_bad_array_is_one_clear_error(text: str, want: str) -> None:
    with pytest.raises(InvalidCommand, match=want):
        jobs.parse_array(text)


def test_a_dependency_reads_slurms_forms_and_refuses_what_it_does_not_know() -> None:
    assert jobs.parse_dependency("afterok:5:6,afterany:7,singleton") == (
        e.Dependency(kind="afterok", job_ids=(5, 6)),
        e.Dependency(kind="afterany", job_ids=(7,)),
        e.Dependency(kind="singleton"),
    )
    for text, want in [
        ("afterok:5?afterany:6", "'\\?' \\(any of the terms\\) is not supported"),
        ("after:5", "'after' is not a dependency"),
        ("afterok:5_3", "'5_3' is no job id"),
        ("afterok:x", "'x' is no job id"),
    ]:
        with pytest.raises(InvalidCommand, match=want):
            jobs.parse_dependency(text)


# --- the domain ------------------------------------------------------------------------------


class World:
    """The organisation of tests/conftest.py folded through decide + evolve, with a clock."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.now = T0
        self.ids: Callable[[], str] = (lambda n: lambda: f"w{next(n)}")(itertools.count(1))

    def run(self, cmd: c.AnyCommand) -> list[e.AnyEvent]:
        events = decide(self.state, cmd, self.now, self.ids)
        for ev in events:
            evolve(self.state, ev)
        return events

    def submit(self, user: str = "alice", **kw: Any) -> list[e.JobSubmitted]:
        kw.setdefault("account", "ai2/olmo")
        kw.setdefault("gpus", 1)
        got = self.run(c.SubmitJob(actor=user, **kw))
        return [ev for ev in got if isinstance(ev, e.JobSubmitted)]

    def place(self, job_id: int, node: str = "n1", *gpus: int) -> None:
        slot = e.GpuSlot(node=node, gpu_indices=gpus or (0,))
        body = c.DecisionBody(
            cycle_id=f"c{job_id}",
            based_on=self.state.events,
            policy_version="test",
            placements=(c.Placement(job_id=job_id, slots=(slot,)),),
        )
        self.run(c.ApplyDecision(actor="@dispatcher", decision=body))

    def finish(self, job_id: int, code: int = 0, **kw: Any) -> list[e.AnyEvent]:
        if self.state.jobs[job_id].status == "placed":
            self.run(c.StartJob(actor="@executor", job_id=job_id))
        return self.run(c.FinishJob(actor="@executor", job_id=job_id, exit_code=code, **kw))

    def blocked(self) -> dict[int, str]:
        return {k: b.code for k, b in jobs.blocked(self.state).items()}


@pytest.fixture
def w(org_state: State) -> World:
    return World(org_state)


def test_a_submission_records_the_jobs_world(w: World) -> None:
    (job,) = w.submit(
        workdir="/home/alice/proj",
        env={"MY_VAR": "42", "PATH": "/usr/bin"},
        stdout="out-%x-%j.txt",
        job_name="train",
        command=("python", "train.py"),
    )
    assert (job.workdir, job.env, job.stdout, job.stderr, job.job_name) == (
        "/home/alice/proj",
        {"MY_VAR": "42", "PATH": "/usr/bin"},
        "out-%x-%j.txt",
        "",
        "train",
    )
    (plain,) = w.submit(workdir="/tmp/x", command=("/usr/bin/python3", "-c", "1"))
    assert plain.stdout == jobs.DEFAULT_OUTPUT and plain.job_name == "python3"
    # atk47-29 F8: a secret set in the command's first word is not its public name
    (token,) = w.submit(
        workdir="/tmp/x", command=("HF_TOKEN=hf_abc", "A=1", "/bin/python3", "t.py")
    )
    assert token.job_name == "python3"
    assert jobs.default_job_name(("X=1",)) == "" and jobs.default_job_name(()) == ""
    (old,) = w.submit()
    assert old.workdir == "" and old.stdout == ""  # no directory: the engine's defaults


@pytest.mark.parametrize(
    ("fields", "want"),
    [
        ({"workdir": "relative/dir"}, "is not absolute"),
        ({"workdir": "/a\x00b"}, "NUL"),
        ({"env": {"1BAD": "x"}}, "invalid environment variable name"),
        ({"env": {"A-B": "x"}}, "invalid environment variable name"),
        ({"env": {"A": "x\x00y"}}, "holds a NUL"),
        ({"env": {f"V{i}": "x" * 16_000 for i in range(20)}}, "at most 262144 are kept"),
        ({"stdout": "out-%q.txt"}, "%q is not a pattern"),
        ({"stderr": "err-%"}, "ends with a lone %"),
        ({"array_limit": 2}, "an array limit"),
        ({"dependency": (e.Dependency(kind="afterok", job_ids=(99,)),)}, "there is no job 99"),
        ({"dependency": (e.Dependency(kind="afterok"),)}, "afterok names no job"),
        ({"dependency": (e.Dependency(kind="singleton", job_ids=(1,)),)}, "singleton names no"),
    ],
)
def test_a_bad_world_is_refused_with_nothing_appended(
    w: World, fields: dict[str, Any], want: str
) -> None:
    before = w.state.events
    with pytest.raises(LedgerError, match=want):
        w.submit(**fields)
    assert w.state.events == before


def test_an_environment_over_its_bounds_is_refused_by_the_schema(w: World) -> None:
    with pytest.raises(InvalidCommand, match="env"):
        w.submit(env={"BIG": "x" * 20_000})


def test_an_array_is_one_job_per_task_with_consecutive_ids(w: World) -> None:
    tasks = w.submit(array=(0, 1, 2, 3, 5), array_limit=2, command=("echo",))
    assert [t.job_id for t in tasks] == [1, 2, 3, 4, 5]
    assert {t.array_job_id for t in tasks} == {1}
    assert [t.array_task_id for t in tasks] == [0, 1, 2, 3, 5]
    assert all(t.array_limit == 2 for t in tasks)
    (single,) = w.submit()
    assert single.job_id == 6 and single.array_job_id is None


def test_an_arrays_limit_never_lets_more_tasks_hold_gpus(w: World) -> None:
    w.submit(array=tuple(range(6)), array_limit=2)
    assert w.blocked() == {3: "WAIT_ARRAY_LIMIT", 4: "WAIT_ARRAY_LIMIT", 5: "WAIT_ARRAY_LIMIT",
                           6: "WAIT_ARRAY_LIMIT"}  # fmt: skip
    snap = snapshot_from_state(w.state, {}, T0)
    assert [p.job_id for p in snap.pending] == [1, 2]
    w.place(1, "n1", 0)
    w.place(2, "n1", 1)
    assert set(w.blocked()) == {3, 4, 5, 6}
    w.finish(1)
    assert set(w.blocked()) == {4, 5, 6}
    assert [p.job_id for p in snapshot_from_state(w.state, {}, T0).pending] == [3]


def test_cancelling_an_arrays_id_cancels_every_unfinished_task(w: World) -> None:
    w.submit(array=(0, 1, 2))
    w.place(1, "n1", 0)
    w.finish(1)
    got = w.run(c.CancelJob(actor="alice", job_id=1, whole_array=True))
    assert [(ev.job_id, ev.reason) for ev in got if isinstance(ev, e.JobFinished)] == [
        (2, "cancelled"),
        (3, "cancelled"),
    ]
    with pytest.raises(LedgerError, match="may not cancel"):
        w.submit(array=(0, 1))
        w.run(c.CancelJob(actor="carol", job_id=4, whole_array=True))


def test_a_dependency_chain_runs_in_order(w: World) -> None:
    w.submit()  # 1
    w.submit(dependency=(e.Dependency(kind="afterok", job_ids=(1,)),))  # 2
    w.submit(dependency=(e.Dependency(kind="afterany", job_ids=(2,)),))  # 3
    assert w.blocked() == {2: "WAIT_DEPENDENCY", 3: "WAIT_DEPENDENCY"}
    w.place(1)
    w.finish(1, 0)
    assert w.blocked() == {3: "WAIT_DEPENDENCY"}
    w.place(2)
    w.finish(2, 1)  # afterany: any end
    assert w.blocked() == {}


def test_a_failed_parent_ends_its_afterok_children_and_theirs(w: World) -> None:
    w.submit()  # 1
    w.submit(dependency=(e.Dependency(kind="afterok", job_ids=(1,)),))  # 2
    w.submit(dependency=(e.Dependency(kind="afterok", job_ids=(2,)),))  # 3
    w.submit(dependency=(e.Dependency(kind="afternotok", job_ids=(2,)),))  # 4: runs
    w.submit(dependency=(e.Dependency(kind="afternotok", job_ids=(1,)),))  # 5: runs
    w.place(1)
    got = w.finish(1, 3)
    ends = [(ev.job_id, ev.reason, ev.outcome) for ev in got if isinstance(ev, e.JobFinished)]
    assert ends == [
        (1, "failed", "failed"),
        (2, "dependency_never_satisfied", "cancelled"),
        (3, "dependency_never_satisfied", "cancelled"),
    ]
    note = next(ev.note for ev in got if isinstance(ev, e.JobFinished) and ev.job_id == 2)
    assert note == "job 1 ended failed: afterok:1 can never be satisfied"
    assert w.blocked() == {}  # 4 and 5 may run
    with pytest.raises(InvalidCommand, match="afterok:1 can never be satisfied: job 1 ended"):
        w.submit(dependency=(e.Dependency(kind="afterok", job_ids=(1,)),))


def test_a_completed_parent_ends_its_afternotok_children(w: World) -> None:
    w.submit()
    w.submit(dependency=(e.Dependency(kind="afternotok", job_ids=(1,)),))
    w.place(1)
    got = w.finish(1, 0)
    assert [ev.reason for ev in got if isinstance(ev, e.JobFinished)] == [
        "completed",
        "dependency_never_satisfied",
    ]


def test_a_dependency_on_an_array_waits_for_every_task(w: World) -> None:
    w.submit(array=(0, 1))  # 1, 2
    w.submit(dependency=(e.Dependency(kind="afterok", job_ids=(1,)),))  # 3
    w.place(1)
    w.finish(1)
    assert w.blocked() == {3: "WAIT_DEPENDENCY"}  # task 2 still runs
    w.place(2)
    got = w.finish(2, 9)
    assert [ev.job_id for ev in got if isinstance(ev, e.JobFinished)] == [2, 3]


def test_afternotok_on_an_array_waits_for_every_task_and_runs_when_one_failed(w: World) -> None:
    """F2 of atk23c: task 0 completing decided `afternotok:ARRAY` alone (refused at submit
    "can never be satisfied", or ended at once) while another task still ran and then failed.
    Slurm: a dependency on an array's id waits for every task."""
    w.submit(array=(0, 1, 2))  # 1, 2, 3
    w.place(1, "n1", 0)
    w.place(2, "n1", 1)
    w.finish(1, 0)  # task 0 completed; tasks 1 and 2 have not ended
    (dep,) = w.submit(dependency=(e.Dependency(kind="afternotok", job_ids=(1,)),))  # 4
    (after,) = w.submit(dependency=(e.Dependency(kind="afterany", job_ids=(1,)),))  # 5
    assert (dep.job_id, after.job_id) == (4, 5)
    assert w.blocked() == {4: "WAIT_DEPENDENCY", 5: "WAIT_DEPENDENCY"}
    got = w.finish(2, 1)  # task 1 failed: afternotok is met once task 2 ends too
    assert [ev.job_id for ev in got if isinstance(ev, e.JobFinished)] == [2]
    assert w.blocked() == {4: "WAIT_DEPENDENCY", 5: "WAIT_DEPENDENCY"}
    w.place(3, "n1", 2)
    got = w.finish(3, 0)
    assert [ev.job_id for ev in got if isinstance(ev, e.JobFinished)] == [3]
    assert w.blocked() == {}  # both may run: one task failed, every task ended
    # once every task has ended with one failed, a later afternotok is accepted
    w.submit(dependency=(e.Dependency(kind="afternotok", job_ids=(1,)),))


def test_afternotok_on_an_array_every_task_of_which_completed_never_holds(w: World) -> None:
    w.submit(array=(0, 1))  # 1, 2
    w.place(1, "n1", 0)
    w.place(2, "n1", 1)
    w.finish(1, 0)
    w.submit(dependency=(e.Dependency(kind="afternotok", job_ids=(1,)),))  # 3: waits
    assert w.blocked() == {3: "WAIT_DEPENDENCY"}
    got = w.finish(2, 0)
    ends = [(ev.job_id, ev.reason) for ev in got if isinstance(ev, e.JobFinished)]
    assert ends == [(2, "completed"), (3, "dependency_never_satisfied")]
    note = next(ev.note for ev in got if isinstance(ev, e.JobFinished) and ev.job_id == 3)
    assert "every task of array 1 completed" in note, note
    with pytest.raises(InvalidCommand, match="afternotok:1 can never be satisfied: the tasks"):
        w.submit(dependency=(e.Dependency(kind="afternotok", job_ids=(1,)),))
    # a task's own id is that task alone (Slurm's ARRAY_TASK form is the ledger's task id)
    with pytest.raises(InvalidCommand, match="afternotok:2 can never be satisfied: job 2"):
        w.submit(dependency=(e.Dependency(kind="afternotok", job_ids=(2,)),))


def test_afterok_on_an_array_ends_at_the_first_failed_task(w: World) -> None:
    w.submit(array=(0, 1, 2))  # 1, 2, 3
    w.submit(dependency=(e.Dependency(kind="afterok", job_ids=(1,)),))  # 4
    w.place(2, "n1", 1)
    got = w.finish(2, 5)  # task 1 failed while tasks 0 and 2 wait: afterok can never hold
    assert [(ev.job_id, ev.reason) for ev in got if isinstance(ev, e.JobFinished)] == [
        (2, "failed"),
        (4, "dependency_never_satisfied"),
    ]


@pytest.mark.parametrize(
    ("kind", "ends", "live", "never"),
    [
        ("afterok", [], True, False),
        ("afterok", ["completed"], True, False),
        ("afterok", ["completed", "failed"], True, True),
        ("afternotok", ["completed"], True, False),
        ("afternotok", ["completed"], False, True),
        ("afternotok", ["completed", "time_limit"], False, False),
        ("afternotok", [], False, False),
        ("afterany", ["completed", "failed"], False, False),
    ],
)
def test_never_met_is_slurms_rule_for_a_job_or_every_task(
    kind: e.DependencyKind, ends: list[str], live: bool, never: bool
) -> None:
    assert jobs.never_met(kind, ends, live) is never


def test_singleton_waits_for_the_earlier_job_of_the_same_user_and_name(w: World) -> None:
    dep = (e.Dependency(kind="singleton"),)
    w.submit(job_name="nightly")  # 1
    w.submit(job_name="nightly", dependency=dep)  # 2
    w.submit("bob", job_name="nightly", dependency=dep)  # 3: another user
    assert w.blocked() == {2: "WAIT_DEPENDENCY"}
    w.place(1)
    w.finish(1, 1)
    assert w.blocked() == {}


def test_a_dependency_on_a_job_whose_end_is_no_longer_kept_is_refused(w: World) -> None:
    w.submit()
    w.place(1)
    w.finish(1)
    w.now += ENDS_KEPT_S + 10
    w.submit()  # 2: its end prunes job 1's
    w.place(2, "n2")
    w.finish(2)
    assert 1 not in w.state.ends and 2 in w.state.ends
    with pytest.raises(InvalidCommand, match="no longer kept for dependencies"):
        w.submit(dependency=(e.Dependency(kind="afterany", job_ids=(1,)),))
    (ok,) = w.submit(dependency=(e.Dependency(kind="afterok", job_ids=(2,)),))
    assert w.blocked() == {}  # job 2 completed: nothing to wait for
    assert ok.dependency == (e.Dependency(kind="afterok", job_ids=(2,)),)


def test_a_live_state_and_its_snapshot_keep_the_ends_and_indexes(w: World) -> None:
    w.submit(array=(0, 1))
    w.submit(dependency=(e.Dependency(kind="afterok", job_ids=(1,)),))
    w.place(1)
    w.finish(1)
    live = snapshots.unfolded(msgspec.msgpack.decode(
        msgspec.msgpack.encode(snapshots.folded(_live(w.state))), type=snapshots.Folded
    ))  # fmt: skip
    assert live.ends == w.state.ends
    assert jobs.blocked(live) == jobs.blocked(w.state)
    assert live.array_tasks(1) == {2} and live.dependents() == {1: {3}}


def _live(state: State) -> State:
    """The same state as a live one (finished jobs dropped)."""
    out = state.copy()
    out.live_only = True
    out.jobs = {k: j for k, j in out.jobs.items() if j.active}
    return out


# --- why every job ended ----------------------------------------------------------------------


def test_every_ending_path_records_its_reason(w: World) -> None:
    reasons: dict[int, str] = {}

    def ends(got: list[e.AnyEvent]) -> None:
        reasons.update({ev.job_id: ev.reason for ev in got if isinstance(ev, e.JobFinished)})

    for _ in range(7):
        w.submit()
    w.submit(dependency=(e.Dependency(kind="afterok", job_ids=(2,)),))  # 8
    for job_id, gpu in zip(range(1, 7), range(6), strict=True):
        w.place(job_id, "n1", gpu)
    ends(w.finish(1, 0))
    ends(w.finish(2, 2))
    ends(w.finish(3, 137, reason="time_limit", engine="slurm", engine_job_id="77"))
    ends(w.run(c.CancelJob(actor="alice", job_id=4)))
    ends(w.finish(5, -1, reason="launch_failed", note="no OS account 'alice'"))
    w.now = T0 + 3 * 3600  # past the contracts
    ends(w.run(c.PreemptJob(actor="root", job_id=6, note="make room")))
    w.place(7, "n2", 0)
    ends(w.run(c.MarkNodeLost(actor="@executor", node="n2", reason="power")))
    assert reasons == {
        1: "completed",
        2: "failed",
        3: "time_limit",
        4: "cancelled",
        5: "launch_failed",
        6: "preempted",
        7: "node_lost",
        8: "dependency_never_satisfied",
    }
    assert set(reasons.values()) == set(e.FINISH_REASONS)


def test_a_finish_records_the_real_end_inside_the_run(w: World) -> None:
    w.submit()
    w.place(1)
    w.now = T0 + 600
    got = w.finish(1, 0, ended_at=T0 + 100)
    (end,) = [ev for ev in got if isinstance(ev, e.JobFinished)]
    assert end.ended_at == T0 + 100
    w.submit()
    w.place(2)
    got = w.finish(2, 0, ended_at=T0 + 10_000)  # later than now: now
    assert next(ev for ev in got if isinstance(ev, e.JobFinished)).ended_at == w.now


# --- output files -----------------------------------------------------------------------------


def test_output_patterns_are_written_out_under_the_working_directory(w: World) -> None:
    (task,) = w.submit(
        array=(7,), workdir="/home/a", stdout="%x-%A_%a.out", stderr="/logs/%u-%j.err",
        job_name="t",
    )  # fmt: skip
    slots = (e.GpuSlot(node="n1", gpu_indices=(0,)),)
    assert output_files(task, slots) == ("/home/a/t-1_7.out", "/logs/alice-1.err")
    (plain,) = w.submit(workdir="/w")
    assert output_files(plain, slots) == ("/w/gpuledger-2.out", "")
    (none,) = w.submit()
    assert output_files(none, slots) == ("", "")
    assert jobs.expand_output(
        "%%j=%j %N", job_id=5, user="u", job_name="n", array_job_id=None, array_task_id=None,
        node="n9",
    ) == "%j=5 n9"  # fmt: skip


def test_a_drained_run_is_requeued_when_resumable_and_ends_preempted_otherwise(w: World) -> None:
    """`agent --drain` reports its node's runs `drained`: the ledger treats them as a drained
    node's jobs, never as failures of their own: a resumable one is requeued (a maintenance
    preemption: its next run is another), one that is not ends `preempted` with no preemption
    recorded (none was decided: issue 23's note), its exit code kept."""
    w.submit(resumable=True)
    w.submit()
    w.place(1, "n1", 0)
    w.place(2, "n1", 1)
    got = w.finish(1, -15, reason="drained") + w.finish(2, -15, reason="drained")
    kinds = [(type(ev).__name__, ev.job_id) for ev in got if isinstance(ev, e.JobEvent)]
    assert kinds == [("JobPreempted", 1), ("JobRequeued", 1), ("JobFinished", 2)]
    assert {ev.reason for ev in got if isinstance(ev, e.JobPreempted)} == {"maintenance"}
    assert w.state.jobs[1].status == "pending"
    (end,) = [ev for ev in got if isinstance(ev, e.JobFinished)]
    assert (end.outcome, end.reason, end.exit_code) == ("preempted", "preempted", -15)
    assert w.state.jobs[2].preemptions == 0


class _Run:
    """A state with the organisation, and every event `run` decides kept in `history`."""

    def __init__(self, org_commands: list[c.AnyCommand], prefix: str) -> None:
        self.state = State()
        self.history: list[e.AnyEvent] = []
        self.ids = (lambda n: lambda: f"{prefix}{next(n)}")(itertools.count(1))
        for cmd in org_commands:
            self(cmd, T0)

    def __call__(self, cmd: c.AnyCommand, now: float) -> list[e.AnyEvent]:
        got = decide(self.state, cmd, now, self.ids)
        for ev in got:
            evolve(self.state, ev)
        self.history.extend(got)
        return got

    def started(self, resumable: bool) -> int:
        """Alice's 1-GPU job with a 1 h contract, placed on n1 at T0 + 1, started at T0 + 2."""
        self(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=3600,
                         resumable=resumable), T0)  # fmt: skip
        job_id = self.state.next_job_id - 1
        slot = e.GpuSlot(node="n1", gpu_indices=(0,))
        body = c.DecisionBody(
            cycle_id="c1", based_on=self.state.events, policy_version="test",
            placements=(c.Placement(job_id=job_id, slots=(slot,)),),
        )  # fmt: skip
        self(c.ApplyDecision(actor="@dispatcher", decision=body), T0 + 1)
        self(c.StartJob(actor="@executor", job_id=job_id), T0 + 2)
        return job_id

    def explained(self, job_id: int, now: float) -> str:
        from ledger.reads.explain import explain_history

        mine = [ev for ev in self.history if getattr(ev, "job_id", None) == job_id]
        return " ".join(explain_history(self.state.jobs[job_id], mine, {}, now, 30.0))


def test_a_drain_inside_a_contract_is_maintenance_allowed_by_audit_and_explained(
    org_commands: list[c.AnyCommand],
) -> None:
    """F9 of atk23c: `agent --drain` of a node whose job is inside its contract was flagged
    PREEMPTED_IN_CONTRACT by `audit check`, called "an admin preemption" by `explain`, and its
    job kept neither its exit code nor its run's end. A drain is host maintenance: allowed,
    said so, and the job's end is its run's."""
    from ledger.history.audit import check

    run = _Run(org_commands, "d")
    job_id = run.started(resumable=False)
    got = run(
        c.FinishJob(actor="@executor", job_id=job_id, exit_code=143, reason="drained",
                    ended_at=T0 + 60),
        T0 + 90,
    )  # fmt: skip
    (end,) = [ev for ev in got if isinstance(ev, e.JobFinished)]
    assert (end.reason, end.exit_code, end.ended_at) == ("preempted", 143, T0 + 60)
    report = check(run.history)
    assert report.ok, [v.line() for v in report.violations]
    assert [v.code for v in report.noted] == ["DRAINED_IN_CONTRACT"]
    said = run.explained(job_id, T0 + 100)
    assert "drained for maintenance" in said and "admin preemption" not in said, said


def test_a_requeue_for_a_failed_node_is_not_called_an_admin_preemption(
    org_commands: list[c.AnyCommand],
) -> None:
    """F2 of atk23d: a resumable job requeued inside its contract because its node failed was
    explained as "an admin preemption"; no one chose it."""
    run = _Run(org_commands, "f")
    job_id = run.started(resumable=True)
    got = run(c.FinishJob(actor="@executor", job_id=job_id, exit_code=-1, reason="node_failure"),
              T0 + 90)  # fmt: skip
    assert [ev.reason for ev in got if isinstance(ev, e.JobPreempted)] == ["node_failure"]
    said = run.explained(job_id, T0 + 100)
    assert "its node failed" in said and "admin preemption" not in said, said
