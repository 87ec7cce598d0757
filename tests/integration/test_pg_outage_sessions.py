"""What a server leaves running in PostgreSQL while the synchronous standby is away (its
processes stopped by SIGSTOP): a commit waits for the standby's confirmation whatever becomes of
its connection, holding its locks. Every connection of a server is named `gpuledger:HOST:PID:ID`
now, its pool's too: the next start on the host cancels what a killed server's pool left
waiting (its append, holding the lease row's share lock), and a stop cancels what its own
connections still wait on. Before, pooled connections were named plain `gpuledger`, which
nothing could match, and a clean stop left its lease take waiting (atk50b-ha F3)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import psycopg

from tests.integration import waits
from tests.integration.hakit import GPULEDGER, make_group
from tests.integration.pgoutkit import pg_pair  # noqa: F401 (the fixture)
from tests.integration.serverkit import BUDGET, cli, env_for, workdir
from tests.integration.test_pg_failover import Pg
from tests.integration.test_pg_outage_hung import signal_all
from tests.integration.test_pg_outage_in_doubt import _append_waits
from tests.integration.test_pg_outage_start import CAUSE, _started, _stopped


def _waiting(dsn: str) -> list[str]:
    """The application names of the backends that wait for the standby's confirmation."""
    with psycopg.connect(dsn, autocommit=True) as con:
        rows = con.execute(
            "SELECT application_name FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        ).fetchall()
    return [str(a) for (a,) in rows]


def test_a_killed_server_s_pool_statements_are_cancelled_and_a_stop_leaves_none_waiting(
    tmp_path: Path,
    pg_pair: Pg,  # noqa: F811
) -> None:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_pair.dsn)
    budget = tmp_path / "budget.toml"
    budget.write_text(BUDGET)
    g = make_group(tmp_path, pg_pair.dsn, 1, "--interval", "0.5s", home=home)
    g.lease = "10s"  # the leader says the standby away a third of it after a commit waits
    (m,) = g.members
    frozen: list[int] = []
    try:
        g.start(m)
        g.leader()
        # 1 a write whose append (a pooled connection) waits for the standby; the server killed
        for _ in range(4):
            frozen = pg_pair.pids("standby")
            signal_all(frozen, signal.SIGSTOP)
            writer = subprocess.Popen(
                [GPULEDGER, "budget", "apply", str(budget)], cwd=workdir(home),
                env=env_for(home, GPULEDGER_USER="root"),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            waits.wait_for("the write's append to wait on the standby, or the write to end",
                           lambda p=writer: p.poll() is not None or _append_waits(pg_pair.dsn),
                           60, g.why)  # fmt: skip
            if writer.poll() is None:
                break
            signal_all(frozen, signal.SIGCONT)  # it came after the leader saw the standby away
            g.leader(timeout=60)
        assert m.proc is not None and _append_waits(pg_pair.dsn), _waiting(pg_pair.dsn)
        pid = m.proc.pid
        m.kill(signal.SIGKILL)
        writer.wait(timeout=60)
        print(f"\nwaiting after the kill: {_waiting(pg_pair.dsn)}")
        # 2 the next start on this host cancels them: the append's backend too
        log = _started(g, m)
        assert CAUSE in log and "internal error" not in log and "Traceback" not in log, log
        assert "cancelled the statements of 1 gone server" in log, log
        left = _waiting(pg_pair.dsn)
        assert not _append_waits(pg_pair.dsn) and not any(f":{pid}:" in a for a in left), left
        assert "gpuledger" not in left, left  # no connection of a server is unnamed
        # 3 its clean stop leaves nothing of its own waiting (its lease take did)
        assert m.proc is not None
        pid = m.proc.pid
        waits.wait_for("the waiting server's take to wait on the standby",
                       lambda: any(f":{pid}:" in a for a in _waiting(pg_pair.dsn)), 30,
                       g.why)  # fmt: skip
        print(f"SIGTERM of the waiting server: {_stopped(m):.2f} s")
        left = _waiting(pg_pair.dsn)
        assert not any(f":{pid}:" in a for a in left), left
        # 4 the standby back: it leads
        signal_all(frozen, signal.SIGCONT)
        frozen = []
        g.start(m)
        assert g.leader(timeout=30) is m
    finally:
        signal_all(frozen, signal.SIGCONT)
        g.stop()
