"""The Slurm batch script ends what its command left in its step's cgroup before its end record
(atk46-s F4; `ledger/engines/slurm/script_tree.py`): the real script, in bash, in a real cgroup
v1 freezer group named as Slurm's proctrack/cgroup names a batch step's
(`slurm_<node>/uid_<uid>/job_<id>/step_batch`), with no Slurm: what a slurmstepd killed with -9
leaves it to do alone. The whole run on real Slurm is `test_slurm_stepd.py`."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.cycle.executor import Launch
from ledger.engines.slurm.launching import own_end
from ledger.engines.slurm.script import batch_script
from schemas.events import GpuSlot

FREEZER = Path("/sys/fs/cgroup/freezer")
JOB = 4242


@pytest.fixture
def step() -> Iterator[Path]:
    """A batch step's freezer group of its own (removed after, its processes killed)."""
    if not os.access(FREEZER, os.W_OK):
        # a machine without it fails, never skips (the suite's rule: CI runs as root on a
        # host with the v1 freezer writable)
        pytest.fail("needs the cgroup v1 freezer, writable (root): /sys/fs/cgroup/freezer")
    top = FREEZER / f"slurm_gl-tree-{os.getpid()}"
    group = top / "uid_0" / f"job_{JOB}" / "step_batch"
    group.mkdir(parents=True)
    try:
        yield group
    finally:
        for _ in range(50):
            left = [int(p) for p in (group / "cgroup.procs").read_text().split()]
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if not left:
                break
            time.sleep(0.1)
        for g in (group, group.parent, group.parent.parent, top):
            with contextlib.suppress(OSError):
                g.rmdir()


def _run(tmp_path: Path, group: Path | None, command: str, job_id: int = JOB) -> float:
    """The batch script of `bash -c command` (grace 2 s: `after_term_s` 13, `own_end_s` 11),
    run in `group` (None: the test's own cgroup) as Slurm job `job_id`; when it ended."""
    job = Launch(5, (GpuSlot(node="n1", gpu_indices=(0,)),), ("bash", "-c", command), None,
                 "alice", "ai2/olmo")  # fmt: skip
    marks = {m: str(tmp_path / m) for m in ("launched", "ended", "signalled", "stopping", "alive")}
    script = tmp_path / "batch"
    script.write_text(batch_script(job, launched_file=marks["launched"],
                                   ended_file=marks["ended"], signalled_file=marks["signalled"],
                                   stopping_file=marks["stopping"], alive_file=marks["alive"],
                                   after_term_s=13, own_end_s=11))  # fmt: skip
    enter = f"echo $$ > {group / 'cgroup.procs'}; " if group is not None else ""
    done = subprocess.run(
        ["bash", "-c", f'{enter}exec bash "$0"', str(script)],
        env={**os.environ, "SLURM_JOB_ID": str(job_id)}, timeout=60, capture_output=True,
        text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return time.time()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_before_the_record(
    tmp_path: Path, step: Path
) -> None:
    kid = tmp_path / "kid"
    began = time.time()
    ended = _run(tmp_path, step, f"( trap '' TERM; exec sleep 60 ) & echo $! > {kid}; sleep 0.5")
    assert not _alive(int(kid.read_text()))
    assert (step / "cgroup.procs").read_text() == ""
    own = own_end(tmp_path)
    assert own is not None and (own.exit_code, own.left, own.killed) == (0, 1, True), own
    assert 2.5 <= ended - began < 6, ended - began  # 0.5 s, then the 2 s grace
    assert own.at >= began + 2.5  # the end of its last process, not of its leader


def test_children_that_end_at_sigterm_end_at_once(tmp_path: Path, step: Path) -> None:
    """Two children (one a `setsid` daemon, out of the job's session: the cgroup holds it)."""
    began = time.time()
    _run(tmp_path, step, "sleep 60 & setsid sleep 60 & sleep 0.3")
    own = own_end(tmp_path)
    assert own is not None and (own.exit_code, own.left, own.killed) == (0, 2, False), own
    assert own.at - began < 2
    assert (step / "cgroup.procs").read_text() == ""
    assert "its command left 2 processes in the job's cgroup, ended at SIGTERM" in own.tree_note()


def test_a_command_that_leaves_nothing_keeps_its_three_word_record(
    tmp_path: Path, step: Path
) -> None:
    _run(tmp_path, step, "sleep 0.2; exit 0")
    assert len((tmp_path / "ended").read_text().split()) == 3
    own = own_end(tmp_path)
    assert own is not None and (own.left, own.killed, own.tree_note()) == (0, False, "")


def test_a_script_in_no_slurm_step_group_leaves_the_rest_to_slurm(tmp_path: Path) -> None:
    """Not in a group named for its job's step (another proctrack, or the wrong job id): it
    touches nothing beyond its command, as before (its own cgroup here is the test's)."""
    kid = tmp_path / "kid"
    try:
        _run(tmp_path, None, f"sleep 30 >/dev/null 2>&1 & echo $! > {kid}; exit 0")
        assert _alive(int(kid.read_text()))
        assert len((tmp_path / "ended").read_text().split()) == 3
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(kid.read_text()), signal.SIGKILL)


def test_a_program_of_the_jobs_own_named_slurmstepd_in_a_group_below_the_step_is_ended(
    tmp_path: Path, step: Path
) -> None:
    """atk47-s F4: a child that copied a program to the name `slurmstepd` and moved itself into
    a group it made below the step's (Slurm gives the job's user the step's directory) was
    skipped by its name: the job `completed`, nothing said left, and it ran on beside the next
    job on its GPUs. The script's own parent is the one slurmstepd it skips (or one it does
    not own); this child is the job's."""
    fake = tmp_path / "slurmstepd"
    fake.write_bytes(Path(shutil.which("sleep") or "/bin/sleep").read_bytes())
    fake.chmod(0o755)
    kid = tmp_path / "kid"
    esc = step / "esc"
    _run(tmp_path, step, f"mkdir {esc}; ( echo $BASHPID > {esc}/cgroup.procs; exec {fake} 60 ) &"
         f" echo $! > {kid}; sleep 0.5")  # fmt: skip
    assert not _alive(int(kid.read_text()))
    own = own_end(tmp_path)
    assert own is not None and (own.exit_code, own.left) == (0, 1), own
    esc.rmdir()


def test_a_stop_that_comes_after_the_command_exited_0_is_not_its_signal(
    tmp_path: Path, step: Path
) -> None:
    """atk52-23 F2 on Slurm: the command exits 0 leaving a child that ignores SIGTERM, and the
    stop's SIGTERM reaches the batch shell while the script reaps that child. The command
    ended before the stop: its end record says unsignalled (`OwnEnd.signalled` False), so the
    executor counts the run ended by itself (`stops.ended_by_itself`: a preempted resumable job
    completes, never runs again). Before, the signal noted in the reap made it signalled."""
    kid = tmp_path / "kid"
    job = Launch(5, (GpuSlot(node="n1", gpu_indices=(0,)),),
                 ("bash", "-c", f"( trap '' TERM; exec sleep 60 ) & echo $! > {kid}; exit 0"),
                 None, "alice", "ai2/olmo")  # fmt: skip
    marks = {m: str(tmp_path / m) for m in ("launched", "ended", "signalled", "stopping", "alive")}
    script = tmp_path / "batch"
    script.write_text(batch_script(job, launched_file=marks["launched"],
                                   ended_file=marks["ended"], signalled_file=marks["signalled"],
                                   stopping_file=marks["stopping"], alive_file=marks["alive"],
                                   after_term_s=13, own_end_s=11))  # fmt: skip
    shell = subprocess.Popen(
        ["bash", "-c", f"echo $$ > {step / 'cgroup.procs'}; exec bash \"$0\"", str(script)],
        env={**os.environ, "SLURM_JOB_ID": str(JOB)}, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.time() + 10
        while not (kid.exists() and kid.read_text().strip()) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # its command has exited: the script reaps the child (2 s grace)
        assert _alive(int(kid.read_text())) and not (tmp_path / "ended").exists()
        shell.send_signal(signal.SIGTERM)  # the stop, as Slurm's or the executor's reaches it
        shell.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            shell.kill()
    own = own_end(tmp_path)
    assert own is not None and (own.exit_code, own.left) == (0, 1), own
    assert not own.signalled, own  # the old script: signalled, so the run was requeued
    assert (tmp_path / "signalled").exists()  # the signal itself is still noted
