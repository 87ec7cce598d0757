"""The Slurm executor's SIGKILL after a grace, a restart's stop that was never signalled, the
Epilog check at start and `--propagate=NONE` (atk47-s F3, F5, F6; atk47-23 F6, F9). Pure."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import msgspec

from ledger.core.state import StoppedRun
from ledger.cycle.executor import Launch
from ledger.engines.slurm.cluster import kill_args
from ledger.engines.slurm.stop_loop import unkilled
from ledger.engines.slurm.stops import KILL_LANDS_S, Stopping, killing_from
from ledger.engines.slurm.words import SbatchUser, SlurmJob, check_config, epilog_note, sbatch_args
from ledger.reads.stopping import stopped_kill_at
from schemas.events import GpuSlot

CONFIG = (
    "PriorityType            = priority/basic\nPreemptType             = preempt/none\n"
    "ProctrackType           = proctrack/cgroup\n"
)
PART = "PartitionName=gpuledger AllowGroups=ALL State=UP PreemptMode=OFF Nodes=vm"


def test_the_kill_after_a_grace_is_a_sigkill_of_the_batch_step_of_that_job_alone() -> None:
    """F3: a plain `scancel` (or `--signal=KILL --full`, which Slurm 22.05 turns into its own
    termination) gave SIGTERM and SIGKILL `KillWait` later; `--batch` with SIGKILL reaches the
    batch step's slurmstepd, which kills its cgroup at once. Named: only that job's."""
    assert kill_args("77", (5, 1)) == [
        "scancel", "--signal=KILL", "--batch", "--name=gpuledger-5", "77"]  # fmt: skip


def test_a_sigkill_that_did_not_land_falls_back_to_slurms_cancel() -> None:
    st = Stopping(100.0, cancelled=True, killed=True, kill_sent_at=110.0)
    running = SlurmJob("77", "gpuledger-5", "RUNNING", "gpuledger", started=True)
    assert not unkilled(st, running, 110.0 + KILL_LANDS_S - 0.1)
    assert unkilled(st, running, 110.0 + KILL_LANDS_S)
    assert not unkilled(st, replace(running, state="COMPLETING"), 200.0)  # it is dying
    assert not unkilled(replace(st, scancelled=True), running, 200.0)  # once
    assert not unkilled(Stopping(100.0), running, 200.0)  # no SIGKILL sent


def test_a_stop_a_restart_finds_never_signalled_is_killed_when_the_reads_said() -> None:
    """F9: its grace counts from the ledger's stop (its SIGKILL at the reads' `kill_at`), from
    the second cancel for one ordered killed; a stray's (no stop recorded) from now."""
    sr = StoppedRun(job_id=5, run=0, slots=(), at=100.0, grace_s=20)
    assert killing_from(sr, 20.0) == 100.0
    assert killing_from(sr, 20.0) + 20.0 == stopped_kill_at(sr, 30.0)
    cut = msgspec.structs.replace(sr, kill=True, killed_at=107.0)
    assert killing_from(cut, 20.0) + 20.0 == stopped_kill_at(cut, 30.0) == 107.0
    assert killing_from(None, 20.0) is None


def test_a_cluster_without_an_epilog_is_refused_unless_the_site_accepts_it() -> None:
    """The issue's note: `up` did not check that slurmd runs gpu-ledger's Epilog; without one,
    what Slurm's proctrack misses lived on beside the next job (atk47-s F1, F2)."""
    (why,) = check_config(CONFIG + PART, "gpuledger")
    assert why.startswith("Epilog is unset") and "epilog.sh" in why, why
    assert check_config(CONFIG + "Epilog = (null)\n" + PART, "gpuledger") == [why]
    assert check_config(CONFIG + PART, "gpuledger", untracked_ok=True) == []
    assert check_config(CONFIG + "Epilog = /etc/slurm/e.sh\n" + PART, "gpuledger") == []


def test_an_epilog_this_host_reads_that_is_not_gpu_ledgers_is_warned_of(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.sh", tmp_path / "theirs.sh"
    ours.write_text("#!/bin/sh\nlogger -t gpuledger-epilog x\n")
    theirs.write_text("#!/bin/sh\nexit 0\n")

    def read(path: str) -> str | None:
        p = Path(path)
        return p.read_text() if p.exists() else None

    assert epilog_note(f"Epilog = {ours}\n", read) == ""
    assert "does not look like gpu-ledger's" in epilog_note(f"Epilog = {theirs}\n", read)
    assert epilog_note(f"Epilog = {tmp_path}/on-the-nodes-only.sh\n", read) == ""
    assert epilog_note("Epilog = (null)\n", read) == ""  # `check_config` refuses that


def test_propagate_none_asks_sbatch_for_none_of_the_services_limits() -> None:
    """F6: `submit --propagate=NONE` records no limit (an empty set): sbatch ran without
    `--propagate=NONE` and handed the job the service's (core 0). A submission that recorded
    none at all (older, HTTP without them) keeps the old rule."""
    job = Launch(5, (GpuSlot(node="n1", gpu_indices=(0,)),), ("true",), None, "alice", "a/b")
    none = replace(job, ulimits=())
    assert "--propagate=NONE" in sbatch_args(none, "gpu", "/l", SbatchUser(), "L")
    assert "--propagate=NONE" not in sbatch_args(job, "gpu", "/l", SbatchUser(), "L")
