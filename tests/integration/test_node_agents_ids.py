"""Node agents for real (the cluster of agentkit.py): a node has one agent. A second agent for it
(another state directory, another machine with the same paths, a disk clone, the holder's agent
id) is refused and launches nothing while the holder's launch may run; a new agent waits until
the old launch is gone."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from ledger.engines.supervised import live_processes
from tests.integration import agentkit
from tests.integration.agentkit import (
    GPUS,
    OTHER_MACHINE,
    Agent,
    Cluster,
    alive,
    all_events,
    held_twice,
    kill_rest,
    launches,
    part_log,
    ran_once,
    refused,
    running_pid,
    take_node_when_free,
    until,
    wait_for,
    with_flags,
    world_script,
)
from tests.integration.serverkit import cli

template, cluster = agentkit.template, agentkit.cluster  # the fixtures


@with_flags(serve=("--node-lost-after", "60s"))
def test_a_second_agent_for_a_node_on_another_state_dir_is_refused_and_launches_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    """atk37-23 F4 (and F6's variant): a second `gpuledger agent` for a node whose agent runs,
    started on another state directory, knew none of the first's runs: it launched the node's
    job again at once (the same launch alive twice); one started on another state directory
    after the first was killed -9 took the node while the first's processes still ran. Now a
    node has one agent: another is refused with one line (before it launches anything) while
    the first's lease may still run, and the first, restarted on its own state directory,
    adopts its job."""
    c = cluster
    go = c.home.parent / "go"
    job = c.submit(1, until(go, 0))
    node, pid = running_pid(c, job)
    first = c.agents[node]
    second = Agent(node, tmp_path / "second-state", first.token, c.server.url,
                   tmp_path / "second.log")  # fmt: skip
    try:
        for when in ("while the first runs", "after the first was killed -9"):
            second.start(registered=False)
            assert second.proc is not None
            try:
                assert second.proc.wait(timeout=60) == 1, when
            except subprocess.TimeoutExpired:
                pytest.fail(f"a second agent {when} ran on: {second.text()[-2000:]}")
            said = second.text().strip().splitlines()
            assert said and said[-1].startswith("error: ") and "Traceback" not in second.text()
            assert f"node '{node}' is held by another agent" in said[-1], said
            assert "launched" not in second.text() and not live_processes(second.state)
            if first.proc is not None and first.proc.poll() is None:
                first.kill(signal.SIGKILL)
        assert alive(pid) and c.job(job)["status"] == "running"
        first.start()
        assert f"adopted 1 running job(s): {job}" in first.text()
        go.touch()
        j = c.wait_status(job, "finished")
        assert (j["outcome"], j["exit_code"]) == ("completed", 0)
        assert len(c.events("job.placed.v1")) == 1 and len(c.events("job.started.v1")) == 1
    finally:
        if second.proc is not None and second.proc.poll() is None:
            second.kill(signal.SIGKILL)
        for p in live_processes(second.state):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)


@with_flags(serve=("--node-lost-after", "60s"))
def test_another_machine_with_the_same_node_and_state_dir_path_is_another_agent_and_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    """atk38-23 F9: agents were told apart by a hash of their state directory's *path*: a
    second machine started with the same `--node` and the same (default) state directory path
    was the same agent to the server, taken while the first ran, and could launch the node's
    running job again. Each agent now keeps a random id, made once in its state directory
    (0600): the second machine (here: a mount namespace where another directory is mounted at
    the same path) is another agent, refused while the first holds the node."""
    c = cluster
    go = c.home.parent / "go"
    job = c.submit(1, until(go, 0))
    node, pid = running_pid(c, job)
    first = c.agents[node]
    elsewhere = tmp_path / "other-machine-disk"
    elsewhere.mkdir(mode=0o700)
    # another machine's /run too: its host-wide lock is its own (`agent.host.hold_node`)
    mount = (
        'mount --bind "$1" "$2" && mount -t tmpfs -o mode=0755 none /run/gpuledger && '
        'shift 2 && exec "$@"'
    )
    other = Agent(node, first.state, first.token, c.server.url, tmp_path / "other.log",
                  prefix=("unshare", "-m", "sh", "-c", mount, "sh", str(elsewhere),
                          str(first.state)))  # fmt: skip
    try:
        refused(other, node)
        ident = first.state / "agent-id"
        assert ident.stat().st_mode & 0o777 == 0o600 and len(ident.read_text().strip()) == 32
        # the same path, another disk: another id
        assert (elsewhere / "agent-id").read_text() != ident.read_text()
        ran_once(c, job, pid, go)
    finally:
        kill_rest(other)


@with_flags(serve=("--node-lost-after", "60s"))
def test_after_a_server_restart_another_agent_is_still_refused_while_the_holder_may_run(
    cluster: Cluster, tmp_path: Path
) -> None:
    """atk38-23 F4: the node's holder was kept in the server's memory only: after a restart,
    a second agent (another state directory) that spoke first was taken for the node and
    launched its running job again, a copy without its world, beside the first launch. The
    holder is recorded (`node.agent_changed.v1`): the restarted server refuses the other agent,
    and the holder, back, keeps its job."""
    c = cluster
    go = c.home.parent / "go"
    job = c.submit(1, until(go, 0))
    node, pid = running_pid(c, job)
    first = c.agents[node]
    first.kill(signal.SIGSTOP)
    second = Agent(node, tmp_path / "second-state", first.token, c.server.url,
                   tmp_path / "second.log")  # fmt: skip
    try:
        assert c.server.stop(signal.SIGKILL) == -signal.SIGKILL
        c.restart_server()
        refused(second, node)
        assert not live_processes(second.state)
        held = [e for e in c.events("node.agent_changed.v1") if e["node"] == node]
        ident = (first.state / "agent-id").read_text().strip()
        assert len(held) == 1 and held[0]["agent"] != ident  # a digest, never the id
        assert first.proc is not None
        first.proc.send_signal(signal.SIGCONT)
        ran_once(c, job, pid, go)
        assert len([e for e in c.events("node.agent_changed.v1") if e["node"] == node]) == 1
    finally:
        kill_rest(second)


@with_flags(serve=("--node-fence", "4s"))
def test_a_new_agent_waits_until_the_old_launch_is_gone_past_its_grace_then_the_job_runs_again(
    cluster: Cluster, tmp_path: Path
) -> None:
    """atk38-23 F5: after kill -9 of a node's agent, the server held the node for the old
    agent's last request + the node-lost timeout + the fence only, but the node's fence SIGTERMs
    a job at its lease's end and SIGKILLs it only after its grace: a new agent (another state
    directory) took the node and launched the job again while its first launch lived on in its
    grace (~26 s twice on the same GPUs). Now the new agent is refused while a run of the node
    may be alive: until its node is lost and its fence (with the job's grace) has passed, so
    the job ends `node_failure` by the node-lost rules (resumable: requeued), and only then
    does the node take work again. Launch 1 ran once; launch 2 started after it was gone."""
    c = cluster
    marks = tmp_path / "marks"
    job = c.submit(2, world_script(marks), "--resumable", "--grace", "8s")
    node = c.wait_status(job, "running")["logs"][0].split(":", 1)[0]
    wait_for("the job's start", lambda: launches(marks), 30, c.why)
    first_pid = int(launches(marks)[0][1])
    c.agents[node].kill(signal.SIGKILL)
    twice: list[str] = []

    def watch() -> None:
        if len(launches(marks)) > 1 and alive(first_pid):
            twice.append(str(launches(marks)))

    other = Agent(node, tmp_path / "other-state", c.agents[node].token, c.server.url,
                  tmp_path / "other.log")  # fmt: skip
    try:
        assert take_node_when_free(other, watch) >= 1
        wait_for("the job's second launch", lambda: (watch(), len(launches(marks)) > 1)[1],
                 60, c.why)  # fmt: skip
        assert twice == [], twice
        assert [ln[0] for ln in launches(marks)] == ["1", "2"]  # launch 1 never again
        [pre] = c.events("job.preempted.v1")
        assert (pre["job_id"], pre["reason"]) == (job, "node_failure")
        assert held_twice(all_events(c)) == []
    finally:
        kill_rest(other)


@with_flags(serve=("--node-fence", "4s"))
def test_a_job_its_rebooted_node_runs_again_after_a_server_restart_keeps_its_whole_world(
    cluster: Cluster, tmp_path: Path
) -> None:
    """atk38-23 F8: after a server restart, a running job was republished with its command only;
    its node, rebooted (processes and state directory gone), launched it again in the agent's
    state directory, output to the agent's log directory, no environment of the submission, no
    job token, while the ledger named the user's output file. Now the agent of the rebooted
    node (a new id: its state directory is new) waits until the job's first launch is surely
    gone (the node lost, its fence passed), and the job's next launch, wherever it runs, has
    its whole world from the log: working directory, environment, output file, umask, token."""
    c = cluster
    marks = tmp_path / "marks"
    wd = tmp_path / "proj"
    wd.mkdir()
    wd.chmod(0o755)
    out = cli(c.home, "submit", "-A", "ai2/olmo", "-G", "2", "--min-runtime", "1h",
              "--resumable", "-o", "out-%j.log", "--", "sh", "-c", world_script(marks), cwd=wd,
              GPULEDGER_USER="root", MY_VAR="world-8")  # fmt: skip
    job = int(out.stdout.split()[2].rstrip(":"))
    node = c.wait_status(job, "running")["logs"][0].split(":", 1)[0]
    wait_for("the job's start", lambda: launches(marks), 30, c.why)
    ag = c.agents[node]
    ag.power_off()  # the node reboots: every process and the state directory go
    shutil.rmtree(ag.state)
    assert c.server.stop(signal.SIGKILL) == -signal.SIGKILL
    c.restart_server()
    take_node_when_free(ag, lambda: None)
    wait_for("the job's next launch", lambda: len(launches(marks)) > 1, 60, c.why)
    [submitted] = [e for e in all_events(c) if e["type"].startswith("job.submitted")]
    umask = f"{submitted['umask']:04o}"
    for launch in launches(marks):
        assert launch[2:] == [str(wd), "world-8", umask, "token"], launches(marks)
    assert [ln[0] for ln in launches(marks)] == ["1", "2"]
    assert (wd / f"out-{job}.log").read_text().count("world-8") == 2
    j = c.job(job)
    assert j["logs"] and all(part_log(x) == wd / f"out-{job}.log" for x in j["logs"])


def test_an_agent_request_that_names_no_agent_is_refused_while_the_holder_runs(
    cluster: Cluster,
) -> None:
    """atk39-23 F8: a request of the agent API without `X-Gpuledger-Agent` was not checked
    (taken for an agent from before the header): with the node token alone, `curl` got the
    node's whole list, job tokens included, while another agent held the node, and kept the
    node alive. Every agent call must now name its agent: one that does not is refused (400,
    one line) and says nothing of the node's runs."""
    c = cluster
    go = c.home.parent / "go"
    job = c.submit(1, until(go, 0))
    node, pid = running_pid(c, job)
    token = c.agents[node].token
    calls = {
        "poll": ("GET", f"/v1/agent/poll?node={node}", None),
        "heartbeat": ("POST", "/v1/agent/heartbeat", {"node": node}),
        "report": ("POST", "/v1/agent/report", {"node": node}),
        "register": ("POST", "/v1/agent/register", {"node": node, "gpus": GPUS, "gpu_type": "sim"}),
    }
    for name, (method, path, body) in calls.items():
        status, reply = c.server.request(method, path, body, token=token)
        assert status == 400, (name, status, reply)
        assert "X-Gpuledger-Agent" in str(reply) and "parts" not in str(reply), (name, reply)
        assert "\n" not in str(reply.get("error", "")), reply
    assert alive(pid) and c.job(job)["status"] == "running"
    go.touch()
    assert c.wait_status(job, "finished")["outcome"] == "completed"


@with_flags(serve=("--node-lost-after", "60s"))
def test_a_clone_of_the_nodes_disk_booted_elsewhere_is_another_agent_and_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    """atk39-23 F4: a copy of a node's state directory (a cloned disk or VM) carried its
    `agent-id`, so a second machine booted from it with the same `--node` was the holder to the
    server: it reported the node's live job lost (its machine has no such process), the ledger
    failed it, the real node's agent SIGTERMed the live job, and both machines launched the
    next job. The id the agent sends is now bound to its host's boot id: the clone is another
    agent, refused while the real node's run may be alive, and the job runs on, once."""
    c = cluster
    go = c.home.parent / "go"
    job = c.submit(1, until(go, 0))
    node, pid = running_pid(c, job)
    first = c.agents[node]
    disk = tmp_path / "cloned-disk"
    subprocess.run(["cp", "-a", str(first.state), str(disk)], check=True)
    (disk / "lock").unlink()
    boot = tmp_path / "other-boot-id"
    boot.write_text("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n")
    machine = ("unshare", "-m", "-p", "-f", "--kill-child", "--mount-proc", "sh", "-c")
    clone = Agent(node, first.state, first.token, c.server.url, tmp_path / "clone.log",
                  prefix=(*machine, OTHER_MACHINE, "sh", str(disk), str(first.state), str(boot))
                  )  # fmt: skip
    try:
        refused(clone, node)
        assert (disk / "agent-id").read_text() == (first.state / "agent-id").read_text()
        assert not c.events("job.engine_ended.v2")  # never reported lost
        ran_once(c, job, pid, go)
    finally:
        kill_rest(clone)


@with_flags(serve=("--node-lost-after", "60s"))
def test_a_second_agent_given_the_holders_agent_id_on_the_same_host_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    """atk39-23 F5: a second agent for a node on this host, on another state directory given
    the holder's `agent-id` (a moved directory, a restored backup), was the same agent to the
    server: accepted while the holder ran, it launched the node's running job again on the
    same GPU. One agent per node on a host now holds a host-wide lock (`agent.host.hold_node`):
    the second is refused in one line before it adopts, asks or launches anything."""
    c = cluster
    go = c.home.parent / "go"
    job = c.submit(1, until(go, 0))
    node, pid = running_pid(c, job)
    first = c.agents[node]
    copied = tmp_path / "copied-state"
    copied.mkdir(mode=0o700)
    shutil.copy2(first.state / "agent-id", copied / "agent-id")
    second = Agent(node, copied, first.token, c.server.url, tmp_path / "copied.log")
    try:
        line = refused(second, node)
        assert "on this host" in line and str(first.state) in line, line
        assert not live_processes(copied)
        ran_once(c, job, pid, go)
    finally:
        kill_rest(second)
