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
from tests.integration.ports import free_port
from tests.integration.test_slurm import BUDGET, GPULEDGER, SLURM_SCRIPT, Cluster, Ledger, status
from tests.integration.test_slurm_records import _hold, _until


@pytest.fixture(scope="module")
def plain() -> Iterator[Cluster]:
    """A private single-node cluster whose 4 fake GPUs are `gpu:4` (stopped afterwards)."""
    data = Path(tempfile.mkdtemp(prefix="gpuledger-slurm-plain-"))
    for _ in range(3):  # a free port may be taken by another process before Slurm binds it
        ctld = free_port()
        slurmd = next(p for p in iter(free_port, None) if p != ctld)
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
    """Issue 23's note: the service is killed while Slurm holds the job (its node reserved), the
    job runs and ends, the service starts again and adopts a run that has ended: Slurm's record
    no longer names the GPU indices (`gpu:1`), and the run was linked with no GPUs
    (`job.engine_linked.v1` gpus []). It keeps the GPUs it was placed on (Slurm was asked for
    those, and took them: they were the free ones), and the finished job its node and GPUs."""
    work = ledger.work
    ledger.up()
    _hold(ledger, True)
    try:
        ledger.submit("alice", 2, f'echo "GPUS=$SLURM_JOB_GPUS"; date +%s.%N > {work}/ended')
        held = lambda: any(j["state"] == "PENDING" for j in ledger.cluster.jobs().values())  # noqa: E731
        _until("Slurm to hold the job", held)
        ledger.kill9()  # nothing more is recorded: not its start, not its end
        assert ledger.of("job.started.v1", 1) == []
    finally:
        _hold(ledger, False)
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


def _epilog(c: Cluster, line: str) -> None:
    """Set this private cluster's `Epilog=` line (`line`: "" for none) and reconfigure Slurm."""
    conf = Path(c.conf)
    kept = [ln for ln in conf.read_text().splitlines() if not ln.startswith("Epilog=")]
    conf.write_text("\n".join([*kept, *([line] if line else [])]) + "\n")
    c.run("scontrol", "reconfigure")
    want = line.partition("=")[2] or "(null)"

    def said() -> str:
        rows = (ln.split("=", 1) for ln in c.run("scontrol", "show", "config").splitlines())
        return next((r[1].strip() for r in rows if r[0].strip() == "Epilog"), "")

    _until("Slurm's Epilog", lambda: said() == want)


def test_up_refuses_a_cluster_without_gpu_ledgers_epilog_in_one_line(ledger: Ledger) -> None:
    """The issue's note: `up` did not check that slurmd runs the ledger's Epilog (docs/slurm.md,
    "Site requirement"), without which what Slurm's proctrack misses lives on beside the next
    job (atk47-s F1, F2). Slurm's own config (`scontrol show config`) without an Epilog: `up`
    refuses, one line naming it; the site's `GPULEDGER_SLURM_UNTRACKED_OK=1` accepts it; an
    Epilog this host reads that is not gpu-ledger's starts with one warning line."""
    c = ledger.cluster
    lines = Path(c.conf).read_text().splitlines()
    original = next(ln for ln in lines if ln.startswith("Epilog="))
    other = ledger.work / "site-epilog.sh"
    other.write_text("#!/bin/sh\nexit 0\n")
    other.chmod(0o755)
    try:
        _epilog(c, "")
        done = subprocess.run(
            [GPULEDGER, "up", "--executor", "slurm", "--partition", c.partition],
            env=ledger.env("root"), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode != 0, done.stdout
        said = [ln for ln in done.stderr.splitlines() if "Epilog" in ln]
        assert len(said) == 1 and "Epilog is unset" in said[0], done.stderr
        ledger.up(GPULEDGER_SLURM_UNTRACKED_OK="1")  # the site accepts the risk: it runs
        ledger.stop()
        _epilog(c, f"Epilog={other}")
        ledger.up()
        warned = lambda: "does not look like gpu-ledger's" in ledger.service_log()  # noqa: E731
        ledger.wait("its warning", warned)
        ledger.stop()
    finally:
        _epilog(c, original)
