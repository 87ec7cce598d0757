"""atk42-24 F4: a run adopted after a restart keeps its output and error files: the executor
notes them at submission in its own directory (Slurm's record has /dev/null)."""

from __future__ import annotations

from pathlib import Path

from ledger.engines.slurm.tracked import forget_logs, note_logs, noted_logs


def test_a_runs_logs_noted_at_submit_are_read_back_and_forgotten_once_it_ended(
    tmp_path: Path,
) -> None:
    """An adopted run's logs come from the service's own note, not from Slurm's record; the
    notes of runs no longer adopted are forgotten."""
    note_logs(tmp_path, 3, 0, ("/w/o-3.out", "/w/e-3.err"))
    note_logs(tmp_path, 4, 1, ("/w/o-4.out",))
    assert noted_logs(tmp_path, 3, 0) == ("/w/o-3.out", "/w/e-3.err")
    assert noted_logs(tmp_path, 3, 1) == ()
    assert (tmp_path / "runs").stat().st_mode & 0o077 == 0
    assert (tmp_path / "runs" / "3.0").stat().st_mode & 0o077 == 0
    forget_logs(tmp_path, [(4, 1)])
    assert noted_logs(tmp_path, 3, 0) == () and noted_logs(tmp_path, 4, 1) == ("/w/o-4.out",)
    (tmp_path / "runs" / "5.0").write_text('{"not": "a list"}')
    assert noted_logs(tmp_path, 5, 0) == ()
