"""atk59b N4: a partition an admin paused (`State=INACTIVE`, `DRAIN`: every `sbatch` refused;
`DOWN`: queued `PENDING`) failed every job placed meanwhile `launch_failed` once the take-back
time (5 minutes) had passed, no fault of the job. Now the executor reads the partition's State
and takes its runs that have not started back to the queue (`paused`; docs/slurm.md, "A
partition an admin paused"); a running one is left as it runs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ledger.cycle.executor import Launch, NodeChange
from ledger.engines.slurm import SlurmExecutor, parse_jobs
from ledger.engines.slurm.launching import TAKEN_BACK
from ledger.engines.slurm.paused import paused_why, unplace_paused
from ledger.engines.slurm.tracked import Run
from ledger.engines.slurm.words import partition_state
from schemas.errors import EngineError
from schemas.events import GpuSlot

LID = "0123abcd4567"
NOW = float(int(time.time()))
PART = ("PartitionName=gpuledger AllowGroups=ALL Default=YES MaxTime=UNLIMITED Nodes=vm,vm2"
        " State={} TotalNodes=2")  # fmt: skip


def test_the_partitions_state_and_why_nothing_starts_there() -> None:
    other = "PartitionName=other State=INACTIVE Nodes=x"
    assert partition_state(other + "\n" + PART.format("INACTIVE"), "gpuledger") == "INACTIVE"
    assert partition_state(PART.format("UP"), "gpuledger") == "UP"
    assert partition_state(other, "gpuledger") == "UP"  # not found: nothing to hold back
    assert paused_why("gpuledger", "UP") == ""
    assert paused_why("gpuledger", "DOWN") == (
        "Slurm's partition gpuledger is DOWN (an admin's pause): nothing starts on it until it "
        "is UP"
    )


def _launch(job: int, node: str) -> Launch:
    return Launch(job, (GpuSlot(node=node, gpu_indices=(0,)),), ("true",), None, "bob", "ai2/olmo")


def _slurm(slurm_id: str, job: int, state: str) -> str:
    start = "Unknown" if state == "PENDING" else time.strftime("%Y-%m-%dT%H:%M:%S")
    return (
        f"JobId={slurm_id} JobName=gpuledger-{job} UserId=bob(1001) JobState={state}"
        f" Reason=PartitionDown ExitCode=0:0 StartTime={start} EndTime=Unknown"
        f" Partition=gpuledger NodeList=vm Comment=gpuledger:{LID}:job={job}:run=0 StdOut=/tmp/y"
    )


def test_the_runs_not_started_go_back_to_the_queue_and_a_running_one_runs_on(
    tmp_path: Path,
) -> None:
    """Job 1 never submitted (its sbatch refused), job 2 pending in Slurm (`PartitionDown`), job
    3 running: 1 and 2 are taken back (marked, 2 cancelled) and unplaced by name, 3 is kept."""
    calls: list[list[str]] = []
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    ex._run = lambda args, *_, **__: calls.append(args) or ""  # type: ignore[method-assign,func-returns-value]
    ex._runs = {
        1: Run(1, 0, _launch(1, "vm"), refused_since=NOW - 3),
        2: Run(2, 0, _launch(2, "vm2"), slurm_id="8", submitted_at=NOW - 3),
        3: Run(3, 0, _launch(3, "vm"), slurm_id="9", submitted_at=NOW - 9, started=True),
    }
    for job in (1, 2):
        ex._checkpoint_file(job, 0).parent.mkdir(parents=True)
    ex._view = {j.slurm_id: j for j in parse_jobs(_slurm("8", 2, "PENDING") + "\n"
                                                 + _slurm("9", 3, "RUNNING"))}  # fmt: skip
    why = paused_why("gpuledger", "INACTIVE")
    got = unplace_paused(ex, why, NOW)
    assert got == [NodeChange("vm", "unplace", why, jobs=(1,)),
                   NodeChange("vm2", "unplace", why, jobs=(2,))]  # fmt: skip
    assert set(ex._runs) == {3}
    assert all((ex._checkpoint_file(j, 0).parent / TAKEN_BACK).exists() for j in (1, 2))
    assert [a for a in calls if a[0] == "scancel"] and all("9" not in a for a in calls), calls


CONFIG = (
    "PriorityType = priority/basic\nPreemptType = preempt/none\n"
    "ProctrackType = proctrack/cgroup\nEpilog = /etc/slurm/gpuledger-epilog.sh\nKillWait = 10 sec\n"
)


@pytest.mark.parametrize("state", ["INACTIVE", "DOWN", "DRAIN"])
def test_the_service_starts_on_a_paused_partition_and_reads_it_paused(
    tmp_path: Path, state: str
) -> None:
    """atk60-slurm F1: `up` (and `serve`) refused to start while an admin paused the partition
    ("partition 'gpuledger' is INACTIVE, not UP"): a restart during a pause took the whole
    service down. Now the check passes and the executor starts with the partition paused (it
    submits nothing, takes its runs not started back); one that does not exist still refuses."""
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    part = PART.format(state)
    ex._run = lambda args, *_, **__: CONFIG if args[1:2] == ["show"] else part  # type: ignore[method-assign]
    ex.check()
    assert ex.partition_state == state
    assert paused_why(ex.partition, ex.partition_state).startswith(
        f"Slurm's partition gpuledger is {state} (an admin's pause)"
    )
    part = PART.format("UP").replace("gpuledger", "other")
    with pytest.raises(EngineError, match="Slurm has no partition 'gpuledger'"):
        ex.check()
