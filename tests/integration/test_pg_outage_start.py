"""A server started while PostgreSQL cannot commit (atk49 F7): the primary takes statements and
its synchronous standby confirms none (the standby's processes stopped by SIGSTOP, as a standby
host frozen or cut off). Before, a start whose address a killed predecessor had reported at
ended "internal error: NotCommitting" (its retire of that row waited on the commit), and one
after a server killed while its commit waited found that backend still holding the lease row:
"canceling statement due to lock timeout". Now the start says so in one line within about a
third of the lease, waits as a standby (listening, reads answered, writes refused), stops in
seconds on SIGTERM, cancels what a killed server of its host left waiting, and leads once the
standby confirms again."""

from __future__ import annotations

import contextlib
import datetime
import re
import signal
import subprocess
import time
from pathlib import Path

import psycopg

from tests.integration import waits
from tests.integration.hakit import GPULEDGER, Group, Member, env_for, make_group
from tests.integration.pgoutkit import pg_pair  # noqa: F401 (the fixture)
from tests.integration.serverkit import cli
from tests.integration.test_pg_failover import Pg
from tests.integration.test_pg_outage_hung import signal_all

CAUSE = "PostgreSQL does not commit: its synchronous standby does not confirm"
WAITS = "this server waits as a standby"
SAID_WITHIN_S = 4.0
"""From the start's first log line to the line saying the store does not commit (a third of
the 2 s lease, plus a loaded machine's start)."""
STOP_S = 5.0


def _stamp(line: str) -> float:
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _started(g: Group, m: Member) -> str:
    """Start `m` (it listens) and return what it logged since."""
    before = len(m.text())
    g.start(m)
    return m.text()[before:]


def _said_once(m: Member, log: str) -> None:
    lines = [x for x in log.splitlines() if CAUSE in x]
    assert len(lines) == 1 and WAITS in lines[0], log
    assert "internal error" not in log and "Traceback" not in log, log
    first = next(x for x in log.splitlines() if re.match(r"\d{4}-\d\d-\d\d ", x))
    took = _stamp(lines[0]) - _stamp(first)
    print(f"\nsaid {took:.2f} s after the start's first line")
    assert took <= SAID_WITHIN_S, log
    h = m.health() or {}
    assert CAUSE in (h.get("store_error") or "") and h.get("role") == "standby", h


def _stopped(m: Member) -> float:
    assert m.proc is not None
    began = time.monotonic()
    m.proc.send_signal(signal.SIGTERM)
    code = m.proc.wait(timeout=STOP_S + 60)
    took = time.monotonic() - began
    assert code == 0 and took <= STOP_S, (code, took, m.text()[-3000:])
    return took


def _sync_waiters(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn, autocommit=True) as con:
        rows = con.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        ).fetchall()
    return [(int(p), str(a)) for p, a in rows]


def test_a_start_while_postgresql_does_not_commit_says_so_waits_and_stops_on_sigterm(
    tmp_path: Path,
    pg_pair: Pg,  # noqa: F811
) -> None:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_pair.dsn)
    g = make_group(tmp_path, pg_pair.dsn, 1, "--interval", "0.5s", home=home)
    (m,) = g.members
    frozen: list[int] = []
    try:
        g.start(m)
        g.leader()  # it reported at its address: the next start there retires that row
        m.kill(signal.SIGKILL)
        frozen = pg_pair.pids("standby")
        signal_all(frozen, signal.SIGSTOP)
        # 1 a start where a killed server reported: one line, a standby, SIGTERM in seconds
        _said_once(m, _started(g, m))
        print(f"SIGTERM of the waiting start: {_stopped(m):.2f} s")
        # 2 a server killed while its take waits on the commit leaves that backend waiting,
        #   holding the lease row: the next start cancels it and says why nobody leads
        _started(g, m)
        assert m.proc is not None
        pid = m.proc.pid

        def waiting() -> bool:
            return any(f":{pid}:" in a for _, a in _sync_waiters(pg_pair.dsn))

        waits.wait_for("the server's take to wait on the commit", waiting, 30, g.why)
        m.kill(signal.SIGKILL)
        log = _started(g, m)
        _said_once(m, log)
        assert "cancelled the statements of 1 gone server" in log, log
        assert not any(f":{pid}:" in a for _, a in _sync_waiters(pg_pair.dsn))
        # 3 the standby back: this server leads, and writes are taken
        signal_all(frozen, signal.SIGCONT)
        frozen = []
        assert g.leader(timeout=30) is m
        print(f"SIGTERM of the leader: {_stopped(m):.2f} s")
    finally:
        signal_all(frozen, signal.SIGCONT)
        g.stop()


def test_the_first_start_on_a_store_while_postgresql_does_not_commit_makes_the_lease_and_waits(
    tmp_path: Path,
    pg_pair: Pg,  # noqa: F811
) -> None:
    """The first server on a store makes the lease's tables (its settings check): their commit
    waited for the standby for ever, whatever its statement timeout (the start logged nothing
    and ignored SIGTERM). It is cancelled once it waits (committed on the primary), and the
    start goes on to wait as a standby."""
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_pair.dsn)
    g = make_group(tmp_path, pg_pair.dsn, 1, "--interval", "0.5s", home=home)
    (m,) = g.members
    frozen = pg_pair.pids("standby")
    signal_all(frozen, signal.SIGSTOP)
    try:
        _said_once(m, _started(g, m))
        print(f"SIGTERM of the waiting start: {_stopped(m):.2f} s")
        signal_all(frozen, signal.SIGCONT)
        frozen = []
        g.start(m)
        assert g.leader(timeout=30) is m
    finally:
        signal_all(frozen, signal.SIGCONT)
        g.stop()


def test_sigterm_during_the_start_ends_it_at_once(
    tmp_path: Path,
    pg_pair: Pg,  # noqa: F811
) -> None:
    """A signal before the server listens ends the start where it is (exit 0, one line), not
    once the start is done: here while it waits for another live server reporting at its
    address to go silent (up to `SILENT_S`)."""
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_pair.dsn)
    g = make_group(tmp_path, pg_pair.dsn, 1, "--interval", "0.5s", home=home)
    (m,) = g.members
    try:
        g.start(m)
        g.leader()
        with psycopg.connect(pg_pair.dsn, autocommit=True) as con:  # a live twin elsewhere
            con.execute(
                "INSERT INTO gpuledger_servers (holder, address, role, position, seen_at) "
                "SELECT 'elsewhere:1:twin', address, 'standby', 0, now() + interval '1 hour' "
                "FROM gpuledger_servers LIMIT 1"
            )
        _stopped(m)
        before = len(m.text())
        with m.log.open("ab") as out:
            m.proc = subprocess.Popen(
                [GPULEDGER, "serve", "--store", pg_pair.dsn, "--listen",
                 f"127.0.0.1:{m.port}", "--lease", g.lease, "--interval", "0.5s"],
                env=env_for(m.home), stdout=out, stderr=out,
            )  # fmt: skip
        waits.wait_for("the start's first line", lambda: "WARNING" in m.text()[before:], 30, g.why)
        time.sleep(2.0)  # the ledger read, the settings agreed: it waits for the twin to go silent
        assert m.alive() and "listening on" not in m.text()[before:], m.text()[before:]
        took = _stopped(m)
        print(f"\nSIGTERM during the start: {took:.2f} s")
        said = m.text()[before:]
        assert "stopping during the start (SIGTERM)" in said and "Traceback" not in said, said
    finally:
        with contextlib.suppress(Exception):
            g.stop()
