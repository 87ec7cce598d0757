"""The deadline on a server's store connections (`ledger.store.pgdeadline`, atk61-ha F1): a
connection lent past it has its socket shut (its statement fails at once, in one line), and the
lease shuts the worker's at once when the worker holds up a lease it took."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

import pytest

from ledger.server.ha import statement_bound_s
from ledger.store import pgdeadline


class _Conn:
    """A connection whose socket is one end of a pair (the other end: the store, silent)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.pgconn = sock, SimpleNamespace(socket=sock.fileno())


def _conn() -> tuple[_Conn, socket.socket]:
    mine, store = socket.socketpair()
    return _Conn(mine), store


def _shut(conn: _Conn) -> bool:
    conn.sock.settimeout(2.0)
    try:
        return conn.sock.recv(1) == b""  # shut: end of stream at once
    except TimeoutError:
        return False


@pytest.fixture
def deadline() -> object:
    before = pgdeadline.deadline_s
    yield
    pgdeadline.deadline_s = before


def test_a_connection_lent_past_the_deadline_is_abandoned(deadline: object) -> None:
    pgdeadline.deadline_s = 0.3
    conn, store = _conn()
    pgdeadline.lend(conn)
    try:
        assert _shut(conn)
        assert pgdeadline.abandoned(conn) is not None
        assert "its connection was abandoned" in (pgdeadline.abandoned(conn) or "")
    finally:
        pgdeadline.returned(conn)
        store.close()
        conn.sock.close()


def test_a_connection_returned_in_time_is_left_alone(deadline: object) -> None:
    pgdeadline.deadline_s = 0.6
    conn, store = _conn()
    pgdeadline.lend(conn)
    pgdeadline.returned(conn)
    time.sleep(1.0)
    try:
        assert pgdeadline.abandoned(conn) is None
        store.sendall(b"x")
        assert conn.sock.recv(1) == b"x"
    finally:
        store.close()
        conn.sock.close()


def test_the_lease_abandons_the_connection_a_thread_waits_on(deadline: object) -> None:
    pgdeadline.deadline_s = None  # no deadline: only the lease's call
    conn, store = _conn()
    lent, done = threading.Event(), threading.Event()
    ident: list[int] = []

    def worker() -> None:
        ident.append(threading.get_ident())
        pgdeadline.lend(conn)
        lent.set()
        done.wait(5)
        pgdeadline.returned(conn)

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert lent.wait(5)
        assert pgdeadline.abandon(None) is None
        assert pgdeadline.lent_for(ident[0]) is not None
        waited = pgdeadline.abandon(ident[0])
        assert waited is not None and waited >= 0
        assert _shut(conn)
    finally:
        done.set()
        t.join()
        store.close()
        conn.sock.close()
    assert pgdeadline.lent_for(ident[0]) is None


def test_the_bound_is_past_a_stalled_append_and_the_lock_timeout() -> None:
    assert statement_bound_s(5.0, 10.0) == 12.0
    assert statement_bound_s(2.0, 1.0) == 10.0
    assert statement_bound_s(30.0, 10.0) == 60.0
    assert pgdeadline.over(10.0, 0.0, 9.0)
    assert not pgdeadline.over(10.0, 0.0, None)
    assert not pgdeadline.over(10.0, 2.0, 9.0)
