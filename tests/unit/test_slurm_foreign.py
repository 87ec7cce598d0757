"""Foreign Slurm jobs count against the ledger's capacity: running on any partition that shares
its nodes, or pending while they still hold an allocation (a requeue releasing it)."""

from __future__ import annotations

from pathlib import Path

from ledger.engines.slurm import SlurmExecutor, parse_jobs

LID = "0123abcd4567"


def line(job: int, state: str, partition: str, gres: str) -> str:
    detail = f" Nodes=vm CPU_IDs=0 Mem=0 GRES={gres}" if gres else ""
    return (
        f"JobId={job} JobName=train UserId=bob(1001) JobState={state} Reason=None ExitCode=0:0"
        f" StartTime=Unknown Partition={partition} NodeList=vm{detail} Comment=mine StdOut=/tmp/y"
    )


def foreign_of(tmp_path: Path, *lines: str) -> dict[str, frozenset[int]]:
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    ex._view = {j.slurm_id: j for j in parse_jobs("\n".join(lines))}
    ex._read_runs(0.0)
    return ex._foreign


def test_running_foreign_jobs_of_any_partition_hold_their_gpus(tmp_path: Path) -> None:
    got = foreign_of(
        tmp_path,
        line(1, "RUNNING", "gpuledger", "gpu:fake_0:1(IDX:0)"),
        line(2, "RUNNING", "other", "gpu:fake_3:1(IDX:3)"),
    )
    assert got == {"vm": frozenset({0, 3})}


def test_a_pending_foreign_job_with_an_allocation_holds_it_one_without_does_not(
    tmp_path: Path,
) -> None:
    got = foreign_of(
        tmp_path,
        line(1, "PENDING", "other", "gpu:fake_1:1(IDX:1)"),  # requeued, still releasing
        line(2, "PENDING", "gpuledger", ""),  # waiting: holds nothing yet
        line(3, "COMPLETED", "gpuledger", "gpu:fake_2:1(IDX:2)"),
    )
    assert got == {"vm": frozenset({1})}
