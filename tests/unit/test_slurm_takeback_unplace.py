"""atk61-slurm F1, F2, F4: runs the executor takes back to the queue rather than failing them.

F1: `up` killed -9 after a take-back's `taken-back` mark, before `job.unplaced` was recorded:
after the restart the run, adopted, ended `launch_failed` for good ("taken back by the executor
... never ran"), though no fault of the job's. F2: MaxTime lowered under a run pending in Slurm
(`PartitionTimeLimit`) failed its job `launch_failed` for good. F4: a run adopted pending during
a pause stayed placed the whole pause. Now each goes back to the queue (`unplace`)."""

from __future__ import annotations

import time
from pathlib import Path

from ledger.core.state import Node
from ledger.cycle.executor import Launch, NodeChange
from ledger.engines.slurm import SlurmExecutor
from ledger.engines.slurm.launching import TAKEN_BACK
from ledger.engines.slurm.leaked_runs import DOUBTED
from ledger.engines.slurm.paused import paused_why, unplace_paused
from ledger.engines.slurm.run_loop import CONFIG_SETTLE_S, over_max_time
from ledger.engines.slurm.script import TAKEN_BACK_EXIT
from ledger.engines.slurm.tracked import Run
from schemas.events import GpuSlot

LID = "0123abcd4567"
NOW = float(int(time.time()))
NODES = {n: Node(name=n, cluster="c", gpu_type="h100", gpus=4) for n in ("vm", "vm2")}


def _at(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def _job(
    state: str, reason: str = "None", exit_code: int = 0, job: int = 1, limit: str = "UNLIMITED"
) -> str:
    ended = state not in ("PENDING", "RUNNING")
    start = "Unknown" if state == "PENDING" else _at(NOW - 5)
    return (
        f"JobId=8 JobName=gpuledger-{job} UserId=bob(1001) JobState={state} Reason={reason}"
        f" TimeLimit={limit}"
        f" ExitCode={exit_code}:0 StartTime={start} EndTime={_at(NOW - 4) if ended else 'Unknown'}"
        f" Partition=gpuledger NodeList={'vm' if state != 'PENDING' else '(null)'}"
        f" Comment=gpuledger:{LID}:job={job}:run=0 StdOut=/tmp/y"
    )


class Slurm:
    def __init__(self, job: str, state: str = "UP", max_time: str = "UNLIMITED") -> None:
        self.job, self.state, self.calls = job, state, list[list[str]]()
        self.max_time = max_time

    def __call__(self, args: list[str], stdin: str | None = None, env: object = None) -> str:
        self.calls.append(args)
        if args[:2] == ["scontrol", "-d"] and "job" in args:
            return self.job
        if args[:3] == ["scontrol", "-o", "show"]:
            return (f"PartitionName=gpuledger MaxTime={self.max_time} Nodes=vm,vm2"
                    f" State={self.state} TotalNodes=2")  # fmt: skip
        return ""

    def scancels(self) -> list[list[str]]:
        return [a for a in self.calls if a[0] == "scancel"]


def _adopted(tmp_path: Path, slurm: Slurm, mark: bool) -> SlurmExecutor:
    ex = SlurmExecutor("gpuledger", LID, tmp_path, run_as="service")
    ex._run = slurm  # type: ignore[method-assign]
    run_dir = ex._checkpoint_file(1, 0).parent
    run_dir.mkdir(parents=True)
    if mark:
        (run_dir / TAKEN_BACK).touch()
    ex.adopt({1: 0}, NOW)
    return ex


def test_a_take_back_cut_by_a_restart_is_finished_while_slurm_keeps_it_pending(
    tmp_path: Path,
) -> None:
    """F1 (tb2: restarted while it still waits in Slurm): cancelled and back to the queue,
    wherever the ledger placed it (no node: the adopted run has no launch), no `launch_failed`."""
    slurm = Slurm(_job("PENDING", "ReqNodeNotAvail"))
    ex = _adopted(tmp_path, slurm, mark=True)
    seen = ex.observe(NOW + 1, NODES)
    assert NodeChange("", "unplace", DOUBTED, jobs=(1,)) in seen.nodes
    assert not seen.exits and 1 not in ex._runs
    assert slurm.scancels(), slurm.calls
    again = ex.observe(NOW + 2, NODES)  # once
    assert not [c for c in again.nodes if c.change == "unplace"] and not again.exits


def test_a_take_back_cut_by_a_restart_is_finished_once_its_script_ended_at_the_mark(
    tmp_path: Path,
) -> None:
    """F1 (tb1: UP again before the restart; Slurm started it, its script found the mark and
    exited 124, FAILED): back to the queue, not `launch_failed` for good."""
    slurm = Slurm(_job("FAILED", "NonZeroExitCode", TAKEN_BACK_EXIT))
    ex = _adopted(tmp_path, slurm, mark=True)
    seen = ex.observe(NOW + 1, NODES)
    assert NodeChange("", "unplace", DOUBTED, jobs=(1,)) in seen.nodes
    assert not seen.exits, seen.exits


def test_a_run_adopted_without_the_mark_is_read_as_any(tmp_path: Path) -> None:
    slurm = Slurm(_job("PENDING", "ReqNodeNotAvail"))
    ex = _adopted(tmp_path, slurm, mark=False)
    seen = ex.observe(NOW + 1, NODES)
    assert not [c for c in seen.nodes if c.change == "unplace"] and 1 in ex._runs


def test_a_run_adopted_pending_during_a_pause_goes_back_to_the_queue(tmp_path: Path) -> None:
    """F4: adopted (no launch) and pending in Slurm while the partition is DOWN: taken back as
    a live service takes back its own (marked, cancelled, unplaced wherever it is placed)."""
    slurm = Slurm(_job("PENDING", "PartitionDown"), state="DOWN")
    ex = _adopted(tmp_path, slurm, mark=False)
    seen = ex.observe(NOW + 1, NODES)
    why = paused_why("gpuledger", "DOWN")
    assert NodeChange("", "unplace", why, jobs=(1,)) in seen.nodes
    assert (ex._checkpoint_file(1, 0).parent / TAKEN_BACK).exists() and slurm.scancels()
    assert unplace_paused(ex, why, NOW + 2) == []


def test_a_run_pending_under_a_lowered_max_time_goes_back_to_the_queue(tmp_path: Path) -> None:
    """F2: Slurm's reason `PartitionTimeLimit` for a placed run: marked, cancelled, its job
    back in the queue (it waits there `PARTITION_TIME_LIMIT`), MaxTime read again at once."""
    slurm = Slurm(_job("PENDING", "PartitionTimeLimit"))
    ex = SlurmExecutor("gpuledger", LID, tmp_path, run_as="service")
    ex._run = slurm  # type: ignore[method-assign]
    launch = Launch(1, (GpuSlot(node="vm2", gpu_indices=(0,)),), ("true",), None, "bob", "ai2/o")
    ex._runs = {1: Run(1, 0, launch, slurm_id="8", submitted_at=NOW - 3)}
    ex._checkpoint_file(1, 0).parent.mkdir(parents=True)
    ex._max_time_at = NOW + 100
    seen = ex.observe(NOW, NODES)
    assert NodeChange("vm2", "unplace", over_max_time(), jobs=(1,)) in seen.nodes
    assert not seen.exits, seen.exits
    assert (ex._checkpoint_file(1, 0).parent / TAKEN_BACK).exists() and slurm.scancels()
    assert ex._max_time_at == NOW + ex.probe_every_s  # read again in the same observe


def _placed(tmp_path: Path, slurm: Slurm, max_time_s: float) -> SlurmExecutor:
    ex = SlurmExecutor("gpuledger", LID, tmp_path, run_as="service")
    ex._run = slurm  # type: ignore[method-assign]
    launch = Launch(1, (GpuSlot(node="vm2", gpu_indices=(0,)),), ("true",), None, "bob", "ai2/o")
    ex._runs = {1: Run(1, 0, launch, slurm_id="8", submitted_at=NOW - 1)}
    ex._checkpoint_file(1, 0).parent.mkdir(parents=True)
    ex._max_time_at, ex.max_time_s = NOW + 100, max_time_s  # as last read: 3 minutes
    return ex


def test_a_run_refused_partitionconfig_under_a_max_time_lowered_unread_goes_back(
    tmp_path: Path,
) -> None:
    """atk62-slurm F2: MaxTime lowered (3 to 1) in the seconds before the service read it; the
    sbatch asked `--time=3:00` and Slurm said `PartitionConfig`, not `PartitionTimeLimit`: the
    job ended `launch_failed` for good. Now MaxTime is read again at once and, under the run's
    `--time` (its TimeLimit), the run goes back to the queue as for `PartitionTimeLimit`."""
    slurm = Slurm(_job("PENDING", "PartitionConfig", limit="00:03:00"), max_time="00:01:00")
    ex = _placed(tmp_path, slurm, 180.0)
    seen = ex.observe(NOW, NODES)
    assert ex.max_time_s == 60.0  # read again in the same observe
    why = over_max_time("PartitionConfig")
    assert NodeChange("vm2", "unplace", why, jobs=(1,)) in seen.nodes, seen.nodes
    assert not seen.exits, seen.exits
    assert (ex._checkpoint_file(1, 0).parent / TAKEN_BACK).exists() and slurm.scancels()


def test_a_partitionconfig_with_its_time_within_max_time_never_starts_as_before(
    tmp_path: Path,
) -> None:
    """Any other `PartitionConfig` (its `--time` within MaxTime read again): `launch_failed`,
    once Slurm's next scheduling pass could have cleared it (`CONFIG_SETTLE_S`): MaxTime lowered
    and raised back within a second left a run `PartitionConfig` that Slurm would have started,
    and it ended at once (atk62b G5)."""
    slurm = Slurm(_job("PENDING", "PartitionConfig", limit="00:03:00"), max_time="00:03:00")
    ex = _placed(tmp_path, slurm, 180.0)
    seen = ex.observe(NOW, NODES)
    assert not [c for c in seen.nodes if c.change == "unplace"], seen.nodes
    assert not seen.exits, seen.exits  # it may still start
    seen = ex.observe(NOW + CONFIG_SETTLE_S + 1, NODES)
    assert not [c for c in seen.nodes if c.change == "unplace"], seen.nodes
    assert [x.reason for x in seen.exits] == ["launch_failed"], seen.exits


def test_an_unplace_with_no_node_takes_back_the_jobs_it_names_where_they_are_placed() -> None:
    from ledger.cycle.record import unplace_commands
    from tests.unit.test_unplaced import ORG, decided, place

    state, _ = decided([*ORG, (ORG[-1][0] + 1, place("c1"))])
    [cmd] = unplace_commands(NodeChange("", "unplace", DOUBTED, jobs=(1,)), state)
    assert (cmd.job_id, cmd.run, cmd.reason) == (1, 0, DOUBTED)
    assert unplace_commands(NodeChange("", "unplace", DOUBTED, jobs=(2,)), state) == []
