"""PostgreSQL hung (attack atk48-ha F5): its postmaster and every backend stopped (SIGSTOP: a
storage stall, an fsync stuck on a dead SAN, a kernel hang of the database host), so TCP stays
up and nothing answers, not the statements, not their `statement_timeout`, not a cancel. Real
jobs (each with a child) run on two real agents, two servers on the store. Before, a lease
statement on the hung server never returned: no server counted the store away, nobody kept the
agents' node leases, and every running job was fenced at the node lease's end. Now a lease
statement unanswered past its budget abandons its connection and counts as the store away: the
servers keep their agents' leases as they do when PostgreSQL is down, the jobs outlive a hang
longer than the node's lease (checked from outside the ledger: every process alive, none
signalled, none launched twice), and once the store answers nothing is recorded lost, failed
or requeued. The leader stopped (SIGTERM) during the hang stops in seconds, as when the store is
down (it waited for the store to answer again)."""

from __future__ import annotations

import contextlib
import os
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
    FENCE_S,
    NODE_LOST_S,
    agent_world,
    pg_pair,  # noqa: F401 (the fixture)
)
from tests.integration.test_pg_failover import Pg

NODE_LEASE_S = NODE_LOST_S + FENCE_S - 3
HUNG_S = NODE_LEASE_S + 10.0
"""The hang outlasts the node's lease: a job whose lease nobody renews is fenced by then."""
STOP_AT_S = 8.0
"""When the leader is stopped: after the acting leader's own keeps, before anyone else's."""


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def test_postgresql_hung_longer_than_the_node_lease_kills_no_job(
    tmp_path: Path,
    pg_pair: Pg,  # noqa: F811
) -> None:
    nodes = ("node-a", "node-b")
    w = agent_world(tmp_path, pg_pair.dsn, nodes)
    home, g, agents, token, marks = w.home, w.group, w.agents, w.token, w.marks
    client = Client(g.urls, token, timeout=30)
    ids: list[int] = []
    running: dict[str, list[int]] = {}
    hung: list[int] = []

    def why() -> str:
        return g.why() + "".join(f"\n--- {a.node}\n{a.text()[-3000:]}" for a in agents)

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

        running = waits.wait_for("the 4 jobs to start", pids, 120, why)
        before = len(log_events(home))

        hung = pg_pair.pids("primary")
        assert len(hung) > 3, hung  # the postmaster and its backends
        signal_all(hung, signal.SIGSTOP)
        hung_at = time.monotonic()
        time.sleep(STOP_AT_S)
        # the leader stopped (SIGTERM) during the hang stops in seconds, and its jobs run on
        assert leader.proc is not None
        began = time.monotonic()
        leader.proc.send_signal(signal.SIGTERM)
        assert leader.proc.wait(timeout=90) == 0, why()
        stopped_in = time.monotonic() - began
        while time.monotonic() - hung_at < HUNG_S:
            for job, (lead, child) in running.items():
                assert _alive(lead) and _alive(child), (job, why())
            assert not any("term" in p.read_text() for p in marks.iterdir()), why()
            time.sleep(0.5)
        signal_all(hung, signal.SIGCONT)
        hung = []
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

        jobs = waits.wait_for("the ledger to say the 4 jobs run", all_running, 60, why)
        for job, (lead, child) in running.items():
            assert _alive(lead) and _alive(child), job
        tags = [str(e["type"]) for e in log_events(home)[before:]]
        launches = {p.name: p.read_text().split("\n") for p in marks.iterdir()}
        agent_logs = [a.text() for a in agents]
        server_logs = "".join(m.text() for m in g.members)
    finally:
        signal_all(hung, signal.SIGCONT)
        for job_id in ids:  # the jobs end by a decision, as every job should
            with contextlib.suppress(LedgerError):
                client.execute(c.CancelJob(actor="", job_id=job_id))
        for pid in [p for pair in running.values() for p in pair]:
            with contextlib.suppress(AssertionError):
                waits.wait_for("the cancelled jobs to stop", lambda p=pid: not _alive(p), 30)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        client.close()
        for agent in agents:
            if agent.proc is not None and agent.proc.poll() is None:
                agent.kill(signal.SIGKILL)
        g.stop()
    # seconds, not the hang's end (the old code: not within 90 s); 16.4 s once at load ~8
    assert stopped_in < 30.0, stopped_in
    assert len(jobs) == 4
    for job, lines in launches.items():  # one launch each, never signalled
        assert [ln.split()[0] for ln in lines if ln] == ["start"], (job, lines)
    bad = ("node.lost", "job.requeued", "job.finished")
    assert not [t for t in tags if t.startswith(bad)], tags
    assert not any("node_failure" in text for text in agent_logs)
    assert all("keeps this node's lease" in text for text in agent_logs), agent_logs
    assert "the store does not answer the lease" in server_logs, server_logs
