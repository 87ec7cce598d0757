"""A launch Slurm held CONFIGURING while the service was down (killed -9 during the hold,
restarted after the hold ended): no read saw the hold, and Slurm 22.05 keeps its StartTime at
the allocation. The adopted run starts at its `launched` mark (never before Slurm's
StartTime), and its limit counts from there (atk45s F1: a `-t 30s` job got SIGTERM 9.2 s after
its command began, and one with no limit that ran 9.5 s was charged 28 s). The executor reads
Slurm's own words (`scontrol` lines, fed to `_run`)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ledger.engines.slurm.launching import LAUNCHED
from ledger.engines.slurm.tracked import real_start
from tests.unit.test_slurm_stop_unseen import NODES, START, Slurm, executor, job


def test_an_adopted_run_starts_at_its_launched_mark() -> None:
    """Pure: an adopted run (no read saw whether Slurm held it) starts at its mark, kept inside
    Slurm's bounds; a run this service saw start keeps Slurm's StartTime, as before."""
    assert real_start(100.0, None, 125.0, None, adopted=True) == 125.0  # held while down
    assert real_start(100.0, None, 125.0, 130.0, adopted=True) == 125.0
    assert real_start(100.0, None, 140.0, 130.0, adopted=True) == 130.0  # a mark made late
    assert real_start(100.0, None, 90.0, None, adopted=True) == 100.0  # never before Slurm's
    assert real_start(100.0, None, None, None, adopted=True) == 100.0  # no mark: Slurm's
    assert real_start(None, None, 125.0, None, adopted=True) is None
    assert real_start(100.0, None, 125.0, None) == 100.0  # not adopted, never held


def adopted(tmp_path: Path, slurm: Slurm, limit_s: float | None) -> tuple[object, float, float]:
    """The executor restarted after the hold: job 1 run 0 running in Slurm, its StartTime (the
    allocation) 300 s before its `launched` mark."""
    ex = executor(tmp_path, slurm)
    ex.job_limit = lambda job_id: limit_s  # type: ignore[method-assign]
    run_dir = ex._checkpoint_file(1, 0).parent
    run_dir.mkdir(parents=True)
    (run_dir / LAUNCHED).touch()  # its command began now, long after Slurm's StartTime
    launched = os.lstat(run_dir / LAUNCHED).st_ctime
    now = time.time()
    assert ex.adopt({1: 0}, now) == {1}
    return ex, launched, now


def test_an_adopted_held_run_keeps_its_limit_from_its_launched_mark(tmp_path: Path) -> None:
    """`-t 30s`: not stopped at once (30 s from the allocation are long past), but 30 s after
    its command began."""
    slurm = Slurm()
    ex, launched, now = adopted(tmp_path, slurm, 30.0)
    (start,) = ex.observe(now + 1, NODES).starts  # type: ignore[attr-defined]
    assert start.started_at == launched, (start.started_at - START, launched - START)
    assert not ex._runs[1].limited  # type: ignore[attr-defined]
    ex.observe(launched + 29, NODES)  # type: ignore[attr-defined]
    assert not ex._runs[1].limited  # type: ignore[attr-defined]
    ex.observe(launched + 30, NODES)  # type: ignore[attr-defined]
    assert ex._runs[1].limited  # type: ignore[attr-defined]


def test_an_adopted_held_run_that_ended_while_the_service_was_down_starts_at_its_mark(
    tmp_path: Path,
) -> None:
    """No limit, ended before the restart's first read: charged from its mark, not from the
    allocation."""
    slurm = Slurm()
    end_s = int(time.time() - START) + 10  # its command ran 10 s after its mark
    slurm.jobs = job("COMPLETED", end_s)
    ex, launched, now = adopted(tmp_path, slurm, None)
    seen = ex.observe(now + 12, NODES)  # type: ignore[attr-defined]
    (start,) = seen.starts
    assert start.started_at == launched, (start.started_at - START, launched - START)
    (end,) = seen.exits
    assert start.started_at <= end.at
