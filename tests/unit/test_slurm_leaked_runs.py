"""atk45s F4: a GPU Slurm counts allocated with no job holding it (`GresUsed`, a leak of its
GRES accounting after a slurmd kill -9) while a run of the ledger placed there waits in Slurm.
The old executor counted that pending run as holding the GPU, so the leak was never seen: the
run waited Slurm's start bound (300 s) and its job failed `launch_failed`, and the next job
placed there did the same. Now a pending run never hides a leak, and a pending run on a leaked
GPU is taken back (marked, cancelled) and its job alone goes back to the queue
(`leaked_runs`; docs/slurm.md, "Foreign jobs")."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from ledger.core.state import State
from ledger.cycle.executor import Launch, NodeChange, Observed
from ledger.engines.slurm import SlurmExecutor, parse_jobs
from ledger.engines.slurm.launching import TAKEN_BACK
from ledger.engines.slurm.leaked_runs import holding, on_leaks, unplace_leaked
from ledger.engines.slurm.tracked import Run
from schemas import commands as c
from schemas import events as e
from schemas.events import GpuSlot

LID = "0123abcd4567"
START = float(int(time.time()) - 60)


def slurm(state: str, reason: str = "None") -> str:
    """Job 1 run 0, Slurm job 7, asking for GPU 0 of vm."""
    start = "Unknown" if state == "PENDING" else time.strftime("%Y-%m-%dT%H:%M:%S")
    gres = "" if state == "PENDING" else " GRES=gpu:fake_0:1(IDX:0)"
    return (
        f"JobId=7 JobName=gpuledger-1 UserId=bob(1001) JobState={state} Reason={reason}"
        f" ExitCode=0:0 StartTime={start} EndTime=Unknown Partition=gpuledger NodeList=vm"
        f" Comment=gpuledger:{LID}:job=1:run=0 StdOut=/tmp/y{gres}"
    )


def launch() -> Launch:
    return Launch(1, (GpuSlot(node="vm", gpu_indices=(0,)),), ("true",), None, "bob", "ai2/olmo")


def executor(tmp_path: Path, calls: list[list[str]]) -> SlurmExecutor:
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    ex._run = lambda args, *_, **__: calls.append(args) or ""  # type: ignore[method-assign,func-returns-value]
    ex._runs = {1: Run(1, 0, launch(), slurm_id="7", submitted_at=START)}
    return ex


def read(ex: SlurmExecutor, text: str, gres_used: tuple[int, ...], now: float) -> None:
    """One read: the jobs, then the nodes' `GresUsed`, as `observe` takes them."""
    ex._view = {j.slurm_id: j for j in parse_jobs(text)}
    ex._read_runs(START + now)
    ex._gres_used = {"vm": gres_used} if gres_used else {}
    ex._hold_leaked()


def test_a_pending_run_never_hides_a_leak(tmp_path: Path) -> None:
    """GPU 0 counted used, no job allocated on it, our run waiting for it: a leak from the
    second read (the old executor counted the pending run as its holder: no leak, ever)."""
    ex = executor(tmp_path, [])
    read(ex, slurm("PENDING", "Resources"), (0,), 1.0)
    read(ex, slurm("PENDING", "Resources"), (0,), 2.0)
    assert ex._leaks.held == {"vm": frozenset({0})}
    assert ex._foreign == {"vm": frozenset({0})}  # the ledger places nothing there


def test_a_running_run_holds_its_gpus_though_slurm_lists_none() -> None:
    """A run Slurm allocated (or lists running without its GPUs, after a recovery) holds them;
    a pending one does not."""
    view = {j.slurm_id: j for j in parse_jobs(slurm("RUNNING"))}
    running = Run(1, 0, launch(), slurm_id="7", started=True)
    assert holding([running], view) == {"vm": {0}}
    waiting = {j.slurm_id: j for j in parse_jobs(slurm("PENDING", "Resources"))}
    assert holding([Run(1, 0, launch(), slurm_id="7")], waiting) == {}
    assert on_leaks([Run(1, 0, launch(), slurm_id="7")], waiting, {"vm": frozenset({0, 2})})
    assert on_leaks([Run(1, 0, launch(), slurm_id="7")], waiting, {"vm": frozenset({1})}) == []
    assert on_leaks([running], view, {"vm": frozenset({0})}) == []


def test_a_run_waiting_on_a_leaked_gpu_goes_back_to_the_queue(tmp_path: Path) -> None:
    """Taken back: its `taken-back` mark made before its `scancel`, no `launch_failed`, and an
    `unplace` naming its job alone."""
    calls: list[list[str]] = []
    ex = executor(tmp_path, calls)
    run_dir = tmp_path / "checkpoints" / "1.0"
    run_dir.mkdir(parents=True)
    read(ex, slurm("PENDING", "Resources"), (0,), 1.0)
    assert unplace_leaked(ex, START + 1.0) == []  # one read: not yet a leak
    read(ex, slurm("PENDING", "Resources"), (0,), 2.0)
    (change,) = unplace_leaked(ex, START + 2.0)
    assert (change.node, change.change, change.jobs) == ("vm", "unplace", (1,))
    assert "GPU 0" in change.reason and "GresUsed" in change.reason
    assert os.path.lexists(run_dir / TAKEN_BACK) and 1 not in ex._runs
    assert [a for a in calls if a[0] == "scancel"] == [["scancel", "--name=gpuledger-1", "7"]]
    assert ex._exits == []  # never `launch_failed`


def test_an_unplace_naming_jobs_requeues_those_alone(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    """Two jobs placed on one node: the `unplace` naming one requeues it; the other stays."""
    from ledger.cycle.record import record, unplace_commands
    from tests.unit.test_cycle_record import FakeLedger, place

    led = FakeLedger(org_state, counter_ids)
    led.execute_all([
        c.SubmitJob(actor="carol", account="ai2/tulu", gpus=2, min_runtime_s=0),
        c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=3600),
    ])  # fmt: skip
    place(led, 1, "n1", 2)  # GPUs 0-1
    led.execute(c.ApplyDecision(actor="@dispatcher", decision=c.DecisionBody(
        cycle_id="cycle-2", based_on=led.state.events, policy_version="test",
        placements=(e.Placement(job_id=2, slots=(GpuSlot(node="n1", gpu_indices=(2, 3)),)),),
    )))  # fmt: skip
    change = NodeChange("n1", "unplace", "leaked", jobs=(2,))
    assert [cmd.job_id for cmd in unplace_commands(change, led.state)] == [2]
    record(led, Observed(nodes=(change,)), "slurm")
    assert (led.state.jobs[1].status, led.state.jobs[2].status) == ("placed", "pending")
