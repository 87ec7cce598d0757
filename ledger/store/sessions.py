"""A server's PostgreSQL sessions, named by their `application_name` (`gpuledger:HOST:PID:ID`),
and the statements a gone server of this host left running: a start or a server killed while a
commit waited for a synchronous standby that is away leaves its backend waiting, holding its
locks, until something cancels it (`cancel_orphans`)."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

log = logging.getLogger("gpuledger.lease")


def dead_here(holder: str) -> bool:
    """Is the server `holder` (`HOST:PID:ID`) a process of this host that is gone? A pid of
    another host, or one alive (reused, perhaps), is not known dead."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, someone else's
    try:  # a zombie (killed, not yet reaped) is gone too
        with open(f"/proc/{int(pid)}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


APP_PREFIX = "gpuledger:"
"""The start of the `application_name` of every connection of a ledger process (a server's lease,
start and pool, a command's reads), followed by its `HOST:PID:ID` (`cancel_orphans` finds a dead
one's statements by it)."""


def app_name(holder: str) -> str:
    """The `application_name` of a connection of the server `holder` (PostgreSQL keeps 63
    bytes)."""
    return (APP_PREFIX + holder)[:63]


def own_name(what: str) -> str:
    """The `application_name` of a connection of this process (`HOST:PID:what`): its pool's,
    a command's direct reads, its start's."""
    return app_name(f"{socket.gethostname()}:{os.getpid()}:{what}")


def cancel_own(con: Any) -> int:
    """Cancel the statements this process's other connections still run (at its end): a commit
    that waits for a synchronous standby that is away waits on after its connection is closed,
    holding its locks (a clean stop's lease take, a failed start's snapshot: the next start and
    its stop waited on them: atk50b-ha F3). Cancelled, it is committed on the primary,
    unconfirmed. How many were cancelled."""
    mine = own_name("")
    rows = con.execute(
        "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE state = 'active' "
        "AND starts_with(application_name, %s) AND pid <> pg_backend_pid()",
        (mine,),
    ).fetchall()
    return len(rows)


def cancel_orphans(con: Any) -> list[int]:
    """Cancel the statements still running for servers of this host that are gone (a start or
    a server killed while a commit waited for a synchronous standby that is away: its backend
    waits on, holding its locks, and the next start's statements waited on them or ended in
    "internal error: QueryCanceled": atk49 F7). Returns their backends' pids. A role that may
    not cancel them (another role's) is left alone: the next statements say why they wait."""
    try:
        rows = con.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE state = 'active' "
            "AND application_name LIKE %s AND pid <> pg_backend_pid()",
            (APP_PREFIX + "%",),
        ).fetchall()
        names = {int(pid): str(name)[len(APP_PREFIX) :] for pid, name in rows}
        gone = [pid for pid, name in names.items() if dead_here(name)]
        for pid in gone:
            con.execute("SELECT pg_cancel_backend(%s)", (pid,))
    except Exception as err:  # best effort: a cancel not allowed, a read refused
        log.debug("could not cancel the statements of gone servers: %s", err)
        return []
    if gone:  # a server's lease, start and pool connections: one server
        servers = {tuple(names[pid].split(":")[:2]) for pid in gone}
        log.info("cancelled the statements of %d gone server(s) of this host", len(servers))
    return gone
