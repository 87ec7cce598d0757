"""Foreign Slurm jobs count against the ledger's capacity: running on any partition that shares
its nodes, or pending while they still hold an allocation (a requeue releasing it)."""

from __future__ import annotations

from pathlib import Path

from ledger.engines.slurm import SlurmExecutor, parse_jobs
from ledger.engines.slurm.words import slurm_time

LID = "0123abcd4567"


def line(job: int, state: str, partition: str, gres: str) -> str:
    detail = f" Nodes=vm CPU_IDs=0 Mem=0 GRES={gres}" if gres else ""
    return (
        f"JobId={job} JobName=train UserId=bob(1001) JobState={state} Reason=None ExitCode=0:0"
        f" StartTime=Unknown Partition={partition} NodeList=vm{detail} Comment=mine StdOut=/tmp/y"
    )


def foreign_of(tmp_path: Path, *lines: str) -> dict[str, frozenset[int]]:
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    ex._view = {j.slurm_id: j for j in parse_jobs("\n".join(lines))}
    ex._read_runs(0.0)
    return ex._foreign


def test_running_foreign_jobs_of_any_partition_hold_their_gpus(tmp_path: Path) -> None:
    got = foreign_of(
        tmp_path,
        line(1, "RUNNING", "gpuledger", "gpu:fake_0:1(IDX:0)"),
        line(2, "RUNNING", "other", "gpu:fake_3:1(IDX:3)"),
    )
    assert got == {"vm": frozenset({0, 3})}


def test_a_pending_foreign_job_with_an_allocation_holds_it_one_without_does_not(
    tmp_path: Path,
) -> None:
    got = foreign_of(
        tmp_path,
        line(1, "PENDING", "other", "gpu:fake_1:1(IDX:1)"),  # requeued, still releasing
        line(2, "PENDING", "gpuledger", ""),  # waiting: holds nothing yet
        line(3, "COMPLETED", "gpuledger", "gpu:fake_2:1(IDX:2)"),
    )
    assert got == {"vm": frozenset({1})}


# --- a node Slurm gives up while our runs had ended by themselves ------------------------------


def ours(job: int, slurm_id: int, state: str) -> str:
    return (
        f"JobId={slurm_id} JobName=gpuledger-{job} UserId=bob(1001) JobState={state} Reason=None"
        " ExitCode=0:0 StartTime=2026-12-01T21:17:50 EndTime=2026-12-01T21:18:11"
        f" Partition=gpuledger NodeList=vm Comment=gpuledger:{LID}:job={job}:run=0 StdOut=/tmp/y"
    )


class FakeSlurm(SlurmExecutor):
    """The executor reading canned `scontrol` output instead of asking Slurm."""

    jobs = ""
    nodes_text = ""

    def _run(self, args: list[str], stdin: str | None = None) -> str:
        return self.nodes_text if "node" in args else self.jobs


def node(state: str) -> str:
    return f"NodeName=vm Gres=gpu:fake_0:1,gpu:fake_1:1 State={state} Partitions=gpuledger"


def test_a_run_that_completed_on_a_node_slurm_gives_up_is_recorded_before_the_loss(
    tmp_path: Path,
) -> None:
    """A slurmd away: the runs' batch scripts end (Slurm holds them COMPLETING, their exits
    known) until Slurm marks the node DOWN. The runs are recorded as they ended (exit 0, not
    node_failure: a completed job is never requeued and run again), and the node's loss and
    the runs that really ended with it (NODE_FAIL) come one read later."""
    from ledger.core.state import Node
    from ledger.engines.slurm.tracked import Run as _Run

    ex = FakeSlurm("gpuledger", LID, tmp_path)
    ex._runs = {
        1: _Run(1, 0, None, slurm_id="1", started=True),
        2: _Run(2, 0, None, slurm_id="2", started=True),
    }
    ledger_nodes = {"vm": Node(name="vm", cluster="c", gpu_type="fake", gpus=2, state="active")}
    ex.jobs = "\n".join([ours(1, 1, "COMPLETING"), ours(2, 2, "RUNNING")])
    ex.nodes_text = node("DOWN+NOT_RESPONDING")
    seen = ex.observe(100.0, ledger_nodes)
    assert (seen.nodes, seen.exits) == ((), ())  # the loss waits for job 1's own end
    assert "vm" in seen.unobserved
    ex.jobs = "\n".join([ours(1, 1, "COMPLETED"), ours(2, 2, "NODE_FAIL")])
    seen = ex.observe(101.0, ledger_nodes)
    assert [(x.job_id, x.exit_code, x.reason) for x in seen.exits] == [(1, 0, "exited")]
    assert seen.nodes == ()
    seen = ex.observe(102.0, ledger_nodes)
    assert [(ch.node, ch.change, ch.fence_s) for ch in seen.nodes] == [("vm", "lost", 300.0)]
    # job 2 may live on under its slurmstepd (its slurmd is away): in doubt, not ended yet
    assert seen.exits == () and 2 in seen.running
    end = slurm_time("2026-12-01T21:18:11")  # Slurm's EndTime of its NODE_FAIL
    ex.nodes_text = node("DOWN")  # its slurmd answers: Slurm's kill reaches job 2 from now
    assert ex.observe(end + 3.0, ledger_nodes).exits == ()
    assert ex.observe(end + 4.0, ledger_nodes).exits == ()
    # KillWait (30 s) after its node answered, decided once SlurmdTimeout has passed (an
    # answering node may hide a dead slurmd until Slurm's next ping)
    assert ex.observe(end + 33.0, ledger_nodes).exits == ()
    seen = ex.observe(end + ex.slurmd_timeout_s, ledger_nodes)
    assert [(x.job_id, x.reason, x.at) for x in seen.exits] == [(2, "node_failure", end + 33.0)]


# --- a run Slurm shows RUNNING is started once its script runs (N3 of the re-test of issue 23) --


def our_run(state: str, reason: str = "None", code: str = "0:0", end: str = "21:17:51") -> str:
    return (
        f"JobId=7 JobName=gpuledger-1 UserId=bob(1001) JobState={state} Reason={reason}"
        f" ExitCode={code} StartTime=2026-12-01T21:17:50 EndTime=2026-12-01T{end}"
        f" Partition=gpuledger NodeList=vm Comment=gpuledger:{LID}:job=1:run=0 StdOut=/tmp/y"
    )


def watched(tmp_path: Path) -> FakeSlurm:
    from ledger.engines.slurm.tracked import Run as _Run

    ex = FakeSlurm("gpuledger", LID, tmp_path)
    ex._runs = {1: _Run(1, 0, None, slurm_id="7")}
    return ex


def reads(ex: FakeSlurm, text: str, now: float) -> None:
    ex._view = {j.slurm_id: j for j in parse_jobs(text)}
    ex._read_runs(now)


def test_a_run_seen_running_before_slurm_fails_its_launch_never_started(tmp_path: Path) -> None:
    """Slurm shows a run RUNNING from its allocation, then fails the launch (an output file its
    user cannot open: Reason=JobLaunchFailure, ExitCode 0:53). A read between the two recorded
    a start; now the start waits for the batch script's mark, and the job ends
    `launch_failed` with why and no start, as on the node agents."""
    ex = watched(tmp_path)
    reads(ex, our_run("RUNNING"), 100.0)
    reads(ex, our_run("RUNNING"), 101.0)
    assert ex._starts == []
    reads(ex, our_run("FAILED", "JobLaunchFailure", "0:53"), 102.0)
    assert ex._starts == []
    assert [(x.job_id, x.reason, x.exit_code) for x in ex._exits] == [(1, "launch_failed", -1)]
    assert "JobLaunchFailure" in ex._exits[0].note


def test_a_launched_run_starts_at_slurms_start_time_once_its_script_marks_it(
    tmp_path: Path,
) -> None:
    """N5: the start recorded is Slurm's StartTime (not when it was seen), as soon as the
    script's mark is there; without a mark (a node that does not share the service's
    directory) after `launch_confirm_s` of running, with the same StartTime."""
    from ledger.engines.slurm.words import slurm_time

    ex = watched(tmp_path)
    reads(ex, our_run("RUNNING"), 100.0)
    assert ex._starts == []
    mark = ex._checkpoint_file(1, 0).with_name("launched")
    mark.parent.mkdir(parents=True)
    mark.touch()
    reads(ex, our_run("RUNNING"), 100.5)
    (start,) = ex._starts
    assert start.started_at == slurm_time("2026-12-01T21:17:50")
    ex = watched(tmp_path / "unshared")
    reads(ex, our_run("RUNNING"), 100.0)
    reads(ex, our_run("RUNNING"), 100.0 + ex.launch_confirm_s - 0.1)
    assert ex._starts == []
    reads(ex, our_run("RUNNING"), 100.0 + ex.launch_confirm_s)
    assert [s.started_at for s in ex._starts] == [slurm_time("2026-12-01T21:17:50")]


def test_a_script_that_cannot_enter_its_directory_is_launch_failed_unless_it_started(
    tmp_path: Path,
) -> None:
    """Issue 23's note: the batch script leaves `cannot-enter` (and never `launched`) when its
    `cd` fails, and ends 127 at once: the run ends `launch_failed` with why and no start. A
    mark found beside `launched`, for a run recorded started, or for a run Slurm ran longer
    than a failing `cd` takes, is not believed (the job's own user may write the directory,
    atk23d F6: a job forged it to run uncharged): it ends as Slurm says."""
    ex = watched(tmp_path)
    run_dir = ex._checkpoint_file(1, 0).parent
    run_dir.mkdir(parents=True)
    (run_dir / "cannot-enter").touch()
    reads(ex, our_run("RUNNING"), 100.0)
    assert ex._starts == []
    reads(ex, our_run("FAILED", code="127:0"), 101.0)
    ((x),) = ex._exits
    assert (x.reason, x.note) == ("launch_failed", "cannot enter the working directory"), x
    assert ex._starts == []
    ex = watched(tmp_path)
    (run_dir / "launched").touch()
    reads(ex, our_run("RUNNING"), 100.0)
    assert len(ex._starts) == 1  # the launch mark wins
    reads(ex, our_run("FAILED", code="127:0"), 101.0)
    ((x),) = ex._exits
    assert (x.reason, x.exit_code) == ("exited", 127) and len(ex._starts) == 1, x
    (run_dir / "launched").unlink()  # forged: the job took its launch mark away
    ex = watched(tmp_path)
    reads(ex, our_run("RUNNING"), 100.0)
    reads(ex, our_run("RUNNING"), 100.0 + ex.launch_confirm_s)  # it runs: started by time
    assert len(ex._starts) == 1
    ex = watched(tmp_path)  # first seen after it ended, 45 s after its start
    reads(ex, our_run("COMPLETED", end="21:18:35"), 200.0)
    ((x),) = ex._exits
    assert x.reason != "launch_failed" and len(ex._starts) == 1, x


# --- a stop whose SIGTERM was never sent before a restart (atk36-23 F2) -------------------------


class SentSlurm(FakeSlurm):
    """FakeSlurm that also keeps the `scancel` commands it was asked to run."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.sent: list[list[str]] = []

    def _run(self, args: list[str], stdin: str | None = None) -> str:
        if args[0] == "scancel":
            self.sent.append(args)
            return ""
        return super()._run(args, stdin)


TERM_5 = [
    ["scancel", "--signal=TERM", "--name=gpuledger-1", "5"],
    ["scancel", "--signal=TERM", "--batch", "--name=gpuledger-1", "5"],
]
"""The executor's SIGTERM of job 1's Slurm job 5: its steps, then its batch shell, never
`--full` (`cluster.term_args`, atk58 F1)."""


def test_a_run_found_after_a_restart_gets_sigterm_and_its_grace_unless_one_was_sent(
    tmp_path: Path,
) -> None:
    """The service stopped between a cancel and carrying it out: Slurm still runs the run the
    ledger no longer runs. It gets SIGTERM and its whole grace from the restart, as the node
    agents give it (it was cancelled at once, its grace counted from a cancel it never heard
    of); a run whose SIGTERM was sent before the restart gets only what is left."""
    from ledger.engines.slurm.tracked import note_stop

    ex = SentSlurm("gpuledger", LID, tmp_path)
    ex.job_grace = lambda _job: 30.0
    ex._view = {j.slurm_id: j for j in parse_jobs(ours(1, 5, "RUNNING"))}
    ex._read_runs(1_000.0)
    assert ex.sent == TERM_5

    again = SentSlurm("gpuledger", LID, tmp_path / "b")
    again.job_grace = lambda _job: 30.0
    note_stop(again.log_dir, "5", 900.0)  # its SIGTERM went out 100 s before: grace over
    again._view = {j.slurm_id: j for j in parse_jobs(ours(1, 5, "RUNNING"))}
    again._read_runs(1_000.0)
    assert again.sent == [["scancel", "--signal=KILL", "--batch", "--name=gpuledger-1", "5"]]


def test_a_run_found_after_a_restart_past_its_recorded_kill_time_is_killed_at_once(
    tmp_path: Path,
) -> None:
    """atk47-23 F3 on Slurm: the ledger recorded the stop (`State.stopped_runs`, at 900 with a
    30 s grace) and the service died before its scancel. A restart at 1,000 finds the run: its
    SIGKILL was due at 930, as every read said, so it is killed at once (SIGTERM, then the
    batch step's SIGKILL in the same read), not given a whole new grace from the restart."""
    from ledger.core.state import StoppedRun
    from schemas.events import GpuSlot

    stop = StoppedRun(job_id=1, run=0, slots=(GpuSlot(node="vm", gpu_indices=(0,)),), at=900.0,
                      grace_s=30)  # fmt: skip
    ex = SentSlurm("gpuledger", LID, tmp_path)
    ex.job_grace = lambda _job: 30.0
    ex.stopped_runs = lambda: {(1, 0): stop}
    ex._view = {j.slurm_id: j for j in parse_jobs(ours(1, 5, "RUNNING"))}
    ex._read_runs(1_000.0)
    assert ex.sent[-1] == ["scancel", "--signal=KILL", "--batch", "--name=gpuledger-1", "5"]
    early = SentSlurm("gpuledger", LID, tmp_path / "b")  # inside its grace: SIGTERM, and waits
    early.job_grace = lambda _job: 30.0
    early.stopped_runs = lambda: {(1, 0): stop}
    early._view = {j.slurm_id: j for j in parse_jobs(ours(1, 5, "RUNNING"))}
    early._read_runs(910.0)
    assert early.sent == TERM_5
