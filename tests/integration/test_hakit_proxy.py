"""hakit's `PgProxy` behaves as a network path: it goes on accepting after the upstream refused
a connection, and passes a close on either way (atk60-ha's note: it stopped accepting at the
first refusal and passed no close, so a PostgreSQL kill -9 behind it was a silent link for
good). A plain TCP echo server stands in for PostgreSQL."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.integration.hakit import PgProxy, free_port

WAIT_S = 3.0


class Echo:
    """A TCP server on `port` that echoes, until `stop`; `hang_up` closes its connections."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conns: list[socket.socket] = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := conn.recv(4096):
                conn.sendall(data)

    def hang_up(self) -> None:
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        self.conns.clear()

    def stop(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept (a close alone leaves it listening)
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.hang_up()


@pytest.fixture
def echo_and_proxy() -> Iterator[tuple[Echo, PgProxy]]:
    port = free_port()
    echo = Echo(port)
    proxy = PgProxy(f"postgresql://u@127.0.0.1:{port}/db")
    try:
        yield echo, proxy
    finally:
        proxy.close()
        echo.stop()


def _client(proxy: PgProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S)


def _echoes(proxy: PgProxy) -> bool:
    with _client(proxy) as c:
        c.sendall(b"ping")
        return c.recv(16) == b"ping"


def _closed(c: socket.socket) -> bool:
    """Whether the other side closed `c` (within `WAIT_S`); False when it stays silent."""
    try:
        return c.recv(16) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_refused_upstream_connection_is_closed_and_the_proxy_accepts_again(
    echo_and_proxy: tuple[Echo, PgProxy],
) -> None:
    echo, proxy = echo_and_proxy
    assert _echoes(proxy)
    echo.stop()  # the database is down: its port refuses
    with _client(proxy) as c:
        assert _closed(c), "the refused connection was held open, silent"
    back = Echo(echo.port)  # the database is back on its port
    try:
        assert _echoes(proxy), "the proxy accepts no more"
    finally:
        back.stop()


def test_a_close_of_either_side_reaches_the_other(echo_and_proxy: tuple[Echo, PgProxy]) -> None:
    echo, proxy = echo_and_proxy
    with _client(proxy) as c:
        c.sendall(b"ping")
        assert c.recv(16) == b"ping"
        echo.hang_up()  # PostgreSQL killed: its connections closed
        assert _closed(c), "the upstream's close did not reach the client"
    with _client(proxy) as c:
        c.sendall(b"ping")
        assert c.recv(16) == b"ping"
        (up,) = echo.conns
    up.settimeout(WAIT_S)  # the client's close reaches the database
    assert _closed(up), "the client's close did not reach the upstream"
