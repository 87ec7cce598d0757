"""The batch script checks, on the node and before it opens anything, that the job's working
directory and its output files' directories are there and its user's to use; when not, it ends
127 before the command, with why in the run's mark, which the executor records as the launch's
reason (`launching.never_ran`). The real batch script in bash."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from ledger.cycle.executor import Launch
from ledger.engines.slurm.launching import CANNOT_ENTER, CANNOT_OPEN, never_ran
from ledger.engines.slurm.script import batch_script
from ledger.engines.slurm.script_files import output_lines
from ledger.engines.slurm.words import SlurmJob
from schemas.events import GpuSlot

ONE = (GpuSlot(node="n1", gpu_indices=(0,)),)


def _run(tmp_path: Path, workdir: Path, out: Path) -> tuple[int, bool, str, str]:
    """(exit code, whether the command ran, the mark left and what it says, stderr)."""
    marks, ran = tmp_path / "marks", tmp_path / "ran"
    marks.mkdir()
    job = Launch(5, ONE, ("sh", "-c", f": > {ran}"), None, "alice", "ai2/olmo",
                 workdir=str(workdir), stdout=str(out))  # fmt: skip
    script = tmp_path / "batch"
    script.write_text(batch_script(job, launched_file=str(marks / "launched"),
                                   cannot_enter_file=str(marks / CANNOT_ENTER),
                                   cannot_open_file=str(marks / CANNOT_OPEN),
                                   outputs=[(str(out), None)]))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["SLURMD_NODENAME"] = "n1"
    done = subprocess.run(["/bin/bash", str(script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    left = [m.name for m in marks.iterdir() if m.name != "launched"]
    said = (marks / left[0]).read_text().strip() if left else ""
    return (
        done.returncode,
        ran.exists(),
        ",".join(left) + (f": {said}" if said else ""),
        done.stderr,
    )


@pytest.mark.parametrize(
    ("case", "want_mark"),
    [
        ("the working directory is gone", f"{CANNOT_ENTER}: cannot enter the working directory "
         "{wd}: no such directory on node n1"),
        ("the working directory is a file", f"{CANNOT_ENTER}: cannot enter the working directory "
         "{wd}: no such directory on node n1"),
        ("the output's directory is gone", CANNOT_OPEN + ": cannot open the output file {out}: "
         "its directory {outdir} does not exist on node n1"),
        ("all is there", ""),
    ],
)  # fmt: skip
def test_the_script_says_why_the_jobs_directories_cannot_be_used_and_never_runs_it(
    tmp_path: Path, case: str, want_mark: str
) -> None:
    wd, outdir = tmp_path / "proj dir", tmp_path / "logs"
    out = outdir / "o-5.out"
    if case != "the working directory is gone":
        wd.mkdir() if case != "the working directory is a file" else wd.write_text("")
    if case != "the output's directory is gone":
        outdir.mkdir()
    code, ran, mark, err = _run(tmp_path, wd, out)
    want = want_mark.format(wd=wd, out=out, outdir=outdir)
    assert mark == want, (case, mark, err)
    assert (code, ran) == ((0, True) if not want else (127, False)), (case, code, err)
    if want:
        assert f"gpuledger: {want.split(': ', 1)[1]}" in err


def test_the_executor_records_the_scripts_why_and_only_a_why_of_its_kind(tmp_path: Path) -> None:
    """The mark's line is the launch's reason; a line of another kind (the mark is the job
    user's to write) is not believed: the executor's own words are kept."""
    job = Launch(5, ONE, ("true",), None, "alice", "ai2/olmo", workdir="/w")
    ended = SlurmJob(slurm_id="7", name="", state="FAILED", partition="p", comment="",
                     exit_code=127, start_time=100.0, end_time=100.5, started=True)  # fmt: skip
    (tmp_path / CANNOT_ENTER).write_text("cannot enter the working directory /w: gone on n1\n")
    assert never_ran(ended, job, (), tmp_path, False, 10.0) == (
        "cannot enter the working directory /w: gone on n1"
    )
    (tmp_path / CANNOT_ENTER).write_text("Slurm started it without the GPUs the ledger placed\n")
    assert (
        never_ran(ended, job, (), tmp_path, False, 10.0) == "cannot enter the working directory /w"
    )
    (tmp_path / CANNOT_ENTER).unlink()
    (tmp_path / CANNOT_OPEN).write_text("cannot open the output file /o: its directory /\x1b[2J")
    assert never_ran(ended, job, ("/o",), tmp_path, False, 10.0) == (
        "cannot open the output file /o: its directory /[2J"
    )


@pytest.mark.parametrize("slow", [0.0, 0.05])
def test_the_opens_watchdog_leaves_no_process_once_the_open_is_done(
    tmp_path: Path, slow: float
) -> None:
    """The watchdog of the output's open, ended once the open was done, left its `sleep` in
    the step's cgroup when it had forked it first (at load): the script's sweep then said "its
    command ended leaving 1 processes of its job" for a job that left nothing. `slow` delays
    the script before each of its commands (a DEBUG trap, not inherited by the watchdog), so
    the watchdog forks its `sleep` before it is ended, as it did at load."""
    out = tmp_path / "o.out"
    script = tmp_path / "open"
    delay = f"trap 'command sleep {slow}' DEBUG\n" if slow else ""
    script.write_text(delay + "\n".join(output_lines([(str(out), None)])) + "\necho opened\n")
    proc = subprocess.Popen(["/bin/bash", str(script)], start_new_session=True)  # fmt: skip
    assert proc.wait(timeout=30) == 0 and out.read_text() == "opened\n"
    time.sleep(0.3)  # a SIGKILLed `sleep` is gone (reaped by init) by then
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == proc.pid and fields[0] != "Z":  # its session: the script's own
            left.append(stat.parent.name)
    assert left == [], left
