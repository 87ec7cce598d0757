"""Red team, a node or a job acting beyond itself (threat model rows T12 and T13,
docs/security.md), against a real `serve --executor agents` and real `gpuledger agent`
processes running real jobs: a job's token works while its run holds its GPUs and not after,
and a node's token reports only about runs placed on its own node."""

from __future__ import annotations

from pathlib import Path

from tests.integration import test_node_agents as agents
from tests.integration.serverkit import GPULEDGER
from tests.integration.test_node_agents import Cluster, part_log

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
