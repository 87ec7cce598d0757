"""atk51-23 F1 and F2 from outside, through `gpuledger up` and its real agent, with a job whose
leader and child ignore SIGTERM (/proc checks).

F1: `up` killed -9 right after its agent launched a job (the ledger reads it `placed`: its start
was not heard), then `node lost` and `node remove`: the removal was accepted, `up` restarted
with no agent for the node, and the job's processes ran on for ever, unseen. Now the removal is
refused while that launch may live; the restarted `up`'s agent stops it and reports it gone, and
the removal is accepted after that.

F2: a cancelled run whose node is removed with `--force` (the machine gone for good) stayed
`stopping` for a day: its `afterany` dependent waited with every GPU free. Now `--force` forgets
it (its end is recorded at the removal) and the dependent runs.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from ledger.engines.supervised import live_processes
from tests.integration.test_node_lost_stopping_up import (
    HOSTILE,
    _alive,
    _tree,
    home,
    placed_and_launched,
)
from tests.integration.test_up_jobs_survive import Service, cli, jobs, submit, wait_for

__all__ = ["home"]  # the fixture


def test_a_node_lost_while_its_launch_was_unheard_is_not_removed_until_the_launch_is_gone(
    home: Path,
) -> None:
    job = placed_and_launched(home, 15)
    procs: list[int] = []
    wait_for("its leader and child", _tree(home, procs), home=home)
    cli(home, "node", "lost", "local", "--reason", "test")
    removed = cli(home, "node", "remove", "local", ok=False)
    # the old code: `removed local`, and nothing ever killed them
    assert removed.returncode != 0, removed.stdout
    assert f"job {job} (run 0, placed when the node was lost)" in removed.stderr, removed.stderr
    assert all(_alive(p) for p in procs), procs
    restart = time.time()
    up = Service(home)  # its agent adopts the launch and stops it (the ledger no longer runs it)
    while any(_alive(p) for p in procs):
        assert time.time() < restart + 15 + 20, "its processes outlived their grace"
        time.sleep(0.5)
    wait_for("the node removed", lambda: cli(home, "node", "remove", "local", ok=False
                                             ).returncode == 0, timeout=30, home=home)  # fmt: skip
    assert up.proc.poll() is None


def test_force_forgets_a_cancelled_run_and_its_afterany_dependent_runs(home: Path) -> None:
    cli(home, "node", "add", "other", "--gpus", "2", "--gpu-type", "sim")
    cli(home, "node", "drain", "other", "--reason", "not yet")
    submit(home, "bob", 1, HOSTILE, "--grace", "120s")
    up = Service(home)
    wait_for("job 1 running", lambda: jobs(home)[1]["status"] == "running", home=home)
    procs: list[int] = []
    wait_for("its leader and child", _tree(home, procs), home=home)
    cli(home, "cancel", "1", actor="bob")  # stopping: 120 s of grace
    up.proc.kill()  # the machine dies: `up` and the job's processes with it
    up.proc.wait(timeout=30)
    for lp in live_processes(home / "agents" / "local"):
        os.killpg(lp.pid, signal.SIGKILL)
    refused = cli(home, "node", "remove", "local", ok=False)
    assert refused.returncode != 0 and "job 1 (run 0)" in refused.stderr, refused.stderr
    cli(home, "node", "remove", "local", "--force")
    cli(home, "node", "return", "other")
    submit(home, "alice", 1, "sleep 600", "-d", "afterany:1")  # job 2
    up = Service(home)
    # the old code: job 1 `stopping` (its SIGKILL long past after 120 s), job 2 pending for a day
    wait_for("job 2 running", lambda: jobs(home)[2]["status"] == "running", timeout=60, home=home)
    assert jobs(home)[1].get("kill_at") is None, jobs(home)[1]
    assert "forgotten by `node remove local --force`" in cli(home, "explain", "1").stdout
    assert up.proc.poll() is None


def test_node_lost_counts_an_afterok_dependent_apart_from_the_failed_jobs(home: Path) -> None:
    """atk51-23 (wording): `node lost` said `2 failed` for its one job and an `afterok`
    dependent elsewhere that ended with it (`dependency_never_satisfied`)."""
    submit(home, "bob", 1, "sleep 600", "--grace", "1s")
    submit(home, "alice", 1, "sleep 600", "-d", "afterok:1")  # job 2, pending
    up = Service(home)
    wait_for("job 1 running", lambda: jobs(home)[1]["status"] == "running", home=home)
    said = cli(home, "node", "lost", "local", "--reason", "test").stdout
    assert "local is lost: 0 jobs requeued, 1 failed, 1 dependent jobs ended" in said, said
    assert jobs(home)[2]["status"] == "finished"
    assert up.proc.poll() is None
