"""The node agents' own output file of a job that names none (N6 of the re-test of issue 23):
like the Slurm executor's, `<log_dir>/job-<id>.log` is the job's user's, 0600, in a 0755
directory only the service writes; other users cannot read a job's output there."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from ledger.cycle.executor import Launch
from ledger.engines.supervised import SupervisedExecutor
from ledger.engines.tree import Containment
from schemas.events import GpuSlot


def test_a_job_without_a_working_directory_writes_a_log_only_its_user_reads(
    tmp_path: Path,
) -> None:
    assert os.geteuid() == 0, "the unit tests run as root (as the suite does)"
    logs = tmp_path / "jobs"
    logs.mkdir(mode=0o777)
    logs.chmod(0o777)  # an older, looser directory is made the service's own
    ex = SupervisedExecutor(tmp_path / "state", logs, containment=Containment(why_not="test"))
    nobody = pwd.getpwnam("nobody")
    slot = GpuSlot(node="n1", gpu_indices=(0,))
    try:
        for job_id, user, uid in [(1, "root", 0), (2, "nobody", nobody.pw_uid)]:
            ex._prepare(Launch(job_id, (slot,), ("true",), None, user, "a/b"), 0.0)
            made = (logs / f"job-{job_id}.log").stat()
            assert stat.S_IMODE(made.st_mode) == 0o600, oct(made.st_mode)
            assert made.st_uid == uid
    finally:
        ex.close()
    assert stat.S_IMODE(logs.stat().st_mode) == 0o755
