"""What the PostgreSQL outage tests (test_pg_outage_*.py) share: one primary with its synchronous
standby per worker, a fresh database of it for each test, and the world of the agents' tests (a
ledger on that database, two servers, real agents, jobs that write their pids).

The pair is started once per worker (`pg_outage_pair`, tests/integration/conftest.py, a session
fixture) instead of once per test: the outage files are xdist groups (`PG_OUTAGE_GROUPS`,
tests/conftest.py), each on one worker, so a group's tests take turns on its worker's pair and
two groups on two workers each stop and freeze a pair of their own. Each test starts from a
clean state all the same, the pair up with its standby streaming (`fresh_pg`) and a database no
other test wrote to."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from tests.integration.agentkit import Agent
from tests.integration.hakit import Group, make_group
from tests.integration.serverkit import BUDGET, cli, make_token
from tests.integration.test_pg_failover import Pg
from tests.integration.userkit import marks_dir

NODE_LOST_S, FENCE_S = 3, 12
"""The node's lease is 3 + 12 - 3 = 12 s (`LEASE_MARGIN_S`): above a server's keep delay with
the tests' 2 s lease (7.7 s, `ledger.server.ha.keep_timing`) and the time to switch servers
(the sizing rule of docs/ha.md: 11.7 s with two servers and 0.5 s heartbeats)."""


def fresh_pg(pair: Pg) -> Pg:
    """The shared pair up (a test before may have left it down or without its standby: `up
    --standby` starts what does not run and waits for the standby to be synchronous), and a
    new, empty database of it: the same pair (`run`, `kill`), a DSN of its own."""
    pair.run("up", "--standby")
    name = f"t_{uuid.uuid4().hex[:12]}"
    base, _, query = pair.dsn.partition("?")
    root, _, _ = base.rpartition("/")
    with psycopg.connect(f"{root}/postgres?{query}", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return Pg(pair.data, pair.env, f"{root}/{name}?{query}")


@dataclass
class AgentWorld:
    """A ledger on `dsn` with `nodes` (2 sim GPUs each), two servers (not started) and an agent
    per node (not started); the jobs write their marks in `marks`."""

    home: Path
    group: Group
    agents: list[Agent]
    token: str
    marks: Path
    node_tokens: dict[str, str] = field(default_factory=dict)


def agent_world(tmp_path: Path, dsn: str, nodes: tuple[str, ...]) -> AgentWorld:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", dsn)
    budget = tmp_path / "budget.toml"
    budget.write_text(BUDGET)
    cli(home, "budget", "apply", str(budget), GPULEDGER_USER="root")
    for node in nodes:
        cli(home, "node", "add", node, "--gpus", "2", "--gpu-type", "sim", GPULEDGER_USER="root")
    node_tokens = {n: make_token(home, "--node", n, "--name", n) for n in nodes}
    token = make_token(home, "--user", "alice")
    marks = marks_dir()  # the jobs run as nobody
    g = make_group(tmp_path, dsn, 2, "--executor", "agents", "--run-as", "service",
                   "--interval", "0.5s", "--node-lost-after", f"{NODE_LOST_S}s",
                   "--node-fence", f"{FENCE_S}s", "--grace", "1s", home=home)  # fmt: skip
    agents = [Agent(n, tmp_path / n, node_tokens[n], g.urls, tmp_path / f"{n}.log") for n in nodes]
    return AgentWorld(home, g, agents, token, marks, node_tokens)


@pytest.fixture
def pg_pair(pg_outage_pair: Pg) -> Pg:
    """The outage tests' pair (`pg_outage_pair`), up, with a fresh database for this test."""
    return fresh_pg(pg_outage_pair)
