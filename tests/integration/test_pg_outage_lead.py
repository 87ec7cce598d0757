"""After and during a PostgreSQL outage, for real (a private primary with its synchronous
standby, two servers on its multi-host DSN, clients submitting): a server stops in seconds while
the store is away; once PostgreSQL is back one of them leads at once (atk33-28 F4, F7); and the
synchronous standby lost (the primary takes statements and commits none) is said by health,
`status` and every refused write, and the ledger resumes once it is back (F10)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from ledger.wire.client import Client
from schemas import commands as c
from tests.integration import waits
from tests.integration.hakit import Group, Member, log_events, wait_cycled_after
from tests.integration.pgoutkit import pg_pair
from tests.integration.serverkit import cli
from tests.integration.test_pg_failover import Pg, Submitters, pair_group

__all__ = ["pair_group", "pg_pair"]  # the fixtures: test_pg_failover's group on a fresh database

OUTAGE_S = 40.0
"""Long enough for psycopg_pool's doubling pause between connection attempts to pass 16 s."""
STOP_S = 10.0
"""A stop while the store is away takes at most this (it took ~1.5 min: F4)."""
LEAD_AGAIN_S = 8.0
"""From PostgreSQL back to the first cycle of a leader, with a 2 s lease (it took ~30 s: F7)."""


def _stopped_within(m: Member, limit: float) -> float:
    assert m.proc is not None
    began = time.monotonic()
    m.proc.send_signal(signal.SIGTERM)
    try:
        code = m.proc.wait(timeout=limit + 60)
    finally:
        took = time.monotonic() - began
    assert code == 0, (code, m.text()[-3000:])
    assert took <= limit, f"the stop took {took:.1f} s:\n{m.text()[-3000:]}"
    assert "internal error" not in m.text(), m.text()[-3000:]
    return took


def _submitted_once(g: Group, subs: Submitters) -> None:
    submitted = [e["job_id"] for e in log_events(g.members[0].home)
                 if e["type"] == "job.submitted.v2"]  # fmt: skip
    assert set(subs.acked) <= set(submitted)  # nothing acknowledged is lost
    assert len(submitted) == len(set(submitted)) and len(subs.acked) == len(set(subs.acked))


def test_a_stop_during_an_outage_is_quick_and_postgresql_back_is_led_at_once(
    pg_pair: Pg, pair_group: tuple[Group, str]
) -> None:
    g, token = pair_group
    leader = g.leader()
    other = next(m for m in g.members if m is not leader)
    subs = Submitters(g, token, n=3)
    try:
        subs.more(20, "submits before the outage", g.why)
        pg_pair.run("down")
        down_at = time.monotonic()
        time.sleep(1.0)  # the leader's group commits are in flight, waiting on the store
        took = _stopped_within(leader, STOP_S)
        print(f"\nstop of the leader 1 s into the outage: {took:.2f} s")
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        pg_pair.run("up", "--standby")
        wall, back = time.time(), time.monotonic()
        _, cycled = wait_cycled_after(g, wall, timeout=120)
        print(f"PostgreSQL back after {OUTAGE_S:g} s: a leader's first cycle {cycled:.2f} s later")
        assert cycled <= LEAD_AGAIN_S, g.why()
        subs.more(10, "submits once PostgreSQL is back", g.why)
        assert time.monotonic() - back < 60
    finally:
        subs.finish()
    assert other.alive()
    took = _stopped_within(other, STOP_S)
    _submitted_once(g, subs)


def test_the_synchronous_standby_lost_is_said_by_health_status_and_writes_and_the_ledger_resumes(
    pg_pair: Pg, pair_group: tuple[Group, str], tmp_path: Path
) -> None:
    g, token = pair_group
    subs = Submitters(g, token, n=2)
    try:
        subs.more(10, "submits before the standby is lost", g.why)
        pg_pair.kill("standby")
        cause = "PostgreSQL does not commit: its synchronous standby does not confirm"

        def said() -> bool:  # the leader says it at its first renewal that does not commit,
            # and leads on until its lease runs out: then neither leads
            hs = [m.health() or {} for m in g.members]
            return all(cause in (h.get("store_error") or "") for h in hs) and all(
                h.get("role") == "standby" and not h.get("leader") for h in hs
            )

        waits.wait_for("both servers to say the store does not commit, neither leading", said,
                       15, g.why)  # fmt: skip
        # a write: one line naming the cause, from either server
        home = g.members[0].home
        env = {"GPULEDGER_URL": g.urls, "GPULEDGER_TOKEN": token, "GPULEDGER_RETRY_S": "0"}
        proc = cli(home, "submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "1h", ok=False,
                   **env)  # fmt: skip
        assert proc.returncode != 0 and proc.stderr.count("\n") == 1, proc.stderr
        assert cause in proc.stderr and "[unavailable]" in proc.stderr, proc.stderr
        out = cli(home, "status", GPULEDGER_URL=g.members[1].url).stdout
        assert f"  store         {cause}" in out, out
        assert "leader none" in out and "nobody leads until the store answers" in out, out
        assert " leader," not in out, out  # no server row called leader
    finally:
        subs.finish()
    pg_pair.run("up", "--standby")
    wall = time.time()
    wait_cycled_after(g, wall, timeout=60)
    client = Client(g.urls, token)
    try:
        got = client.execute(c.SubmitJob(actor="", account="ai2/olmo", gpus=1, min_runtime_s=60))
        assert got.position > 0
    finally:
        client.close()
    waits.wait_for("health to clear", lambda: not any(
        (m.health() or {}).get("store_error") for m in g.members), 30, g.why)  # fmt: skip
    _submitted_once(g, subs)


def test_a_standby_stopped_while_postgresql_is_down_stops_in_seconds(
    pg_pair: Pg, pair_group: tuple[Group, str]
) -> None:
    """atk49 F2: a standby SIGTERMed while the store was down said "stopped cleanly" and exited
    ~32 s later: its ledger, closed after `serve` returned, took a snapshot through
    eventsourcing's ten tries of the pool's 3 s. The leader too, stopped after it."""
    g, token = pair_group
    leader = g.leader()
    other = next(m for m in g.members if m is not leader)
    subs = Submitters(g, token, n=2)
    try:
        subs.more(10, "submits before the outage", g.why)  # the standby folds what it snapshots
    finally:
        subs.finish()
    waits.wait_for("the standby at the leader's position", lambda: (other.health() or {}).get(
        "head") == (leader.health() or {}).get("head"), 30, g.why)  # fmt: skip
    pg_pair.run("down")
    time.sleep(2.0)
    took = _stopped_within(other, STOP_S)
    print(f"\nstop of the standby 2 s into the outage: {took:.2f} s")
    took = _stopped_within(leader, STOP_S)
    print(f"stop of the leader then: {took:.2f} s")
