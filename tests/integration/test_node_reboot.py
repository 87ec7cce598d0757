"""A rebooted node's agent says so at once (docs/agent.md, "One agent per node"): real server,
real agents (the fixtures of agentkit.py, kept apart: that file is long). The host's
reboot is its processes killed and another boot id and uptime where the agent reads them
(`GPULEDGER_AGENT_PROC`, a directory standing for /proc); its state directory survives, as a
disk does."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from ledger.agent.identity import BOOT_FILE, PROC_ENV
from ledger.engines.supervised import live_processes
from tests.integration import agentkit as base
from tests.integration.agentkit import (
    Cluster,
    alive,
    launches,
    running_pid,
    take_node_when_free,
    until,
    wait_for,
    with_flags,
)

template, cluster = base.template, base.cluster  # the node agents' suite's fixtures

LOST_AFTER_S = 20
"""The server's node-lost timeout here: it believes a reboot from a holder silent since half
of it before the boot (`fence.reboot_honoured`); its fence stays the default 300 s."""


def reboot(c: Cluster, node: str, proc: Path, boot: str, uptime_s: float) -> None:
    """`node`'s host goes down: its agent and every process of its jobs killed; it comes back
    with boot id `boot`, `uptime_s` seconds since that boot, when its agent next starts."""
    ag = c.agents[node]
    ag.power_off()
    (proc / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(f"{boot}\n")
    (proc / "uptime").write_text(f"{uptime_s:.2f} 0.00\n")
    ag.prefix = ("env", f"{PROC_ENV}={proc}")


@with_flags(serve=("--node-lost-after", f"{LOST_AFTER_S}s"))
def test_a_rebooted_nodes_agent_ends_its_runs_at_once_not_after_node_lost_and_the_fence(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The issue's open point: a rebooted node's agent was a new agent, refused until its
    runs ended by the node-lost rules (the node-lost timeout + the fence, ~6.5 min by default).
    Now it says it rebooted (its state directory's boot id is not this boot's) and the server,
    which last heard the holder before that boot, ends the node's runs at once (the resumable
    job requeued, `node_failure`, the engine's note naming the reboot) and takes the agent: it
    registers at its first try, the job runs again, once, and completes."""
    c = cluster
    go, marks = tmp_path / "go", tmp_path / "marks"
    job = c.submit(1, f"echo x >> {marks}; " + until(go, 0), "--resumable")
    node = c.wait_status(job, "running")["logs"][0].split(":", 1)[0]
    wait_for("the job's start", lambda: marks.exists(), 30, c.why)
    pids = [p.pid for p in live_processes(c.agents[node].state)]
    reboot(c, node, tmp_path / "proc", "7e1f0c2a-5b3d-4e6f-8a9b-0c1d2e3f4a5b", 1.0)
    wait_for("the job's processes to go", lambda: not any(alive(p) for p in pids), 30, c.why)
    time.sleep(LOST_AFTER_S / 2 + 1.0 + 1.5)  # the holder silent since well before the boot
    before = len(c.agents[node].text())
    c.agents[node].start()  # registers at once: not refused for the holder it was
    said = c.agents[node].text()[before:]
    assert "held by another agent" not in said, said
    [pre] = wait_for("the run's end", lambda: c.events("job.preempted.v1"), 30, c.why)
    assert (pre["job_id"], pre["reason"]) == (job, "node_failure"), pre
    [ended] = [e for e in c.events("job.engine_ended.v2") if e["job_id"] == job]
    assert f"node {node}: its host rebooted" in ended["note"], ended
    wait_for("the job's next launch", lambda: len(launches(marks)) == 2, 60, c.why)
    go.touch()
    done = c.wait_status(job, "finished")
    assert (done["outcome"], done["exit_code"]) == ("completed", 0), done
    assert len(c.events("job.started.v1")) == 2
    state = c.agents[node].state
    assert (state / BOOT_FILE).read_text().strip() == "7e1f0c2a-5b3d-4e6f-8a9b-0c1d2e3f4a5b"


@with_flags(serve=("--node-lost-after", f"{LOST_AFTER_S}s"))
def test_a_job_that_completed_before_its_nodes_reboot_stays_completed_and_never_runs_again(
    cluster: Cluster, tmp_path: Path
) -> None:
    """atk43 F4: the agent down while its job completes (its supervisor wrote exit 0 in the
    run directory, which survives), then the host reboots. The server ended the node's runs as
    `node_failure` at the agent's first request, before its report of that exit: the resumable
    job was requeued and ran a second time. Now the agent's first request after the reboot
    carries the ends recorded before it: completed, exit 0, at its own end, one launch."""
    c = cluster
    go, marks = tmp_path / "go", tmp_path / "marks"
    job = c.submit(2, f"echo x >> {marks}; " + until(go, 0), "--resumable")
    node = c.wait_status(job, "running")["logs"][0].split(":", 1)[0]
    wait_for("the job's start", lambda: marks.exists(), 30, c.why)
    [part] = live_processes(c.agents[node].state)
    c.agents[node].kill()  # the agent is down (a crash, an upgrade); the job runs on
    down = time.monotonic()
    go.touch()
    runs = c.agents[node].state / "runs"
    [exit_file] = wait_for(
        "the exit its supervisor records", lambda: list(runs.glob(f"{job}.1/*/exit")), 30
    )
    assert not any(alive(p) for p in (part.pid, *part.pids))
    assert json.loads(exit_file.read_text())["code"] == 0
    ended_at = time.time()
    reboot(c, node, tmp_path / "proc", "3c1f0c2a-5b3d-4e6f-8a9b-0c1d2e3f4a5b", 1.0)
    time.sleep(max(0.0, down + LOST_AFTER_S / 2 + 2.5 - time.monotonic()))
    c.agents[node].start()
    done = c.wait_status(job, "finished")
    assert (done["outcome"], done["exit_code"]) == ("completed", 0), done
    assert done["finished_at"] <= ended_at, (done, ended_at)  # its own end, not the reboot's
    assert c.events("job.preempted.v1") == []
    time.sleep(2.0)  # a next cycle or two: nothing places it again
    assert len(c.events("job.placed.v1")) == 1 and len(launches(marks)) == 1


@pytest.mark.parametrize("server_restarts", [True, False], ids=["server-restarted", "quick"])
@with_flags(serve=("--node-lost-after", "30s"))
def test_a_job_that_completed_before_a_reboot_not_yet_believed_is_completed_at_the_first_refusal(
    cluster: Cluster, tmp_path: Path, server_restarts: bool
) -> None:
    """atk43n F4: as above, but the server does not believe the reboot at once: it restarted
    around it (it counts the holder's silence from its own start), or the host is back within
    the margin (half the node-lost timeout). The agent's first request (the ends its run
    directories recorded, exit 0) was refused (409), the exit never recorded, and once the
    reboot was believed the run ended `node_failure` and the resumable job ran again. Now the
    refused agent's recorded ends are taken before it is judged: completed at its own end, at
    its first try; then the node is its, one launch."""
    c = cluster
    go, marks = tmp_path / "go", tmp_path / "marks"
    job = c.submit(2, f"echo x >> {marks}; " + until(go, 0), "--resumable")
    node = c.wait_status(job, "running")["logs"][0].split(":", 1)[0]
    wait_for("the job's start", lambda: marks.exists(), 30, c.why)
    c.agents[node].kill()
    go.touch()
    runs = c.agents[node].state / "runs"
    wait_for("the exit its supervisor records", lambda: list(runs.glob(f"{job}.1/*/exit")), 30)
    ended_at = time.time()
    reboot(c, node, tmp_path / "proc", "5d1f0c2a-5b3d-4e6f-8a9b-0c1d2e3f4a5b", 1.0)
    if server_restarts:  # the power event takes it too
        assert c.server.stop(signal.SIGKILL) == -signal.SIGKILL
        c.restart_server()
    ag, before = c.agents[node], len(c.agents[node].text())
    ag.start(registered=False)  # silent too short a time: not believed yet
    assert ag.proc is not None and ag.proc.wait(timeout=30) == 1, ag.text()[-2000:]
    said = ag.text()[before:]
    assert f"node '{node}' is held by another agent" in said and "launched" not in said, said
    done = c.wait_status(job, "finished", timeout=10)
    assert (done["outcome"], done["exit_code"]) == ("completed", 0), done
    assert done["finished_at"] <= ended_at, (done, ended_at)
    take_node_when_free(c.agents[node], lambda: None)  # once the reboot is believed
    time.sleep(2.0)  # a next cycle or two: nothing places it again
    assert c.events("job.preempted.v1") == [], c.why()
    assert len(c.events("job.placed.v1")) == 1 and len(launches(marks)) == 1


@with_flags(serve=("--node-lost-after", f"{LOST_AFTER_S}s"))
def test_an_agent_restart_that_adopts_live_parts_claims_no_reboot_whatever_the_boot_id_says(
    cluster: Cluster, tmp_path: Path
) -> None:
    """atk43 F2: an agent restarted (kill -9) where the boot id reads another (a sandbox, a
    restore, a wrong GPULEDGER_AGENT_PROC) said its host rebooted although it had just adopted
    the job's live processes (same pids, same start times): the server ended the run and placed
    the resumable job on another node while the first launch still ran (JOB_RUN_TWICE). Now it
    claims no reboot: the run goes on, adopted, one launch, and the recorded boot is kept."""
    c = cluster
    go, marks = tmp_path / "go", tmp_path / "marks"
    job = c.submit(1, f"echo x >> {marks}; " + until(go, 0), "--resumable")
    node, pid = running_pid(c, job)
    boot = (c.agents[node].state / BOOT_FILE).read_text()
    c.agents[node].kill()
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text("9a9a9a9a-5b3d-4e6f-8a9b-0c1d\n")
    (proc / "uptime").write_text("1.00 0.00\n")
    c.agents[node].prefix = ("env", f"{PROC_ENV}={proc}")
    time.sleep(LOST_AFTER_S / 2 + 2.5)  # as a reboot would be believed
    before = len(c.agents[node].text())
    c.agents[node].start()
    time.sleep(2.0)  # cycles: nothing ends it, nothing places it elsewhere
    assert c.job(job)["status"] == "running" and alive(pid)
    assert c.events("job.preempted.v1") == [] and len(c.events("job.placed.v1")) == 1
    said = c.agents[node].text()[before:]
    assert "the host did not reboot" in said, said
    assert (c.agents[node].state / BOOT_FILE).read_text() == boot
    go.touch()
    done = c.wait_status(job, "finished")
    assert (done["outcome"], done["exit_code"]) == ("completed", 0), done
    assert len(launches(marks)) == 1
