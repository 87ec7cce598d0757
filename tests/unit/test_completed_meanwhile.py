"""A job that completes by itself just as the ledger stops it is recorded completed, never run
again (atk38-24 F3: a Slurm job exiting 0 between the dispatcher's read and its `scancel` was
recorded preempted, requeued and ran its whole command a second time). One core rule
(`runs.ended_meanwhile`) for every engine: the stopped run's end says its command ended by
itself (`ConfirmRunEnded.by_itself`: Slurm's own end record unsignalled, an agent's exit of a
run it was not stopping), exit 0, and no later run has started. Logs written before (no
`by_itself`) fold and decide as they did."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.cycle.executor import Exit, Start
from ledger.cycle.record import overtaken_command, stopped_commands
from ledger.engines.slurm import SlurmExecutor
from ledger.engines.slurm.ends import OwnEnd
from ledger.engines.slurm.stops import Stopping, ended_by_itself, stopped_end
from ledger.engines.slurm.tracked import Run
from ledger.engines.slurm.words import parse_jobs
from schemas import commands as c
from schemas import events as e
from schemas.codec import decode

LID = "0123abcd4567"
SLOT = e.GpuSlot(node="n1", gpu_indices=(0,))


class _Domain:
    def __init__(self, state: State) -> None:
        self.s = state
        self.clock = itertools.count(2000)
        self.ids = (lambda n: lambda: f"x{next(n)}")(itertools.count(1))

    def __call__(self, cmd: c.AnyCommand) -> list[e.AnyEvent]:
        events = decide(self.s, cmd, float(next(self.clock)), self.ids)
        for ev in events:
            evolve(self.s, ev)
        return events

    def place(self, job: int, run: int = 0) -> None:
        self(c.ApplyDecision(actor="@dispatcher", decision=c.DecisionBody(
            cycle_id=f"c{job}.{run}", based_on=0, policy_version="test",
            placements=(c.Placement(job_id=job, slots=(SLOT,)),))))  # fmt: skip

    def start(self, job: int, run: int = 0) -> None:
        self(c.StartJob(actor="@executor", job_id=job, engine="slurm",
                        engine_job_id=f"7{run}", run=run))  # fmt: skip


def _requeued(org_state: State) -> tuple[_Domain, int]:
    """A resumable 1-GPU job, run 0 started on Slurm, then requeued by an admin."""
    do = _Domain(org_state)
    (sub,) = [ev for ev in do(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1,
                                          min_runtime_s=0, resumable=True))
              if isinstance(ev, e.JobSubmitted)]  # fmt: skip
    do.place(sub.job_id)
    do.start(sub.job_id)
    do(c.RequeueJob(actor="root", job_id=sub.job_id))
    assert (sub.job_id, 0) in org_state.stopped_runs
    return do, sub.job_id


def _end(
    job: int, *, by_itself: bool, code: int = 0, run: int = 0, rule: bool = False
) -> c.ConfirmRunEnded:
    return c.ConfirmRunEnded(actor="@executor", job_id=job, engine="slurm", engine_job_id="70",
                             run=run, ended_at=2001.5, exit_code=code,
                             by_itself=by_itself, exit_decides=rule)  # fmt: skip


@pytest.mark.parametrize("placed_again", [False, True])
def test_a_stopped_run_that_completed_by_itself_completes_its_job(
    org_state: State, placed_again: bool
) -> None:
    do, job = _requeued(org_state)
    if placed_again:  # its next run placed, not started (the executor holds it: F3)
        do.place(job, 1)
    events = do(_end(job, by_itself=True))
    assert [type(ev) for ev in events] == [e.JobRunEnded, e.JobFinished]
    run_end, fin = events
    assert isinstance(run_end, e.JobRunEnded) and run_end.by_itself
    assert isinstance(fin, e.JobFinished)
    assert (fin.outcome, fin.reason, fin.exit_code, fin.ended_at) == (
        "completed", "completed", 0, 2001.5)  # fmt: skip
    assert job not in org_state.active and org_state.holders == {}


@pytest.mark.parametrize(
    ("case", "by_itself", "code", "rule"),
    [("its end unknown (older engines, logs before)", False, 0, False),
     ("its end unknown, failed, under the rule", False, 3, True),
     ("it ended by itself but failed, reported before the rule (s54)", True, 1, False)],
)  # fmt: skip
def test_otherwise_a_stopped_runs_end_is_only_recorded(
    org_state: State, case: str, by_itself: bool, code: int, rule: bool
) -> None:
    do, job = _requeued(org_state)
    events = do(_end(job, by_itself=by_itself, code=code, rule=rule))
    assert [type(ev) for ev in events] == [e.JobRunEnded], case
    assert org_state.jobs[job].status == "pending"


@pytest.mark.parametrize("placed_again", [False, True])
@pytest.mark.parametrize(("case", "code"), [("exit 3", 3), ("a signal of its own", -9)])
def test_a_stopped_run_that_failed_by_itself_fails_its_job_under_the_rule(
    org_state: State, placed_again: bool, case: str, code: int
) -> None:
    """atk53-23 F3: a command that exited non-zero (or by a signal of its own) before a requeue
    reached it was requeued and ran its whole command again; its exit is its outcome (the
    report's rule, `exit_decides`): the job fails with that code, never to run again."""
    do, job = _requeued(org_state)
    if placed_again:
        do.place(job, 1)
    events = do(_end(job, by_itself=True, code=code, rule=True))
    assert [type(ev) for ev in events] == [e.JobRunEnded, e.JobFinished], case
    run_end, fin = events
    assert isinstance(run_end, e.JobRunEnded) and run_end.exit_decides
    assert isinstance(fin, e.JobFinished)
    assert (fin.outcome, fin.reason, fin.exit_code, fin.ended_at) == (
        "failed", "failed", code, 2001.5)  # fmt: skip
    assert f"exit {code}" in fin.note
    assert job not in org_state.active and org_state.holders == {}


def test_every_stopped_runs_end_the_executors_report_is_under_the_rule() -> None:
    x = Exit(1, 3, 2001.5, "exited", "70", "COMPLETED", run=0, by_itself=True)
    (cmd,) = stopped_commands([x], "slurm")
    assert isinstance(cmd, c.ConfirmRunEnded) and cmd.exit_decides and cmd.by_itself


def test_a_job_whose_next_run_started_is_not_completed_by_an_old_runs_end(
    org_state: State,
) -> None:
    do, job = _requeued(org_state)
    do.place(job, 1)
    do.start(job, 1)
    assert [type(ev) for ev in do(_end(job, by_itself=True))] == [e.JobRunEnded]
    assert org_state.jobs[job].status == "running"


def test_an_old_run_ended_record_decodes_without_by_itself() -> None:
    old = (b'{"type":"job.run_ended.v1","event_id":"a","at":1.0,"actor":"@executor",'
           b'"job_id":1,"engine":"slurm","engine_job_id":"7","run":0,"ended_at":1.0,'
           b'"exit_code":0,"killed":false,"note":""}')  # fmt: skip
    ev = decode(old)  # the one decoder: v1 upcast to the latest (v2, no own start)
    assert isinstance(ev, e.JobRunEnded) and ev.by_itself is False and ev.started_at is None


# --- the engines' word -----------------------------------------------------------------------


def _job(state: str, code: str = "0:0") -> str:
    return (
        f"JobId=70 JobName=gpuledger-1 UserId=bob(1001) JobState={state} Reason=None"
        f" ExitCode={code} StartTime=2026-12-01T21:17:50 EndTime=2026-12-01T21:17:58"
        f" Partition=gpuledger NodeList=vm Comment=gpuledger:{LID}:job=1:run=0 StdOut=/tmp/y"
    )


@pytest.mark.parametrize(
    ("case", "own", "refused", "state", "want"),
    [("its record: exit 0, no signal first", OwnEnd(0, 9.0, False), False, "COMPLETED", True),
     ("its record: it caught the stop's TERM and saved", OwnEnd(0, 9.0, True), False,
      "COMPLETED", False),
     ("no record; the TERM found it ended, COMPLETED", None, True, "COMPLETED", True),
     ("no record; the TERM reached it", None, False, "COMPLETED", False),
     ("no record; the TERM found it ended, FAILED (atk53-23 F3)", None, True, "FAILED", True),
     ("no record; the TERM reached it, FAILED", None, False, "FAILED", False)],
)  # fmt: skip
def test_whether_a_stopped_run_ended_by_itself(
    case: str, own: OwnEnd | None, refused: bool, state: str, want: bool
) -> None:
    (j,) = parse_jobs(_job(state, "0:0" if state == "COMPLETED" else "1:0"))
    assert ended_by_itself(own, j, refused) is want, case
    x = stopped_end(Stopping(1.0, run=(1, 0)), j, 2e9, by_itself=want)
    assert x.by_itself is want and (stopped_commands([x], "slurm")[0].by_itself is want)


class _Slurm(SlurmExecutor):
    """The executor reading canned `scontrol` output; every scancel is refused as a job that
    has ended (it completed between the read and the stop)."""

    jobs = ""
    sent: list[list[str]]

    def _run(self, args: list[str], stdin: str | None = None, env: object = None) -> str:
        self.sent.append(args)
        if args[0] == "scancel":
            from schemas.errors import EngineError

            raise EngineError("scancel: error: Kill job error on job id 70: Invalid job id "
                              "specified")  # fmt: skip
        if args[0] == "sbatch":
            return "71\n"
        return "" if "node" in args else self.jobs


def test_the_slurm_executor_says_a_stopped_run_completed_and_holds_its_next_run(
    tmp_path: Path,
) -> None:
    """The run completes (its record: exit 0, unsignalled) just as the ledger requeues it and
    places it again: the stop's SIGTERM finds it gone; the next read reports its end by itself
    and submits nothing for the job in that read (the ledger records it completed first)."""
    from ledger.cycle.executor import Launch, Orders

    ex = _Slurm("gpuledger", LID, tmp_path)
    ex.sent = []
    ex._runs = {1: Run(1, 0, None, slurm_id="70", started=True)}
    ex.jobs = _job("RUNNING")
    ex.observe(100.0, {})
    nxt = Launch(job_id=1, slots=(e.GpuSlot(node="vm", gpu_indices=(0,)),), command=("true",),
                 duration_s=None, user="", account="ai2/olmo", run=1)  # fmt: skip
    ex.carry_out(Orders(launches=(nxt,)), 100.5)  # requeued and placed again: run 0 stops
    assert ex._stopping["70"].term_refused
    record = ex._checkpoint_file(1, 0).with_name("ended")
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text("0 1796305930.17 0\n")
    ex.jobs = _job("COMPLETED")
    seen = ex.observe(101.0, {})
    (x,) = seen.stopped
    assert (x.job_id, x.run, x.exit_code, x.by_itself) == (1, 0, 0, True)
    assert not [a for a in ex.sent if a[0] == "sbatch"]  # held for the ledger's word
    assert 1 in seen.running


def test_an_exit_the_ledger_moved_past_is_the_stopped_runs_end(org_state: State) -> None:
    """The run exited 0 before the executor was told to stop it (an admin's requeue between
    two reads): the exit, which the ledger has moved past, is its stopped run's end, by
    itself; the job completes."""
    do, job = _requeued(org_state)
    x = Exit(job, 0, 2001.5, "exited", "70", "COMPLETED", run=0)
    cmd = overtaken_command(x, org_state, "slurm")
    assert cmd is not None and cmd.by_itself and cmd.run == 0
    assert [type(ev) for ev in do(cmd)] == [e.JobRunEnded, e.JobFinished]
    assert overtaken_command(x, org_state, "slurm") is None  # recorded: awaited no more


@pytest.mark.parametrize(("code", "placed_again"), [(0, False), (0, True), (3, True)])
def test_an_exit_of_a_run_requeued_while_placed_is_its_jobs_outcome(
    org_state: State, code: int, placed_again: bool
) -> None:
    """atk54-23 F1: on Slurm a requeue landed after the placement but before the executor saw
    the run start (its command had exited 0 or 3, its batch script reaping a leftover); the
    next read reported the start and the exit together, the ledger (job pending, no stopped run
    kept for a placed one) dropped both, placed the job again and it ran its whole command a
    second time. Now that exit is the run's end, by itself, charged from its start: the job
    completes (fails with its code), never runs again."""
    do = _Domain(org_state)
    (sub,) = [ev for ev in do(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1,
                                          min_runtime_s=0, resumable=True))
              if isinstance(ev, e.JobSubmitted)]  # fmt: skip
    job = sub.job_id
    do.place(job)
    do(c.RequeueJob(actor="root", job_id=job))
    assert (job, 0) not in org_state.stopped_runs  # placed: no start recorded
    if placed_again:
        do.place(job, 1)
    x = Exit(job, code, 2001.5, "exited", "70", "COMPLETED" if code == 0 else "FAILED", run=0)
    began = Start(job, "70", 0, started_at=2000.5)
    cmd = overtaken_command(x, org_state, "slurm", (began,))
    assert cmd is not None and cmd.by_itself and cmd.run == 0 and cmd.started_at == 2000.5
    evs = do(cmd)
    assert [type(ev) for ev in evs] == [e.JobRunEnded, e.JobFinished]
    done = evs[1]
    assert isinstance(done, e.JobFinished)
    assert (done.outcome, done.exit_code) == (("completed", 0) if code == 0 else ("failed", 3))
    assert overtaken_command(x, org_state, "slurm", (began,)) is None  # recorded once


def test_a_stops_end_of_a_run_requeued_while_placed_is_not_its_outcome(org_state: State) -> None:
    """The same run ended by the stop (not `exited`): only the run's end is the ledger's, and
    none of a run the ledger has started a later run since."""
    do = _Domain(org_state)
    (sub,) = [ev for ev in do(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1,
                                          min_runtime_s=0, resumable=True))
              if isinstance(ev, e.JobSubmitted)]  # fmt: skip
    job = sub.job_id
    do.place(job)
    do(c.RequeueJob(actor="root", job_id=job))
    assert overtaken_command(Exit(job, 143, 2001.5, "cancelled", "70", run=0), org_state, "slurm") is None  # fmt: skip  # noqa: E501
    do.place(job, 1)
    do.start(job, 1)
    assert overtaken_command(Exit(job, 0, 2001.5, "exited", "70", run=0), org_state, "slurm") is None  # fmt: skip  # noqa: E501


def test_an_agents_exit_of_a_run_it_was_not_stopping_is_by_itself(org_ledger: object) -> None:
    from ledger.engines.agents import AgentExecutor
    from ledger.store.application import Ledger
    from schemas import agent as a

    assert isinstance(org_ledger, Ledger)
    ex = AgentExecutor(org_ledger, node_lost_after_s=60.0, grace_s=30.0)
    gone = a.PartExited(job_id=5, run=0, exit_code=0, ended_at=10.0)
    ex.receive(a.Report(node="n1", exited=(gone,)), 11.0)
    (x,) = ex.observe(11.0, dict(org_ledger.state.nodes)).stopped
    assert x.by_itself and x.exit_code == 0


@pytest.mark.parametrize(("reaping_on", "itself"), [(("n1",), False), (("n1", "n2"), True)])
def test_a_gang_parts_exit_is_by_itself_only_if_every_parts_command_had_ended(
    org_ledger: object, reaping_on: tuple[str, ...], itself: bool
) -> None:
    """atk52-23 F2: a part whose command had ended before the stop is told as an exit by itself
    (`PartExited`); for a gang run that is the run's only if every part's command had ended
    (reaping or exited) when the ledger stopped it: a part still running then did not
    complete, and its job is not taken for completed."""
    from ledger.cycle.executor import Orders
    from ledger.engines.agent_runs import AgentRun
    from ledger.engines.agents import AgentExecutor
    from ledger.store.application import Ledger
    from schemas import agent as a

    assert isinstance(org_ledger, Ledger)
    ex = AgentExecutor(org_ledger, node_lost_after_s=60.0, grace_s=30.0)
    r = AgentRun(job_id=5, run=0, nodes=("n1", "n2"), start_reported=True)
    for n in reaping_on:
        r.reaping[n] = a.PartReaping(job_id=5, run=0, leader_ended_at=9.0, kill_at=39.0)
    ex._runs[5] = r
    ex.carry_out(Orders(stops=(5,)), 10.0)
    gone = a.PartExited(job_id=5, run=0, exit_code=0, ended_at=12.0)
    listed = f"{ex.board.epoch}.{ex.board.number('n1')}"
    ex.receive(a.Report(node="n1", exited=(gone,), version=listed, running=()), 12.0)
    # n2 may still run its part: the run has not ended yet (atk53-23 F2)
    assert ex.observe(12.0, dict(org_ledger.state.nodes)).stopped == ()
    listed = f"{ex.board.epoch}.{ex.board.number('n2')}"
    last = a.PartExited(job_id=5, run=0, exit_code=0, ended_at=14.0)
    ex.receive(a.Report(node="n2", exited=(last,), version=listed, running=()), 14.0)
    (x,) = ex.observe(14.0, dict(org_ledger.state.nodes)).stopped
    assert x.by_itself is itself  # the first part's end, told at its last part's
    assert x.at == 14.0


def test_a_stopped_gang_runs_end_waits_for_its_other_nodes_list_to_drop_it(
    org_ledger: object,
) -> None:
    """atk53-23 F2: one part's end of a stopped gang run is recorded only once the other node
    says it no longer has its part (its list, with no exit of its own: its end is the first's)."""
    from ledger.cycle.executor import Orders
    from ledger.engines.agent_runs import AgentRun
    from ledger.engines.agents import AgentExecutor
    from ledger.store.application import Ledger
    from schemas import agent as a

    assert isinstance(org_ledger, Ledger)
    ex = AgentExecutor(org_ledger, node_lost_after_s=60.0, grace_s=30.0)
    ex._runs[5] = AgentRun(job_id=5, run=0, nodes=("n1", "n2"), start_reported=True)
    ex.carry_out(Orders(stops=(5,)), 10.0)
    gone = a.PartExited(job_id=5, run=0, exit_code=0, ended_at=12.0)
    ex.receive(a.Report(node="n1", exited=(gone,)), 12.0)
    assert ex.observe(12.0, dict(org_ledger.state.nodes)).stopped == ()  # n2's part lives on
    still = (a.PartRun(job_id=5, run=0),)
    listed = f"{ex.board.epoch}.{ex.board.number('n2')}"
    ex.receive(a.Report(node="n2", version=listed, running=still), 13.0)
    assert ex.observe(13.0, dict(org_ledger.state.nodes)).stopped == ()
    ex.receive(a.Report(node="n2", version=listed, running=()), 20.0)
    (x,) = ex.observe(20.0, dict(org_ledger.state.nodes)).stopped
    assert (x.job_id, x.at) == (5, 12.0)


class _SlurmSignals(_Slurm):
    """As `_Slurm`, but Slurm takes every scancel (the batch script still ran: it reaped)."""

    def _run(self, args: list[str], stdin: str | None = None, env: object = None) -> str:
        if args[0] == "scancel":
            self.sent.append(args)
            return ""
        return super()._run(args, stdin, env)


def test_a_stopped_run_killed_while_its_script_reaped_ended_by_itself_with_its_code(
    tmp_path: Path,
) -> None:
    """atk54-23 F1 (job 28): the command exited 3 leaving a child that ignores SIGTERM; a
    requeue's SIGTERM came after that exit, while the batch script reaped the child; the
    stop's SIGKILL came before the script wrote its end record. Its `reaping` mark says the
    command ended by itself, exit 3: the run's end is by itself with that code (its job fails
    with it, never runs again). The old code: exit 137, `killed after its grace`, not by
    itself, and the job ran its whole command again."""
    from ledger.cycle.executor import Launch, Orders
    from ledger.engines.slurm.script_tree import REAPING_MARK

    (j,) = parse_jobs(_job("RUNNING"))
    assert j.start_time is not None
    t0 = j.start_time
    ex = _SlurmSignals("gpuledger", LID, tmp_path)
    ex.sent = []
    ex._runs = {1: Run(1, 0, None, slurm_id="70", started=True, started_at=t0)}
    ex.jobs = _job("RUNNING")
    ex.observe(t0 + 1.0, {})
    run_dir = ex._checkpoint_file(1, 0).parent
    run_dir.mkdir(parents=True, exist_ok=True)
    ended_us, kill_us = int((t0 + 1.5) * 1e6), int((t0 + 31.5) * 1e6)
    (run_dir / REAPING_MARK).write_text(f"3 {ended_us} 1 {kill_us}\n")
    nxt = Launch(job_id=1, slots=(e.GpuSlot(node="vm", gpu_indices=(0,)),), command=("true",),
                 duration_s=None, user="", account="ai2/olmo", run=1)  # fmt: skip
    ex.carry_out(Orders(launches=(nxt,)), t0 + 2.0)  # requeued after that exit: run 0 stops
    assert not ex._stopping["70"].term_refused
    ex.jobs = _job("FAILED", "0:9")  # killed after its grace: no end record
    seen = ex.observe(t0 + 8.0, {})
    (x,) = seen.stopped
    assert (x.job_id, x.run, x.exit_code, x.by_itself) == (1, 0, 3, True), x
    assert not [a for a in ex.sent if a[0] == "sbatch"]  # held for the ledger's word


def test_a_reaping_mark_after_the_stops_signal_is_no_exit_by_itself(tmp_path: Path) -> None:
    """The mark says the command ended after the stop's SIGTERM (`since`), or after a signal
    its script noted (the `signalled` mark's ctime): its exit may be the stop's, so the run's
    end is not by itself."""
    import time

    from ledger.engines.slurm.launching import SIGNALLED, reaped_before
    from ledger.engines.slurm.script_tree import REAPING_MARK

    t = time.time()
    (tmp_path / REAPING_MARK).write_text(f"3 {int((t + 10) * 1e6)} 1 {int((t + 40) * 1e6)}\n")
    assert reaped_before(tmp_path, t, t + 5, t + 50, 30.0) is None  # after the stop's TERM
    own = reaped_before(tmp_path, t, t + 20, t + 50, 30.0)
    assert own is not None and (own.exit_code, own.signalled, own.left) == (3, False, 1)
    (tmp_path / SIGNALLED).touch()  # its ctime: before the command's end
    assert reaped_before(tmp_path, t, t + 20, t + 50, 30.0) is None


def test_a_preemption_in_a_time_limits_grace_kills_at_once_and_reports_the_end(
    tmp_path: Path,
) -> None:
    """atk54-23 F2: the executor stops a run at its time limit (SIGTERM, the job's 60 s grace);
    8 s later the ledger preempts it, past its limit: SIGKILL at once (`StoppedRun.kill`), as
    the reads say, and the run's end, once Slurm ends it, is reported (the GPU freed). The old
    code kept the limit's stop, which names no run: no SIGKILL until the limit's grace ended,
    and no end reported at all (the job `stopping`, its GPU held, until a restart)."""
    from ledger.core.state import StoppedRun
    from ledger.cycle.executor import Launch, Orders

    (j,) = parse_jobs(_job("RUNNING"))
    assert j.start_time is not None
    t0 = j.start_time
    ex = _SlurmSignals("gpuledger", LID, tmp_path)
    ex.sent = []
    go = Launch(job_id=1, slots=(SLOT,), command=("true",), duration_s=None, user="",
                account="ai2/olmo", run=0, time_limit_s=60, grace_s=60.0)  # fmt: skip
    ex._runs = {1: Run(1, 0, go, slurm_id="70", started=True, started_at=t0)}
    ex.jobs = _job("RUNNING")
    ex.observe(t0 + 61.0, {})  # its limit: SIGTERM, 60 s of grace
    assert ex._runs[1].limited and ex._stopping["70"].run is None
    stopped = StoppedRun(job_id=1, run=0, slots=(SLOT,), at=t0 + 69.0, grace_s=60, kill=True)
    ex.stopped_runs = lambda: {(1, 0): stopped}
    ex.carry_out(Orders(stops=(1,)), t0 + 69.0)  # preempted in the limit's grace
    ex.sent.clear()
    ex.observe(t0 + 70.0, {})
    assert [a for a in ex.sent if a[0] == "scancel" and "--signal=KILL" in a], ex.sent
    ex.jobs = _job("FAILED", "0:9")
    (x,) = ex.observe(t0 + 72.0, {}).stopped
    assert (x.job_id, x.run) == (1, 0), x
    assert "70" not in ex._stopping
