"""The Slurm epilog (ledger/engines/slurm/epilog.sh) on a stand-in cgroup root: the directories it
finds, that it kills below sub-cgroups, that it gives up at its bound and always exits 0. (Its
work on real cgroups: tests/integration/test_slurm_epilog.py.)"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import ledger.engines.slurm

EPILOG = Path(ledger.engines.slurm.__file__).parent / "epilog.sh"


def _run(root: Path, job: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", str(EPILOG)],
        env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": job,
             "GPULEDGER_EPILOG_CGROUP_ROOT": str(root), **env},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


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
