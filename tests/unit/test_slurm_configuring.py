"""A launch Slurm holds CONFIGURING (a slow PrologSlurmctld: Slurm 22.05 keeps its StartTime
at the allocation) has not started (atk43s F1: a `-t 30s` job held 20 s was recorded started
during the hold, charged from the allocation, and got 11 s of its 30). Its start is when its
command started: after the last read that showed it CONFIGURING, from its `launched` mark
where a read saw it, no later than the first read that showed it RUNNING; its limit counts
from there. The executor's reads on Slurm's words."""

from __future__ import annotations

import time
from pathlib import Path

from ledger.cycle.executor import Launch
from ledger.engines.slurm import SlurmExecutor, parse_jobs
from ledger.engines.slurm.launching import LAUNCHED
from ledger.engines.slurm.tracked import Run, real_start
from schemas.events import GpuSlot

LID = "0123abcd4567"
START = float(int(time.time()) - 3600)
"""Slurm's StartTime of the run: its allocation (whole seconds)."""


def slurm(state: str) -> str:
    alloc = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(START))
    return (
        f"JobId=7 JobName=gpuledger-1 UserId=bob(1001) JobState={state} Reason=None"
        f" ExitCode=0:0 StartTime={alloc} EndTime=Unknown Partition=gpuledger NodeList=n1"
        f" Comment=gpuledger:{LID}:job=1:run=0 StdOut=/tmp/y"
    )


def executor(tmp_path: Path, limit_s: int | None = None) -> SlurmExecutor:
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    job = Launch(1, (GpuSlot(node="n1", gpu_indices=(0,)),), ("true",), None, "bob", "ai2/olmo",
                 time_limit_s=limit_s)  # fmt: skip
    ex._runs[1] = Run(1, 0, job, slurm_id="7")
    (tmp_path / "checkpoints" / "1.0").mkdir(parents=True)
    return ex


def read(ex: SlurmExecutor, state: str, now: float) -> None:
    ex._view = {j.slurm_id: j for j in parse_jobs(slurm(state))}
    ex._read_runs(START + now)


def test_a_launch_held_configuring_is_not_started_nor_charged_during_the_hold(
    tmp_path: Path,
) -> None:
    """Held 20 s (reads every second), then RUNNING without a mark seen (a node that does not
    share the directory): started after 10 s RUNNING, charged from the hold's end, not from
    Slurm's StartTime."""
    ex = executor(tmp_path)
    for t in range(1, 21):
        read(ex, "CONFIGURING", t)
    assert ex._starts == [] and ex._runs[1].started_at is None
    for t in range(21, 33):
        read(ex, "RUNNING", t)
    assert [s.started_at - START for s in ex._starts] == [20.0]


def test_its_launched_mark_says_when_its_command_started(tmp_path: Path) -> None:
    ex = executor(tmp_path)
    for t in range(1, 21):
        read(ex, "CONFIGURING", t)
    (tmp_path / "checkpoints" / "1.0" / LAUNCHED).touch()  # its ctime: later than START + 22
    read(ex, "RUNNING", 22)
    assert [s.started_at - START for s in ex._starts] == [22.0]  # no later than that read


def test_its_time_limit_counts_from_its_real_start(tmp_path: Path) -> None:
    """A `-t 30s` launch held 20 s: not stopped at 30 s from the allocation, at 30 s from its
    start."""
    ex = executor(tmp_path, limit_s=30)
    for t in range(1, 21):
        read(ex, "CONFIGURING", t)
    for t in range(21, 50):
        read(ex, "RUNNING", t)
    assert not ex._runs[1].limited
    read(ex, "RUNNING", 50)
    assert ex._runs[1].limited


def test_real_start() -> None:
    """Pure: Slurm's StartTime unless a read saw it CONFIGURING; the mark's time kept inside
    the Slurm bounds (never before the hold's last read, never after the first RUNNING read)."""
    assert real_start(100.0, None, 150.0, 160.0) == 100.0  # never held: Slurm's, as before
    assert real_start(None, 120.0, None, None) is None
    assert real_start(100.0, 120.0, None, None) == 120.0
    assert real_start(100.0, 120.0, 121.5, 122.0) == 121.5
    assert real_start(100.0, 120.0, 140.0, 122.0) == 122.0  # a mark made late by its user
    assert real_start(100.0, 120.0, 110.0, 122.0) == 120.0  # a mark made during the hold
