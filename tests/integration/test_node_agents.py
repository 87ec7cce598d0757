"""Node agents for real: one `gpuledger serve --executor agents` on 127.0.0.1 (random port) and
three `gpuledger agent` processes, node-a/b/c, each with its own state directory, running real
shell jobs. Killing or stopping any of them never kills or double-books a job."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ledger.engines.supervised import live_processes
from tests.integration import agentkit, userkit
from tests.integration.agentkit import (
    GPUS,
    NODES,
    RUNNER,
    Cluster,
    alive,
    all_events,
    audit_check,
    held_twice,
    limits_of,
    os_user,
    part_log,
    running_pid,
    until,
    wait_for,
    with_flags,
)
from tests.integration.serverkit import GPULEDGER, cli, env_for

template, cluster = agentkit.template, agentkit.cluster  # the fixtures


def test_placements_run_on_their_nodes_and_report_exit_codes_and_the_job_token_is_scoped(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    show = 'echo "$GPULEDGER_NODE $CUDA_VISIBLE_DEVICES $GPULEDGER_JOB_ID"'
    ok = c.submit(1, show)
    bad = c.submit(1, "exit 3")
    limited = c.submit(1, "exec sleep 60", "-t", "2s")  # the agent enforces the limit
    # a resumable job reports a checkpoint of its own with its token, then tries another job's
    other = c.submit(1, "exec sleep 30", "--resumable")
    c.wait_status(other, "running")
    go = tmp_path / "go"  # once its start is recorded: a report before is said by its file
    probe = (
        f"while [ ! -e {go} ]; do sleep 0.1; done; "
        f"{GPULEDGER} checkpoint && echo own=ok; "
        f"{GPULEDGER} checkpoint {other}; echo other=$?; "
        f'curl -s -o /dev/null -w "%{{http_code}}" -X POST '
        f'-H "Authorization: Bearer $GPULEDGER_JOB_TOKEN" '
        f'-H "Content-Type: application/json" -d "{{\\"actor\\": \\"\\", \\"job_id\\": {other}}}" '
        f'"$GPULEDGER_URL/v1/commands/job.checkpoint" > {tmp_path}/status'
    )
    mine = c.submit(1, probe, "--resumable")
    c.wait_status(mine, "running")
    go.touch()
    for j in (ok, bad, mine, limited):
        c.wait_status(j, "finished")
    got = c.jobs()
    assert got[ok]["logs"][0] in c.cli("explain", str(ok)).stdout  # NODE:PATH, shown
    assert (got[ok]["outcome"], got[ok]["exit_code"]) == ("completed", 0)
    assert (got[bad]["outcome"], got[bad]["exit_code"]) == ("failed", 3)
    node, visible, job_id = part_log(got[ok]["logs"][0]).read_text().split()
    assert got[ok]["logs"][0].startswith(f"{node}:") and node in NODES
    assert visible in ("0", "1") and job_id == str(ok)
    log = part_log(got[mine]["logs"][0]).read_text()
    assert "own=ok" in log and "other=1" in log, log
    assert "may only report checkpoints of its job" in log
    assert (tmp_path / "status").read_text() == "403"
    checkpoints = c.events("job.checkpointed.v1")
    assert [e["job_id"] for e in checkpoints] == [mine]  # nothing appended for `other`
    assert checkpoints[0]["actor"] == f"@job:{mine}"
    engine = {e["job_id"]: e for e in c.events("job.engine_ended.v2")}
    assert engine[bad]["engine"] == "agent" and engine[bad]["exit_code"] == 3
    assert engine[limited]["reason"] == "time_limit" and got[limited]["outcome"] == "failed"
    assert held_twice(all_events(c)) == []


def test_a_gang_job_runs_one_part_per_node_and_a_failed_part_stops_the_others(
    cluster: Cluster,
) -> None:
    c = cluster
    show = 'echo "$GPULEDGER_NODE $CUDA_VISIBLE_DEVICES $NODE_RANK $WORLD_SIZE $GPULEDGER_NODELIST"'
    gang = c.submit(4, show)
    j = c.wait_status(gang, "finished")
    # both parts write the job's one output file, as the tasks of an srun do
    [out] = {part_log(p) for p in j["logs"]}
    lines = sorted(ln.split() for ln in out.read_text().splitlines())
    assert len(lines) == 2 and {ln[0] for ln in lines} <= set(NODES) and lines[0][0] != lines[1][0]
    assert [ln[1:4] for ln in lines] in ([["0,1", "0", "2"], ["0,1", "1", "2"]],
                                         [["0,1", "1", "2"], ["0,1", "0", "2"]])  # fmt: skip
    assert j["outcome"] == "completed"
    fail = 'if [ "$NODE_RANK" = 1 ]; then sleep 1; exit 9; fi; echo $$; exec sleep 60'
    failing = c.submit(4, fail)
    j = c.wait_status(failing, "finished")
    assert (j["outcome"], j["exit_code"]) == ("failed", 9)
    pid = int(part_log(j["logs"][0]).read_text().split()[0])  # only rank 0 says its pid
    wait_for("rank 0 to be stopped", lambda: not alive(pid), 15, c.why)


@with_flags(serve=("--node-lost-after", "60s"))
def test_kill_9_of_agents_adopts_their_jobs_and_reports_exits_that_happened_meanwhile(
    cluster: Cluster,
) -> None:
    """Both agents return within the node-lost timeout: the job that exited while its agent was
    dead is reported with its real exit code, the other one is adopted (same process)."""
    c = cluster
    go_a, go_b = c.home.parent / "go-a", c.home.parent / "go-b"
    a, b = c.submit(2, until(go_a, 7)), c.submit(2, until(go_b, 0))  # a whole node each
    (node_a, pid_a), (node_b, pid_b) = running_pid(c, a), running_pid(c, b)
    assert node_a != node_b
    for node in (node_a, node_b):
        c.agents[node].kill(signal.SIGKILL)
    assert alive(pid_a) and alive(pid_b)
    go_a.touch()  # job a ends while no agent watches it
    wait_for("job a to exit", lambda: not alive(pid_a), 15, c.why)
    assert c.job(a)["status"] == "running"  # nobody has said otherwise yet
    for node in (node_a, node_b):
        c.agents[node].start()
    assert f"adopted 1 running job(s): {a}" in c.agents[node_a].text()
    assert f"adopted 1 running job(s): {b}" in c.agents[node_b].text()
    j = c.wait_status(a, "finished")
    assert (j["outcome"], j["exit_code"]) == ("failed", 7)
    [ended] = [e for e in c.events("job.engine_ended.v2") if e["job_id"] == a]
    assert (ended["engine"], ended["reason"], ended["exit_code"]) == ("agent", "exited", 7)
    assert c.job(b)["status"] == "running" and alive(pid_b)  # adopted, not relaunched
    go_b.touch()
    j = c.wait_status(b, "finished")
    assert (j["outcome"], j["exit_code"]) == ("completed", 0)
    assert len(c.events("job.placed.v1")) == 2  # each launched once, never again
    assert held_twice(all_events(c)) == []


def test_sigterm_and_kill_9_of_serve_then_a_restart_keep_jobs_running(cluster: Cluster) -> None:
    c = cluster
    go = c.home.parent / "go"
    job = c.submit(1, until(go, 0))
    _, pid = running_pid(c, job)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        assert c.server.stop(sig) == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
        assert alive(pid)
        # with the server gone, the ledger's GPU holders agree with the processes really alive
        assert ": 0 violations" in audit_check(c)
        c.restart_server()
        assert c.job(job)["status"] == "running" and alive(pid)
    second = c.submit(2, "sleep 1")
    go.touch()
    for j in (job, second):
        assert c.wait_status(j, "finished")["outcome"] == "completed"
    assert held_twice(all_events(c)) == []
    assert len(c.events("job.placed.v1")) == 2


@with_flags(serve=("--node-fence", "4s"))
def test_a_silent_node_is_lost_after_the_timeout_and_past_its_fence_its_jobs_end_or_run_elsewhere(
    cluster: Cluster,
) -> None:
    """Two nodes fall silent: they are lost after the 5 s timeout, but their runs stay in doubt
    (they may live on a partitioned node) until the fence passes; by then each part has stopped
    itself (its node's lease ran out), and only then is the resumable job placed on the third
    node and the other recorded failed (node_failure). The returning agents take no old work."""
    c = cluster
    resumable = c.submit(2, "echo $$; exec sleep 60", "--resumable")
    fixed = c.submit(2, "echo $$; exec sleep 60")
    (node_r, pid_r), (node_f, pid_f) = running_pid(c, resumable), running_pid(c, fixed)
    for node in (node_r, node_f):
        c.agents[node].kill(signal.SIGSTOP)
    t0 = time.monotonic()
    wait_for("both nodes to be lost",
             lambda: {c.nodes()[n] for n in (node_r, node_f)} == {"lost"}, 30, c.why)  # fmt: skip
    assert time.monotonic() - t0 >= 4.5  # not before the 5 s node-lost timeout
    lost = {e["node"]: e for e in c.events("node.lost.v1")}
    assert lost[node_f]["reason"].startswith("no word from its agent for")
    assert lost[node_f]["fence_s"] >= 4
    wait_for(
        "the resumable job to run on the third node",
        lambda: (x := c.job(resumable))["status"] == "running" and x["logs"]
        and x["logs"][0].split(":", 1)[0] not in (node_r, node_f) and x,
        60, c.why,
    )  # fmt: skip
    assert not alive(pid_r)  # its first run stopped itself before the second was handed out
    f = c.wait_status(fixed, "finished")
    assert (f["outcome"], f["finish_reason"]) == ("failed", "node_lost")
    assert not alive(pid_f)
    [pre] = c.events("job.preempted.v1")
    assert (pre["job_id"], pre["reason"]) == (resumable, "node_failure")
    assert "FENCED" in pre["note"]
    # in doubt until the fence passed: nothing ended or placed again before
    [fin] = [
        e for e in all_events(c) if e["type"].startswith("job.finished") and e["job_id"] == fixed
    ]
    assert fin["at"] >= lost[node_f]["at"] + lost[node_f]["fence_s"]
    assert pre["at"] >= lost[node_r]["at"] + lost[node_r]["fence_s"]
    again = [e for e in c.events("job.placed.v1") if e["job_id"] == resumable][1]
    assert again["at"] >= pre["at"]
    for node in (node_r, node_f):
        c.agents[node].proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    wait_for("the nodes to return",
             lambda: {c.nodes()[n] for n in (node_r, node_f)} == {"active"}, 30, c.why)  # fmt: skip
    assert c.job(resumable)["status"] == "running"  # untouched by the returns
    assert held_twice(all_events(c)) == []
    c.server.stop(signal.SIGTERM)
    assert ": 0 violations" in audit_check(c)


@with_flags(serve=("--node-fence", "5m"))
def test_a_node_back_within_its_fence_keeps_its_runs_and_an_exit_meanwhile_is_recorded_as_it_was(
    cluster: Cluster,
) -> None:
    """An agent stopped past the node-lost timeout, then back within the fence: its job that
    kept running is the same process, never run twice; the one that exited 0 while its agent
    was away is recorded completed with its real end, not as a node failure."""
    c = cluster
    flag = c.home.parent / "go"
    keeps = c.submit(1, "echo $$; exec sleep 600", "--resumable")
    ends = c.submit(1, f"echo $$; while [ ! -e {flag} ]; do sleep 0.1; done; sleep 0.3 & wait")
    (node_k, pid_k), (node_e, pid_e) = running_pid(c, keeps), running_pid(c, ends)
    nodes = {node_k, node_e}
    for node in nodes:
        c.agents[node].kill(signal.SIGSTOP)
    wait_for("the nodes to be lost", lambda: {c.nodes()[n] for n in nodes} == {"lost"}, 30,
             c.why)  # fmt: skip
    flag.touch()
    wait_for("the job to exit while its agent is away", lambda: not alive(pid_e), 30, c.why)
    exited_at = time.time()
    time.sleep(1.0)  # several cycles: nothing of the two jobs is decided meanwhile
    assert c.job(keeps)["status"] == c.job(ends)["status"] == "running"
    for node in nodes:
        c.agents[node].proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    done = c.wait_status(ends, "finished")
    assert (done["outcome"], done["exit_code"]) == ("completed", 0)
    [fin] = [e for e in c.events("job.finished.v2") if e["job_id"] == ends]
    assert fin["ended_at"] is not None and fin["ended_at"] <= exited_at + 0.5
    wait_for("the nodes to return", lambda: {c.nodes()[n] for n in nodes} == {"active"}, 30,
             c.why)  # fmt: skip
    assert alive(pid_k) and c.job(keeps)["status"] == "running"
    assert c.events("job.preempted.v1") == [] and len(c.events("job.placed.v1")) == 2
    assert held_twice(all_events(c)) == []
    c.server.stop(signal.SIGTERM)
    assert ": 0 violations" in audit_check(c)


@with_flags(serve=("--node-lost-after", "60s"))
def test_samples_checkpoints_status_and_drain(cluster: Cluster) -> None:
    c = cluster  # the agent is away while it drains: within the node-lost timeout
    script = 'echo $$; sleep 0.5; touch "$GPULEDGER_CHECKPOINT_FILE"; exec sleep 60'
    job = c.submit(2, script, "--resumable")
    for ag in c.agents.values():  # the documented test source: a file per job
        (ag.state / "utilisation").mkdir(exist_ok=True)
        (ag.state / "utilisation" / str(job)).write_text("7")
    j = c.wait_status(job, "running")
    node = j["logs"][0].split(":", 1)[0]
    pid = int(wait_for("the job's pid", lambda: part_log(j["logs"][0]).read_text().split())[0])
    wait_for("a checkpoint", lambda: c.events("job.checkpointed.v1"), 30, c.why)
    samples = wait_for("a sample", lambda: c.events("job.utilisation_sampled.v1"), 30, c.why)
    assert samples[0]["job_id"] == job and samples[0]["gpu_utilisation"] == [7.0, 7.0]
    ag = c.agents[node]
    status = cli(ag.state, "agent", "status", "--state-dir", str(ag.state)).stdout
    listed = status.split(f"{job} (pids ", 1)[1].split(",")[0].split()
    assert f"node {node}: agent running" in status and str(pid) in listed
    assert "GPUs 0,1)" in status and "containment   cgroup v2 (tracking, cgroup.kill)" in status
    assert "last contact" in status and "ago" in status
    ag.kill(signal.SIGTERM)  # stopping the agent leaves the job running
    assert alive(pid)
    status = cli(ag.state, "agent", "status", "--state-dir", str(ag.state)).stdout
    assert "agent not running" in status and str(pid) in status.split(f"{job} (pids ", 1)[1]
    drain = cli(ag.state, "agent", "--node", node, "--url", c.server.url, "--gpus", str(GPUS),
                "--state-dir", str(ag.state), "--grace", "1s", "--drain",
                GPULEDGER_NODE_TOKEN=ag.token)  # fmt: skip
    assert f"drained node {node}: stopped 1 job(s)" in drain.stdout
    assert not alive(pid)
    # F5: a resumable job with a checkpoint is requeued (a maintenance preemption), as
    # `node drain` would; F17: the node is drained in the ledger, not left active
    wait_for("the job to be requeued", lambda: c.events("job.requeued.v1"), 30, c.why)
    (pre,) = c.events("job.preempted.v1")
    assert pre["job_id"] == job and pre["reason"] == "maintenance", pre
    assert not [ev for ev in c.events("job.finished.v2") if ev["job_id"] == job]
    assert c.nodes()[node] == "drained", c.nodes()
    j = c.wait_status(job, "running", "placed")  # again, on another node
    assert j["placements"] == 2 and node not in j["nodes"], j
    # an agent that registers again brings its node back
    ag.start()
    wait_for("the node to return", lambda: c.nodes()[node] == "active", 30, c.why)


def test_an_agent_that_finds_other_gpus_than_the_ledger_is_one_clear_error(
    cluster: Cluster, tmp_path: Path
) -> None:
    ag = cluster.agents["node-c"]
    ag.kill(signal.SIGKILL)  # its state directory, free: another would be refused (one agent)
    got = cli(tmp_path, "agent", "--node", "node-c", "--url", cluster.server.url, "--gpus", "4",
              "--state-dir", str(ag.state), ok=False,
              GPULEDGER_NODE_TOKEN=ag.token)  # fmt: skip
    assert got.returncode == 1
    lines = got.stderr.strip().splitlines()
    assert "Traceback" not in got.stderr and lines[-1].startswith("error: ")
    assert "has 2 GPUs in the ledger; its agent found 4 (flags)" in lines[-1]
    cluster.agents["node-b"].kill(signal.SIGKILL)  # else its host lock refuses first (F5)
    wrong = cli(tmp_path, "agent", "--node", "node-b", "--url", cluster.server.url, "--gpus", "2",
                "--state-dir", str(tmp_path / "other"), ok=False,
                GPULEDGER_NODE_TOKEN=ag.token)  # fmt: skip
    assert wrong.returncode == 1 and "may not act for node 'node-b'" in wrong.stderr


@with_flags(serve=("--squat-after", "2s"))
def test_an_idle_job_is_listed_by_squatters_and_preempted_after_its_contract_for_a_waiting_job(
    cluster: Cluster,
) -> None:
    """The agents' test source says 0%: the job squats (listed by `squatters`), and once its
    2 s contract is over it is the victim of a job that waits for its GPUs."""
    c = cluster
    idle = c.submit(2, "exec sleep 60", "--resumable", "--min-runtime", "2s", user="bob")
    for ag in c.agents.values():  # the documented test source: a file per job, on every node
        (ag.state / "utilisation").mkdir(exist_ok=True)
        (ag.state / "utilisation" / str(idle)).write_text("0")
    # the other nodes are taken by jobs inside their contracts (no file: unknown, not idle)
    busy = [c.submit(2, "exec sleep 60", user="alice") for _ in range(2)]
    for j in (idle, *busy):
        c.wait_status(j, "running")
    node = c.job(idle)["logs"][0].split(":", 1)[0]
    [pid] = [p.pid for p in live_processes(c.agents[node].state) if p.job_id == idle]

    def listed() -> list[dict[str, Any]]:
        return json.loads(c.cli("squatters", "--after", "2s", "--json").stdout)

    [row] = wait_for("the idle job to be listed as a squatter", listed, 30, c.why)
    assert (row["job_id"], row["user"], row["gpus"]) == (idle, "bob", 2)
    text = c.cli("squatters", "--after", "2s").stdout
    assert f"job {idle} ai2/olmo bob 2 GPUs idle since" in text
    waiting = c.submit(2, "exec sleep 60", user="alice")
    j = c.wait_status(waiting, "running")
    assert j["logs"][0].startswith(f"{node}:")  # on the squatter's GPUs
    [pre] = c.events("job.preempted.v1")
    assert (pre["job_id"], pre["reason"], pre["for_job"]) == (idle, "squatting", waiting)
    [placed] = [e for e in c.events("job.placed.v1") if e["job_id"] == idle]
    assert pre["at"] >= placed["at"] + 2  # never inside its contract
    wait_for("the squatter's process to be stopped", lambda: not alive(pid), 15, c.why)
    assert c.job(idle)["status"] == "pending"  # resumable: requeued
    samples = [e for e in c.events("job.utilisation_sampled.v1") if e["job_id"] == idle]
    assert samples and all(s["gpu_utilisation"] == [0.0, 0.0] for s in samples)
    assert held_twice(all_events(c)) == []


@with_flags(agent=("--run-as", "submitter"))
def test_an_agent_running_as_root_launches_each_job_as_its_submitter(cluster: Cluster) -> None:
    c = cluster
    assert os.geteuid() == 0, "the agents must run as root for this test"
    runner = os_user(RUNNER)
    c.cli("member", "add", RUNNER, "ai2/olmo")
    job = c.submit(1, 'echo $$ "$(id -u) $(id -g) $USER"; exec sleep 60', user=RUNNER)
    _, pid = running_pid(c, job)
    with open(f"/proc/{pid}/status") as f:  # the live process itself, not only what it said
        uids = next(line.split()[1:] for line in f if line.startswith("Uid:"))
    assert uids == [str(runner.pw_uid)] * 4
    log = part_log(c.job(job)["logs"][0])
    assert log.read_text().split()[:4] == [str(pid), str(runner.pw_uid), str(runner.pw_gid),
                                           RUNNER]  # fmt: skip
    assert log.stat().st_uid == runner.pw_uid  # its output is its own
    c.cli("cancel", str(job), user=RUNNER)
    wait_for("the job to be stopped", lambda: not alive(pid), 15, c.why)


@with_flags(agent=("--run-as", "submitter"))
def test_a_script_in_a_users_home_runs_there_as_the_user_through_the_node_agents(
    cluster: Cluster,
) -> None:
    """The issue's first test on the node agents (the Slurm executor's twin is in
    test_slurm_world.py): a script in a real user's home that reads ./input.txt and $MY_VAR,
    submitted from that directory: it runs there, as that uid with its primary and
    supplementary groups and its HOME, none of the service's variables, and writes
    gpuledger-<id>.out owned by the user."""
    c = cluster
    with userkit.os_user("glag", groups=2) as user:
        c.cli("member", "add", user.name, "ai2/olmo")
        proj = user.home / "proj"
        proj.mkdir()
        (proj / "input.txt").write_text("from the input\n")
        (proj / "train.sh").write_text(
            '#!/bin/sh\necho "pwd=$(pwd)"; cat ./input.txt; echo "MY_VAR=$MY_VAR"\n'
            'echo "ids=$(id -u) $(id -g)"; echo "groups=$(id -G)"; echo "HOME=$HOME"\n'
            'echo "TOKEN_FILE=$GPULEDGER_NODE_TOKEN"\n'
        )
        for p in (proj, proj / "input.txt", proj / "train.sh"):
            os.chown(p, user.uid, user.gid)
        out = cli(c.home, "submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "1h",
                  "train.sh", cwd=proj, GPULEDGER_USER=user.name, MY_VAR="hello")  # fmt: skip
        job = int(out.stdout.split()[2].rstrip(":"))
        row = c.wait_status(job, "finished")
        assert row["finish_reason"] == "completed", row
        log = proj / f"gpuledger-{job}.out"
        text = log.read_text().splitlines()
        assert text[:3] == [f"pwd={proj}", "from the input", "MY_VAR=hello"], text
        assert text[3] == f"ids={user.uid} {user.gid}", text
        assert set(map(int, text[4].removeprefix("groups=").split())) == user.gids, text
        assert text[5:] == [f"HOME={user.home}", "TOKEN_FILE="], text
        assert (log.stat().st_uid, log.stat().st_gid) == (user.uid, user.gid)


def test_an_exit_while_the_server_is_down_is_charged_to_its_real_end(cluster: Cluster) -> None:
    """The issue's test on the node agents (Slurm's twin is in test_slurm_world.py): the job
    ends while `serve` is killed with -9; the restarted server records the end its supervisor
    saw, within 1 s of the job's own clock, not the restart."""
    c = cluster
    go, end = c.home.parent / "go-end", c.home.parent / "ended-at"
    job = c.submit(1, f"echo $$; while [ ! -e {go} ]; do sleep 0.1; done; date +%s.%N > {end}")
    running_pid(c, job)
    assert c.server.stop(signal.SIGKILL) == -signal.SIGKILL
    go.touch()
    wait_for("the job to end", lambda: end.exists() and end.read_text().strip(), 30)
    time.sleep(5)  # the server stays down well past the end
    restarted = time.time()
    c.restart_server()
    row = c.wait_status(job, "finished")
    really = float(end.read_text())
    assert row["finish_reason"] == "completed", row
    assert abs(row["finished_at"] - really) <= 1.0, (row["finished_at"], really)
    assert row["finished_at"] < restarted - 4


def test_a_cancelled_jobs_gpus_show_stopping_until_its_node_says_it_is_gone(
    cluster: Cluster,
) -> None:
    """`node list` showed a cancelled job's GPUs free during its grace, though the agent starts
    nothing on them until its processes are gone: they are `stopping` (not free) until its
    node's report no longer lists the run."""
    job = cluster.submit(1, "trap '' TERM; while :; do sleep 0.2; done", "--grace", "5s")
    (slot,) = cluster.wait_status(job, "running")["slots"]

    def node() -> dict[str, Any]:
        rows = cluster.read("nodes", "node", "list")
        return next(n for n in rows if n["node"] == slot["node"])

    cluster.cli("cancel", str(job))
    shown = lambda: node()["stopping_gpus"] == slot["gpu_indices"]  # noqa: E731
    wait_for("its GPU shown stopping", shown, 30, cluster.why)
    assert node()["free_gpus"] == GPUS - 1
    wait_for("its GPU free", lambda: node()["free_gpus"] == GPUS, 30, cluster.why)
    assert node()["stopping_gpus"] == []
    assert cluster.events("job.run_ended.v2")  # its end was reported: the fence let it go


def test_a_job_in_its_grace_is_stopping_in_every_read_and_a_second_cancel_kills_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    """atk46-23 F7: a job past its time limit, in its grace, showed plain `running` in `jobs`,
    `queue` and `node list`, and a cancelled one in its grace could not be cut short. Every
    read (the CLI's over the server's /v1) shows it `stopping` with the same SIGKILL time; a
    second cancel kills it at once."""
    c = cluster
    termed, again = tmp_path / "termed-f7", tmp_path / "again-f7"
    limited = c.submit(1, f"trap 'touch {termed}' TERM; while :; do sleep 0.1; done",
                       "-t", "2s", "--grace", "60s")  # fmt: skip
    wait_for("its limit's SIGTERM", termed.exists, 30, c.why)

    def reads(job: int) -> tuple[dict[str, Any], dict[str, Any], list[int]]:
        rows = json.loads(c.cli("queue", "--state", "running", "--json").stdout)
        nodes = json.loads(c.cli("node", "list", "--json").stdout)
        ending = [j for n in nodes for j in n["stopping_jobs"]]
        return c.jobs()[job], next((r for r in rows if r["job_id"] == job), {}), ending

    row, queued, ending = reads(limited)
    assert row["status"] == "stopping" and queued["state"] == "stopping", (row, queued)
    assert row["kill_at"] == pytest.approx(row["started_at"] + 62, abs=0.01)
    assert queued["kill_at"] == pytest.approx(row["kill_at"], abs=0.01) and limited in ending
    assert " is stopping." in c.cli("explain", str(limited)).stdout
    assert "stopping (SIGKILL by" in c.cli("queue", "--state", "running").stdout
    c.cli("cancel", str(limited))  # past its limit: killed at once, as before
    # cancelled in a minute's grace: stopping (as squeue's CG) until a second cancel
    job = c.submit(1, f"trap 'touch {again}' TERM; while :; do sleep 0.1; done",
                   "--grace", "60s")  # fmt: skip
    c.wait_status(job, "running")
    c.cli("cancel", str(job))
    wait_for("its SIGTERM", again.exists, 30, c.why)
    row, queued, ending = reads(job)
    assert row["status"] == "stopping" and row["outcome"] == "cancelled", row  # not finished
    assert row["finished_at"] is None and row["kill_at"] == queued["kill_at"], (row, queued)
    assert queued["state"] == "stopping" and job in ending, queued
    out = c.cli("cancel", str(job)).stdout
    assert "killed now" in out, out
    t0 = time.monotonic()
    wait_for("its end", lambda: [e for e in c.events("job.run_ended.v2") if e["job_id"] == job],
             30, c.why)  # fmt: skip
    assert time.monotonic() - t0 < 15  # not its minute's grace
    (ended,) = [e for e in c.events("job.run_ended.v2") if e["job_id"] == job]
    assert ended["killed"] or ended["exit_code"] in (-9, 137), ended
    wait_for("nothing stopping", lambda: not reads(job)[2], 30, c.why)
    assert c.cli("cancel", str(job), ok=False).returncode == 1  # a finished job, as before


@with_flags(serve=("--node-fence", "5m"))
def test_a_server_restarted_with_a_shorter_fence_shortens_the_nodes_lease_at_once(
    cluster: Cluster,
) -> None:
    """atk37-28 F1: an agent learnt the node-lost timeout and fence only when it registered; a
    server restarted with a shorter fence (its agents do not register again) fenced and ran a
    job elsewhere while the node's lease, of the old length, kept the first launch alive. Every
    answer to a report now carries the server's settings, and the lease follows them."""
    c = cluster
    lease = next(iter(c.agents.values())).state / "lease"

    def lease_left() -> float:
        return float(json.loads(lease.read_text())["until"]) - time.time()

    wait_for("a 5-minute lease", lambda: lease.exists() and lease_left() > 200, 30, c.why)
    assert c.server.stop(signal.SIGTERM) == 0
    c.restart_server("--node-fence", "4s")
    # node-lost 5 s + fence 4 s - margin 3 s: the lease is a few seconds long again
    wait_for("the lease to follow the new fence", lambda: lease_left() < 10, 30, c.why)
    assert json.loads(lease.read_text())["node_fence_s"] == 4.0


def test_the_longest_environment_and_log_path_submit_accepts_run_and_are_charged(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A 16,384-character value (a module's LD_LIBRARY_PATH) killed the agent's poll thread: the
    job, and every later one on its node, stayed placed for ever (atk46-23 F13). A log path of
    4,096 characters ran with its start dropped (`node:path` over the bound): no start time, no
    charge (atk46-23 F14)."""
    c = cluster
    value = "/opt/lib:" * (16_384 // 9)
    out = cli(c.home, "submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "1h", "--",
              "sh", "-c", 'echo "${#LONG_LIB}"', GPULEDGER_USER="root", LONG_LIB=value)  # fmt: skip
    long_env = int(out.stdout.split()[2].rstrip(":"))
    deep = tmp_path
    while len(str(deep)) < 4_000:
        deep /= "d" * min(200, 4_000 - len(str(deep)))
    deep.mkdir(parents=True)
    path = f"{deep}/" + "o" * (4_096 - len(str(deep)) - 1)
    assert len(path) == 4_096
    out = cli(c.home, "submit", "-A", "ai2/olmo", "-G", "2", "--min-runtime", "1h",
              "-o", path.rpartition("/")[2], "--", "sh", "-c", "sleep 1; echo done",
              cwd=deep, GPULEDGER_USER="root")  # fmt: skip
    long_log = int(out.stdout.split()[2].rstrip(":"))
    after = [c.submit(2, "true") for _ in range(3)]  # every node runs again
    for j in (long_env, long_log, *after):
        c.wait_status(j, "finished")
    got = c.jobs()
    assert got[long_env]["outcome"] == "completed", got[long_env]
    assert part_log(got[long_env]["logs"][0]).read_text().strip() == str(len(value))
    row = got[long_log]
    assert row["outcome"] == "completed" and row["started_at"] is not None, row
    assert [part_log(x) for x in row["logs"]] == [Path(path)]
    assert all(got[j]["outcome"] == "completed" for j in after)
    assert "Traceback" not in "".join(ag.text() for ag in c.agents.values())


@with_flags(serve=("--node-fence", "3s"))
def test_an_exit_while_its_agent_was_away_past_the_fence_is_recorded_at_its_real_end(
    cluster: Cluster, tmp_path: Path
) -> None:
    """atk46-23 F5: the job exits while its node's agent is stopped; the node is lost and its
    fence passes (the job ends `node_lost` at the fence); the agent returns and reports the real
    end, which wins: `jobs` shows it (not the fence's) and its exit code (not the fence's -1),
    and the audit finds every charge inside the real run."""
    c = cluster
    go, end = tmp_path / "go-f5", tmp_path / "ended-f5"
    job = c.submit(1, f"echo $$; while [ ! -e {go} ]; do sleep 0.1; done; date +%s.%N > {end}; "
                      "exit 3")  # fmt: skip
    node, _ = running_pid(c, job)
    c.agents[node].kill(signal.SIGSTOP)
    go.touch()
    wait_for("the job to end", lambda: end.exists() and end.read_text().strip(), 30)
    really = float(end.read_text())
    fenced = c.wait_status(job, "finished")
    assert fenced["finish_reason"] == "node_lost" and fenced["finished_at"] > really + 4, fenced
    assert fenced["exit_code"] == -1, fenced  # no word from its node yet
    c.agents[node].proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    heard = lambda: abs(c.job(job)["finished_at"] - really) <= 1.0  # noqa: E731
    wait_for("the real end to be recorded", heard, 30, c.why)
    row = c.job(job)  # its real exit code, as sacct shows it; still ended by the fence (F5)
    assert (row["exit_code"], row["finish_reason"], row["outcome"]) == (3, "node_lost", "failed")
    assert c.events("job.run_ended.v2")[-1]["ended_at"] == pytest.approx(really, abs=1.0)
    c.server.stop(signal.SIGTERM)
    assert ": 0 violations" in audit_check(c)


@with_flags(agent=("--run-as", "submitter"))
def test_a_job_starts_with_its_submitters_soft_limits_never_above_its_nodes_hard_ones(
    cluster: Cluster,
) -> None:
    """atk46-23 F12: under `ulimit -Sn 512; ulimit -Ss 4096; ulimit -Su 300` a job got the
    agent's limits (nofile 20000, stack 8192, nproc 96367), where sbatch gives it the
    submitting shell's (PropagateResourceLimits=ALL). Now its process starts with them, as its
    user; `--propagate=NONE` keeps the agent's; a soft limit above the node's hard limit is
    that hard limit, and the job's error file says so in one line."""
    c = cluster
    nofile_hard = 4000  # the nodes' hard limit: the agents' own, lowered (root may not raise it)
    above = 5000
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[1] >= above
    for ag in c.agents.values():
        assert ag.proc is not None
        soft = resource.prlimit(ag.proc.pid, resource.RLIMIT_NOFILE)[0]
        resource.prlimit(ag.proc.pid, resource.RLIMIT_NOFILE, (min(soft, 1024), nofile_hard))
    with userkit.os_user("glul") as user:
        c.cli("member", "add", user.name, "ai2/olmo")

        def submit(soft: dict[int, int], *opts: str) -> int:
            def lowered() -> None:  # the submitting shell's `ulimit -S ...`
                for number, value in soft.items():
                    resource.setrlimit(number, (value, resource.getrlimit(number)[1]))

            out = subprocess.run(
                [GPULEDGER, "submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "1h", *opts,
                 "-D", str(user.home), "--", "sh", "-c", "cat /proc/$$/limits"],
                env=env_for(c.home, GPULEDGER_USER=user.name), capture_output=True, text=True,
                preexec_fn=lowered, check=True, timeout=60,
            )  # fmt: skip
            return int(out.stdout.split()[2].rstrip(":"))

        lowered = {resource.RLIMIT_NOFILE: 512, resource.RLIMIT_STACK: 4096 * 1024,
                   resource.RLIMIT_NPROC: 300}  # fmt: skip
        jobs = {
            "propagated": submit(lowered),
            "none": submit(lowered, "--propagate=NONE"),
            "above": submit({resource.RLIMIT_NOFILE: above}, "--propagate=NOFILE"),
        }
        got = {}
        for what, job in jobs.items():
            row = c.wait_status(job, "finished")
            assert row["finish_reason"] == "completed", row
            got[what] = (user.home / f"gpuledger-{job}.out").read_text()
        mine = limits_of(got["propagated"])
        assert mine["Max open files"][0] == "512", got["propagated"]
        assert mine["Max stack size"][0] == str(4096 * 1024)
        assert mine["Max processes"][0] == "300"
        assert mine["Max open files"][1] == str(nofile_hard)  # the hard limit is the node's
        theirs = limits_of(got["none"])
        assert theirs["Max open files"][0] != "512" and theirs["Max processes"][0] != "300"
        said, *text = got["above"].splitlines()
        assert said == (
            f"gpuledger: RLIMIT_NOFILE: the submitter's soft limit {above} is above this node's "
            f"hard limit {nofile_hard}: the job runs with {nofile_hard} (as slurmstepd: "
            f'"reducing req:{above} to max:{nofile_hard}")'
        )
        assert limits_of("\n".join(text))["Max open files"] == (str(nofile_hard),) * 2
        (sub,) = [ev for ev in c.events("job.submitted.v2") if ev["job_id"] == jobs["propagated"]]
        assert (sub["ulimits"]["nofile"], sub["ulimits"]["nproc"]) == (512, 300)
