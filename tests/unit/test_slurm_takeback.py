"""A run the executor took back (Slurm would not start it: cancelled, its job `launch_failed`,
nothing charged) that a slurmctld restart brings back (atk45s F5: run to completion by Slurm,
unseen, while the ledger placed another job on its GPUs): the executor marks it `taken-back`
before its cancel, the batch script then ends before anything of the job's, and a Slurm job of
the run listed again after its end was reported is stopped again (docs/slurm.md, "A run Slurm
will not start")."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from ledger.cycle.executor import Launch
from ledger.engines.slurm import SlurmExecutor, parse_jobs
from ledger.engines.slurm.ends import BEAT_EVERY_S, OwnEnd, beat_window, ended_unseen
from ledger.engines.slurm.launching import TAKEN_BACK, run_script
from ledger.engines.slurm.script import TAKEN_BACK_EXIT, batch_script
from ledger.engines.slurm.stops import still_ended
from ledger.engines.slurm.tracked import Run
from ledger.engines.slurm.words import SbatchUser
from schemas.events import GpuSlot

LID = "0123abcd4567"
START = float(int(time.time()) - 60)


def at(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(START + seconds))


def slurm(state: str, reason: str = "None", start: float | None = None,
          end: float | None = None) -> str:  # fmt: skip
    """Job 1 run 0, Slurm job 7, as `scontrol -o show job` shows it."""
    starts = "Unknown" if start is None else at(start)
    ends = "Unknown" if end is None else at(end)
    return (
        f"JobId=7 JobName=gpuledger-1 UserId=bob(1001) JobState={state} Reason={reason}"
        f" ExitCode=0:0 StartTime={starts} EndTime={ends} Partition=gpuledger NodeList=vm"
        f" Comment=gpuledger:{LID}:job=1:run=0 StdOut=/tmp/y"
    )


def job(out: Path) -> Launch:
    return Launch(1, (GpuSlot(node="vm", gpu_indices=(0,)),),
                  ("bash", "-c", f"echo ran >> {out}"), None, "bob", "ai2/olmo")  # fmt: skip


# --- the batch script, in bash ---


def test_a_taken_back_run_s_script_ends_before_anything_of_the_job_s(tmp_path: Path) -> None:
    """With its `taken-back` mark there (a link counts), the script exits TAKEN_BACK_EXIT at
    once: its command never runs, and it leaves no launch mark, no beat, no end record."""
    marks = {m: str(tmp_path / m) for m in ("launched", "ended", "relaunched", "alive", TAKEN_BACK)}  # fmt: skip  # noqa: E501
    script = tmp_path / "batch"
    script.write_text(batch_script(job(tmp_path / "out"), launched_file=marks["launched"],
                                   ended_file=marks["ended"], alive_file=marks["alive"],
                                   relaunched_file=marks["relaunched"],
                                   taken_back_file=marks[TAKEN_BACK]))  # fmt: skip
    os.symlink(tmp_path / "nowhere", marks[TAKEN_BACK])
    refused = subprocess.run(["/bin/bash", str(script)], timeout=30, check=False)
    assert refused.returncode == TAKEN_BACK_EXIT
    assert not (tmp_path / "out").exists()
    assert not any(os.path.lexists(marks[m]) for m in ("launched", "ended", "relaunched", "alive"))
    os.unlink(marks[TAKEN_BACK])  # not taken back: it runs as always
    ran = subprocess.run(["/bin/bash", str(script)], timeout=30, check=False)
    assert ran.returncode == 0 and (tmp_path / "out").read_text() == "ran\n"


def test_the_run_s_script_looks_for_its_taken_back_mark_beside_its_checkpoint(
    tmp_path: Path,
) -> None:
    """The script the executor submits (`run_script`) refuses when its run directory holds the
    mark (the old script had no such check and ran the command)."""
    run_dir = tmp_path / "checkpoints" / "1.0"
    run_dir.mkdir(parents=True)
    text = run_script(job(tmp_path / "out"), SbatchUser(), run_dir / "checkpoint", 0o022, (),
                      0o077, "", 60, (), 40)  # fmt: skip
    (run_dir / TAKEN_BACK).touch()
    script = tmp_path / "batch"
    script.write_text(text)
    refused = subprocess.run(["/bin/bash", str(script)], timeout=30, check=False)
    assert refused.returncode == TAKEN_BACK_EXIT and not (tmp_path / "out").exists()


# --- the executor ---


class Calls:
    """Slurm's commands as called; for each `scancel`, whether the run's mark was there."""

    def __init__(self, run_dir: Path) -> None:
        self.calls: list[list[str]] = []
        self.marked: list[bool] = []
        self.run_dir = run_dir

    def __call__(self, args: list[str], *_: object, **__: object) -> str:
        self.calls.append(args)
        if args[0] == "scancel":
            self.marked.append(os.path.lexists(self.run_dir / TAKEN_BACK))
        return ""

    def cancels(self) -> list[list[str]]:
        return [a for a in self.calls if a[0] == "scancel" and a[-1] == "7"]


def read(ex: SlurmExecutor, text: str, now: float) -> None:
    ex._view = {j.slurm_id: j for j in parse_jobs(text)}
    ex._read_runs(START + now)


@pytest.mark.parametrize("again", ["PENDING", "RUNNING"])
def test_a_taken_back_run_slurm_lists_again_is_marked_first_and_stopped(
    tmp_path: Path, again: str
) -> None:
    """The take-back marks the run `taken-back` before its `scancel`; once its end is reported,
    a restarted slurmctld that lists its job again, pending or running, gets it stopped (the
    old executor skipped it: its id was among the ends it had reported)."""
    run_dir = tmp_path / "checkpoints" / "1.0"
    run_dir.mkdir(parents=True)
    ex = SlurmExecutor("gpuledger", LID, tmp_path, start_within_s=300.0)
    calls = Calls(run_dir)
    ex._run = calls  # type: ignore[method-assign]
    ex._runs = {1: Run(1, 0, job(tmp_path / "out"), slurm_id="7", submitted_at=START)}
    read(ex, slurm("PENDING", "Resources"), 300.0)
    (x,) = ex._exits
    assert (x.job_id, x.reason) == (1, "launch_failed") and 1 not in ex._runs
    assert len(calls.cancels()) == 1 and calls.marked == [True]
    read(ex, slurm("CANCELLED", end=300.0), 302.0)  # its end: reported
    read(ex, slurm("CANCELLED", end=300.0), 304.0)
    assert len(calls.cancels()) == 1
    start = 340.0 if again == "RUNNING" else None
    read(ex, slurm(again, start=start), 341.0)  # slurmctld restarted: the cancel lost
    # a plain scancel of a pending job; a running one's SIGTERM, steps then batch shell
    assert len(calls.cancels()) == (3 if again == "RUNNING" else 2), calls.calls
    assert "7" in ex._stopping  # its GPUs held `stopping` until Slurm ends it


def test_still_ended() -> None:
    """Reported ends Slurm lists ended stay skipped; forgotten or listed alive again do not."""
    view = {j.slurm_id: j for j in parse_jobs(slurm("CANCELLED", end=1.0))}
    assert still_ended({"7", "8"}, view) == {"7"}
    alive = {j.slurm_id: j for j in parse_jobs(slurm("PENDING"))}
    assert still_ended({"7"}, alive) == set()


# --- atk45s F3: a run Slurm lists running after its own end ---


def test_ended_unseen() -> None:
    """Its own record and a beat `window` old: ended; no record, no beat, or a fresh beat: not.
    A beat more than a beat after the record was written does not count (`record_beat`)."""
    own = OwnEnd(0, 100.0, False, written=100.0)
    assert ended_unseen(own, 99.0, 99.0 + 30.0, 30.0)
    assert not ended_unseen(own, 99.0, 99.0 + 29.0, 30.0)
    assert not ended_unseen(None, 99.0, 500.0, 30.0)
    assert not ended_unseen(own, None, 500.0, 30.0)
    assert ended_unseen(own, 125.0, 100.0 + BEAT_EVERY_S + 30.0, 30.0)  # touched from outside


def test_a_run_slurm_lists_running_after_its_own_end_ends_by_its_record(tmp_path: Path) -> None:
    """A run that exited 0 just before slurmctld lost its state is listed RUNNING with nothing
    of it alive: once its heartbeat is `beat_window` stale it ends by its own end record
    (exit 0, at the record's time), and Slurm's job is cancelled. The old executor kept it
    running, its GPUs held, as long as Slurm listed it."""
    run_dir = tmp_path / "checkpoints" / "1.0"
    run_dir.mkdir(parents=True)
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    calls = Calls(run_dir)
    ex._run = calls  # type: ignore[method-assign]
    ex._runs = {1: Run(1, 0, job(tmp_path / "out"), slurm_id="7", started=True,
                       started_at=START, seen_running_at=START)}  # fmt: skip
    real = time.time()
    (run_dir / "alive").touch()
    (run_dir / "launched").touch()
    window = beat_window(ex.kill_wait_s)
    read(ex, slurm("RUNNING", start=0.0), real - START + window - 5.0)  # no record: it runs
    assert ex._exits == [] and 1 in ex._runs
    (run_dir / "ended").write_text(f"0 {real:.6f} 0\n")
    read(ex, slurm("RUNNING", start=0.0), real - START + window - 3.0)  # its beat fresh
    assert ex._exits == [] and 1 in ex._runs and calls.cancels() == []
    read(ex, slurm("RUNNING", start=0.0), real - START + window + 1.0)
    (x,) = ex._exits
    assert (x.job_id, x.exit_code, x.reason, x.run) == (1, 0, "exited", 0), x
    assert real - 1.0 <= x.at <= real + 1.0 and 1 not in ex._runs
    assert calls.cancels() == [["scancel", "--signal=KILL", "--batch", "--name=gpuledger-1", "7"]]


# --- a taken-back run Slurm ran all the same: its script's exit 124 is no run of the job's ---


def test_a_taken_back_run_slurm_ran_again_as_a_stray_is_recorded_never_ran(
    tmp_path: Path,
) -> None:
    """After its take-back was reported, a rewound slurmctld lists the run RUNNING: stopped
    again, its script exits 124 at once (its mark), Slurm ends it FAILED 124. Its end is
    recorded as a run whose command never ran, no start of its own (the old executor recorded
    Slurm's FAILED 124 as the run's end, as if its command had run and failed)."""
    run_dir = tmp_path / "checkpoints" / "1.0"
    run_dir.mkdir(parents=True)
    ex = SlurmExecutor("gpuledger", LID, tmp_path, start_within_s=300.0)
    ex._run = Calls(run_dir)  # type: ignore[method-assign]
    ex._runs = {1: Run(1, 0, job(tmp_path / "out"), slurm_id="7", submitted_at=START)}
    read(ex, slurm("PENDING", "Resources"), 300.0)  # taken back: marked, cancelled
    read(ex, slurm("CANCELLED", end=300.0), 302.0)
    ex._exits.clear()
    read(ex, slurm("RUNNING", start=340.0), 341.0)  # the cancel lost: stopped again
    failed = slurm("FAILED", start=340.0, end=340.0).replace("ExitCode=0:0", "ExitCode=124:0")
    read(ex, failed, 343.0)
    (x,) = ex._stopped
    assert (x.job_id, x.run, x.started_at) == (1, 0, None), x
    assert "the command never ran" in x.note, x.note


def test_a_taken_back_run_the_executor_still_carries_ends_launch_failed_uncharged(
    tmp_path: Path,
) -> None:
    """A run of the job's current run marked taken back (a leader that took it back and lost
    its lease before its end was recorded; an adopted run) that Slurm ran, exit 124 at once:
    `launch_failed`, no start recorded (the old executor recorded its start at Slurm's
    StartTime and its end FAILED 124: charged, `failed`)."""
    run_dir = tmp_path / "checkpoints" / "1.0"
    run_dir.mkdir(parents=True)
    (run_dir / TAKEN_BACK).touch()
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    ex._run = Calls(run_dir)  # type: ignore[method-assign]
    ex._runs = {1: Run(1, 0, None, slurm_id="7", adopted=True)}
    failed = slurm("FAILED", start=10.0, end=10.0).replace("ExitCode=0:0", "ExitCode=124:0")
    read(ex, failed, 12.0)
    (x,) = ex._exits
    assert (x.job_id, x.reason, x.exit_code) == (1, "launch_failed", -1), x
    assert "never ran" in x.note and ex._starts == []
