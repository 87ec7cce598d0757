"""A server starting on a slow link to PostgreSQL never takes the lease away from the leader
(docs/ha.md; attack atk43ha F3): real PostgreSQL, real servers, a TCP proxy that holds every
answer to the starting server for seconds once it has asked about the lease row.

Before, every start made the lease's schema (`ALTER TABLE ...`: an ACCESS EXCLUSIVE lock on the
lease row's table) in its settings' check's transaction and held the lock until its answers
came back; the leader's keeps waited behind it, it stepped down, and nobody led until the
starting server's transaction ended (10 minutes for a frozen one). Now a start that finds the
schema made reads the row and takes no lock a keep waits for."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

from tests.integration.hakit import make_group
from tests.integration.serverkit import cli
from tests.integration.test_ha_settings import one_line, serve

HOLD_S = 6.0
"""How long the proxy holds each answer once the lease row is asked about (three leases)."""


class SlowProxy:
    """A TCP proxy to PostgreSQL: on a connection whose client has named the lease row's table,
    every later answer of the database reaches the client `HOLD_S` late (a slow link, or a
    process paused as its answers come)."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            up = socket.create_connection(self.upstream)
            self.held += [conn, up]
            asked = threading.Event()
            threading.Thread(target=self._pump, args=(conn, up, asked, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, conn, asked, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, asked: threading.Event,
              ask: bool) -> None:  # fmt: skip
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            if ask and b"gpuledger_leader" in data:
                asked.set()
            elif not ask and asked.is_set():
                time.sleep(HOLD_S)
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for s in self.held:
            with contextlib.suppress(OSError):
                s.close()


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
    parts = urlsplit(pg_store)
    proxy = SlowProxy(parts.hostname or "", parts.port or 5432)
    via = urlunsplit(parts._replace(netloc=parts.netloc.replace(
        f"{parts.hostname}:{parts.port}", f"127.0.0.1:{proxy.port}")))  # fmt: skip
    try:
        s0 = g.start(g.members[0])
        assert g.leader() is s0
        epoch = _epoch(pg_store)
        # refused (another min_uid), its answers held: the leader keeps leading throughout
        err = one_line(serve(tmp_path / "loose", via, "--lease", g.lease, "--executor", "record",
                             "--config", str(loose)))  # fmt: skip
        assert "min_uid 1000 (recorded) against 1 here" in err, err
        assert _epoch(pg_store) == epoch, g.why()
        assert "stepping down" not in s0.text() and "ran out" not in s0.text(), g.why()
        assert g.leader() is s0
    finally:
        g.stop()
        proxy.close()
