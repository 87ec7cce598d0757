"""A deadline on the store's pooled connections, kept on this side of the link (atk61-ha F1).

A statement whose bytes a network swallowed (a stateful firewall or NAT that lost the flow's
state during a partition: the flow's packets are dropped from then on) is never answered, and
neither TCP keepalives nor `tcp_user_timeout` end it when a middlebox acknowledges what it then
drops: a standby's worker waited on its follow for good after a silent cut healed, so it took
the lease, handed it over (its worker had not taken up the work) and never led again. Now each
connection the pool lends is watched: one lent for longer than `deadline_s` (set from the
lease by `serve`: `ledger.server.ha.statement_bound_s`) has its socket shut, and the statement
on it fails at once with `WORDS`; the pool drops the broken connection and the next statement
takes a new one. `abandon(thread)` does it at once, for the lease (a worker that holds up a
lease it took: `Leadership._tick`).

The projector's own reads (`pgread.PgSource`) are watched too: a standby's follow waited
there. An edge (threads, sockets): one watcher thread per process, started at the first loan
once a deadline is set.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import weakref
from typing import Any

log = logging.getLogger("gpuledger.store")

WATCH_S = 0.25
"""How often the loans are looked at."""
WORDS = "the store has not answered for {:.1f} s (over {:g} s): its connection was abandoned"
"""What a statement on an abandoned connection fails with (one line)."""

deadline_s: float | None = None
"""How long a connection may stay lent (None: no deadline, the default outside `serve`)."""
_lent: dict[int, list[tuple[Any, float]]] = {}
"""The connections each thread holds now (the innermost last), and since when (monotonic)."""
_abandoned: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
"""Connections whose socket this module shut: how long they had been lent."""
_lock = threading.Lock()
_watcher: threading.Thread | None = None


def lend(conn: Any) -> None:
    """`conn` is now used by this thread (a statement, a transaction or the pool's check)."""
    global _watcher
    with _lock:
        _lent.setdefault(threading.get_ident(), []).append((conn, time.monotonic()))
        if _watcher is None and deadline_s is not None:  # (none outside `serve`)
            _watcher = threading.Thread(target=_watching, name="store-deadline", daemon=True)
            _watcher.start()


def returned(conn: Any) -> None:
    """This thread is done with `conn`."""
    with _lock:
        me = threading.get_ident()
        held = [loan for loan in _lent.get(me, []) if loan[0] is not conn]
        if held:
            _lent[me] = held
        else:
            _lent.pop(me, None)


def abandoned(conn: Any) -> str | None:
    """Why `conn` failed, when this module shut its socket (None: it did not)."""
    try:
        waited = _abandoned.get(conn)
    except TypeError:
        return None
    return None if waited is None else WORDS.format(waited, deadline_s or waited)


def lent_for(thread: int | None) -> float | None:
    """How long `thread` has held its oldest connection (None: it holds none)."""
    loans = [] if thread is None else list(_lent.get(thread, []))
    return time.monotonic() - loans[0][1] if loans else None


def abandon(thread: int | None) -> float | None:
    """Shut the socket of every connection `thread` holds (its statement fails at once); how
    long it had held the oldest (None: it holds none)."""
    loans = [] if thread is None else list(_lent.get(thread, []))
    if not loans:
        return None
    waited = time.monotonic() - loans[0][1]
    for conn, since in loans:
        _shut(conn, time.monotonic() - since)
    return waited


def over(now: float, since: float, limit: float | None) -> bool:
    """Pure: is a loan made at `since` past the deadline `limit` (None: none) at `now`?"""
    return limit is not None and now - since > limit


def _watching() -> None:
    while True:
        time.sleep(WATCH_S)
        try:
            _look()
        except Exception as err:  # the watcher goes on, whatever one look met
            log.debug("the store connections' deadline: %s", err)


def _look() -> None:
    now, limit = time.monotonic(), deadline_s
    with _lock:
        late = [(c, now - t) for ls in _lent.values() for c, t in ls if over(now, t, limit)]
    for conn, waited in late:
        if abandoned(conn) is None:
            log.warning(WORDS.format(waited, limit or waited))
            _shut(conn, waited)


def _shut(conn: Any, waited: float) -> None:
    with contextlib.suppress(TypeError):  # (a connection that takes no weak reference)
        _abandoned[conn] = waited
    with contextlib.suppress(Exception):  # closed meanwhile: nothing to abandon
        fd = conn.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
