"""atk49-23 F3 from outside, through `gpuledger up` and its real agent: an admin's `node lost`
(then `node return`) of a node whose job ignores SIGTERM and has a child that ignores it too.
The agent stops the run the ledger no longer has (SIGTERM, the grace, SIGKILL); until its
processes are gone (`/proc`) the job reads `stopping` with its SIGKILL time, its `afterany`
dependent and a `singleton` of its name wait, and no job is placed on its GPU. Before, the
job read failed with no SIGKILL time and the dependent ran beside its live processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.engines.supervised import live_processes
from tests.integration.test_up_jobs_survive import (
    Service,
    cli,
    jobs,
    stop_started,
    submit,
    wait_for,
)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    cli(home, "init", "--admin", "root")
    budget = tmp_path / "b.toml"
    budget.write_text(
        '[accounts."ai2"]\nkind = "program"\n'
        '[accounts."ai2/olmo"]\nkind = "project"\nmembers = ["alice", "bob"]\n'
    )
    cli(home, "budget", "apply", str(budget))
    cli(home, "node", "add", "local", "--gpus", "2", "--gpu-type", "sim")
    yield home
    stop_started()
    for d in (home / "agents").glob("*"):
        for p in live_processes(d):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)


def _fields(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command: state, ppid, pgrp, session, ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return []


def _session(pid: int) -> list[int]:
    """Every process of `pid`'s session, from /proc (the job's tree: its supervisor makes one)."""
    sid = (_fields(pid) or ["", "", "", ""])[3]
    return [int(d.name) for d in Path("/proc").iterdir()
            if d.name.isdigit() and (_fields(int(d.name)) or [""] * 4)[3] == sid]  # fmt: skip


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return ""


def _alive(pid: int) -> bool:
    """The process is alive (not a zombie), as /proc says."""
    state = _fields(pid)
    return bool(state) and state[0] != "Z"


def _row(home: Path, job: int) -> dict[str, object]:
    rows = json.loads(cli(home, "queue", "--state", "running", "--json").stdout)
    return next((r for r in rows if r["job_id"] == job), {})


def test_an_admins_node_lost_leaves_its_live_run_stopping_holding_dependents_and_gpu(
    home: Path,
) -> None:
    state = home / "agents" / "local"
    hostile = (
        "trap '' TERM; (trap '' TERM; while :; do sleep 0.2; done) & while :; do sleep 0.2; done"
    )
    submit(home, "bob", 1, hostile, "--grace", "25s", "-J", "rb")
    up = Service(home)
    wait_for("job 1 running", lambda: jobs(home)[1]["status"] == "running", home=home)
    procs: list[int] = []

    def shells() -> bool:  # the leader and its child, both `sh` ignoring TERM
        leaders = [lp.pid for lp in live_processes(state)]
        tree = _session(leaders[0]) if leaders else []  # its supervisor's wrapper leads it
        procs[:] = [p for p in tree if _comm(p) == "sh" and str(p) != _fields(p)[3]]
        return len(procs) == 2

    wait_for("its leader and child", shells, home=home)
    [slot] = jobs(home)[1]["slots"]
    gpu = slot["gpu_indices"]
    lost_at = time.time()
    cli(home, "node", "lost", "local", "--reason", "test")
    cli(home, "node", "return", "local")
    row = _row(home, 1)
    assert row.get("state") == "stopping", row  # was gone from the running jobs: failed
    kill_at = float(row["kill_at"])  # type: ignore[arg-type]
    assert lost_at - 1 <= kill_at - 25 <= lost_at + 3, (row, lost_at)
    assert jobs(home)[1]["kill_at"] == kill_at
    submit(home, "alice", 1, "sleep 600", "-d", "afterany:1")  # job 2
    submit(home, "bob", 1, "sleep 600", "-J", "rb", "-d", "singleton")  # job 3
    submit(home, "alice", 2, "sleep 600")  # job 4: two GPUs, one held
    said = cli(home, "explain", "2").stdout
    assert "job 1" in said, said
    while any(_alive(p) for p in procs):
        state = jobs(home)
        assert all(state[j]["status"] == "pending" for j in (2, 3, 4)), (
            {j: state[j]["status"] for j in (2, 3, 4)},
            up.log.read_text()[-3000:],
        )
        assert time.time() < kill_at + 15, "its processes outlived its SIGKILL"
        time.sleep(0.5)
    gone_at = time.time()
    assert gone_at >= kill_at - 2, (gone_at, kill_at)  # they lived out their grace
    wait_for("job 2 running", lambda: jobs(home)[2]["status"] == "running", timeout=60, home=home)
    assert jobs(home)[2]["slots"][0]["gpu_indices"] in (gpu, [1 - gpu[0]])
    assert jobs(home)[1]["status"] == "finished" and jobs(home)[1]["outcome"] == "failed"
    assert up.proc.poll() is None
