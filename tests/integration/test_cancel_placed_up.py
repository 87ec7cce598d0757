"""atk51-23 F3 from outside, through `gpuledger up` and its real agent, with a job whose leader
and child ignore SIGTERM (/proc checks).

`up` killed -9 right after its agent launched a job (the ledger reads it `placed`: its start was
not heard), then a cancel: the ledger kept no stopped run, so its GPUs read free at once, the
next job was placed on them (and read `placed` with no reason while the processes lived), and
the restarted `up`'s agent gave the processes a new grace, from the restart. Now the cancelled
launch is `stopping` from the cancel (SIGKILL at the cancel plus the grace), holds its GPUs
(the next job waits, and says why), and its processes are gone by that SIGKILL."""

from __future__ import annotations

import time
from pathlib import Path

from ledger.engines.supervised import live_processes
from tests.integration.test_node_lost_stopping_up import HOSTILE, _alive, _row, _tree, home
from tests.integration.test_up_jobs_survive import Service, cli, jobs, submit, wait_for

__all__ = ["home"]  # the fixture

GRACE_S = 25


def _placed_and_launched(home: Path) -> int:
    """A job `up`'s agent launched whose start the ledger did not hear (`up` killed -9 at
    once: a race, retried)."""
    state = home / "agents" / "local"
    for attempt in range(1, 4):
        submit(home, "bob", 1, HOSTILE, "--grace", f"{GRACE_S}s")
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


def test_a_cancel_of_a_placed_launched_job_stops_it_from_the_cancel_and_holds_its_gpu(
    home: Path,
) -> None:
    job = _placed_and_launched(home)
    procs: list[int] = []
    wait_for("its leader and child", _tree(home, procs), home=home)
    cancelled = time.time()
    cli(home, "cancel", str(job), actor="bob")  # `up` is down: embedded
    row = _row(home, job)  # the old code: no row (finished), nothing stopping
    assert row.get("state") == "stopping", row
    kill_at = float(row["kill_at"])  # type: ignore[arg-type]
    assert cancelled - 2 <= kill_at - GRACE_S <= time.time() + 1, row
    submit(home, "alice", 2, "sleep 600")  # the whole node: only once the launch is gone
    later = max(jobs(home))
    time.sleep(8)  # a restart well after the cancel: the old code's SIGKILL came 8 s later
    up = Service(home)  # its agent adopts the launch and stops it
    seen_alive = time.time()
    while any(_alive(p) for p in procs):
        seen_alive = time.time()
        assert seen_alive < kill_at + 4, "its processes outlived the cancel plus its grace"
        # nothing placed on the GPU they hold (the old code: placed at once); a read slow
        # under load may end after they died, so a placement seen is checked against them
        row = jobs(home)[later]
        assert row["status"] == "pending" or not any(_alive(p) for p in procs), row
        time.sleep(0.2)
    gone = time.time()
    assert gone >= kill_at - 3, "killed before its grace ended"
    wait_for("the next job running", lambda: jobs(home)[later]["status"] == "running",
             timeout=30, home=home)  # fmt: skip
    placed = jobs(home)[later]["placed_at"]
    assert placed >= seen_alive, f"placed {seen_alive - placed:.1f} s before its GPU was free"
    assert jobs(home)[job].get("kill_at") is None, jobs(home)[job]  # its end is recorded
    assert up.proc.poll() is None
