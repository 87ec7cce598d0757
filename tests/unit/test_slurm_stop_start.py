"""A run the ledger stopped while placed, before any read saw it start, whose command ran (atk44s
F3: requeued while Slurm held it CONFIGURING, the service killed before its `stopping` mark; the
hold ended and the command ran 14 s until the restarted service's stop ended it): its recorded
end carries its own start, its launch mark (`Exit.started_at` -> `job.run_ended.v2`
`started_at`), so the run is charged (tests/unit/test_charged_from_start.py). The executor reads
Slurm's own words (`scontrol` lines, fed to `_run`)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from ledger.engines.slurm.launching import LAUNCHED
from tests.unit.test_slurm_stop_unseen import NODES, START, Slurm, executor, job, node_line


def test_a_stop_of_a_run_never_recorded_started_reports_its_launch_mark_as_its_start(
    tmp_path: Path,
) -> None:
    slurm = Slurm()
    slurm.jobs = job("RUNNING")  # Slurm runs it; the ledger requeued it while placed
    slurm.node = node_line("MIXED")
    ex = executor(tmp_path, slurm)
    ex.stopped_runs = lambda: {}  # stopped while placed: not a run stopped while it ran
    run_dir = ex._checkpoint_file(1, 0).parent
    run_dir.mkdir(parents=True)
    (run_dir / LAUNCHED).touch()  # its command began (the batch script's launch mark)
    launched = os.lstat(run_dir / LAUNCHED).st_ctime
    now = time.time()
    assert ex.adopt({}, now) == set()
    ex.observe(now + 0.5, NODES)  # the restart stops it: SIGTERM, its grace
    assert "7" in ex._stopping
    end_s = int(now - START) + 2  # its command ended (TERM, exit 0) a second or two later
    slurm.jobs = job("COMPLETED", end_s)
    (end,) = ex.observe(now + 3.0, NODES).stopped
    assert (end.job_id, end.run) == (1, 0), end
    assert end.started_at == launched, (end.started_at, launched)  # it was None: uncharged
    assert end.started_at <= end.at


def test_a_stop_that_came_before_its_command_reports_no_start(tmp_path: Path) -> None:
    """atk43s F10's side: the script ended it before its command started (its end record, the
    stop first, no launch mark): no start, nothing charged."""
    slurm = Slurm()
    slurm.jobs = job("RUNNING")
    ex = executor(tmp_path, slurm)
    ex.stopped_runs = lambda: {}
    run_dir = ex._checkpoint_file(1, 0).parent
    run_dir.mkdir(parents=True)
    now = time.time()
    ex.adopt({}, now)
    ex.observe(now + 0.5, NODES)
    (run_dir / "ended").write_text(f"143 {now + 1:.6f} 1\n")
    slurm.jobs = job("FAILED", int(now - START) + 2, "143:0")
    (end,) = ex.observe(now + 3.0, NODES).stopped
    assert end.started_at is None and "never ran" in end.note, end


def test_explain_says_a_run_stopped_before_its_start_was_seen_is_charged_from_its_own_start() -> (
    None
):
    from ledger.reads.explain import run_ended_line
    from schemas import events as e

    ev = e.JobRunEnded(event_id="x", at=1_000.0, actor="@executor", job_id=11, engine="slurm",
                       engine_job_id="7", run=0, ended_at=990.0, started_at=975.0)  # fmt: skip
    line = run_ended_line(ev)
    assert "charged from its own start at" in line and "before seeing it start" in line, line
    plain = run_ended_line(msgspec.structs.replace(ev, started_at=None))
    assert "own start" not in plain
