"""SIGTERM of the leader while PostgreSQL hangs (atk49 F4): the primary's and the standby's
processes stopped by SIGSTOP (a storage stall: TCP up, nothing answers), two real agents
reporting every 0.5 s. Before, the stop took 14-16 s: the web server's graceful stop waited
10 s for the agents' reports queued behind the worker's statement, then cancelled them with a
traceback each. Now the requests waiting on the worker are answered 503 at the stop, and the
stop takes seconds with no traceback in its log."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.integration.hakit import Member
from tests.integration.pgoutkit import agent_world, pg_pair  # noqa: F401 (the fixture)
from tests.integration.test_pg_failover import Pg
from tests.integration.test_pg_outage_hung import signal_all

HUNG_BEFORE_S = 5.0
"""How long PostgreSQL hangs before the SIGTERM (the agents' reports queue up meanwhile)."""
STOP_S = 5.0
"""A stop during the hang takes at most this: the worker's `AWAY_STOP_S` (2 s), the lease
thread's abandoned statement (two thirds of the 2 s lease), a loaded machine."""


def _stop(m: Member) -> tuple[float, str]:
    assert m.proc is not None
    before = len(m.text())
    began = time.monotonic()
    m.proc.send_signal(signal.SIGTERM)
    code = m.proc.wait(timeout=90)
    took = time.monotonic() - began
    said = m.text()[before:]
    assert code == 0, (code, said)
    return took, said


def test_sigterm_of_the_leader_while_postgresql_hangs_takes_seconds_and_logs_no_traceback(
    tmp_path: Path,
    pg_pair: Pg,  # noqa: F811
) -> None:
    w = agent_world(tmp_path, pg_pair.dsn, ("node-a", "node-b"))
    g, agents = w.group, w.agents
    hung: list[int] = []

    try:
        for m in g.members:
            g.start(m)
        leader = g.leader()
        other = next(m for m in g.members if m is not leader)
        for agent in agents:
            agent.start()
        time.sleep(3.0)  # agent.start waits for its registration; then a few reports each
        hung = pg_pair.pids("primary") + pg_pair.pids("standby")
        signal_all(hung, signal.SIGSTOP)
        time.sleep(HUNG_BEFORE_S)
        took, said = _stop(leader)
        print(f"\nSIGTERM of the leader {HUNG_BEFORE_S:g} s into the hang: {took:.2f} s\n{said}")
        assert "stopped cleanly" in said, said
        assert "Traceback" not in said and "Cancel " not in said, said
        assert took <= STOP_S, f"{took:.1f} s:\n{said}"
        took, said = _stop(other)
        print(f"SIGTERM of the standby then: {took:.2f} s")
        assert "Traceback" not in said and took <= STOP_S, f"{took:.1f} s:\n{said}"
    finally:
        signal_all(hung, signal.SIGCONT)
        for agent in agents:
            agent.kill()
        g.stop()
