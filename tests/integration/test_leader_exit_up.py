"""atk49-23 F4 from outside, through `gpuledger up` and its real agent: a job whose command exits
at once, leaving a child that ignores SIGTERM. Its supervisor SIGTERMs the child and SIGKILLs it
after the job's grace; until then the job reads `stopping` (`queue`, `jobs`, `explain`) with that
SIGKILL time, and a job waiting for its GPUs is estimated to start at that SIGKILL (plus a
cycle), not at its time limit. Before, it read `running`, with no SIGKILL time, and the estimate
stayed at its time limit (10 minutes away here)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.integration.test_node_lost_stopping_up import _alive, _row, _session, home
from tests.integration.test_up_jobs_survive import Service, cli, jobs, procs, submit, wait_for

__all__ = ["home"]  # the fixture

GRACE_S = 20
LEFT = "(trap '' TERM; while :; do sleep 0.2; done) & sleep 1; exit 0"
"""The command: its leader exits after a second, leaving a child that ignores SIGTERM."""


def _pending(home: Path, job: int) -> dict[str, object]:
    rows = json.loads(cli(home, "queue", "--json").stdout)
    return next((r for r in rows if r["job_id"] == job), {})


def test_a_job_whose_command_exited_reads_stopping_until_its_leftovers_are_killed(
    home: Path,
) -> None:
    submit(home, "bob", 2, LEFT, "-t", "10m", "--grace", f"{GRACE_S}s")  # job 1: both GPUs
    submit(home, "alice", 1, "sleep 600", "-t", "5m")  # job 2: waits for them
    up = Service(home)
    wait_for("job 1 running", lambda: jobs(home)[1]["status"] == "running", home=home)
    started = float(jobs(home)[1]["started_at"])
    wait_for("its command ended, job 1 stopping",
             lambda: _row(home, 1).get("state") == "stopping", timeout=30, home=home)  # fmt: skip
    seen = time.time()
    left = [p for lp in procs(home) for p in _session(lp.pid) if _alive(p)]
    assert left, "its child was already gone"
    row = _row(home, 1)  # the old code: `running`, kill_at None, until its end
    kill_at = float(row["kill_at"])  # type: ignore[arg-type]
    assert started + 1 + GRACE_S - 2 <= kill_at <= seen + GRACE_S + 1, (row, started)
    assert "its command exited" in str(row["reason"]), row
    assert jobs(home)[1]["status"] == "stopping", jobs(home)[1]
    assert jobs(home)[1]["kill_at"] == kill_at, jobs(home)[1]
    said = cli(home, "explain", "1").stdout
    assert "is stopping" in said and "its command exited" in said, said
    # job 2 starts once they are gone, not at job 1's time limit (10 minutes away)
    estimate = _pending(home, 2).get("estimated_start_at")
    assert estimate is not None and float(estimate) <= kill_at + 5, (estimate, kill_at)  # type: ignore[arg-type]
    while any(_alive(p) for p in left):
        assert time.time() < kill_at + 5, "its leftovers outlived their SIGKILL"
        time.sleep(0.5)
    assert time.time() >= kill_at - 2, "killed before its grace ended"
    wait_for("job 1 finished", lambda: jobs(home)[1]["status"] == "finished", home=home)
    wait_for("job 2 running", lambda: jobs(home)[2]["status"] == "running", home=home)
    assert jobs(home)[1].get("kill_at") is None, jobs(home)[1]
    assert up.proc.poll() is None
