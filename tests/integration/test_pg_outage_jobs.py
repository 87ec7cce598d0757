"""PostgreSQL down while real jobs run on a real agent, two servers on the store (atk28 F1, F3):
nothing kills a job but a decision. The servers cut off from their store keep the agent's node
lease (nothing can be placed elsewhere while the store is away), so the jobs outlive an outage
far longer than the node's lease, and end `completed`; meanwhile
every valid token is still known (never 401) and a write is refused at once in one line (503)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path

from ledger.wire.client import Client
from schemas import commands as c
from schemas.errors import LedgerError, Unavailable
from tests.integration import waits
from tests.integration.hakit import wait_cycled_after
from tests.integration.pgoutkit import agent_world, pg_pair  # noqa: F401 (the fixture)
from tests.integration.test_pg_failover import Pg

JOB = (
    "trap 'echo term >> \"{dir}/$GPULEDGER_JOB_ID\"; exit 0' TERM; "
    'echo "start $$" >> "{dir}/$GPULEDGER_JOB_ID"; i=0; '
    'while [ $i -lt {secs} ]; do sleep 1; i=$((i+1)); done; echo done >> "{dir}/$GPULEDGER_JOB_ID"'
)
OUTAGE_S = 40.0
"""More than three node leases (3 s + 12 s - 3 s); the fence keeps the lease longer than a
server's keep delay with the tests' 2 s lease (7.7 s, `ledger.server.ha.keep_timing`)."""
JOB_S = int(OUTAGE_S) + 20
"""The jobs outlive the outage, and end ~10 s after the store is back (they ran 40 s more)."""


def test_postgresql_down_longer_than_the_node_fence_kills_no_job_and_forgets_no_token(
    tmp_path: Path,
    pg_pair: Pg,  # noqa: F811
) -> None:
    w = agent_world(tmp_path, pg_pair.dsn, ("node-a",))
    g, (agent,), token, marks = w.group, w.agents, w.token, w.marks
    try:
        for m in g.members:
            g.start(m)
        leader = g.leader()
        agent.start()
        client = Client(g.urls, token, timeout=30)
        command = ("sh", "-c", JOB.format(dir=marks, secs=JOB_S))
        ids = set()
        for _ in range(2):
            got = client.execute(c.SubmitJob(actor="", account="ai2/olmo", gpus=1,
                                             min_runtime_s=60, command=command))  # fmt: skip
            ids.add(got.events[0].job_id)  # type: ignore[union-attr]
        waits.wait_for("both jobs to start", lambda: len(list(marks.iterdir())) == 2, 120, g.why)
        # atk33-28 F2: writes in flight when the store goes away leave the leader's ledger
        # stale; its reload must not empty the state the node leases are kept from
        stop_writing = threading.Event()

        def write() -> None:
            writer = Client(leader.url, token, timeout=10)
            while not stop_writing.is_set():
                with contextlib.suppress(LedgerError):
                    writer.execute(c.SubmitJob(actor="", account="ai2/olmo", gpus=1,
                                               min_runtime_s=60))  # fmt: skip
                time.sleep(0.02)
            writer.close()

        writing = threading.Thread(target=write, daemon=True)
        writing.start()
        time.sleep(1.0)
        pg_pair.run("down")
        down_at = time.monotonic()
        time.sleep(2.0)
        stop_writing.set()
        writing.join(30)
        refused_in: list[float] = []
        while time.monotonic() - down_at < OUTAGE_S:
            said = {p.name: p.read_text() for p in marks.iterdir()}
            assert not any("term" in t for t in said.values()), (said, agent.text()[-3000:])
            for m in g.members:  # F3: the tokens are still known (never 401)
                reader = Client(m.url, token, timeout=30)
                assert reader.get("whoami")["actor"] == "alice", m.name
                reader.close()
            if time.monotonic() - down_at > 8 and not refused_in:
                writer = Client(leader.url, token, timeout=30)  # F3: a write, refused at once
                began = time.monotonic()
                try:
                    writer.execute(c.SubmitJob(actor="", account="ai2/olmo", gpus=1,
                                               min_runtime_s=60))  # fmt: skip
                except Unavailable as err:
                    refused_in.append(time.monotonic() - began)
                    assert "store does not answer" in err.line() or "lead" in err.line(), err
                writer.close()
            time.sleep(2)
        assert refused_in and refused_in[0] < 5.0, refused_in
        pg_pair.run("up", "--standby")
        wait_cycled_after(g, time.time(), timeout=120)

        def finished() -> list[dict[str, object]] | None:
            try:
                jobs = client.get("jobs", {"limit": 1000})
            except LedgerError:
                return None
            jobs = [j for j in jobs if j["job_id"] in ids]  # not the writes around the outage
            return jobs if all(j["status"] == "finished" for j in jobs) else None

        jobs = waits.wait_for("both jobs to end", finished, 240, g.why)
        client.close()
    finally:
        if agent.proc is not None and agent.proc.poll() is None:
            agent.kill(signal.SIGKILL)
        g.stop()
    assert {(j["outcome"], j["exit_code"]) for j in jobs} == {("completed", 0)}, jobs
    for p in marks.iterdir():
        assert [ln.split()[0] for ln in p.read_text().split("\n") if ln] == ["start", "done"]
    assert "keeps this node's lease" in agent.text()
