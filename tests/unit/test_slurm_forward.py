"""Slurm's own terminations reach the job's command (atk38-24 F2): at a node's DOWN, Slurm's
TIMEOUT or a plain `scancel`, slurmd signals the batch shell alone; the ledger's batch script
ate that SIGTERM (it notes it and waits for its command), so the command got nothing until the
SIGKILL KillWait later, with no chance to checkpoint. The script now passes a SIGTERM on to the
command. The executor's own stop signals the batch shell alone too (`cluster.term_args`: never
`--full`, which signals `srun`, whose answer is to SIGKILL its ranks, atk58 F1): the script
passes it on to every process below its command but an `srun`. The real script, in bash."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from ledger.cycle.executor import Launch
from ledger.engines.slurm.launching import stop_marks
from ledger.engines.slurm.script import STOPPED_FIRST, batch_script
from ledger.engines.slurm.stops import Stopping, stopped_end
from ledger.engines.slurm.words import parse_jobs
from schemas.events import GpuSlot


def _run(
    tmp_path: Path, *, stopping: bool, command: tuple[str, ...] = (), ready: int = 0
) -> tuple[int, list[str], str]:
    """The script of a command that logs each SIGTERM and ends 0 after ~2 s (or `command`);
    SIGTERM'd once, to the batch shell alone, 0.5 s in (and once `ready` lines are in the file
    `ready`). Its exit, the command's log lines and the end record."""
    log = tmp_path / "terms"
    command = command or ("bash", "-c", f"trap 'echo TERM >> {log}' TERM; for i in $(seq 20);"
                          " do sleep 0.1; done; exit 0")  # fmt: skip
    job = Launch(5, (GpuSlot(node="n1", gpu_indices=(0,)),), command, None, "alice", "ai2/olmo")
    marks = {m: str(tmp_path / m) for m in ("launched", "ended", "signalled", "stopping")}
    script = tmp_path / "batch"
    script.write_text(batch_script(job, launched_file=marks["launched"],
                                   ended_file=marks["ended"], signalled_file=marks["signalled"],
                                   stopping_file=marks["stopping"]))  # fmt: skip
    bash = subprocess.Popen(["/bin/bash", str(script)], start_new_session=True)
    try:
        time.sleep(0.3)
        if stopping:  # the executor's stop of a running command: its mark, then its SIGTERM
            Path(marks["stopping"]).touch()
        time.sleep(0.2)
        deadline = time.monotonic() + 20
        while ready and len(_lines(tmp_path / "ready")) < ready:
            assert time.monotonic() < deadline, _lines(tmp_path / "ready")
            time.sleep(0.05)
        assert bash.poll() is None
        os.kill(bash.pid, signal.SIGTERM)
        code = bash.wait(timeout=20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGKILL)
    return code, _lines(log), Path(marks["ended"]).read_text()


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_slurms_term_to_the_batch_shell_reaches_the_command_once(tmp_path: Path) -> None:
    code, terms, record = _run(tmp_path, stopping=False)
    assert terms == ["TERM"]
    assert code == 0 and record.split()[::2] == ["0", "1"]  # its own code; the signal noted


def test_the_executors_own_stop_reaches_every_process_but_srun(tmp_path: Path) -> None:
    """atk58 F1: its `stopping` mark, then SIGTERM to the batch shell alone (`term_args`'s
    `--batch`; its steps' tasks get theirs from Slurm): the command and its child get it, once,
    and an `srun` below the command gets none (srun SIGKILLs its step's tasks at a SIGTERM).
    Before: the script passed none on (`--full` had signalled every process, `srun` too)."""
    log = tmp_path / "terms"
    srun = tmp_path / "bin" / "srun"  # named srun, as /proc says: its `comm`
    srun.parent.mkdir()
    ready = tmp_path / "ready"
    srun.write_text(f"#!/bin/bash\ntrap 'echo srun >> {log}' TERM\necho srun >> {ready}\n"
                    "for i in $(seq 30); do sleep 0.1; done\n")  # fmt: skip
    srun.chmod(0o755)
    command = ("bash", "-c", f"trap 'echo command >> {log}' TERM; {srun} &"
               f" ( trap 'echo child >> {log}' TERM; echo child >> {ready};"
               " for i in $(seq 30); do sleep 0.1; done ) &"
               f" echo command >> {ready}; for i in $(seq 20); do sleep 0.1; done; wait; exit 0")  # fmt: skip  # noqa: E501
    code, terms, _ = _run(tmp_path, stopping=True, command=command, ready=3)
    assert sorted(terms) == ["child", "command"] and code == 0, terms


def test_a_stop_that_came_before_its_command_started_ends_the_run_without_it(
    tmp_path: Path,
) -> None:
    """atk43s F10: a stop of a launch Slurm held CONFIGURING (its `PrologSlurmctld`) signals no
    process; its command started 3 s after the stop, got no SIGTERM at all (the `stopping` mark
    makes the script pass none on) and ran the whole grace. The script that finds the mark
    before its command starts ends there: the command never runs, no launch mark, no beat;
    its end record says 143, the stop first, and the executor's note says it never ran."""
    ran = tmp_path / "ran"
    job = Launch(5, (GpuSlot(node="n1", gpu_indices=(0,)),), ("sh", "-c", f": > {ran}; sleep 30"),
                 None, "alice", "ai2/olmo")  # fmt: skip
    marks = {m: str(tmp_path / m) for m in ("launched", "ended", "signalled", "stopping", "alive")}
    script = tmp_path / "batch"
    files = {f"{m}_file": marks[m] for m in ("launched", "ended", "signalled", "stopping", "alive")}
    script.write_text(batch_script(job, **files))  # type: ignore[arg-type]
    Path(marks["stopping"]).touch()  # the executor's mark, before Slurm started the script
    done = subprocess.run(["/bin/bash", str(script)], capture_output=True, text=True, timeout=20)
    assert done.returncode == 143 and STOPPED_FIRST in done.stderr, done
    assert not ran.exists()
    assert not Path(marks["launched"]).exists() and not Path(marks["alive"]).exists()
    code, _, first = Path(marks["ended"]).read_text().split()
    assert (code, first) == ("143", "1")
    own, beat, never_ran = stop_marks(tmp_path, time.time())
    assert own is not None and beat is None and never_ran
    Path(marks["launched"]).touch()  # a run that got to its command is no such run
    assert not stop_marks(tmp_path, time.time())[2]
    (j,) = parse_jobs(
        "JobId=7 JobName=gpuledger-5 JobState=FAILED Reason=None ExitCode=143:0"
        " StartTime=2026-12-04T10:00:00 EndTime=2026-12-04T10:00:03 Partition=gpuledger"
    )
    end = stopped_end(Stopping(since=0.0, run=(5, 0)), j, 2e9, never_ran=True)
    assert "the command never ran" in end.note and not end.by_itself, end


def test_a_gangs_watcher_is_launched_before_the_sigterm_and_the_pass_at_it_only_without_one(
    tmp_path: Path,
) -> None:
    """atk59 F5: a step launched at Slurm's own SIGTERM (a plain `scancel`, its TIMEOUT) is
    refused (the job's credential revoked), so a rank's child on another node got only the
    SIGKILL. The pass to the other nodes (`script_tree.gpuledger_watch`) is a step launched
    before (here a fake `srun`, noting what it runs); the pass at the SIGTERM (`gpuledger_far`)
    launches a step only while no watcher runs."""
    from ledger.engines.slurm.script_tree import pass_lines

    bin_dir, said = tmp_path / "bin", tmp_path / "srun-said"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f'#!/bin/bash\nfor a; do l=$a; done\necho "$l" >> {said}\n'
                                  'case $l in *"while :"*) exec sleep 30 ;; esac\n')  # fmt: skip
    (bin_dir / "srun").chmod(0o755)
    body = "\n".join([*pass_lines(), "gpuledger_watch; sleep 0.5; gpuledger_far; sleep 0.5",
                      'kill "${gpuledger_watchers[@]}"; wait; gpuledger_far; wait'])  # fmt: skip
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "5",
           "SLURM_JOB_NUM_NODES": "2", "SLURMD_NODENAME": "n1"}  # fmt: skip
    subprocess.run(["/bin/bash", "-c", body], env=env, timeout=30, check=True)
    runs = said.read_text().split("\n}; ")
    steps = [r.split(";")[0].strip() for r in runs[1:]]
    assert [s.split()[0] for s in steps] == ["trap", "gpuledger_others"], runs  # watch, far
