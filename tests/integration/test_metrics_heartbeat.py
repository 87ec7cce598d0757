"""`/metrics` tells how long ago each node's agent reached a real `gpuledger serve --executor
agents` (register and heartbeat over HTTP with the node's own token)."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.serverkit import Server, cli, make_token, start_server

AGENT = {"X-Gpuledger-Agent": "0123456789abcdef0123456789abcdef"}


def ages(server: Server, token: str) -> dict[str, float]:
    status, text = server.request("GET", "/metrics", token=token)
    assert status == 200, text
    raw = text.decode() if isinstance(text, bytes) else str(text)
    return {
        s.labels["node"]: s.value
        for fam in text_string_to_metric_families(raw)
        if fam.name == "gpuledger_node_heartbeat_age_seconds"
        for s in fam.samples
    }


def test_heartbeat_age_follows_the_agents_reports(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    cli(home, "init", "--admin", "root")
    root = make_token(home, "--user", "root")
    cli(home, "node", "add", "gpu-a", "--gpus", "8", "--gpu-type", "h100", GPULEDGER_USER="root")
    node = make_token(home, "--user", "root", "--node", "gpu-a")
    server = start_server(home, "--executor", "agents", "--node-lost-after", "1h")
    try:
        assert ages(server, root) == {}  # no agent has reported yet
        body = {"node": "gpu-a", "gpus": 8, "gpu_type": "h100"}
        status, reply = server.request(
            "POST", "/v1/agent/register", body, token=node, headers=AGENT
        )
        assert status == 200, reply
        time.sleep(1.5)
        first = ages(server, root)
        assert set(first) == {"gpu-a"} and 1.0 <= first["gpu-a"] < 60
        status, reply = server.request(
            "POST", "/v1/agent/heartbeat", {"node": "gpu-a"}, token=node, headers=AGENT
        )
        assert status == 200, reply
        assert ages(server, root)["gpu-a"] < first["gpu-a"]  # the heartbeat made it fresh
    finally:
        assert server.stop() == 0
