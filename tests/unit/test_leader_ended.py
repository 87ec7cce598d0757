"""A job whose command has exited while processes it left live out their grace (atk49-23 F4):
its supervisor SIGTERMs them when the command ends and SIGKILLs them after the grace; the
agent reports it (`Report.reaping`), the server records `LeaderEnded`, and every read shows
the job `stopping` with that SIGKILL; the queue's estimates count its GPUs free then, not at
its time limit. Before, it read `running` with no SIGKILL time, and a job waiting for its GPUs
was estimated at its time limit. Pure: the fold, the reads, the agent executor's gathering and
what an agent sends an older server."""

from __future__ import annotations

import msgspec
import pytest

from ledger.core.authz import authorise
from ledger.core.state import State
from ledger.cycle.executor import Reaping
from ledger.cycle.inputs import snapshot_from_state
from ledger.cycle.record import reaping_commands
from ledger.dispatch.engine import decide as dispatch
from ledger.dispatch.registry import build
from ledger.engines.agent_runs import AgentRun, run_reaping
from ledger.reads.estimates import estimated_starts
from ledger.reads.explain import explain_history, run_ended_line
from ledger.reads.preview import _holding_rows
from ledger.reads.stopping import reaping_kills, stopping_kills
from ledger.reads.viewers import Viewer
from ledger.wire.client import sent
from schemas import agent as a
from schemas import commands as c
from schemas import events as e
from schemas import views as v
from schemas.errors import InvalidTransition, NotAuthorised
from tests.unit.domainkit import ONE_NODE
from tests.unit.domainkit import run as _run


def _ledger() -> tuple[State, list[e.AnyEvent]]:
    """n1 has 4 GPUs; job 1 (2 GPUs, 10 min limit, grace 30 s) and job 2 (1 GPU, 10 min) run
    from t=0; job 3 (3 GPUs) waits."""
    state = State()
    history = _run(state, 0.0,
         *ONE_NODE,
         c.SubmitJob(actor="u", account="p/q", gpus=2, time_limit_s=600, grace_s=30),
         c.SubmitJob(actor="u", account="p/q", gpus=1, time_limit_s=600))  # fmt: skip
    decision = dispatch(snapshot_from_state(state, {}, 0.0), build("fifo"), 0.0)
    body = c.DecisionBody(cycle_id="c0", based_on=state.events, policy_version="x",
                          placements=tuple(decision.placements))  # fmt: skip
    history += _run(state, 0.0, c.ApplyDecision(actor="@dispatcher", decision=body))
    for j in (1, 2):
        history += _run(state, 0.0, c.StartJob(actor="@executor", job_id=j))
    history += _run(state, 5.0, c.SubmitJob(actor="u", account="p/q", gpus=3, time_limit_s=60))
    return state, history


def _ended(at: float = 10.0, run: int = 0) -> c.ReportLeaderEnded:
    return c.ReportLeaderEnded(actor="@executor", job_id=1, run=run, leader_ended_at=at, left=2,
                               kill_at=at + 30)  # fmt: skip


def test_a_job_whose_command_exited_reads_stopping_and_frees_its_gpus_at_its_sigkill() -> None:
    state, history = _ledger()
    now = 12.0
    snap = snapshot_from_state(state, {}, now, hold_stopping=True)
    decision = dispatch(snap, build("fifo"), now)
    assert estimated_starts(state, snap, decision, now)[3] == 600.0  # job 1's limit
    history += _run(state, 10.0, _ended())
    assert [type(ev) for ev in history[-1:]] == [e.LeaderEnded]
    job = state.jobs[1]
    assert (job.status, job.reaping_kill_at, job.leader_ended_at, job.reaping_left) == (
        "running", 40.0, 10.0, 2
    )  # fmt: skip
    rows = {r.job_id: r for r in _holding_rows(state, v.QueueFilter(state="running"), now, 100)}
    assert (rows[1].state, rows[1].kill_at) == ("stopping", 40.0)
    assert rows[1].reason.startswith("its command exited at "), rows[1].reason
    assert "leaving 2 processes: SIGTERM sent, SIGKILL at " in rows[1].reason
    assert (rows[2].state, rows[2].kill_at) == ("running", None)
    assert reaping_kills(state) == {1: 40.0}  # what `jobs` shows stopping
    assert stopping_kills(state) == {}  # the stopped runs, apart
    # and so through a server (its reads run on a copy of what they need of the live state)
    assert reaping_kills(Viewer("u", state).detached().state) == {1: 40.0}
    # its GPUs come free at its SIGKILL plus the cycle that places on them
    assert estimated_starts(state, snap, decision, now)[3] == 42.0
    said = explain_history(state.jobs[1], history, {}, now, 30.0)
    assert said[0].endswith(" is stopping."), said
    assert any("its command exited, leaving 2 process(es) of its run 0" in s for s in said), said
    assert said[-1].startswith("It is stopping: its command exited at "), said


def test_its_time_limit_cuts_the_reaping_short_and_a_new_run_forgets_it() -> None:
    state, _ = _ledger()
    _run(state, 590.0, _ended(590.0))  # SIGKILL 620; its limit's is 600 + 30
    assert reaping_kills(state) == {1: 620.0}
    other = c.ReportLeaderEnded(actor="@executor", job_id=2, leader_ended_at=591.0, kill_at=700)
    _run(state, 591.0, other)
    assert reaping_kills(state)[2] == 630.0  # its limit (600) plus the service's grace (30)
    _run(state, 592.0, c.RequeueJob(actor="root", job_id=1))
    assert state.jobs[1].reaping_kill_at is None
    assert 1 not in reaping_kills(state)


def test_only_the_executor_reports_it_once_for_the_running_run() -> None:
    state, _ = _ledger()
    with pytest.raises(InvalidTransition):
        _run(state, 10.0, _ended(run=1))  # not its run
    with pytest.raises(NotAuthorised):
        authorise(state, msgspec.structs.replace(_ended(), actor="u"))
    with pytest.raises(NotAuthorised):  # a node's token reports only for its own node
        authorise(state, msgspec.structs.replace(_ended(), actor="@node:n2"))
    _run(state, 10.0, _ended())
    with pytest.raises(InvalidTransition):
        _run(state, 11.0, _ended(11.0))
    with pytest.raises(InvalidTransition):
        _run(state, 11.0, c.ReportLeaderEnded(actor="@executor", job_id=3, leader_ended_at=1.0,
                                              kill_at=2.0))  # fmt: skip


def test_recording_takes_the_reaping_of_running_jobs_current_runs_only() -> None:
    state, _ = _ledger()
    said = [Reaping(1, 0, 10.0, 2, 40.0), Reaping(2, 1, 10.0, 1, 40.0), Reaping(3, 0, 1, 1, 2)]
    assert [(x.job_id, x.kill_at) for x in reaping_commands(said, state.jobs)] == [(1, 40.0)]


def test_a_gang_run_is_reaping_once_every_part_has_ended_or_is_reaping() -> None:
    r = AgentRun(job_id=7, run=0, nodes=("n1", "n2"), start_reported=True)
    r.reaping["n1"] = a.PartReaping(job_id=7, run=0, leader_ended_at=10.0, left=1, kill_at=40.0)
    assert run_reaping(r) is None  # n2's command still runs
    r.exits["n2"] = a.PartExited(job_id=7, run=0, exit_code=0)
    assert run_reaping(r) == Reaping(7, 0, 10.0, 1, 40.0)
    assert run_reaping(r) is None  # once
    late = AgentRun(job_id=8, run=0, nodes=("n1", "n2"), start_reported=True)
    late.reaping["n1"] = a.PartReaping(job_id=8, run=0, leader_ended_at=10.0, left=1, kill_at=40)
    late.reaping["n2"] = a.PartReaping(job_id=8, run=0, leader_ended_at=12.0, left=3, kill_at=42)
    assert run_reaping(late) == Reaping(8, 0, 12.0, 3, 42.0)


class _OlderReport(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`Report` as a server before `reaping` has it."""

    node: str
    started: tuple[a.PartStarted, ...] = ()
    exited: tuple[a.PartExited, ...] = ()
    samples: tuple[a.PartSample, ...] = ()
    checkpoints: tuple[a.PartCheckpoint, ...] = ()
    stopped: tuple[a.PartStopped, ...] = ()
    version: str = ""
    running: tuple[a.PartRun, ...] | None = None
    draining: bool = False


def test_an_older_server_takes_a_report_without_reaping() -> None:
    report = a.Report(node="n1", exited=(a.PartExited(job_id=1, run=0, exit_code=0),),
                      running=())  # fmt: skip
    older = msgspec.json.Decoder(_OlderReport)
    with pytest.raises(msgspec.ValidationError, match="reaping"):
        older.decode(msgspec.json.encode(report))  # every field, as agents sent it
    got = older.decode(msgspec.json.encode(sent(report)))
    assert got.exited == report.exited and got.running == ()
    # the server of this version reads it back the same
    assert msgspec.json.decode(msgspec.json.encode(sent(report)), type=a.Report) == report


def test_an_agent_sends_the_rest_again_without_reaping_once_an_older_server_refuses_it() -> None:
    """An older server refuses the whole report for `reaping`: the agent keeps what it holds,
    without reaping parts, or its exits would never be taken again."""
    from ledger.agent.node import Outbox, refuses_reaping
    from schemas.errors import InvalidCommand, Unavailable

    out = Outbox()
    out.exited.append(a.PartExited(job_id=1, run=0, exit_code=0))
    refused = InvalidCommand("Validation failed for POST /v1/agent/report: Object contains "
                             "unknown field `reaping`", status=400, answered="invalid")  # fmt: skip
    assert not refuses_reaping(refused, out)  # it sent none: another refusal
    out.reaping.append(a.PartReaping(job_id=2, run=0, leader_ended_at=1.0, kill_at=2.0))
    assert refuses_reaping(refused, out)
    assert not refuses_reaping(InvalidCommand("job 1 is unknown"), out)
    # not a server's answer: a connection error whose URL holds the word (atk56-23 F1's kind)
    assert not refuses_reaping(Unavailable("cannot reach the server at http://reaping:8000"), out)


@pytest.mark.parametrize(
    ("code", "want"), [(0, "completed"), (3, "cancelled"), (None, "cancelled")]
)
def test_a_cancel_after_the_command_exited_0_records_the_jobs_completion(
    code: int | None, want: str
) -> None:
    """atk52-23 F2: a cancel while the processes a command left live out their grace, the
    command having exited 0 (`LeaderEnded.exit_code`), ends the job `completed` (exit 0), the
    leftovers killed at once; exited non-zero, or a record made before the field (None), the
    cancel ends it `cancelled`, as before, with the usual grace; a non-zero code is kept
    (atk54-23 F4: `cancelled` with exit code null, the command's own code lost)."""
    state, _ = _ledger()
    state.jobs[1] = msgspec.structs.replace(state.jobs[1], engine="local", engine_job_id="1.1")
    _run(state, 10.0, msgspec.structs.replace(_ended(), exit_code=code))
    [end] = [ev for ev in _run(state, 12.0, c.CancelJob(actor="u", job_id=1))
             if isinstance(ev, e.JobFinished)]  # fmt: skip
    assert (end.outcome, end.reason) == (want, want), end
    assert end.exit_code == code, end
    assert (f"its command exited {code} at" in end.note) is (code is not None), end.note
    stopped = state.stopped_runs[(1, 0)]
    assert stopped.kill is (want == "completed"), stopped
    assert stopped.why == "cancelled"
    # its run's end (told by itself: its command ended before the stop) changes nothing more
    tail = _run(state, 20.0, c.ConfirmRunEnded(actor="@executor", job_id=1, engine="local",
                                               engine_job_id="1.1", run=0, ended_at=19.0,
                                               exit_code=0, by_itself=True))  # fmt: skip
    assert [type(ev) for ev in tail] == [e.JobRunEnded], tail
    assert state.jobs[1].outcome == want
    # `explain` says its own code (atk54-23 F4)
    assert "its command exited 0 by itself before the stop reached it" in run_ended_line(tail[0])


def test_the_gathered_reaping_says_the_commands_exit_code_of_every_part() -> None:
    """A gang run's reaping says its command's code only when every part said one: the first
    non-zero, else 0 (`command_code`)."""
    r = AgentRun(job_id=1, run=0, nodes=("n1", "n2"), start_reported=True)
    r.reaping["n1"] = a.PartReaping(job_id=1, run=0, leader_ended_at=5.0, kill_at=35.0,
                                    exit_code=0)  # fmt: skip
    r.exits["n2"] = a.PartExited(job_id=1, run=0, exit_code=0)
    said = run_reaping(r)
    assert said is not None and said.exit_code == 0
    r2 = AgentRun(job_id=1, run=0, nodes=("n1", "n2"), start_reported=True)
    r2.reaping["n1"] = a.PartReaping(job_id=1, run=0, leader_ended_at=5.0, kill_at=35.0)
    r2.exits["n2"] = a.PartExited(job_id=1, run=0, exit_code=0)
    said2 = run_reaping(r2)
    assert said2 is not None and said2.exit_code is None
    [cmd] = reaping_commands([said], _ledger()[0].jobs)
    assert isinstance(cmd, c.ReportLeaderEnded) and cmd.exit_code == 0


def test_a_cancel_past_the_limit_of_a_job_whose_command_exited_0_before_it_is_a_completion() -> (
    None
):
    """Its command exited 0 before its time limit (the engine then stops it no more at the
    limit): a cancel after the limit records its completion, not `time_limit`; one whose command
    ended after its limit is the limit's (`_timed_out`), as before."""
    for ended_at, want in ((590.0, "completed"), (601.0, "time_limit")):
        state, _ = _ledger()
        state.jobs[1] = msgspec.structs.replace(state.jobs[1], engine="local", engine_job_id="1.1")
        _run(state, ended_at, msgspec.structs.replace(_ended(ended_at), exit_code=0))
        [end] = [ev for ev in _run(state, 605.0, c.CancelJob(actor="u", job_id=1))
                 if isinstance(ev, e.JobFinished)]  # fmt: skip
        assert end.reason == want, (ended_at, end)
