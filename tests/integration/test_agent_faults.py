"""Node agents through the faults the outside kill tests found (issue 24, F2-F4, F10, F11): a
job's supervisor killed with -9 while its node is cut off, an agent's state file or whole state
directory lost while its jobs run, an admin's `node lost` of a node whose agent still runs. Real
`serve` and `agent` processes (the cluster of agentkit.py), real jobs that fork.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.integration.agentkit import (
    Cluster,
    alive,
    all_events,
    audit_check,
    cluster,
    held_twice,
    running_pid,
    take_node_when_free,
    template,
    wait_for,
    with_flags,
)
from tests.integration.userkit import os_user

__all__ = ["cluster", "template"]  # the fixtures, shared with agentkit.py

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
    # F11: launch 0 is charged until the fence, when its lease stopped it, not to the loss
    events = all_events(c)
    [lost] = [ev for ev in events if ev["type"] == "node.lost.v1" and ev["node"] == node]
    [end] = [ev for ev in events if ev["type"] == "job.engine_ended.v2" and ev["job_id"] == job]
    assert end["ended_at"] >= lost["at"] + lost["fence_s"], (end, lost)
    c.agents[node].proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    wait_for("the node to return", lambda: c.nodes()[node] == "active", 30, c.why)
    c.server.stop(signal.SIGTERM)
    assert ": 0 violations" in audit_check(c)


def flagged(flag: Path, starts: Path) -> str:
    """A job that notes each start, forks, and exits 3 once `flag` exists."""
    return (
        f"echo $$; echo start $$ >>{starts}; sleep 600 & "
        f"while [ ! -e {flag} ]; do sleep 0.2; done; exit 3"
    )


@with_flags(serve=("--node-lost-after", "60s"))
def test_an_agent_that_lost_its_state_file_finds_its_live_run_and_reports_its_real_exit(
    cluster: Cluster,
) -> None:
    """F3: the agent is killed, its state.json removed, and it is started again. It finds the
    run from its run directory and processes, keeps its GPUs held and reports the exit the job
    really made (before: reported lost at once, its GPUs given to the next job)."""
    c = cluster
    flag, starts = c.home.parent / "go", c.home.parent / "starts"
    job = c.submit(2, flagged(flag, starts))
    node, _ = running_pid(c, job)
    ag = c.agents[node]
    ag.kill(signal.SIGKILL)
    (ag.state / "state.json").unlink()
    ag.start()
    assert "adopting it from its processes" in ag.text()
    c.submit(2, "sleep 1")  # the next job: it must wait for the GPUs the live run holds
    flag.touch()
    done = c.wait_status(job, "finished")
    assert (done["outcome"], done["exit_code"]) == ("failed", 3), done
    assert starts.read_text().count("start") == 1
    c.server.stop(signal.SIGTERM)
    assert ": 0 violations" in audit_check(c)
    assert held_twice(all_events(c)) == []


@with_flags(serve=("--node-lost-after", "60s"))
def test_an_agent_whose_state_directory_is_gone_never_starts_its_live_run_twice(
    cluster: Cluster,
) -> None:
    """F4: the agent is killed and its whole state directory moved away. Started again on a
    new, empty one, it is another agent (its id was in the old directory: atk38-23 F9), so it
    is refused while the node's run may be alive and launches nothing (it finds the run from
    the processes marked with it, and leaves it alone). Given its directory back, it is the
    same agent again and adopts the run: started once, its real exit reported."""
    c = cluster
    flag, starts = c.home.parent / "go", c.home.parent / "starts"
    job = c.submit(2, flagged(flag, starts))
    node, _ = running_pid(c, job)
    ag = c.agents[node]
    ag.kill(signal.SIGKILL)
    old = ag.state.with_name(ag.state.name + ".old")
    ag.state.rename(old)
    before = len(ag.text())
    ag.start(registered=False)
    assert ag.proc is not None and ag.proc.wait(timeout=60) == 1, ag.text()[before:]
    said = ag.text()[before:]
    assert f"node '{node}' is held by another agent" in said and "launched" not in said, said
    shutil.rmtree(ag.state)
    old.rename(ag.state)
    ag.start()
    assert f"adopted 1 running job(s): {job}" in ag.text()[before:]
    c.submit(2, "sleep 1")
    flag.touch()
    done = c.wait_status(job, "finished")
    assert (done["outcome"], done["exit_code"]) == ("failed", 3), done
    assert starts.read_text().count("start") == 1, starts.read_text()
    assert held_twice(all_events(c)) == []


@with_flags(serve=("--node-fence", "4s"))
def test_a_job_whose_state_directory_was_removed_stops_at_its_fence_before_another_agent_runs(
    cluster: Cluster,
) -> None:
    """atk39-23 F7: the agent killed -9 and its state directory removed (the lease with it),
    another agent started on a new directory: the job never fenced itself ("no lease file: no
    fence"), while the server called its node lost and its fence passed and let the new agent
    take the node and launch the next job on the same GPUs. A part now counts a missing lease
    as run out at the last `until` it read: the whole tree (a child that ignores SIGTERM too)
    is gone by the time the new agent takes the node."""
    c = cluster
    job = c.submit(2, FORKS)
    node, pid = running_pid(c, job)
    tree = [pid, *wait_for("the job's children", lambda: len(children(pid)) == 2 and children(pid))]
    ag = c.agents[node]
    ag.kill(signal.SIGKILL)
    shutil.rmtree(ag.state)
    ag.state = ag.state.with_name(ag.state.name + ".new")
    try:
        take_node_when_free(ag, lambda: None)
        assert [p for p in tree if alive(p)] == [], c.why()  # fenced by its own part
        assert c.job(job)["status"] != "running"
    finally:
        for p in tree:  # never outlives the test, whatever it found
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def test_an_admins_node_lost_stays_until_the_admin_returns_the_node(cluster: Cluster) -> None:
    """F10: `node lost` by an admin while the node's agent still runs. The agent's next report
    is told the node is lost and registers again; that no longer returns the node (before: it
    was active again within seconds). `node return` does."""
    c = cluster
    node = "node-a"
    c.cli("node", "lost", node, "--reason", "bad fan")
    wait_for(
        "the agent to register again and be refused the return",
        lambda: "stays lost" in c.server.log_path.read_text(errors="replace"),
        60, c.why,
    )  # fmt: skip
    assert c.nodes()[node] == "lost"
    job = c.submit(2 * 3, "sleep 1")  # every GPU: it waits while node-a is lost
    assert c.job(job)["status"] == "pending"
    c.cli("node", "return", node)
    wait_for("the node to be active", lambda: c.nodes()[node] == "active", 30, c.why)
    c.wait_status(job, "running", "finished")


@with_flags(serve=("--node-lost-after", "60s"))
def test_a_process_another_user_marks_as_a_job_never_stops_or_wedges_it_at_a_restart(
    cluster: Cluster,
) -> None:
    """atk36-23 F6, F3: any OS user can start a process carrying a job's markers (the scope is
    in every job's own environment): one naming another user's running job with a later launch,
    one naming a job never placed there. The agent, started again, took the first for the job's
    newest launch and SIGKILLed the real run as an older one (recorded failed, 137, its TERM
    trap never ran), and retried a report of the second forever, recording nothing behind it.
    Now neither is believed: the job runs on, its exit is reported, and the forger's processes
    are left alone."""
    c = cluster
    flag, starts = c.home.parent / "go-f6", c.home.parent / "starts-f6"
    job = c.submit(2, flagged(flag, starts))
    node, pid = running_pid(c, job)
    env = dict(
        item.split("=", 1)
        for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        if "=" in item
    )
    scope, launch = env["GPULEDGER_SCOPE"], int(env["GPULEDGER_LAUNCH"])
    ag = c.agents[node]
    with os_user("atk") as forger:
        marks = [
            ["setsid", "env", "-i", f"GPULEDGER_SCOPE={scope}", f"GPULEDGER_JOB_ID={jid}",
             f"GPULEDGER_LAUNCH={n}", "RANK=0", "sleep", "300"]
            for jid, n in ((job, launch + 1), (job + 1000, 1))
        ]  # fmt: skip
        forged = [
            subprocess.Popen(m, user=forger.uid, group=forger.gid, extra_groups=[]) for m in marks
        ]
        try:
            ag.kill(signal.SIGKILL)
            ag.start()
            wait_for("the agent's first report", lambda: "adopted job" in ag.text(), 30, c.why)
            time.sleep(2)
            assert alive(pid), ag.text()
            flag.touch()
            done = c.wait_status(job, "finished")
            assert (done["outcome"], done["exit_code"]) == ("failed", 3), done
            assert starts.read_text().count("start") == 1
            assert all(f.poll() is None for f in forged)
            assert not list((ag.state / "runs").glob(f"{job}.{launch + 1}"))
            assert not list((ag.state / "runs").glob(f"{job + 1000}.*"))
        finally:
            for f in forged:
                f.kill()
                f.wait()
    assert held_twice(all_events(c)) == []
