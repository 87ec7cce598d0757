"""PostgreSQL down while real jobs (each with a child) run on two real agents, two servers on the
store, and the leader stopped (SIGTERM) in the middle of it (attack F1, F3, F9): no server is a
single point of failure for "nothing kills a job but a decision". Every server that cannot reach
the store keeps its agents' node leases, the standby too, so the jobs outlive an outage several
times the node's lease (checked from outside the ledger: every process is still alive, none was
signalled, none launched twice), and once the store is back nothing is recorded lost, failed or
requeued. Meanwhile the stopped leader stops in seconds, and a CLI write says in one line that
the store does not answer. Once the store is back, a node whose agent dies is counted lost as
usual (the stopped leader's successor at its address says it is gone)."""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

from ledger.wire.client import Client
from schemas import commands as c
from schemas.errors import LedgerError
from tests.integration import waits
from tests.integration.hakit import JOB, log_events, wait_cycled_after
from tests.integration.hakit import alive as _alive
from tests.integration.pgoutkit import (
    NODE_LOST_S,
    agent_world,
    pg_pair,  # noqa: F401 (the fixture)
)
from tests.integration.serverkit import cli
from tests.integration.test_pg_failover import Pg

OUTAGE_S = 40.0
"""More than three node leases."""
STOP_AT_S = 8.0
"""When the leader is stopped: after the acting leader's own keeps, before anyone else's."""


def test_postgresql_down_and_the_leader_stopped_meanwhile_kills_no_job(
    tmp_path: Path,
    pg_pair: Pg,  # noqa: F811
) -> None:
    nodes = ("node-a", "node-b")
    w = agent_world(tmp_path, pg_pair.dsn, nodes)
    home, g, agents, token, marks = w.home, w.group, w.agents, w.token, w.marks
    client = Client(g.urls, token, timeout=30)
    ids: list[int] = []
    running: dict[str, list[int]] = {}
    try:
        for m in g.members:
            g.start(m)
        leader = g.leader()
        for agent in agents:
            agent.start()
        command = ("sh", "-c", JOB.format(dir=marks))
        for _ in range(4):
            got = client.execute(c.SubmitJob(actor="", account="ai2/olmo", gpus=1,
                                             min_runtime_s=60, command=command))  # fmt: skip
            ids.append(got.events[0].job_id)  # type: ignore[union-attr]

        def pids() -> dict[str, list[int]] | None:
            said = {p.name: p.read_text().split() for p in marks.iterdir()}
            if len(said) < len(ids) or any(len(w) < 3 for w in said.values()):
                return None
            return {job: [int(w[1]), int(w[2])] for job, w in said.items()}

        running = waits.wait_for("the 4 jobs to start", pids, 120, g.why)
        before = len(log_events(home))  # the nodes were lost once before their agents began

        pg_pair.run("down")
        down_at = time.monotonic()
        # F3: a CLI write while no server reaches the store: one line, at once, that says so
        began = time.monotonic()
        out = cli(tmp_path / "client", "submit", "--account", "ai2/olmo", "--gpus", "1", "--",
                  "true", ok=False, GPULEDGER_URL=g.urls, GPULEDGER_TOKEN=token)  # fmt: skip
        said_in = time.monotonic() - began
        lines = out.stderr.strip().splitlines()
        assert out.returncode != 0 and len(lines) == 1, out.stderr
        assert "store does not answer" in lines[0] and "standby" not in lines[0], lines
        assert said_in < 10.0, said_in
        time.sleep(max(0.0, STOP_AT_S - (time.monotonic() - down_at)))
        # F9: the leader stops in seconds while the store is away (its jobs run on)
        assert leader.proc is not None
        began = time.monotonic()
        leader.proc.send_signal(signal.SIGTERM)
        assert leader.proc.wait(timeout=60) == 0, g.why()
        stopped_in = time.monotonic() - began
        while time.monotonic() - down_at < OUTAGE_S:
            for job, (lead, child) in running.items():
                assert _alive(lead) and _alive(child), (job, [a.text()[-2000:] for a in agents])
            assert not any("term" in p.read_text() for p in marks.iterdir())
            time.sleep(1.0)
        pg_pair.run("up", "--standby")
        back = time.time()
        g.start(leader)  # the stopped server comes back and stands by
        wait_cycled_after(g, back, timeout=120)
        time.sleep(NODE_LOST_S + 2.0)  # what a leader would count lost, it counts by now

        def all_running() -> list[dict[str, object]] | None:
            try:
                jobs = [j for j in client.get("jobs", {"limit": 100}) if j["job_id"] in ids]
            except LedgerError:
                return None
            return jobs if all(j["status"] == "running" for j in jobs) else None

        jobs = waits.wait_for("the ledger to say the 4 jobs run", all_running, 60, g.why)
        node_states = {n["node"]: n["state"] for n in client.get("nodes")}
        for job, (lead, child) in running.items():
            assert _alive(lead) and _alive(child), job
        tags = [str(e["type"]) for e in log_events(home)[before:]]
        launches = {p.name: p.read_text().split("\n") for p in marks.iterdir()}
        # once every keep window has passed, a node whose agent dies is counted lost as
        # usual: not 15 min later for the stopped leader's silent row (its successor at its
        # address retired it)
        agents[1].kill(signal.SIGKILL)
        killed = time.monotonic()

        def lost() -> bool:
            return {n["node"]: n["state"] for n in client.get("nodes")}["node-b"] == "lost"

        waits.wait_for("node-b to be counted lost", lost, 60, g.why)
        lost_in = time.monotonic() - killed
    finally:
        for job_id in ids:  # the jobs end by a decision, as every job should
            with contextlib.suppress(LedgerError):
                client.execute(c.CancelJob(actor="", job_id=job_id))
        for pid in [p for pair in running.values() for p in pair]:
            waits.wait_for("the cancelled jobs to stop", lambda p=pid: not _alive(p), 60, g.why)
        client.close()
        for agent in agents:
            if agent.proc is not None and agent.proc.poll() is None:
                agent.kill(signal.SIGKILL)
        g.stop()
    assert stopped_in < 15.0, stopped_in
    assert lost_in < 30.0, lost_in
    print(f"CLI refusal {said_in:.2f} s, leader stop {stopped_in:.2f} s, node lost {lost_in:.1f} s")
    assert len(jobs) == 4 and node_states == {"node-a": "active", "node-b": "active"}
    for job, lines in launches.items():  # one launch each, never signalled
        assert [ln.split()[0] for ln in lines if ln] == ["start"], (job, lines)
    bad = ("node.lost", "job.requeued", "job.finished")
    assert not [t for t in tags if t.startswith(bad)], tags
    assert all("keeps this node's lease" in a.text() for a in agents)
