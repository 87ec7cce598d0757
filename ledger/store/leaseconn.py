"""The lease's connections at their edge: a statement cancelled quietly, a connection
abandoned, a commit watched for its synchronous standby, a server's own statements ended at its
exit.

Split from `ledger.store.lease` (the lease row, its take, renewal and reports stay there): what
the lease does to a PostgreSQL connection that does not answer, or whose commit waits for a
standby that is away. An edge (the network, threads).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from ledger.store.pgread import connect
from ledger.store.sessions import cancel_own, own_name
from schemas.errors import Unavailable

log = logging.getLogger("gpuledger.lease")

SYNC_WAIT = "canceling wait for synchronous replication"
"""PostgreSQL's warning when a commit that waited for its synchronous standby is cancelled (the
transaction committed locally, and the standby never confirmed it)."""
NOT_COMMITTING = (
    "PostgreSQL does not commit: its synchronous standby does not confirm (a commit waited "
    "{:g} s; synchronous_standby_names names a standby that is down or cut off)"
)


class NotCommitting(Unavailable):
    """The store takes statements but does not commit them (its synchronous standby is away):
    one line wherever it ends up (a start said "internal error: NotCommitting": atk49 F7)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


def cancel_quietly(con: Any, timeout: float = 2.0) -> None:
    """Cancel the statement running on `con` (the lease's watchdog, on a timer thread): a
    cancel that gets no answer (a silent partition: `CancellationTimeout`) is one log line,
    not an unhandled thread traceback (atk45ha F3); the statement's own error tells the rest."""
    try:
        con.cancel_safe(timeout=timeout)
    except Exception as err:  # any failure of a best-effort cancel
        log.warning("the lease's statement could not be cancelled: %s: %s",
                    type(err).__name__, err)  # fmt: skip


def abandon_connection(con: Any) -> None:
    """Shut the socket of `con` (another thread's statement on it raises at once, whatever the
    server does): the way out of a statement on a server that answers nothing, not even a
    cancel. The connection is closed by its user (`Lease._run`)."""
    try:
        fd = con.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except Exception as err:  # closed meanwhile: nothing to abandon
        log.debug("could not abandon the lease's connection: %s", err)


END_WAIT_S = 1.0
"""How long a server's exit waits for `end_sessions` (a store that does not answer is left)."""


def end_sessions(dsn: str) -> None:
    """At a server's exit (a clean stop, a start that failed): cancel the statements its own
    connections still run (`cancel_own`: commits waiting for a synchronous standby that is
    away), within `END_WAIT_S`; a store that does not answer is left to end them itself."""

    def run() -> None:
        try:
            with connect(dsn, connect_timeout=2, application_name=own_name("end"),
                         options="-c statement_timeout=2000") as con:  # fmt: skip
                n = cancel_own(con)
        except Exception as err:  # best effort: the store away, a cancel not allowed
            log.debug("could not cancel this server's own statements: %s", err)
            return
        if n:
            log.info("cancelled %d statement(s) of this server still running at its end (a "
                     "commit waiting for the synchronous standby)", n)  # fmt: skip

    thread = threading.Thread(target=run, name="end-sessions", daemon=True)
    thread.start()
    thread.join(END_WAIT_S)


def _waits_for_standby(dsn: str, pid: int, within_s: float) -> bool:
    """Does the backend `pid` wait for the synchronous standby's confirmation of its commit?"""
    try:
        with connect(dsn, connect_timeout=max(1, round(within_s))) as con:
            row = con.execute(
                "SELECT wait_event = 'SyncRep' FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
    except Exception:  # the store does not answer: the statement's own timeouts end it
        return False
    return bool(row and row[0])


def _sync_waits(con: Any) -> bool:
    """Does a commit of the store wait for its synchronous standby now (a statement that timed
    out waited for a lock that commit holds)?"""
    if con is None or con.closed:
        return False
    try:
        row = con.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep')"
        ).fetchone()
    except Exception:  # the connection is gone too: the error said enough
        return False
    return bool(row and row[0])


def watched(con: Any, within_s: float, sql: str, dsn: str) -> None:
    """`sql` on the autocommit connection `con` (of the store `dsn`), cancelled once its commit
    waits for a synchronous standby (looked at every `within_s`, from a connection of its own:
    a slow DDL is left to its own timeouts): `NotCommitting` (it committed here, unconfirmed).
    It waited forever, whatever the statement timeout, and a start said nothing and ignored
    SIGTERM (atk49 F7)."""
    notices: list[str] = []

    def noticed(diag: Any) -> None:
        notices.append(str(diag.message_primary or ""))

    done, pid = threading.Event(), con.info.backend_pid

    def watch() -> None:
        while not done.wait(within_s):
            if _waits_for_standby(dsn, pid, within_s):
                cancel_quietly(con, within_s)
                return

    con.add_notice_handler(noticed)
    threading.Thread(target=watch, name="ledger-start-watch", daemon=True).start()
    try:
        con.execute(sql)
    finally:
        done.set()
        con.remove_notice_handler(noticed)
    if any(SYNC_WAIT in n for n in notices):
        raise NotCommitting(NOT_COMMITTING.format(round(within_s, 1)))
