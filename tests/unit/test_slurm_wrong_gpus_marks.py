"""A run's `wrong-gpus` mark is its user's to write (atk43s F2): a resumable job that removed its
`launched` mark, left `wrong-gpus` and exited 127 within `launch_confirm_s` was recorded
`node_failure` "never ran", requeued, never recorded started: it ran 7 s of every 8 on its GPUs
forever, nothing charged. A run Slurm ran is charged for the time Slurm ran it, a `launched`
mark a read saw is not undone by its removal, and a job whose runs keep claiming wrong GPUs is
placed no more after `WRONG_GPUS_RUNS` in a row. The executor's reads on Slurm's words."""

from __future__ import annotations

import time
from pathlib import Path

from ledger.cycle.executor import Launch
from ledger.engines.slurm import SlurmExecutor, parse_jobs
from ledger.engines.slurm.launching import LAUNCHED, WRONG_GPUS, WRONG_GPUS_RUNS
from ledger.engines.slurm.tracked import Run
from schemas.events import GpuSlot

LID = "0123abcd4567"
START = float(int(time.time()) - 3600)
"""Slurm's StartTime of each run (whole seconds)."""
SLOTS = (GpuSlot(node="n1", gpu_indices=(0, 1)),)


def at(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(START + seconds))


def slurm(run: int, state: str, end: float | None = None, code: str = "0:0") -> str:
    """Slurm's line for the job's run `run` (Slurm job 7), started at START."""
    ends = f" EndTime={at(end)}" if end is not None else " EndTime=Unknown"
    return (
        f"JobId=7 JobName=gpuledger-1 UserId=bob(1001) JobState={state} Reason=None"
        f" ExitCode={code} StartTime={at(0)}{ends} Partition=gpuledger NodeList=n1"
        f" Comment=gpuledger:{LID}:job=1:run={run} StdOut=/tmp/y"
    )


def read(ex: SlurmExecutor, text: str, now: float) -> None:
    ex._view = {j.slurm_id: j for j in parse_jobs(text)}
    ex._read_runs(START + now)


def forged_run(ex: SlurmExecutor, tmp_path: Path, run: int, seen_launched: bool = False) -> None:
    """One run of the attacker's shape: Slurm shows it RUNNING (at 1 s and 5 s, its `launched`
    mark removed by its command, or seen at 1 s with `seen_launched`), then FAILED 127 at 7 s,
    `wrong-gpus` left in its directory."""
    job = Launch(1, SLOTS, ("sh", "-c", "sleep 7"), None, "bob", "ai2/olmo", run=run)
    ex._runs[1] = Run(1, run, job, slurm_id="7")
    run_dir = tmp_path / "checkpoints" / f"1.{run}"
    run_dir.mkdir(parents=True)
    if seen_launched:
        (run_dir / LAUNCHED).touch()
    read(ex, slurm(run, "RUNNING"), 1.0)
    (run_dir / LAUNCHED).unlink(missing_ok=True)
    read(ex, slurm(run, "RUNNING"), 5.0)
    (run_dir / WRONG_GPUS).touch()
    read(ex, slurm(run, "FAILED", end=7.0, code="127:0"), 8.0)


def test_a_run_slurm_ran_is_charged_whatever_its_wrong_gpus_mark_says(tmp_path: Path) -> None:
    """The run is recorded started at Slurm's StartTime (charged to its end at 7 s); it still
    ends `node_failure` (a real restart without GRES is the node's doing)."""
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    forged_run(ex, tmp_path, 0)
    assert [(s.job_id, s.run, s.started_at) for s in ex._starts] == [(1, 0, START)]
    assert [(x.reason, x.at - START) for x in ex._exits] == [("node_failure", 7.0)]


def test_runs_that_keep_claiming_wrong_gpus_are_not_requeued_without_bound(
    tmp_path: Path,
) -> None:
    """Each claim requeued the job (`node_failure`); the `WRONG_GPUS_RUNS`th in a row ends it
    `launch_failed`, its note saying why, and every run is charged."""
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    for run in range(WRONG_GPUS_RUNS):
        forged_run(ex, tmp_path, run)
    assert [x.reason for x in ex._exits] == ["node_failure"] * (WRONG_GPUS_RUNS - 1) + [
        "launch_failed"
    ]
    last = ex._exits[-1].note
    assert last.startswith("Slurm started it without the GPUs")
    assert last.endswith(f"{WRONG_GPUS_RUNS} runs in a row: not placed again")
    assert [s.run for s in ex._starts] == list(range(WRONG_GPUS_RUNS))


def test_a_run_that_ended_otherwise_starts_the_count_again(tmp_path: Path) -> None:
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    for run in range(WRONG_GPUS_RUNS - 1):
        forged_run(ex, tmp_path, run)
    n = WRONG_GPUS_RUNS - 1
    ex._runs[1] = Run(1, n, Launch(1, SLOTS, ("true",), None, "bob", "ai2/olmo", run=n), "7")
    read(ex, slurm(n, "FAILED", end=30.0, code="1:0"), 31.0)
    forged_run(ex, tmp_path, n + 1)
    assert [x.reason for x in ex._exits][-2:] == ["exited", "node_failure"]


def test_a_launched_mark_a_read_saw_is_not_undone_by_its_removal(tmp_path: Path) -> None:
    """Seen at the first read, the mark said the command ran: its later removal and a
    `wrong-gpus` mark do not make the run one that never ran; it ends as Slurm says (failed,
    127), not requeued."""
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    forged_run(ex, tmp_path, 0, seen_launched=True)
    assert [(s.run, s.started_at) for s in ex._starts] == [(0, START)]
    assert [(x.reason, x.exit_code, x.note) for x in ex._exits] == [("exited", 127, "")]
