"""atk46-s F1: a run cancelled while `placed` (its start unseen) whose command started anyway
(a launch held CONFIGURING, released while the service was down) is stopped by a restarted
service as a stray, a stop the ledger does not keep (`State.stopped_runs` holds only runs it
recorded running). A second kill of the service during that stop lost it: the next restart
found the Slurm job ended and recorded nothing for the run (57.6 GPU-s uncharged). The stop is
now noted on disk (`strays`); these build the situations from Slurm's answers."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ledger.engines.slurm.executor import SlurmExecutor
from ledger.engines.slurm.launching import LAUNCHED
from ledger.engines.slurm.strays import STRAY
from tests.unit.test_slurm_stop_unseen import NODES, START, Slurm, executor, job, node_line

MARK = START + 3.0  # when the command started (its launch mark)


def first_restart(tmp_path: Path) -> tuple[Slurm, SlurmExecutor, float]:
    """The first restart: job 1's run 0, cancelled while placed (not in `stopped_runs`), runs in
    Slurm (job 7) with its launch mark: stopped as a stray (SIGTERM), then the service dies."""
    slurm = Slurm()
    slurm.node = node_line("MIXED")
    ex = executor(tmp_path, slurm)
    run_dir = ex._checkpoint_file(1, 0).parent
    run_dir.mkdir(parents=True)
    (run_dir / LAUNCHED).touch()
    now = time.time()
    ex.adopt({}, now)  # the run is no run of the ledger's: a stray
    ex.observe(now + 0.5, NODES)
    assert "7" in ex._stopping and ex._stopping["7"].run == (1, 0)
    assert any("--signal=TERM" in said for said in slurm.said), slurm.said  # its SIGTERM
    return slurm, ex, now


def launched_at(ex: SlurmExecutor) -> float:
    return os.lstat(ex._checkpoint_file(1, 0).parent / LAUNCHED).st_ctime


def test_a_second_kill_during_a_stray_s_stop_still_records_its_end(tmp_path: Path) -> None:
    """Killed again in the stop's KillWait, the service is restarted once Slurm has ended the
    job (CANCELLED): the run's end is recorded, its start the launch mark. Before: nothing
    (`resumed_stops` skips an ended Slurm job the ledger holds no stop of)."""
    slurm, ex, now = first_restart(tmp_path)
    mark = launched_at(ex)
    assert (tmp_path / "stops" / ("7" + STRAY)).is_file()  # fsynced before the kill
    end_s = int(now - START) + 2
    slurm.jobs = job("CANCELLED", end_s, "0:15")
    again = executor(tmp_path, slurm)  # kill -9, restart
    again.adopt({}, now + 10)
    (end,) = again.observe(now + 10.5, NODES).stopped
    assert (end.job_id, end.run, end.engine_job_id) == (1, 0, "7"), end
    assert end.at == START + end_s, end  # Slurm's end of it
    assert end.started_at == max(mark, START), end  # its own start: the launch mark
    # reported once; the note goes when the ledger holds the end
    assert again.observe(now + 11, NODES).stopped == ()
    assert (tmp_path / "stops" / ("7" + STRAY)).is_file()
    again.strays.recorded = lambda tag: tag == (1, 0)
    again.observe(now + 12, NODES)
    assert not (tmp_path / "stops" / ("7" + STRAY)).exists()


def test_a_stray_slurm_forgot_ends_by_its_marks_with_its_noted_start(tmp_path: Path) -> None:
    """Slurm no longer lists it (purged, or its state lost) and its mark is gone: its end from
    its marks (`forgotten_end`), its start as noted."""
    slurm, ex, now = first_restart(tmp_path)
    mark = launched_at(ex)
    (ex._checkpoint_file(1, 0).parent / LAUNCHED).unlink()
    slurm.jobs = ""
    again = executor(tmp_path, slurm)
    again.adopt({}, now + 3600)
    (end,) = again.observe(now + 3600.5, NODES).stopped
    assert (end.job_id, end.run) == (1, 0) and end.started_at == min(mark, end.at), end


def test_a_recorded_stray_s_note_is_dropped_and_nothing_reported(tmp_path: Path) -> None:
    """The first process's report was recorded before the kill: the restart reports nothing."""
    slurm, _, now = first_restart(tmp_path)
    slurm.jobs = job("CANCELLED", int(now - START) + 2, "0:15")
    again = executor(tmp_path, slurm)
    again.strays.recorded = lambda tag: tag == (1, 0)
    again.adopt({}, now + 10)
    assert again.observe(now + 10.5, NODES).stopped == ()
    assert not (tmp_path / "stops" / ("7" + STRAY)).exists()


def test_a_stray_whose_command_never_started_is_not_noted(tmp_path: Path) -> None:
    """No launch mark: nothing ran, nothing to charge; no note."""
    slurm = Slurm()
    ex = executor(tmp_path, slurm)
    now = time.time()
    ex.adopt({}, now)
    ex.observe(now + 0.5, NODES)
    assert "7" in ex._stopping
    assert not (tmp_path / "stops" / ("7" + STRAY)).exists()


def test_the_process_that_noted_a_stray_reports_its_end_once(tmp_path: Path) -> None:
    """Without a kill: the stop ends as it always did, reported once; no second take-up while
    the ledger has not recorded it yet."""
    slurm, ex, now = first_restart(tmp_path)
    slurm.jobs = job("CANCELLED", int(now - START) + 2, "0:15")
    (end,) = ex.observe(now + 10, NODES).stopped
    assert end.started_at == max(launched_at(ex), START), end
    slurm.jobs = ""  # and Slurm forgets it
    assert ex.observe(now + 11, NODES).stopped == ()
    assert ex.observe(now + 12, NODES).stopped == ()


def test_a_restart_that_finds_the_stray_running_stops_it_and_reports_its_end_once(
    tmp_path: Path,
) -> None:
    """Killed during the grace, the service is back while Slurm still runs the job: it is a
    stray again (`resume_stops`, what is left of its grace), its note kept; its end once."""
    slurm, _, now = first_restart(tmp_path)
    again = executor(tmp_path, slurm)
    again.adopt({}, now + 1)
    again.observe(now + 1.5, NODES)
    assert "7" in again._stopping
    slurm.jobs = job("CANCELLED", int(now - START) + 2, "0:15")
    (end,) = again.observe(now + 10, NODES).stopped
    assert end.started_at is not None and (end.job_id, end.run) == (1, 0), end
    assert again.observe(now + 11, NODES).stopped == ()
    slurm.jobs = ""
    assert again.observe(now + 12, NODES).stopped == ()
