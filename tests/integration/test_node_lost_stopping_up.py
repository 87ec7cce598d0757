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
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ledger.engines.supervised import live_processes
from tests.integration.serverkit import read_served
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
    rows = read_served(home, "queue?state=running&limit=50", "queue", "--state", "running")
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
        if not any(_alive(p) for p in procs):
            break  # they died while `jobs` read (its end may be recorded, the dependents placed)
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


HOSTILE = "trap '' TERM; (trap '' TERM; while :; do sleep 0.2; done) & while :; do sleep 0.2; done"


def placed_and_launched(home: Path, grace_s: int) -> int:
    """A job (HOSTILE, its grace `grace_s`) `up`'s agent launched whose start the ledger did not
    hear: `up` killed -9 at once (a race, retried); `up` is down after."""
    state = home / "agents" / "local"
    for attempt in range(1, 4):
        submit(home, "bob", 1, HOSTILE, "--grace", f"{grace_s}s")
        up = Service(home)
        deadline = time.time() + 60
        while not live_processes(state):
            assert time.time() < deadline, up.log.read_text()[-3000:]
            time.sleep(0.01)
        up.proc.kill()
        up.proc.wait(timeout=30)
        if jobs(home)[attempt]["status"] == "placed":
            return attempt
        cli(home, "cancel", str(attempt))  # its start was heard: again, once its run is gone
        up = Service(home)
        wait_for("no run left", lambda: not live_processes(state), timeout=90, home=home)
        up.proc.kill()
        up.proc.wait(timeout=30)
    raise AssertionError("every launch's start was heard before `up` was killed")


def _tree(home: Path, procs: list[int]) -> Callable[[], bool]:
    """A condition: the only live run's leader and child (both `sh` ignoring TERM) are in
    `procs` (from /proc: its supervisor's wrapper leads the session)."""

    def shells() -> bool:
        leaders = [lp.pid for lp in live_processes(home / "agents" / "local")]
        tree = _session(leaders[0]) if leaders else []
        procs[:] = [p for p in tree if _comm(p) == "sh" and str(p) != _fields(p)[3]]
        return len(procs) == 2

    return shells


def test_the_first_cancel_of_a_requeued_node_lost_job_kills_its_earlier_run(home: Path) -> None:
    """atk50b-23 F2: a resumable job requeued by an admin's `node lost` (then `node return`)
    while its processes ignore SIGTERM: the user's first cancel kills them at once (it ended
    the record and left them to their SIGKILL at loss + grace, 40 s here; a second cancel
    killed them)."""
    submit(home, "bob", 1, HOSTILE, "--grace", "40s", "--resumable")
    up = Service(home)
    wait_for("job 1 running", lambda: jobs(home)[1]["status"] == "running", home=home)
    procs: list[int] = []
    wait_for("its leader and child", _tree(home, procs), home=home)
    lost_at = time.time()
    cli(home, "node", "lost", "local", "--reason", "test")
    cli(home, "node", "return", "local")
    assert jobs(home)[1]["status"] in ("pending", "placed"), jobs(home)[1]
    # F5: the reads name the earlier run still stopping (they said only pending / no job)
    told = cli(home, "explain", "1").stdout
    assert "Its earlier run 0 (node_lost) is still stopping on local GPUs" in told, told
    assert "(stopping: 1)" in cli(home, "node", "list").stdout
    said = cli(home, "cancel", "1", actor="bob").stdout
    while any(_alive(p) for p in procs):
        assert time.time() < lost_at + 15, ("alive after the first cancel", procs, said)
        time.sleep(0.2)
    assert "cancelled job 1" in said and "killed now" in said, said
    kills = [r for r in json.loads(cli(home, "log", "--json", "--limit", "100").stdout)
             if r["event"]["type"] == "job.kill_ordered.v1"]  # fmt: skip
    assert [k["event"]["job_id"] for k in kills] == [1], kills
    assert jobs(home)[1]["outcome"] == "cancelled"
    # the agent says the run gone on its next beat after its processes died (a loaded machine:
    # seconds); until then the run is honestly still stopping and a cancel kills it "now"
    wait_for("its run's end recorded", lambda: "(stopping:" not in
             cli(home, "node", "list").stdout, timeout=60, home=home)  # fmt: skip
    again = cli(home, "cancel", "1", actor="bob", ok=False)
    assert again.returncode != 0, again.stdout  # nothing left to kill: refused in one line
    assert up.proc.poll() is None


def test_a_node_whose_lost_run_still_stops_is_not_removed_and_its_run_is_killed_after_a_restart(
    home: Path,
) -> None:
    """atk50b-23 F1 and F4: `node remove` of a node an admin declared lost while its run's
    processes live out their grace is refused (as `scontrol delete` refuses a node with jobs),
    so `up` killed -9 and started again still has the node's agent, which kills them at loss +
    grace; `node add` of the name cannot place a job on their GPU. Before, the removal was
    recorded, the restarted `up` had no agent for the node, and they ran on for ever."""
    submit(home, "bob", 1, HOSTILE, "--grace", "25s")
    up = Service(home)
    wait_for("job 1 running", lambda: jobs(home)[1]["status"] == "running", home=home)
    procs: list[int] = []
    wait_for("its leader and child", _tree(home, procs), home=home)
    lost_at = time.time()
    cli(home, "node", "lost", "local", "--reason", "test")
    removed = cli(home, "node", "remove", "local", ok=False)
    assert removed.returncode != 0, removed.stdout
    assert "job 1 (run 0)" in removed.stderr and "--force" in removed.stderr, removed.stderr
    assert cli(home, "node", "add", "local", "--gpus", "2", "--gpu-type", "sim", ok=False
               ).returncode != 0  # fmt: skip
    up.proc.kill()  # kill -9 before its SIGKILL
    up.proc.wait(timeout=30)
    assert all(_alive(p) for p in procs), procs
    up = Service(home)
    while any(_alive(p) for p in procs):
        assert time.time() < lost_at + 25 + 15, "its processes outlived its SIGKILL"
        time.sleep(0.5)
    assert time.time() >= lost_at + 25 - 2  # they lived out their grace
    wait_for("its end reported", lambda: jobs(home)[1].get("kill_at") is None, timeout=30,
             home=home)  # fmt: skip
    wait_for("the node removed", lambda: cli(home, "node", "remove", "local", ok=False
                                             ).returncode == 0, timeout=30, home=home)  # fmt: skip
    assert up.proc.poll() is None
