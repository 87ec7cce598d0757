"""A run Slurm starts without the GPUs the ledger placed it on never runs its command
(atk40-24 F2: Slurm 22.05 requeues a launch that failed on a node whose slurmd had just died and
starts it again with no GRES at all, `JOB_GRES=(null)`, no `CUDA_VISIBLE_DEVICES`). The real
batch script in bash, Slurm's variables as slurmd sets them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ledger.cycle.executor import Launch
from ledger.engines.slurm.launching import (
    WRONG_GPUS,
    never_ran,
    never_ran_reason,
    run_script,
)
from ledger.engines.slurm.script import batch_script
from ledger.engines.slurm.words import SbatchUser, SlurmJob
from schemas.events import GpuSlot


def _run(tmp_path: Path, slots: tuple[GpuSlot, ...], pinned: set[str],
         env: dict[str, str]) -> tuple[int, bool, bool]:  # fmt: skip
    """(exit code, whether the command ran, whether the `wrong-gpus` mark was left)."""
    ran = tmp_path / "ran"
    job = Launch(5, slots, ("sh", "-c", f": > {ran}"), None, "alice", "ai2/olmo")
    script = tmp_path / "batch"
    script.write_text(batch_script(job, ended_file=str(tmp_path / "ended"),
                                   launched_file=str(tmp_path / "launched"),
                                   wrong_gpus_file=str(tmp_path / WRONG_GPUS),
                                   pinned_nodes=pinned))  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    done = subprocess.run(["/bin/bash", str(script)], env=base | env, capture_output=True,
                          timeout=30, check=False)  # fmt: skip
    wrong = (tmp_path / WRONG_GPUS).exists()
    if wrong:
        assert b"without the GPUs the ledger placed it on" in done.stderr
        assert not (tmp_path / "launched").exists()
    return done.returncode, ran.exists(), wrong


ONE = (GpuSlot(node="n1", gpu_indices=(2, 0)),)


@pytest.mark.parametrize(
    ("pinned", "env", "want"),
    [
        ({"n1"}, {"SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0,2"}, (0, True, False)),
        # Slurm 22.05's restart of a requeued launch: no GRES at all
        ({"n1"}, {"SLURMD_NODENAME": "n1"}, (127, False, True)),
        ({"n1"}, {"SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": ""}, (127, False, True)),
        ({"n1"}, {"SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0,1"}, (127, False, True)),
        ({"n1"}, {"SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0"}, (127, False, True)),
        ({"n1"}, {"SLURMD_NODENAME": "n9", "SLURM_JOB_GPUS": "0,2"}, (127, False, True)),
        # plain `gpu:N` nodes: Slurm picks the lowest free ones; as many is right
        (set(), {"SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0,1"}, (0, True, False)),
        (set(), {"SLURMD_NODENAME": "n1"}, (127, False, True)),
    ],
)
def test_the_script_runs_its_command_only_on_the_gpus_the_ledger_placed_it_on(
    tmp_path: Path, pinned: set[str], env: dict[str, str], want: tuple[int, bool, bool]
) -> None:
    assert _run(tmp_path, ONE, pinned, env) == want


def test_a_placement_of_no_gpus_or_of_several_nodes_is_not_checked(tmp_path: Path) -> None:
    """What Slurm says of a gang's other nodes' GPUs on the batch node is not checked yet."""
    gang = (GpuSlot(node="n1", gpu_indices=(0,)), GpuSlot(node="n2", gpu_indices=(1,)))
    assert _run(tmp_path, gang, {"n1", "n2"}, {"SLURMD_NODENAME": "n1"}) == (0, True, False)
    (tmp_path / "ran").unlink()
    none = (GpuSlot(node="n1", gpu_indices=()),)
    assert _run(tmp_path, none, {"n1"}, {"SLURMD_NODENAME": "n1"}) == (0, True, False)


def test_a_run_that_left_the_mark_never_ran_and_ends_with_its_node(tmp_path: Path) -> None:
    """The executor reads the mark of a run not recorded started: its command never ran, and it
    ends `node_failure` (a resumable job is placed again), not `launch_failed`."""
    job = Launch(5, ONE, ("true",), None, "alice", "ai2/olmo")
    ended = SlurmJob("7", "gpuledger-5", "FAILED", "p", exit_code=127, start_time=100.0,
                     end_time=100.0)  # fmt: skip
    assert never_ran(ended, job, (), tmp_path, False, 10.0) == ""
    (tmp_path / WRONG_GPUS).touch()
    why = never_ran(ended, job, (), tmp_path, False, 10.0)
    assert why.startswith("Slurm started it without the GPUs") and never_ran_reason(why) == (
        "node_failure"
    )
    assert never_ran_reason("cannot enter the working directory /x") == "launch_failed"
    # Slurm's first start of the launch may have been recorded (RUNNING 10 s unmarked), and
    # its StartTime may stay that first one
    assert never_ran(ended, job, (), tmp_path, True, 10.0) == why
    late = SlurmJob("7", "gpuledger-5", "FAILED", "p", exit_code=127, start_time=100.0,
                    end_time=130.0)  # fmt: skip
    assert never_ran(late, job, (), tmp_path, True, 10.0) == why
    (tmp_path / "launched").touch()
    assert never_ran(late, job, (), tmp_path, True, 10.0) == ""  # it ran: the mark is the user's


def test_the_executors_script_checks_its_gpus(tmp_path: Path) -> None:
    """The wiring: the script the executor submits has the check, its mark beside the run's."""
    job = Launch(5, ONE, ("true",), None, "alice", "ai2/olmo")
    text = run_script(job, SbatchUser(), tmp_path / "checkpoint", 0o022, (), 0o077, "", 13,
                      {"n1"}, 11)  # fmt: skip
    assert f"{tmp_path / WRONG_GPUS}" in text and '"${SLURM_JOB_GPUS-}" = 0,2' in text
