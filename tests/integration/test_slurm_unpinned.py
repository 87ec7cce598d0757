"""The Slurm executor on a node whose GPUs are one plain `gpu:N` GRES (not pinned, as at many
sites: Slurm picks the indices, and once a job has ended its record no longer names them): a
private cluster of its own (scripts/slurm/slurm with `GPULEDGER_SLURM_PINNED=0`, free ports),
`gpuledger up --executor slurm` as a process."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import slurm_group
from tests.integration.test_slurm import BUDGET, SLURM_SCRIPT, Cluster, Ledger, status
from tests.integration.test_slurm_records import _partition, _until


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def plain() -> Iterator[Cluster]:
    """A private single-node cluster whose 4 fake GPUs are `gpu:4` (stopped afterwards)."""
    data = Path(tempfile.mkdtemp(prefix="gpuledger-slurm-plain-"))
    for _ in range(3):  # a free port may be taken by another process before Slurm binds it
        ctld = _free_port()
        slurmd = next(p for p in iter(_free_port, None) if p != ctld)
        ports = {"GPULEDGER_SLURMCTLD_PORT": str(ctld), "GPULEDGER_SLURMD_PORT": str(slurmd)}
        # a node name of its own: its jobs' cgroups apart from the suite's clusters' (which may
        # run beside it, scripts/test's two groups)
        env = {**os.environ, "GPULEDGER_SLURM_DATA": str(data), "GPULEDGER_SLURM_PINNED": "0",
               "GPULEDGER_SLURM_NODE": f"{socket.gethostname().split('.')[0]}-plain",
               **ports}  # fmt: skip
        done = subprocess.run([str(SLURM_SCRIPT), "up"], env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        if done.returncode == 0 or "Address already in use" not in done.stderr:
            break
        subprocess.run([str(SLURM_SCRIPT), "down"], env=env, capture_output=True, timeout=120)
    try:
        assert done.returncode == 0, done.stderr
        conf = done.stdout.strip()
        node = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N"], env={**os.environ, "SLURM_CONF": conf},
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        yield Cluster(conf, "gpuledger", node.stdout.split()[0], str(slurm_group(Path(__file__))))
    finally:
        subprocess.run([str(SLURM_SCRIPT), "down"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def ledger(plain: Cluster) -> Iterator[Ledger]:
    plain.up()
    plain.clean()
    top = Path(tempfile.mkdtemp(prefix="gpuledger-slurm-"))
    top.chmod(0o755)
    led = Ledger(top / "home", plain)
    led.cli("init", "--admin", "root")
    (top / "budget.toml").write_text(BUDGET)
    led.cli("budget", "apply", str(top / "budget.toml"))
    try:
        yield led
    finally:
        led.stop()
        plain.clean()
        shutil.rmtree(top, ignore_errors=True)


def test_a_run_first_seen_after_it_ended_keeps_its_gpus_on_an_unpinned_node(
    ledger: Ledger,
) -> None:
    """Issue 23's note: the service is killed while Slurm holds the job (partition down), the
    job runs and ends, the service starts again and adopts a run that has ended: Slurm's record
    no longer names the GPU indices (`gpu:1`), and the run was linked with no GPUs
    (`job.engine_linked.v1` gpus []). It keeps the GPUs it was placed on (Slurm was asked for
    those, and took them: they were the free ones), and the finished job its node and GPUs."""
    work = ledger.work
    ledger.up()
    _partition(ledger, "DOWN")
    try:
        ledger.submit("alice", 2, f'echo "GPUS=$SLURM_JOB_GPUS"; date +%s.%N > {work}/ended')
        held = lambda: any(j["state"] == "PENDING" for j in ledger.cluster.jobs().values())  # noqa: E731
        _until("Slurm to hold the job", held)
        ledger.kill9()  # nothing more is recorded: not its start, not its end
        assert ledger.of("job.started.v1", 1) == []
    finally:
        _partition(ledger, "UP")
    _until("the job to end in Slurm", lambda: (work / "ended").exists(), 120)
    ledger.up()
    ledger.wait("the job to be recorded", lambda: status(ledger, 1) == "finished")
    row = ledger.jobs()[1]
    assert row["finish_reason"] == "completed", row
    (linked,) = ledger.of("job.engine_linked.v1", 1)
    (placed,) = ledger.of("job.placed.v1", 1)
    assert linked["gpus"] == placed["slots"] != [], (linked, placed)  # was []
    (slot,) = placed["slots"]
    gave = next(ln for ln in ledger.log_of(1).splitlines() if ln.startswith("GPUS="))
    assert gave == "GPUS=" + ",".join(map(str, slot["gpu_indices"])), (gave, slot)
    assert row["nodes"] == [ledger.cluster.node], row
