"""A server starting on a slow link to PostgreSQL never takes the lease away from the leader
(docs/ha.md; attack atk43ha F3): real PostgreSQL, real servers, a TCP proxy that holds every
answer to the starting server for seconds once it has asked about the lease row.

Before, every start made the lease's schema (`ALTER TABLE ...`: an ACCESS EXCLUSIVE lock on the
lease row's table) in its settings' check's transaction and held the lock until its answers
came back; the leader's keeps waited behind it, it stepped down, and nobody led until the
starting server's transaction ended (10 minutes for a frozen one). Now a start that finds the
schema made reads the row and takes no lock a keep waits for."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg

from tests.integration.hakit import PgProxy, make_group
from tests.integration.serverkit import cli
from tests.integration.test_ha_settings import one_line, serve

HOLD_S = 6.0
"""How long the proxy holds each answer once the lease row is asked about (three leases)."""


class SlowProxy(PgProxy):
    """A proxy to PostgreSQL: on a connection whose client has named the lease row's table,
    every later answer of the database reaches the client `HOLD_S` late (a slow link, or a
    process paused as its answers come)."""

    def passing(self, data: bytes, upward: bool, link: threading.Event) -> bytes | None:
        if upward and b"gpuledger_leader" in data:
            link.set()
        elif not upward and link.is_set():
            time.sleep(HOLD_S)
        return data


def _epoch(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as con:
        row = con.execute("SELECT epoch FROM gpuledger_leader").fetchone()
    assert row is not None
    return int(row[0])


def test_a_server_starting_on_a_slow_link_never_deposes_the_leader(
    tmp_path: Path, pg_store: str
) -> None:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    loose = tmp_path / "loose.toml"
    loose.write_text("min_uid = 1\n")
    g = make_group(tmp_path, pg_store, 1, "--executor", "record", home=home)
    proxy = SlowProxy(pg_store)
    try:
        s0 = g.start(g.members[0])
        assert g.leader() is s0
        epoch = _epoch(pg_store)
        # refused (another min_uid), its answers held: the leader keeps leading throughout
        err = one_line(serve(tmp_path / "loose", proxy.via, "--lease", g.lease, "--executor",
                             "record", "--config", str(loose)))  # fmt: skip
        assert "min_uid 1000 (recorded) against 1 here" in err, err
        assert _epoch(pg_store) == epoch, g.why()
        assert "stepping down" not in s0.text() and "ran out" not in s0.text(), g.why()
        assert g.leader() is s0
    finally:
        g.stop()
        proxy.close()
