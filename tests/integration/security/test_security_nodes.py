"""Red team, a node or a job acting beyond itself (threat model rows T12 and T13,
docs/security.md), against a real `serve --executor agents` and real `gpuledger agent`
processes running real jobs: a job's token works while its run holds its GPUs and not after,
and a node's token reports only about runs placed on its own node."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.integration import agentkit as agents
from tests.integration.agentkit import Cluster, part_log
from tests.integration.serverkit import GPULEDGER

template, cluster = agents.template, agents.cluster
"""The node agents' tests' fixtures: three 2-GPU nodes, each with its real agent."""


def test_a_job_token_stops_working_once_its_run_ended(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    kept = tmp_path / "token"
    script = (
        f'(umask 077; echo "$GPULEDGER_JOB_TOKEN" > {kept}); {GPULEDGER} checkpoint && echo own=ok'
    )
    job = c.submit(1, script, "--resumable")
    got = c.wait_status(job, "finished")
    assert "own=ok" in part_log(got["logs"][0]).read_text()  # it worked while the run lived
    token = kept.read_text().strip()
    assert token.startswith("glt_")
    before = [e for e in c.events("job.checkpointed.v1") if e["job_id"] == job]
    assert len(before) == 1, before
    for path, body in (
        ("/v1/commands/job.checkpoint", {"actor": "", "job_id": job}),
        ("/v1/whoami", None),
    ):
        status, answer = c.server.request("POST" if body else "GET", path, body, token=token)
        assert status == 401, (path, answer)
    after = [e for e in c.events("job.checkpointed.v1") if e["job_id"] == job]
    assert after == before


def test_a_node_reports_only_about_runs_placed_on_it(cluster: Cluster) -> None:
    """Two real agents: node Y's token telling that node X's job started, exited, was stopped,
    checkpointed or sampled is refused whole (403), recorded nowhere and logged with Y's
    identity; X's own late word about that run after it ended is still taken (a genuine
    race, never refused), and Y's agent goes on running its own jobs."""
    c = cluster
    job = c.submit(1, "exec sleep 600")
    running = c.wait_status(job, "running")
    mine = running["logs"][0].split(":", 1)[0]
    other = next(n for n in c.agents if n != mine)
    token, named = c.agents[other].token, c.agents[other].named()
    _no_secret_in_ps_or_logs(c, job, mine)
    lies: dict[str, dict[str, Any]] = {
        "exited": {"exited": [{"job_id": job, "run": 0, "exit_code": 0}]},
        "stopped": {"stopped": [{"job_id": job, "run": 0, "exit_code": 0}]},
        "started": {"started": [{"job_id": job, "run": 0, "log": "/tmp/x"}]},
        "checkpointed": {"checkpoints": [{"job_id": job, "run": 0}]},
        "sampled": {"samples": [{"job_id": job, "run": 0, "gpu_utilisation": [1.0]}]},
        "a job that does not exist": {"exited": [{"job_id": 9_999, "run": 0, "exit_code": 0}]},
    }
    before = _about(c, job)
    for what, items in lies.items():
        status, problem = c.server.request(
            "POST", "/v1/agent/report", {"node": other, **items}, token=token, headers=named
        )
        assert status == 403, (what, problem)
        assert problem["code"] == "forbidden"
        assert problem["detail"].startswith(
            f"node {other!r} may report only about runs placed on it: job(s) "
        ), problem
    # and with the other node's name in the body: its token is not that node's
    status, problem = c.server.request(
        "POST", "/v1/agent/report", {"node": mine, **lies["exited"]}, token=token, headers=named
    )
    assert status == 403 and f"'@node:{other}' may not act for node" in problem["detail"]
    assert c.job(job)["status"] == "running"
    assert [e for e in _about(c, job) if e not in before] == [], "something was recorded"
    logged = c.server.log_path.read_text()
    assert f"refused a report of node {other} (token:" in logged
    assert f"about job(s) {job}, never placed on it" in logged
    # the job's own node, after the run ended: a late report is taken, not refused
    c.cli("cancel", str(job))
    c.wait_status(job, "finished")
    status, ack = c.server.request(
        "POST",
        "/v1/agent/report",
        {"node": mine, **lies["exited"]},
        token=c.agents[mine].token,
        headers=c.agents[mine].named(),
    )
    assert status == 200, ack
    # the refused agent was never stopped: its node runs work as before
    both = c.submit(2 * len(c.agents), "true")  # a gang over every node
    assert c.wait_status(both, "finished")["outcome"] == "completed"


def _about(c: Cluster, job: int) -> list[dict[str, Any]]:
    """The recorded events about `job`, but utilisation samples (its node keeps sending them)."""
    return [
        e
        for e in agents.all_events(c)
        if e.get("job_id") == job and e["type"] != "job.utilisation_sampled.v1"
    ]


def _no_secret_in_ps_or_logs(c: Cluster, job: int, node: str) -> None:
    """Row T13's "never on a command line": with a job running under its agent, neither the
    job's token (read from its spec, as root) nor any node's token is in any process's
    arguments (`ps`), the server's log or an agent's log."""
    spec = c.agents[node].state / "runs" / f"{job}.1" / "0" / "spec.json"
    job_token = json.loads(spec.read_text())["env"]["GPULEDGER_JOB_TOKEN"]
    ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    logs = c.server.log_path.read_text() + "".join(ag.text() for ag in c.agents.values())
    for secret in (job_token, *(ag.token for ag in c.agents.values())):
        assert secret.startswith("glt_")
        assert secret not in ps and secret not in logs, secret[:20]
