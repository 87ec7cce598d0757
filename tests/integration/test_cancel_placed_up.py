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

from tests.integration.test_node_lost_stopping_up import (
    _alive,
    _row,
    _tree,
    home,
    placed_and_launched,
)
from tests.integration.test_up_jobs_survive import Service, cli, jobs, submit, wait_for

__all__ = ["home"]  # the fixture

GRACE_S = 25


def test_a_cancel_of_a_placed_launched_job_stops_it_from_the_cancel_and_holds_its_gpu(
    home: Path,
) -> None:
    job = placed_and_launched(home, GRACE_S)
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
    # nothing can kill them before the service is back: under load (CI 20-27, here ~50) its start
    # (" up: ") came after `kill_at` (17 s), its agent's SIGKILL 0.5 s after that; the old
    # code's came a whole grace after the restart, past either bound
    serving = seen_alive = time.time()
    while any(_alive(p) for p in procs):
        seen_alive = time.time()
        assert seen_alive < max(kill_at, serving) + 4, (
            "its processes outlived the cancel plus its grace (or the restart, if later)",
            kill_at, serving)  # fmt: skip
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
    # its launch ran: its end says when it started (its agent's word), so `jobs` names where
    # it ran and it is charged from then, as Slurm accounts a cancelled job from its start
    # (atk52-23 F4, atk54-23 F3: no start, not charged)
    wait_for("its run's start recorded", lambda: jobs(home)[job].get("started_at") is not None,
             timeout=30, home=home)  # fmt: skip
    got = jobs(home)[job]
    assert got["started_at"] <= cancelled, got
    assert [sl["node"] for sl in got["slots"]] == ["local"], got
    assert "charged from its own start" in cli(home, "explain", str(job)).stdout
    assert up.proc.poll() is None
