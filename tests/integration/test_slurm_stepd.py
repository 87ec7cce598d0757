"""Slurm as the engine, the job as its whole process tree when its slurmstepd is gone (issue 24,
atk46-s F4): slurmstepd kill -9, the leader exits, its forked child lives on in the job's cgroup.
Real Slurm (scripts/slurm/slurm: proctrack/cgroup), a real job that forks; which processes lived
when is read from outside the ledger (the child's own lines every 0.2 s, /proc)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

from tests.integration import test_slurm as base
from tests.integration.test_slurm import Cluster, Ledger
from tests.integration.test_slurm_stops import _times
from tests.integration.test_slurm_trees import alive, kill_of_job, pids

cluster, slurm, ledger = base.cluster, base.slurm, base.ledger  # the Slurm suite's fixtures


def _stepd_of(pid: int) -> int:
    """The slurmstepd above `pid` (its parents walked up)."""
    while pid > 1:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.split("(", 1)[1].rsplit(")", 1)[0] == "slurmstepd":
            return pid
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    raise AssertionError("no slurmstepd above the job's leader")


def _remove_groups(cl: Cluster, slurm_id: str) -> None:
    """The job's cgroups, which nobody removes once its slurmstepd is gone (empty by now)."""
    for top in Path("/sys/fs/cgroup").glob(f"*/slurm_{cl.node}/uid_*/job_{slurm_id}"):
        for group in sorted(top.glob("**/"), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                group.rmdir()


def test_a_child_left_when_slurmstepd_is_killed_ends_before_the_run_is_recorded_ended(
    ledger: Ledger,
) -> None:
    """atk46-s F4: job 1 (every GPU) forks a child that ignores SIGTERM and writes a line every
    0.2 s for 60 s; its slurmstepd is killed with -9, then its leader exits 0. The batch script
    wrote its end record at once (Slurm still lists the job RUNNING, with no slurmstepd to empty
    its cgroup); the ledger ended the run by that record and its stale heartbeat, cancelled it
    and started job 2 on the same GPUs beside the child, which ran on. Now the script ends what
    the command left in its cgroup (SIGTERM, SIGKILL after the grace, 2 s here), beating
    meanwhile, and writes its record after: the child is gone before the run's end is recorded
    and before job 2 starts, the recorded end is not before its last line, and the record says
    it was killed."""
    work = ledger.work
    ledger.up()
    kid = f"( trap '' TERM; for i in $(seq 300); do date +%s.%N >> {work}/kid; sleep 0.2; done ) &"
    leader = f"echo kid=$!; echo leader=$$; while [ ! -e {work}/stop ]; do sleep 0.2; done; exit 0"
    ledger.submit("alice", 4, f"{kid} {leader}")
    ledger.submit("bob", 4, f"date +%s.%N >> {work}/next; sleep 1")
    ledger.wait(
        "job 1 to run and fork",
        lambda: bool(pids(ledger.log_of(1), "leader")) and bool(_times(work / "kid")),
        timeout=120,
    )
    (child,) = pids(ledger.log_of(1), "kid")
    (leader_pid,) = pids(ledger.log_of(1), "leader")
    environ = Path(f"/proc/{leader_pid}/environ").read_bytes().split(b"\0")
    (slurm_id,) = [v[13:].decode() for v in environ if v.startswith(b"SLURM_JOB_ID=")]
    os.kill(_stepd_of(leader_pid), signal.SIGKILL)
    try:
        (work / "stop").touch()  # its leader exits 0; the child is left
        ledger.wait("job 1's end", lambda: bool(ledger.of("job.engine_ended.v2", 1)), timeout=90)
        assert not alive(child), "the child outlived the end the ledger recorded"
        (ended,) = ledger.of("job.engine_ended.v2", 1)
        ledger.wait("job 2 to start", lambda: (work / "next").exists(), timeout=90)
    finally:
        kill_of_job(child, {slurm_id})
        time.sleep(0.5)
        _remove_groups(ledger.cluster, slurm_id)
    last = _times(work / "kid")[-1]
    (started,) = _times(work / "next")
    assert started > last, f"job 2 started {last - started:.1f} s before job 1's child ended"
    assert ended["exit_code"] == 0 and ended["ended_at"] >= last - 0.5, (ended, last)
    # how many: the child's subshell and whatever it runs that moment (a sleep, a date)
    assert re.search(r"left [1-9][0-9]* processes in the job's cgroup, killed", ended["note"]), (
        ended
    )
    assert last - (work / "stop").stat().st_mtime < 2 + 3, "the child was not ended at its grace"
