"""A node agent whose --url lists only a standby follows the leader that standby names (attack
atk38-28 F2b: a server added later, agent configs not yet updated): real servers on a real
PostgreSQL and a real agent. Before, the agent asked the standby every second, was told "the
leader is X" and never went to X: its node was counted lost, and its jobs fenced."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from ledger.wire.client import Client
from tests.integration.agentkit import Agent
from tests.integration.hakit import make_group
from tests.integration.serverkit import init_on_store, make_token

NODE_LOST_S = 3


def test_an_agent_that_lists_only_a_standby_registers_with_the_leader_it_names(
    tmp_path: Path, pg_store: str
) -> None:
    home = tmp_path / "server-0"
    init_on_store(home, tmp_path, pg_store, "node-a", 2, "sim")
    node_token = make_token(home, "--node", "node-a", "--name", "node-a")
    token = make_token(home, "--user", "alice")
    flags = ("--executor", "agents", "--run-as", "service")
    node_flags = ("--node-lost-after", f"{NODE_LOST_S}s", "--node-fence", "20s")
    g = make_group(tmp_path, pg_store, 2, *flags, *node_flags, home=home)
    s0, s1 = g.members
    agent = None
    try:
        g.start(s0)
        assert g.leader() is s0
        g.start(s1)
        assert g.leader() is s0  # s1 stands by
        agent = Agent("node-a", tmp_path / "node-a", node_token, s1.url, tmp_path / "a.log")
        agent.start()  # registered: by the leader s1 named
        time.sleep(3 * NODE_LOST_S)  # its heartbeats reach the leader: never counted lost
        client = Client(s0.url, token)
        states = {n["node"]: n["state"] for n in client.get("nodes")}
        client.close()
        assert states["node-a"] == "active", (states, agent.text()[-3000:], g.why())
        assert "the leader is" not in agent.text(), agent.text()[-3000:]
    finally:
        if agent is not None and agent.proc is not None and agent.proc.poll() is None:
            agent.kill(signal.SIGKILL)
        g.stop()
