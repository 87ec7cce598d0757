"""Slurm as the engine, the job as its whole process tree (issue 24, findings F1/F6/F7/F9 of the
outside kill tests): children re-parented to init and `setsid` double forks end with their Slurm
job before the ledger records its end, and a job opens only its own GPU device files. Real Slurm
(scripts/slurm/slurm: proctrack/cgroup, task/cgroup, ConstrainDevices), real jobs that fork.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Collection
from pathlib import Path

from tests.integration.test_slurm import Cluster, Ledger, cluster, ledger, slurm, status

__all__ = ["cluster", "ledger", "slurm"]  # the fixtures, shared with test_slurm.py

# a job that leaves two children behind: an ordinary orphan and a TERM-ignoring setsid daemon;
# it prints their pids, then its own, then which GPU device files it may open
FORKS = (
    'echo "CVD=$SLURM_JOB_GPUS"; '
    "sleep 600 & echo kid=$!; "
    "setsid bash -c 'trap \"\" TERM HUP; echo daemon=$$; exec sleep 600' & "
    "sleep 0.5; echo leader=$$; "
    'for d in "$DEVS"/nvidia*; do err=$(head -c1 "$d" 2>&1 >/dev/null); '
    '  case "$err" in *"not permitted"*) echo "denied=${d##*nvidia}";; '
    '  *) echo "open=${d##*nvidia}";; esac; done; '
)


def pids(log: str, key: str) -> list[int]:
    return [int(ln.split("=", 1)[1]) for ln in log.splitlines() if ln.startswith(key + "=")]


def kill_of_job(pid: int, slurm_ids: Collection[str]) -> None:
    """SIGKILL `pid` (a test's clean-up) only while it is still a process of one of the Slurm
    jobs `slurm_ids` (its environment's SLURM_JOB_ID): a process that ended meanwhile left its
    pid to whatever the host started next (pid_max is 32,768 and the suite forks fast), maybe
    another test's job."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return
    job = next((v[len(b"SLURM_JOB_ID=") :] for v in env if v.startswith(b"SLURM_JOB_ID=")), None)
    if job is not None and job.decode() in slurm_ids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def devs(cluster: Cluster) -> str:
    return str(Path(cluster.conf).parent / "dev")


def test_a_slurm_jobs_orphans_and_setsid_children_end_before_its_end_is_recorded(
    ledger: Ledger,
) -> None:
    """F1: under proctrack/linuxproc Slurm lost children re-parented to init, and the ledger
    gave their GPUs to the next job while they ran (the outside tester: 3,481 GPU-seconds)."""
    ledger.up()
    d = devs(ledger.cluster)
    ledger.submit("alice", 1, f"DEVS={d}; " + FORKS + "sleep 2; exit 0")  # ends by itself
    ledger.submit("alice", 1, f"DEVS={d}; " + FORKS + "sleep 600")  # its leader is killed
    ledger.submit("alice", 1, f"DEVS={d}; " + FORKS + "sleep 600")  # preempted
    ledger.wait(
        "the three jobs to run and fork",
        lambda: (
            all(pids(ledger.log_of(j), "leader") for j in (2, 3))
            and bool(ledger.jobs()[1]["outcome"] or pids(ledger.log_of(1), "leader"))
        ),
        timeout=180,
    )
    os.kill(pids(ledger.log_of(2), "leader")[0], signal.SIGKILL)
    ledger.cli("preempt", "3", "--reason", "test")

    ledger.wait("job 3's preemption", lambda: bool(ledger.of("job.preempted.v1", 3)))
    ledger.submit("alice", 4, "sleep 1")  # placed where the three ran, once they are gone

    def tree(job_id: int) -> list[int]:
        log = ledger.log_of(job_id)
        found = pids(log, "kid") + pids(log, "daemon") + pids(log, "leader")
        assert len(found) == 3, log
        return found

    for job_id in (1, 2):
        ledger.wait(
            f"job {job_id}'s end", lambda j=job_id: bool(ledger.of("job.engine_ended.v2", j))
        )
        # the moment its end is recorded, no process of its tree runs any more
        left = [p for p in tree(job_id) if alive(p)]
        assert left == [], f"job {job_id}: {left} outlived its Slurm job\n{ledger.log_of(job_id)}"
    ledger.wait("job 4 to start", lambda: bool(ledger.of("job.started.v1", 4)), timeout=180)
    left = [p for j in (1, 2, 3) for p in tree(j) if alive(p)]
    assert left == [], f"{left} still run on the GPUs job 4 started on"
    for job_id in (1, 2, 3):
        # ConstrainDevices: only its own GPU's device file opens
        log = ledger.log_of(job_id)
        gpus = [int(i) for i in log.split("CVD=", 1)[1].split()[0].split(",")]
        assert pids(log, "open") == gpus and len(pids(log, "denied")) == 3, log
    assert ledger.jobs()[1]["outcome"] == "completed"
    # its batch script ended what the leader left (its TERM-ignoring daemon killed after the
    # grace) before its end record, which says so (atk46-s F4)
    (ended,) = ledger.of("job.engine_ended.v2", 1)
    assert re.search(r"left \d processes in the job's cgroup, killed after", ended["note"]), ended


def test_no_job_is_preempted_for_a_job_over_the_partitions_max_time(ledger: Ledger) -> None:
    """F6: Slurm never starts a job whose time limit is over the partition's MaxTime, so the
    ledger neither places it nor preempts for it (before: it preempted a running job, then the
    placement failed with PartitionTimeLimit). Once an admin raises MaxTime it runs. The
    running job asks no limit: it takes its limit from MaxTime and runs, as under Slurm
    (s62; e4a7d9c4 kept it waiting PARTITION_TIME_LIMIT; `tests/unit/test_slurm_no_limit.py`)."""
    victim = "trap 'exit 0' TERM; while true; do sleep 0.2; done"
    part = f"partitionname={ledger.cluster.partition}"
    ledger.cluster.run("scontrol", "update", part, "maxtime=10")  # ten minutes
    try:
        ledger.up()
        ledger.submit("bob", 4, victim, "--min-runtime", "0", "--resumable")  # no -t
        ledger.wait("the unfunded job to run", lambda: status(ledger, 1) == "running")
        ledger.submit("alice", 4, "sleep 1", "--min-runtime", "1h", "-t", "2h")
        # a window of many cycles (0.2 s each): the funded job would preempt the unfunded one
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            assert ledger.of("job.preempted.v1") == [], ledger.service_log()[-2000:]
            time.sleep(0.5)
        assert status(ledger, 2) == "pending" and status(ledger, 1) == "running"
        assert ledger.jobs()[1]["time_limit_s"] == 600 - 2 - 60  # MaxTime, its grace, a minute
        ledger.cluster.run("scontrol", "update", part, "maxtime=UNLIMITED")
        ledger.wait("job 2 to run once MaxTime allows it", lambda: status(ledger, 2) != "pending",
                    timeout=90)  # fmt: skip
        assert [p["for_job"] for p in ledger.of("job.preempted.v1", 1)] == [2]
    finally:
        ledger.cluster.run("scontrol", "update", part, "maxtime=UNLIMITED", check=False)
