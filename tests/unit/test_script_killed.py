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


def test_a_forged_end_record_never_makes_a_run_slurm_ended_by_a_signal_its_own(
    tmp_path: Path,
) -> None:
    """atk55-23 F4: the job wrote `0 <its start + 1> 0` as its end record (a file its user
    writes) and killed its own batch script with -9: Slurm said FAILED 0:9, and the ledger took
    the record's exit, `completed`. A script a signal killed wrote no record: Slurm's word is
    the outcome (137, failed), and the note says the record was not taken."""
    from ledger.engines.slurm.launching import run_end
    from ledger.engines.slurm.words import parse_jobs

    line = ("JobId=23 JobName=gpuledger-23 JobState=FAILED Reason=NonZeroExitCode ExitCode=0:9"
            " StartTime=2026-12-02T01:11:47 EndTime=2026-12-02T01:12:10 Partition=gpuledger"
            " NodeList=vm Comment=x")  # fmt: skip
    (j,) = parse_jobs(line)
    assert j.end_time is not None and j.start_time is not None and j.exit_signal == 9
    (tmp_path / END_RECORD).write_text(f"0 {j.start_time + 1} 0\n")  # forged
    now = j.end_time + 1.5
    code, at, own = run_end(tmp_path, j, j.start_time, now, None, None, (None, 0.0))
    assert (code, at, own) == (137, j.end_time, False)
    note = script_killed(tmp_path, "FAILED", 137, j.start_time, now, 30.0, signalled=True)
    assert note.startswith("its batch script was killed by signal 9"), note
    assert note.endswith("is not its script's and was not taken"), note
    # its script's own exit 137 (a command killed by SIGKILL: `137:0`) keeps its record's word
    (mine,) = parse_jobs(line.replace("ExitCode=0:9", "ExitCode=137:0"))
    (tmp_path / END_RECORD).write_text(f"137 {j.end_time - 1} 0\n")
    code, at, own = run_end(tmp_path, mine, j.start_time, now, None, None, (None, 0.0))
    assert (code, own) == (137, True)
    # Slurm's own `0:1` (a batch job a returning slurmctld found missing): its record's word
    (missing,) = parse_jobs(line.replace("ExitCode=0:9", "ExitCode=0:1"))
    (tmp_path / END_RECORD).write_text(f"0 {j.end_time - 1} 0\n")
    assert run_end(tmp_path, missing, j.start_time, now, None, None, (None, 0.0))[::2] == (0, True)
