"""The batch script's `reaping` mark (`script_tree.REAPING_MARK`) as the Slurm executor reads it
(`launching.reaping_said`): its command's code, end, leftovers and their SIGKILL, kept inside the
run and within the job's grace of that end (the mark is the job user's word); none for a link,
a FIFO or words that do not read. The script writes it before its SIGTERM."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ledger.engines.slurm.launching import reaping_said
from ledger.engines.slurm.script_tree import REAPING_MARK, reap_lines


def _mark(run_dir: Path, words: str) -> None:
    (run_dir / REAPING_MARK).write_text(words + "\n")


def test_the_mark_says_the_commands_code_end_leftovers_and_sigkill(tmp_path: Path) -> None:
    _mark(tmp_path, "0 1000500000 2 1030500000")
    said = reaping_said(tmp_path, 900.0, 2000.0, 30.0)
    assert said is not None
    assert (said.exit_code, said.leader_ended_at, said.left, said.kill_at) == (0, 1000.5, 2, 1030.5)


@pytest.mark.parametrize(
    ("words", "want"),
    [
        ("-1 1000000000 1 1010000000", (None, 1000.0, 1, 1010.0)),  # no code said
        ("0 100000000 1 9000000000", (0, 900.0, 1, 931.0)),  # before its start; SIGKILL bound
        ("0 1000000000 1 10", (0, 1000.0, 1, 1000.0)),  # a SIGKILL before its end
    ],
)
def test_the_marks_times_are_kept_inside_the_run_and_its_grace(
    tmp_path: Path, words: str, want: tuple[object, ...]
) -> None:
    _mark(tmp_path, words)
    said = reaping_said(tmp_path, 900.0, 2000.0, 30.0)
    assert said is not None
    assert (said.exit_code, said.leader_ended_at, said.left, said.kill_at) == want


def test_a_mark_made_in_the_reads_cycle_keeps_its_own_time(tmp_path: Path) -> None:
    """atk55-23 F5: the mark was made after the cycle began (its `now`), before its read; its
    time was cut to `now`, and the ledger's `leader_ended_at` (and its SIGKILL) came 1.2 s
    before the command's real exit, which `explain`'s note said. Now the mark's own time, no
    later than its ctime (a time its user wrote past that is cut to it)."""
    exited = time.time()
    _mark(tmp_path, f"0 {int(exited * 1e6)} 2 {int((exited + 6.0) * 1e6)}")
    said = reaping_said(tmp_path, exited - 100.0, exited - 1.2, 5.0)
    assert said is not None
    assert said.leader_ended_at == pytest.approx(exited, abs=1e-6), (said, exited)
    assert said.kill_at == pytest.approx(exited + 6.0, abs=1e-6)
    ahead = exited + 3600.0  # a time past its writing: cut to when it was written
    _mark(tmp_path, f"3 {int(ahead * 1e6)} 1 {int(ahead * 1e6)}")
    said = reaping_said(tmp_path, exited - 100.0, exited - 1.2, 5.0)
    assert said is not None and exited <= said.leader_ended_at <= time.time(), said


@pytest.mark.parametrize("words", ["", "0 x 1 2", "0 1 2"])
def test_a_mark_that_does_not_read_says_nothing(tmp_path: Path, words: str) -> None:
    _mark(tmp_path, words)
    assert reaping_said(tmp_path, 0.0, 2000.0, 30.0) is None


def test_a_link_or_a_fifo_is_never_read(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("0 1000000000 1 1010000000\n")
    (tmp_path / REAPING_MARK).symlink_to(target)
    assert reaping_said(tmp_path, 0.0, 2000.0, 30.0) is None
    (tmp_path / REAPING_MARK).unlink()
    os.mkfifo(tmp_path / REAPING_MARK)
    assert reaping_said(tmp_path, 0.0, 2000.0, 30.0) is None


def test_the_script_writes_the_mark_before_its_sigterm() -> None:
    lines = "\n".join(reap_lines(20, "/runs/1/ended", beating=True))
    assert lines.index(f"/runs/1/{REAPING_MARK}") < lines.index("kill -TERM")
    assert "/runs/1/ended.code" in lines
    assert REAPING_MARK not in "\n".join(reap_lines(20, "", beating=False))
