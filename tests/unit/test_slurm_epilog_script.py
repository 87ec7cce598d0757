"""The Slurm epilog (ledger/engines/slurm/epilog.sh) on a stand-in cgroup root: the directories it
finds (its own node's alone), that it kills below sub-cgroups and in its owner's other jobs (the
processes with its job id in their environment), that it gives up at its bound and always exits
0. (Its work on real cgroups: tests/integration/test_slurm_epilog.py.)"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ledger.engines.slurm

EPILOG = Path(ledger.engines.slurm.__file__).parent / "epilog.sh"


def _run(root: Path, job: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", str(EPILOG)],
        env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": job, "SLURMD_NODENAME": "n1",
             "GPULEDGER_EPILOG_CGROUP_ROOT": str(root), **env},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


@contextmanager
def _sleepers(*jobs: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """A `sleep` per entry, each with SLURM_JOB_ID set to it (as a job's process has)."""
    procs = [subprocess.Popen(["sleep", "60"], env={**os.environ, "SLURM_JOB_ID": j}) for j in jobs]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _group(root: Path, rel: str, *pids: int) -> Path:
    group = root / rel
    group.mkdir(parents=True)
    if pids:  # a real cgroup's files go with it at rmdir; a stand-in's would keep it
        (group / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    return group


def test_an_empty_tree_is_removed_at_once_in_every_hierarchy(tmp_path: Path) -> None:
    _group(tmp_path, "freezer/slurm_n1/uid_7/job_42/step_batch/esc")
    _group(tmp_path, "devices/slurm_n1/uid_7/job_42/step_batch/task_0")
    _group(tmp_path, "unified/system.slice/slurmstepd.scope/job_42/step_0")
    other = _group(tmp_path, "freezer/slurm_n1/uid_7/job_43/step_batch", 1)
    began = time.monotonic()
    done = _run(tmp_path, "42")
    assert time.monotonic() - began < 5
    assert (done.returncode, done.stderr) == (0, "")
    assert not list(tmp_path.glob("*/slurm_n1/uid_7/job_42")) and (tmp_path / "freezer").exists()
    assert not (tmp_path / "unified/system.slice/slurmstepd.scope/job_42").exists()
    assert other.exists(), "another job's cgroup was touched"


def test_a_process_in_a_sub_cgroup_is_killed_and_what_stays_listed_is_logged(
    tmp_path: Path,
) -> None:
    """The stand-in's cgroup.procs keeps listing the pid after it died (a real one would not):
    the epilog gives up at its bound, says so, and exits 0 all the same."""
    victim = subprocess.Popen(["sleep", "60"])
    try:
        _group(tmp_path, "freezer/slurm/uid_7/job_42/step_batch/esc/deeper", victim.pid)
        done = _run(tmp_path, "42", GPULEDGER_EPILOG_BOUND="1")
        assert victim.wait(timeout=5) == -9
    finally:
        victim.kill()
    assert done.returncode == 0
    assert f"still in its cgroups after 1 s, left alive: {victim.pid}" in done.stderr


def test_no_job_or_a_job_without_cgroups_is_nothing_to_do(tmp_path: Path) -> None:
    for job in ("", "12x", "99"):
        done = _run(tmp_path, job)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_another_nodes_directory_of_the_job_is_left_to_that_nodes_epilog(tmp_path: Path) -> None:
    """atk59 F6: several slurmd on one host (MULTIPLE_SLURMD, the test clusters) each have their
    slurm_<node> directories; node n1's epilog emptied the job's on n2 too, a kill separate
    hosts never see."""
    with _sleepers("42") as (other_node,):
        there = _group(tmp_path, "freezer/slurm_n2/uid_7/job_42/step_0", other_node.pid)
        _group(tmp_path, "freezer/slurm_n1/uid_7/job_42/step_batch")
        done = _run(tmp_path, "42", SLURM_JOB_UID="7")
        time.sleep(0.2)
        assert other_node.poll() is None, "node n1's epilog killed the job's process on n2"
    assert (done.returncode, done.stderr) == (0, "")
    assert there.exists() and not (tmp_path / "freezer/slurm_n1/uid_7/job_42").exists()


def test_a_process_that_moved_into_its_owners_other_job_is_killed_there(tmp_path: Path) -> None:
    """atk59 F2: a process of job 42 makes a sub-cgroup of the step of its owner's job 43 on the
    same node (Slurm chowns it to the user) and moves there; job 42's own directories are gone.
    It is killed by its job id in its environment; job 43's own process, another owner's and
    another node's are not, and job 43's directories stay."""
    with _sleepers("42", "43", "42", "42") as (moved, own, stranger, far):
        hide = _group(tmp_path, "freezer/slurm_n1/uid_7/job_43/step_batch/hide", moved.pid)
        _group(tmp_path, "freezer/slurm_n1/uid_7/job_43/step_batch/task_0", own.pid)
        _group(tmp_path, "freezer/slurm_n1/uid_8/job_44/step_batch/hide", stranger.pid)
        _group(tmp_path, "freezer/slurm_n2/uid_7/job_45/step_batch/hide", far.pid)
        done = _run(tmp_path, "42", SLURM_JOB_UID="7")
        assert moved.wait(timeout=5) == -9
        time.sleep(0.2)
        assert [p.poll() for p in (own, stranger, far)] == [None] * 3
    assert done.returncode == 0 and hide.exists()
    assert done.stderr.splitlines() == [
        "gpuledger-epilog: job 42: killed 1 processes left in its cgroups",
        "gpuledger-epilog: job 42: of them, in its owner's other jobs' cgroups (this job's id in"
        f" their environment): {moved.pid} ",
    ]


def test_a_bound_run_out_before_the_first_round_still_kills_once(tmp_path: Path) -> None:
    """A unit run at load: the bound counted in whole seconds could run out before the first
    round (started at x.99 s), and the epilog gave up with the job's process alive. A bound of 0
    is the same case made certain: one round of kills, then it gives up."""
    victim = subprocess.Popen(["sleep", "60"])
    try:
        _group(tmp_path, "freezer/slurm/uid_7/job_42/step_batch", victim.pid)
        done = _run(tmp_path, "42", GPULEDGER_EPILOG_BOUND="0")
        assert victim.wait(timeout=5) == -9
    finally:
        victim.kill()
    assert done.returncode == 0
    assert f"still in its cgroups after 0 s, left alive: {victim.pid}" in done.stderr
