"""atk53-23 F8 (explain's half): on Slurm a job's own process (a leftover its batch script was
ending) killed that script with -9: Slurm says FAILED 0:9, no end record, and the ledger, which
stopped nothing, records the job failed (137). The note of its end (`launching.script_killed`,
shown by `explain` and `jobs`) says so in words: a process of the job's own killed its batch
script, and what the script's `reaping` mark said of the command's own end. Before: the note
was empty, `explain` said only "failed ..., exit code 137"."""

from __future__ import annotations

from pathlib import Path

from ledger.engines.slurm.launching import END_RECORD, script_killed
from ledger.engines.slurm.script_tree import REAPING_MARK
from schemas.units import when

T0 = 1_800_000_000.0


def test_a_batch_script_killed_by_a_signal_nobody_of_the_ledger_sent_says_so(
    tmp_path: Path,
) -> None:
    note = script_killed(tmp_path, "FAILED", 137, T0, T0 + 60, 30.0)
    assert note.startswith("its batch script was killed by signal 9 before it wrote its end "
                           "record, though neither the ledger nor Slurm stopped it: a process "
                           "of the job's own"), note  # fmt: skip
    # its command had exited 0 leaving a child, which the script was ending (its mark)
    (tmp_path / REAPING_MARK).write_text(f"0 {int((T0 + 5) * 1e6)} 1 {int((T0 + 35) * 1e6)}\n")
    note = script_killed(tmp_path, "FAILED", 137, T0, T0 + 60, 30.0)
    want = f"its command exited 0 and ended at {when(T0 + 5)} leaving 1 process(es); its batch"
    assert note.startswith(want + " script was killed by signal 9"), note
    assert note.endswith(", while it was ending them"), note


def test_an_end_of_its_own_or_not_by_a_signal_says_nothing_more(tmp_path: Path) -> None:
    assert script_killed(tmp_path, "FAILED", 3, T0, T0 + 60, 30.0) == ""
    assert script_killed(tmp_path, "COMPLETED", 0, T0, T0 + 60, 30.0) == ""
    assert script_killed(tmp_path, "CANCELLED", 143, T0, T0 + 60, 30.0) == ""
    (tmp_path / END_RECORD).write_text(f"137 {T0 + 9} 0\n")  # the script's own record: its word
    assert script_killed(tmp_path, "FAILED", 137, T0, T0 + 60, 30.0) == ""
