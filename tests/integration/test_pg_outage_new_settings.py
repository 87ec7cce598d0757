"""A shorter fence recorded by `--new-settings`, then a PostgreSQL outage (attack atk39-28 F1):
real PostgreSQL, real servers, real agents and a real job (with a child), checked from the
job's side. The agent, out of contact across the change, is kept by the new leader while the
store is away; the keep said no settings, so the agent renewed its lease by the OLD fence of its
lease file (40 s) while the leader counted the node lost by the new one (3 s + 4 s): the job ran
in two launches for ~30 s. Every answer that renews a node's lease now says the settings it
grants it under (`X-Gpuledger-Node-Lease`), and the agent renews by those alone."""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

from tests.integration import waits
from tests.integration.hakit import alive, job_on_agents, run_the_job
from tests.integration.pgoutkit import pg_pair  # noqa: F401 (a fixture)
from tests.integration.test_pg_failover import Pg


def test_a_keep_after_a_shorter_fence_renews_the_node_lease_by_the_new_one(
    tmp_path: Path,
    pg_pair: Pg,  # noqa: F811
) -> None:
    common = ("--executor", "agents", "--run-as", "service", "--interval", "0.5s", "--grace", "1s",
              "--node-lost-after", "3s")  # fmt: skip
    w = job_on_agents(tmp_path, pg_pair.dsn, *common, "--node-fence", "40s")
    try:
        run_the_job(w)
        assert w.cut is not None and w.cut.proc is not None
        s0, s1 = w.g.members
        w.cut.proc.send_signal(signal.SIGSTOP)  # out of contact across the change
        s0.kill(signal.SIGTERM)
        w.g.args = (*common, "--node-fence", "4s", "--new-settings")
        w.g.start(s1)
        w.g.leader()
        time.sleep(2)
        pg_pair.run("down")
        time.sleep(4)  # s1 knows its store is away: the agent's first answer is no ack
        w.cut.proc.send_signal(signal.SIGCONT)
        time.sleep(20)  # kept by s1 (from its keep delay on)
        kept = (w.cut.state / "lease").read_text()
        w.cut.proc.send_signal(signal.SIGSTOP)
        pg_pair.run("up", "--standby")
        again = waits.wait_for("the job to start again", lambda: w.starts()[1:] or None, 120,
                               w.why)  # fmt: skip
        # the first launch's processes had stopped by then (their node lease ran out)
        assert not any(alive(p) for p in w.pids), (w.pids, again, kept, w.why())
    finally:
        with contextlib.suppress(Exception):
            pg_pair.run("up", "--standby")
        w.close()
