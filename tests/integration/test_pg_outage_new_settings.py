"""A shorter fence recorded by `--new-settings`, then a PostgreSQL outage (attack atk39-28 F1):
real PostgreSQL, real servers, real agents and a real job (with a child), checked from the
job's side. The agent, out of contact across the change, is kept by the new leader while the
store is away; the keep said no settings, so the agent renewed its lease by the OLD fence of its
lease file (40 s) while the leader counted the node lost by the new one (3 s + 4 s): the job ran
in two launches for ~30 s. Every answer that renews a node's lease now says the settings it
grants it under (`X-Gpuledger-Node-Lease`), and the agent renews by those alone."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from pathlib import Path

from ledger.wire.client import Client
from schemas import commands as c
from schemas.errors import LedgerError
from tests.integration import waits
from tests.integration.hakit import make_group
from tests.integration.pgoutkit import JOB, alive, pg_pair  # noqa: F401 (a fixture)
from tests.integration.serverkit import cli, init_on_store, make_token
from tests.integration.test_node_agents import Agent
from tests.integration.test_pg_failover import Pg


def test_a_keep_after_a_shorter_fence_renews_the_node_lease_by_the_new_one(
    tmp_path: Path,
    pg_pair: Pg,  # noqa: F811
) -> None:
    home = tmp_path / "server-0"
    init_on_store(home, tmp_path, pg_pair.dsn, "node-a", 2, "sim")
    cli(home, "node", "add", "node-b", "--gpus", "2", "--gpu-type", "sim", GPULEDGER_USER="root")
    token = make_token(home, "--user", "alice")
    marks = Path(tempfile.mkdtemp(prefix="gpuledger-marks-"))
    marks.chmod(0o1777)  # the job runs as nobody
    common = ("--executor", "agents", "--run-as", "service", "--interval", "0.5s", "--grace", "1s",
              "--node-lost-after", "3s")  # fmt: skip
    g = make_group(tmp_path, pg_pair.dsn, 2, *common, "--node-fence", "40s", home=home)
    agents = {}
    for node in ("node-a", "node-b"):
        node_token = make_token(home, "--node", node, "--name", node)
        agents[node] = Agent(node, tmp_path / node, node_token, g.urls, tmp_path / f"{node}.log")
    client = Client(g.urls, token, timeout=30)
    job_id = 0
    pids: list[int] = []
    cut = None

    def why() -> str:
        return g.why() + "".join(f"\n--- {n}\n{a.text()[-3000:]}" for n, a in agents.items())

    try:
        s0, s1 = g.members
        g.start(s0)
        g.leader()
        for agent in agents.values():
            agent.start()
        got = client.execute(c.SubmitJob(actor="", account="ai2/olmo", gpus=2, min_runtime_s=60,
                                         resumable=True,
                                         command=("sh", "-c", JOB.format(dir=marks))))  # fmt: skip
        job_id = got.events[0].job_id  # type: ignore[union-attr]
        mark = marks / str(job_id)

        def starts() -> list[list[int]]:
            lines = mark.read_text().splitlines() if mark.exists() else []
            return [[int(w) for w in ln.split()[1:3]] for ln in lines if ln.startswith("start")]

        pids = waits.wait_for("the job to start", lambda: starts() or None, 120, why)[0]
        row = next(j for j in client.get("jobs", {"limit": 100}) if j["job_id"] == job_id)
        nodes = row["nodes"] if isinstance(row["nodes"], list) else str(row["nodes"]).split(",")
        cut = agents.get(str(nodes[0]).strip())
        assert cut is not None and cut.proc is not None, (row, why())
        cut.proc.send_signal(signal.SIGSTOP)  # out of contact across the change
        s0.kill(signal.SIGTERM)
        g.args = (*common, "--node-fence", "4s", "--new-settings")
        g.start(s1)
        g.leader()
        time.sleep(2)
        pg_pair.run("down")
        time.sleep(4)  # s1 knows its store is away: the agent's first answer is no ack
        cut.proc.send_signal(signal.SIGCONT)
        time.sleep(20)  # kept by s1 (from its keep delay on)
        kept = (cut.state / "lease").read_text()
        cut.proc.send_signal(signal.SIGSTOP)
        pg_pair.run("up", "--standby")
        again = waits.wait_for("the job to start again", lambda: starts()[1:] or None, 120, why)
        # the first launch's processes had stopped by then (their node lease ran out)
        assert not any(alive(p) for p in pids), (pids, again, kept, why())
    finally:
        with contextlib.suppress(Exception):
            pg_pair.run("up", "--standby")
        if cut is not None and cut.proc is not None:
            cut.proc.send_signal(signal.SIGCONT)
        if job_id:
            with contextlib.suppress(LedgerError):
                client.execute(c.CancelJob(actor="", job_id=job_id))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        client.close()
        for agent in agents.values():
            if agent.proc is not None and agent.proc.poll() is None:
                agent.kill(signal.SIGKILL)
        g.stop()
