"""A run Slurm launched again after slurmctld lost its state (atk43s F3-F6, F11; docs/slurm.md,
"A launch Slurm restarts"): the batch script refuses a second launch of its run, the executor
cancels Slurm's new launch and records how the first one really ended (its own end record, else
killed by Slurm: `node_failure`, never the user's `cancelled`), a run Slurm forgot is adopted and
ends by its own record, and a Slurm id Slurm gave twice starts nothing unmarked."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from ledger.cycle.executor import Launch
from ledger.engines.slurm import SlurmExecutor, parse_jobs
from ledger.engines.slurm.ends import BEAT_EVERY_S, OwnEnd
from ledger.engines.slurm.launch_notes import Notes
from ledger.engines.slurm.relaunch import RELAUNCH_EXIT, first_launch_end, restarted
from ledger.engines.slurm.restarts import NEVER_REACHED_WHY, REUSED_WHY
from ledger.engines.slurm.script import batch_script
from ledger.engines.slurm.tracked import Run
from schemas.events import GpuSlot

LID = "0123abcd4567"
START = 0.0


@pytest.fixture(autouse=True)
def _start() -> None:
    global START
    START = float(int(time.time()) - 60)


def at(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(START + seconds))


def slurm(state: str, start: float | None = 0.0, end: float | None = None, sid: str = "7",
          job: int = 1, code: str = "0:0") -> str:  # fmt: skip
    """Our run (job `job` run 0) as `scontrol -o show job` shows it."""
    starts = "Unknown" if start is None else at(start)
    ends = "Unknown" if end is None else at(end)
    return (
        f"JobId={sid} JobName=gpuledger-{job} UserId=bob(1001) JobState={state} Reason=None"
        f" ExitCode={code} StartTime={starts} EndTime={ends} Partition=gpuledger NodeList=vm"
        f" Comment=gpuledger:{LID}:job={job}:run=0 StdOut=/tmp/y"
    )


class Cancels:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, args: list[str], *_: object, **__: object) -> str:
        self.calls.append(args)
        return ""


def executor(tmp_path: Path) -> tuple[SlurmExecutor, Cancels]:
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    calls = Cancels()
    ex._run = calls  # type: ignore[method-assign]  # Slurm's commands, as called
    return ex, calls


def run_dir(tmp_path: Path, job: int = 1) -> Path:
    d = tmp_path / "checkpoints" / f"{job}.0"
    d.mkdir(parents=True, exist_ok=True)
    return d


def read(ex: SlurmExecutor, text: str, now: float) -> None:
    ex._view = {j.slurm_id: j for j in parse_jobs(text)}
    ex._read_runs(START + now)


def started_run(ex: SlurmExecutor, tmp_path: Path) -> None:
    """Job 1's run, Slurm job 7, recorded started at START (its start noted)."""
    ex._runs = {1: Run(1, 0, None, slurm_id="7", started=True, started_at=START, seen_running_at=START + 5)}  # fmt: skip  # noqa: E501
    ex._restarts.notes.note(1, 0, "7", START)
    (run_dir(tmp_path) / "launched").touch()


# --- the batch script, in bash ---


def test_the_batch_script_never_runs_its_command_a_second_time(tmp_path: Path) -> None:
    """atk43s F4/F6: Slurm launched the same batch job again; the second launch finds the first
    one's marks, leaves `relaunched` and ends with RELAUNCH_EXIT, its command not run, the
    first launch's end record untouched."""
    job = Launch(5, (GpuSlot(node="n1", gpu_indices=(0,)),),
                 ("bash", "-c", f"echo ran >> {tmp_path / 'out'}"), None, "alice", "ai2/olmo")  # fmt: skip  # noqa: E501
    marks = {m: str(tmp_path / m) for m in ("launched", "ended", "relaunched", "alive")}
    script = tmp_path / "batch"
    script.write_text(batch_script(job, launched_file=marks["launched"], ended_file=marks["ended"],
                                   alive_file=marks["alive"], relaunched_file=marks["relaunched"]))  # fmt: skip  # noqa: E501
    first = subprocess.run(["/bin/bash", str(script)], timeout=30, check=False)
    assert first.returncode == 0 and not os.path.exists(marks["relaunched"])
    record = Path(marks["ended"]).read_text()
    second = subprocess.run(["/bin/bash", str(script)], timeout=30, check=False)
    assert second.returncode == RELAUNCH_EXIT
    assert (tmp_path / "out").read_text() == "ran\n"
    assert os.path.exists(marks["relaunched"]) and Path(marks["ended"]).read_text() == record
    os.unlink(marks["ended"])  # a launch mark alone says the same (the first one was killed)
    third = subprocess.run(["/bin/bash", str(script)], timeout=30, check=False)
    assert third.returncode == RELAUNCH_EXIT and (tmp_path / "out").read_text() == "ran\n"


# --- the pure rules ---


@pytest.mark.parametrize(
    ("case", "state", "start", "first", "relaunched", "launched", "want"),
    [
        ("running as first seen", "RUNNING", 0.0, 0.0, None, 1.0, ""),
        ("pending again after its start", "PENDING", None, 0.0, None, 1.0, "pending again"),
        ("its StartTime moved", "RUNNING", 40.0, 0.0, None, 1.0, "StartTime moved"),
        ("a second of Slurm's rounding", "RUNNING", 1.0, 0.0, None, 1.0, ""),
        ("never seen started, pending", "PENDING", None, None, None, None, ""),
        ("the script refused a later launch", "FAILED", 40.0, None, 41.0, 1.0, "launched it again"),
        ("a refusal Slurm does not back", "FAILED", 0.0, None, 1.0, 0.5, ""),
        ("started after its launch mark", "CANCELLED", 17.0, None, None, 1.0, "started it again"),
        ("a launch mark within the margin", "RUNNING", 5.0, None, None, 1.0, ""),
        ("a launch mark after the start", "RUNNING", 0.0, None, None, 30.0, ""),
    ],
)
def test_restarted(
    case: str, state: str, start: float | None, first: float | None, relaunched: float | None,
    launched: float | None, want: str,
) -> None:  # fmt: skip
    (j,) = parse_jobs(slurm(state, start))
    got = restarted(j, None if first is None else START + first,
                    None if relaunched is None else START + relaunched,
                    None if launched is None else START + launched)  # fmt: skip
    assert (got == "") if not want else (want in got), (case, got)


def test_first_launch_end() -> None:
    # its own record, no beat after it: as it says (exit 0: completed, at its real end)
    own = OwnEnd(0, 12.0, False, written=12.3)
    got = first_launch_end(own, 11.0, 0.0, 100.0, 19.0, 5.0, False)
    assert got is not None and (got.exit_code, got.at, got.reason) == (0, 12.0, "exited")
    # signalled first: Slurm's kill, an engine failure
    got = first_launch_end(OwnEnd(143, 20.0, True, 20.1), 19.0, 0.0, 100.0, 19.0, 5.0, False)
    assert got is not None and got.reason == "node_failure" and got.exit_code == 143
    # no record: gone once its heartbeat is a window old, a beat after its last
    assert first_launch_end(None, 90.0, 0.0, 100.0, 19.0, 5.0, True) is None
    got = first_launch_end(None, 30.0, 0.0, 100.0, 19.0, 5.0, False)
    assert got is not None and (got.at, got.reason) == (30.0 + BEAT_EVERY_S, "node_failure")
    # no heartbeat (a directory the service does not see): once Slurm's job has ended
    assert first_launch_end(None, None, 0.0, 100.0, 19.0, 5.0, False) is None
    got = first_launch_end(None, None, 0.0, 100.0, 19.0, 5.0, True)
    assert got is not None and (got.at, got.reason) == (5.0, "node_failure")


# --- the executor ---


def test_a_run_slurm_shows_pending_again_is_cancelled_in_slurm_and_ends_as_it_really_did(
    tmp_path: Path,
) -> None:
    """atk43s F11 (the service up throughout) and F6: a run recorded started shows PENDING
    after slurmctld's return. Slurm's job is cancelled at once (never launched again) and,
    its first launch having exited 0 (its own end record), the run is completed at its real
    end: not `cancelled`, not `failed`, not charged past it."""
    ex, calls = executor(tmp_path)
    started_run(ex, tmp_path)
    read(ex, slurm("PENDING", start=None), 60.0)
    assert ["scancel", "--name=gpuledger-1", "7"] in calls.calls
    assert 1 in ex._runs and ex._exits == []  # its first launch may still run: held
    (run_dir(tmp_path) / "ended").write_text(f"0 {START + 30.0:.6f} 0\n")
    os.utime(run_dir(tmp_path) / "ended")  # its ctime now: written "late" (the record's time kept)
    read(ex, slurm("CANCELLED", start=None, end=61.0), 62.0)
    (x,) = ex._exits
    assert (x.exit_code, x.reason, x.run) == (0, "exited", 0), x
    assert START + 30.0 <= x.at <= START + 62.0 and 1 not in ex._runs


def test_the_cancel_of_slurms_second_launch_names_the_runs_job(tmp_path: Path) -> None:
    """atk44ha F1's rule for `Restarts`: the scancel of a launch Slurm made again carries the
    run's job name (`cluster.scancel_args`), so a controller swapped within scancel's retries,
    which has another job under the id, leaves that job alone (it was a bare `scancel 7`)."""
    ex, calls = executor(tmp_path)
    started_run(ex, tmp_path)
    read(ex, slurm("PENDING", start=None), 60.0)
    cancels = [c for c in calls.calls if c[0] == "scancel"]
    assert cancels == [["scancel", "--name=gpuledger-1", "7"]], cancels


def test_a_run_slurm_killed_and_cancelled_is_a_node_failure_at_its_last_beat(
    tmp_path: Path,
) -> None:
    """atk43s F11: Slurm SIGKILLed the first launch (no end record) and cancelled the job
    nobody in the ledger cancelled: `node_failure` (a resumable job is requeued), ended a beat
    after its last heartbeat, not `cancelled` when last seen before the outage."""
    ex, _ = executor(tmp_path)
    started_run(ex, tmp_path)
    (run_dir(tmp_path) / "alive").touch()  # its last beat: now (START + 60)
    read(ex, slurm("PENDING", start=None), 60.0)
    read(ex, slurm("CANCELLED", start=20.0, end=61.0), 62.0)
    assert ex._exits == [] and 1 in ex._runs  # its beat is fresh: it may live
    read(ex, slurm("CANCELLED", start=20.0, end=61.0), 60.0 + 40.0)
    (x,) = ex._exits
    assert x.reason == "node_failure" and x.reason != "cancelled", x
    assert START + 59.0 <= x.at <= START + 60.0 + BEAT_EVERY_S + 1.0, x.at - START


def test_a_second_launch_slurm_made_after_a_restart_of_the_service_is_cancelled(
    tmp_path: Path,
) -> None:
    """atk43s F4: the service restarted during the outage (its run adopted, not started in
    its memory); Slurm launched the job again (its StartTime moved past the start the executor
    noted). The new launch is cancelled, and the first one, killed, ends `node_failure`."""
    ex, _ = executor(tmp_path)
    ex._restarts.notes.note(1, 0, "7", START)  # kept on disk by the service before
    ex2, calls2 = executor(tmp_path)  # the restarted service
    ex2._runs = {1: Run(1, 0, None, slurm_id="7")}
    d = run_dir(tmp_path)
    (d / "launched").touch()
    read(ex2, slurm("RUNNING", start=45.0), 50.0)
    assert ["scancel", "--name=gpuledger-1", "7"] in calls2.calls and ex2._starts == []
    os.utime(d / "launched")
    (d / "alive").touch()
    read(ex2, slurm("CANCELLED", start=45.0, end=51.0), 60.0 + 45.0)  # its beat is old
    (x,) = ex2._exits
    assert x.reason == "node_failure", x


def test_a_run_slurm_forgot_is_adopted_and_ends_by_its_own_record(tmp_path: Path) -> None:
    """atk43s F3: slurmctld lost the job (it no longer lists it) and the service restarted
    meanwhile; its command had exited 0 (its end record). The run is adopted from the
    executor's own note, not recorded `lost` at once; once it has been missing long enough it
    is recorded as its record says: exit 0, at its real end."""
    ex, _ = executor(tmp_path)
    ex._restarts.notes.note(1, 0, "7", START)
    (run_dir(tmp_path) / "ended").write_text(f"0 {START + 12.0:.6f} 0\n")
    ex2, _ = executor(tmp_path)
    ex2._view = {}
    got = ex2._restarts.unlisted({1: 0, 2: 0}, set(), ex2._checkpoint_file, START + 60)
    assert [(r.job_id, r.slurm_id) for r in got] == [(1, "7")]
    ex2._runs = {r.job_id: r for r in got}
    ex2._read_runs(START + 60.0)
    ex2._read_runs(START + 60.0 + ex2.vanish_after_s)
    (x,) = ex2._exits
    assert (x.exit_code, x.reason) == (0, "exited") and x.at <= START + 61.0, x


def test_a_slurm_id_slurm_gave_twice_starts_nothing_unmarked_and_is_not_charged(
    tmp_path: Path,
) -> None:
    """atk43s F5: Slurm gave a new submission the id of an earlier run of ours it forgot;
    slurmd refused its launch (Duplicate jobid) and Slurm cancelled it. It is not started by
    running unmarked, and ends `launch_failed` (nothing charged), not `cancelled` and
    started."""
    notes = Notes(tmp_path)
    notes.note(17, 0, "25", START - 100)  # job 17's run had Slurm id 25
    ex, _ = executor(tmp_path)
    assert ex._restarts.submitted(20, 0, "25")
    run_dir(tmp_path, 20)
    ex._runs = {20: Run(20, 0, None, slurm_id="25", submitted_at=START)}
    read(ex, slurm("RUNNING", start=1.0, sid="25", job=20), 2.0)
    read(ex, slurm("RUNNING", start=1.0, sid="25", job=20), 20.0)
    assert ex._starts == []
    read(ex, slurm("CANCELLED", start=1.0, end=28.0, sid="25", job=20), 30.0)
    assert ex._starts == []
    (x,) = ex._exits
    assert (x.reason, x.note) == ("launch_failed", REUSED_WHY), x


def test_a_run_whose_id_names_another_job_now_is_not_ended_by_that_job(tmp_path: Path) -> None:
    """atk43s F5: the id of a run of ours that Slurm forgot names another of our runs now:
    the first run is missing (its own record ends it), never ended by the other's state."""
    ex, _ = executor(tmp_path)
    ex._runs = {17: Run(17, 0, None, slurm_id="25", started=True, started_at=START)}
    read(ex, slurm("CANCELLED", start=1.0, end=28.0, sid="25", job=20), 30.0)
    assert ex._exits == [] and ex._runs[17].missing_since == START + 30.0


def test_a_launch_slurmd_refused_on_a_node_whose_marks_are_seen_never_started(
    tmp_path: Path,
) -> None:
    """atk43s F5 with an id of any job Slurm forgot (another ledger's, a foreign one): slurmd
    refused the launch ("Duplicate jobid"), Slurm showed it RUNNING 27 s, then CANCELLED. On a
    node where the service saw a run's launch mark before, a run whose script never marked
    anything (no launch mark, no heartbeat) is not started by running unmarked and ends
    `launch_failed`, nothing charged: not `cancelled` and started."""
    ex, _ = executor(tmp_path)
    placed = Launch(20, (GpuSlot(node="vm", gpu_indices=(0,)),), ("true",), None, "bob", "a/b")
    earlier = Run(19, 0, placed)
    ex._restarts.marks_seen(earlier)  # a launch mark seen on node vm before
    run_dir(tmp_path, 20)
    ex._runs = {20: Run(20, 0, placed, slurm_id="9", submitted_at=START)}
    read(ex, slurm("RUNNING", start=1.0, sid="9", job=20), 2.0)
    read(ex, slurm("RUNNING", start=1.0, sid="9", job=20), 25.0)
    assert ex._starts == []
    read(ex, slurm("CANCELLED", start=1.0, end=28.0, sid="9", job=20), 30.0)
    assert ex._starts == []
    (x,) = ex._exits
    assert (x.reason, x.note) == ("launch_failed", NEVER_REACHED_WHY), x
    # where its script beat, it ran (a job may remove its launch mark: atk43s F2)
    ex2, _ = executor(tmp_path)
    ex2._restarts.marks_seen(earlier)
    (run_dir(tmp_path, 20) / "alive").touch()
    ex2._runs = {20: Run(20, 0, placed, slurm_id="9", submitted_at=START)}
    read(ex2, slurm("RUNNING", start=1.0, sid="9", job=20), 2.0)
    read(ex2, slurm("RUNNING", start=1.0, sid="9", job=20), 25.0)
    assert [s.job_id for s in ex2._starts] == [20]


def test_a_stop_whose_slurm_id_names_another_run_now_never_cancels_that_run(
    tmp_path: Path,
) -> None:
    """atk43s F5: the ledger was stopping job 17's run (Slurm job 25) when slurmctld forgot
    it and gave 25 to job 20's run. The stop is over (its Slurm job is gone); job 20's run is
    never cancelled by it, however long its grace."""
    from ledger.engines.slurm.stops import Stopping

    ex, calls = executor(tmp_path)
    ex._stopping = {"25": Stopping(START, grace_s=2.0, run=(17, 0))}
    read(ex, slurm("RUNNING", start=1.0, sid="25", job=20), 30.0)
    assert ["scancel", "25"] not in calls.calls and ex._stopping == {}


def test_a_launch_slurm_requeued_before_its_script_began_is_left_to_slurms_restart(
    tmp_path: Path,
) -> None:
    """A launch that met a dead slurmd (Slurm showed it RUNNING 10 s: recorded started, its
    start noted) and that Slurm requeued before its script began (no launch mark) is Slurm's
    to start again, its script checking its GPUs (`script_gpus`): not cancelled as a restart."""
    ex, calls = executor(tmp_path)
    ex._runs = {1: Run(1, 0, None, slurm_id="7", started=True, started_at=START, running_seen=START)}  # fmt: skip  # noqa: E501
    ex._restarts.notes.note(1, 0, "7", START)
    run_dir(tmp_path)  # no mark: its script never began
    read(ex, slurm("PENDING", start=None), 14.0)
    read(ex, slurm("RUNNING", start=130.0), 131.0)
    assert not [c for c in calls.calls if c[0] == "scancel"] and ex._restarts.why == {}


def test_a_run_slurm_forgot_while_it_ran_is_gone_when_its_heartbeat_stops(tmp_path: Path) -> None:
    """atk43s F3 with the service up: slurmctld lost the job while its first launch ran; Slurm
    no longer lists it and no end record says how it ended. It is not `lost` while its
    heartbeat is fresh; once that is a window old it ends `node_failure` (Slurm's kill: a
    resumable job is requeued) a beat after its last."""
    from ledger.engines.slurm.restarts import vanished

    r = Run(1, 0, None, slurm_id="7", started=True, started_at=START)
    d = run_dir(tmp_path)
    (d / "alive").touch()  # its last beat: now (START + 60)
    assert vanished(r, d, None, START + 65.0, kill_wait_s=10.0) is None
    gone = vanished(r, d, None, START + 60.0 + 30.0, kill_wait_s=10.0)
    assert gone is not None and gone.reason == "node_failure", gone
    assert START + 59.0 <= gone.at <= START + 60.0 + BEAT_EVERY_S + 1.0


def test_a_run_that_exited_0_in_an_outage_no_read_saw_it_start_in_is_completed(
    tmp_path: Path,
) -> None:
    """atk44s F7: slurmctld killed the moment the launch showed RUNNING, before any read of the
    service; the command ran and exited 0 (its launch mark, beats, end record); the returning
    slurmctld allocated the job again (its StartTime after the launch mark), slurmd refused a
    second copy ("already running") and Slurm cancelled the job. It was recorded started after
    its real end and `cancelled` "outside the ledger", nothing charged. Now: started at its
    launch mark, completed at its own end."""
    ex, _ = executor(tmp_path)
    ex._runs = {1: Run(1, 0, None, slurm_id="7", submitted_at=START)}
    d = run_dir(tmp_path)
    for mark in ("launched", "alive"):
        (d / mark).touch()
    launched = os.lstat(d / "launched").st_ctime
    ended = time.time()
    (d / "ended").write_text(f"0 {ended:.6f} 0\n")
    read(ex, slurm("CANCELLED", start=launched - START + 16, end=launched - START + 17), 80.0)
    (x,) = ex._exits
    assert (x.exit_code, x.reason) == (0, "exited") and x.reason != "cancelled", x
    assert abs(x.at - ended) < 1.5, (x.at, ended)
    (st,) = ex._starts
    assert st.started_at is not None and abs(st.started_at - launched) < 1.0, (st, launched)


def test_a_first_launch_slurm_killed_that_no_read_saw_running_is_a_node_failure(
    tmp_path: Path,
) -> None:
    """atk44s F1: slurmctld killed ~1 s after the sbatch, the service up throughout and no read
    of it seeing the run; the command ran 12.5 s (launch mark, heartbeat) until the returning
    slurmctld's new launch SIGKILLed it, and the script refused that launch (125). It was
    recorded `launch_failed` ("; no start of it was seen: its command never ran"), its resumable
    job not requeued, nothing charged. Now: started at its launch mark, `node_failure` a beat
    after its last heartbeat (a resumable job is requeued)."""
    ex, _ = executor(tmp_path)
    ex._runs = {1: Run(1, 0, None, slurm_id="7", submitted_at=START)}
    d = run_dir(tmp_path)
    for mark in ("launched", "alive", "relaunched"):
        (d / mark).touch()
    launched = os.lstat(d / "launched").st_ctime
    code = f"{RELAUNCH_EXIT}:0"
    failed = slurm("FAILED", start=launched - START + 20, end=launched - START + 21, code=code)
    read(ex, failed, 62.0)
    assert ex._exits == [] and 1 in ex._runs  # its beat is fresh: it may live
    read(ex, failed, 62.0 + 60.0)
    (x,) = ex._exits
    assert x.reason == "node_failure" and x.note.startswith("Slurm "), x
    (st,) = ex._starts
    assert st.started_at is not None and abs(st.started_at - launched) < 1.0, (st, launched)


def test_a_reused_slurm_id_adopted_by_a_restarted_service_starts_nothing_unmarked(
    tmp_path: Path,
) -> None:
    """atk44s F6 (atk43s F5 through a restart): Slurm forgot job 38's id and gave it to job 44's
    submission; the service was killed and restarted, and adopted the job by its name. slurmd
    refused the launch ("already running") and Slurm cancelled it: it was recorded started and
    `cancelled` though its command never ran. The adoption checks the executor's notes as a
    submission does: a reused id, started only by its launch mark, `launch_failed` without."""
    Notes(tmp_path).note(38, 0, "40", START - 100)  # the service before: job 38 had id 40
    ex, _ = executor(tmp_path)
    said = {"text": slurm("RUNNING", start=1.0, sid="40", job=44)}
    ex._run = lambda args, *_, **__: said["text"] if args[-1] == "job" else ""  # type: ignore[method-assign]
    run_dir(tmp_path, 44)
    assert ex.adopt({44: 0}, START + 2.0) == {44}
    read(ex, said["text"], 20.0)  # RUNNING, unmarked, 18 s
    assert ex._starts == []
    read(ex, slurm("CANCELLED", start=1.0, end=28.0, sid="40", job=44), 30.0)
    assert ex._starts == []
    (x,) = ex._exits
    assert (x.reason, x.note) == ("launch_failed", REUSED_WHY), x


def test_a_run_slurm_forgot_before_launching_it_is_submitted_again(tmp_path: Path) -> None:
    """atk44s F4: slurmctld killed right after the sbatch, before its state save: it forgot the
    job and gave its id to the next submission (another user's job). The run's script never
    made a mark on a node whose marks the service sees: it was recorded `failed`, exit -1,
    `lost` ("its run vanished"), its resumable job never run. Now it is submitted again (the
    same run: nothing of it ran), with no end recorded."""
    job = Launch(20, (GpuSlot(node="vm", gpu_indices=(0,)),), ("true",), None, "alice", "ai2/olmo")  # fmt: skip  # noqa: E501
    ex, _ = executor(tmp_path)
    ex._restarts.sharing.add("vm")  # an earlier run's launch mark was seen there
    ex._runs = {20: Run(20, 0, job, slurm_id="25", submitted_at=START)}
    run_dir(tmp_path, 20)
    theirs = slurm("RUNNING", start=5.0, sid="25", job=21)  # the id is job 21's now
    read(ex, theirs, 6.0)
    read(ex, theirs, 6.0 + ex.vanish_after_s)
    assert ex._exits == [] and 20 in ex._runs, ex._exits
    r = ex._runs[20]
    assert (r.slurm_id, r.submitted_at, r.run) == (None, None, 0), r  # submitted again
    # one whose script marked its launch ran: it is never submitted again (its record says)
    ex._runs = {20: Run(20, 0, job, slurm_id="25", submitted_at=START)}
    (run_dir(tmp_path, 20) / "launched").touch()
    read(ex, theirs, 100.0)
    read(ex, theirs, 100.0 + ex.vanish_after_s)
    assert ex._runs.get(20) is None or ex._runs[20].slurm_id == "25"


def test_a_restarted_service_judges_a_run_slurm_forgot_before_launching_from_the_disk(
    tmp_path: Path,
) -> None:
    """atk44s F4 after a restart of the service: the run's resubmission needed a launch mark
    seen in this service's memory (`Restarts.sharing`); a restarted service that had read none
    yet recorded the run `lost`. Now it judges from what lasts: the nodes noted at each
    submission (`<home>/jobs/launches/`) and their runs' launch marks on disk."""
    job = Launch(20, (GpuSlot(node="vm", gpu_indices=(0,)),), ("true",), None, "alice", "ai2/olmo")  # fmt: skip  # noqa: E501
    earlier = Launch(19, (GpuSlot(node="vm", gpu_indices=(1,)),), ("true",), None, "bob", "a/b")
    ex, _ = executor(tmp_path)  # the service before its restart
    ex._restarts.submitted(19, 0, "24", earlier)  # noted at its sbatch, with its node
    (run_dir(tmp_path, 19) / "launched").touch()  # its script ran there
    ex2, _ = executor(tmp_path)  # restarted: nothing read since
    assert ex2._restarts.sharing == set()
    ex2._restarts.submitted(20, 0, "25", job)
    ex2._runs = {20: Run(20, 0, job, slurm_id="25", submitted_at=START)}
    run_dir(tmp_path, 20)
    theirs = slurm("RUNNING", start=5.0, sid="25", job=21)  # Slurm forgot it: 25 is job 21's
    read(ex2, theirs, 6.0)
    read(ex2, theirs, 6.0 + ex2.vanish_after_s)
    assert ex2._exits == [] and 20 in ex2._runs, ex2._exits  # it was `lost`, exit -1
    r = ex2._runs[20]
    assert (r.slurm_id, r.submitted_at, r.run) == (None, None, 0), r  # submitted again
    # where no noted run left a launch mark on its node, the service cannot know: as before
    other = tmp_path / "other"
    ex3, _ = executor(other)
    ex3._restarts.submitted(19, 0, "24", earlier)  # noted, but its script left no mark
    ex3._restarts.submitted(20, 0, "25", job)
    ex3._runs = {20: Run(20, 0, job, slurm_id="25", submitted_at=START)}
    read(ex3, theirs, 6.0)
    read(ex3, theirs, 6.0 + ex3.vanish_after_s)
    assert 20 not in ex3._runs or ex3._runs[20].slurm_id == "25"


def test_a_run_slurm_forgot_that_ran_is_started_at_its_launch_mark(tmp_path: Path) -> None:
    """atk44s F5: slurmctld forgot the job while it ran (no read recorded its start); its command
    completed by its own end record: it was recorded completed at its real end but with no
    start, its running time never charged. Now it is started at its launch mark."""
    ex, _ = executor(tmp_path)
    ex._restarts.notes.note(1, 0, "7")  # submitted, its start never recorded
    d = run_dir(tmp_path)
    for mark in ("launched", "alive"):
        (d / mark).touch()
    launched = os.lstat(d / "launched").st_ctime
    (d / "ended").write_text(f"0 {time.time():.6f} 0\n")
    ex2, _ = executor(tmp_path)
    ex2._view = {}
    ex2._runs = {r.job_id: r for r in ex2._restarts.unlisted({1: 0}, set(), ex2._checkpoint_file, START + 60)}  # fmt: skip  # noqa: E501
    ex2._read_runs(START + 60.0)
    ex2._read_runs(START + 60.0 + ex2.vanish_after_s)
    (x,) = ex2._exits
    assert (x.exit_code, x.reason) == (0, "exited"), x
    (st,) = ex2._starts
    assert st.started_at is not None and abs(st.started_at - launched) < 1.0, (st, launched)
