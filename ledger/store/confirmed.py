"""How far the relay may publish a PostgreSQL store's log: only rows its synchronous standby
confirmed (atk52-ha F1).

A commit whose wait for the synchronous standby was cancelled (a leader whose lease ran out, a
server stopping, a watchdog) is visible on the primary, but the standby never had it: a failover
loses it, and the new log holds another event at its position. Kafka takes nothing back, so a
relay that had published it left a topic that forks there, and every reader stopped for good.

The standby confirms in WAL order, so a commit it confirmed confirms every row committed before
it. Before it publishes, the relay makes such a commit: one statement that reads the log's last
position and locks that row (`FOR KEY SHARE`: a lock writes WAL, so its commit waits for the
standby like an append's, and changes nothing a reader sees). It publishes only up to that
position, and only once the commit returned normally; cancelled (the standby does not confirm
within `CONFIRM_WAIT_S`) or failed, it publishes nothing and says why (`RelayUnavailable`: the
relay tries again). Without a synchronous standby the commit returns at once. SQLite is one
file on one host: every row it shows is as durable as it gets (no barrier).
"""

from __future__ import annotations

import threading
from typing import Any

from eventsourcing.sqlite import SQLiteApplicationRecorder
from psycopg.sql import SQL, Identifier

from ledger.store.lease import SYNC_WAIT, cancel_quietly
from ledger.store.relay_topic import RelayUnavailable

CONFIRM_WAIT_S = 5.0
"""How long the relay's barrier commit may wait for the synchronous standby before it is
cancelled (nothing is published then; the relay tries again)."""


def confirmed_head(recorder: Any, wait_s: float = CONFIRM_WAIT_S) -> int | None:
    """The log's last position, once a commit made after reading it was confirmed by the
    store's synchronous standby (so every row up to it was); None: a store without that question
    (SQLite). Raises RelayUnavailable when the confirmation does not come."""
    if not _postgres(recorder):
        return None
    datastore: Any = recorder.datastore
    query = SQL(
        "SELECT notification_id FROM {}.{} ORDER BY notification_id DESC LIMIT 1 FOR KEY SHARE"
    ).format(Identifier(datastore.schema), Identifier(recorder.events_table_name))
    notices: list[str] = []

    def heard(diag: Any) -> None:
        notices.append(str(diag.message_primary or ""))

    try:
        with datastore.get_connection() as conn:
            conn.add_notice_handler(heard)
            watchdog = threading.Timer(wait_s, cancel_quietly, (conn,))
            watchdog.daemon = True
            watchdog.start()
            try:
                row = conn.execute(query).fetchone()
            finally:
                watchdog.cancel()
                conn.remove_notice_handler(heard)
    except Exception as e:  # the store away, or the statement cancelled before its commit
        raise RelayUnavailable(
            f"cannot tell which of the store's rows its synchronous standby confirmed: "
            f"{type(e).__name__}: {e}",
            hint="nothing unconfirmed is published; the relay tries again",
        ) from e
    if any(SYNC_WAIT in n for n in notices):
        raise RelayUnavailable(
            f"the store's synchronous standby did not confirm its commits within {wait_s:g} s: "
            "rows it has not confirmed are not published (a failover would lose them)",
            hint="the relay publishes them once the standby confirms them (or drops them, if "
            "a failover lost them); check the standby (synchronous_standby_names)",
        )
    if row is None:
        return 0
    got = row["notification_id"] if isinstance(row, dict) else row[0]
    return int(got)


def publishable(recorder: Any, after: int) -> int | None:
    """The last position a relay that published up to `after` may publish now: on PostgreSQL,
    the head its synchronous standby confirmed (`confirmed_head`, asked only when the log holds
    something after `after`); None (the head) on SQLite."""
    if not _postgres(recorder):
        return None
    if int(recorder.max_notification_id() or 0) <= after:
        return after
    return confirmed_head(recorder)


def _postgres(recorder: Any) -> bool:
    """Whether `recorder` is a PostgreSQL store's (SQLite's datastore has a pool too)."""
    if isinstance(recorder, SQLiteApplicationRecorder):
        return False
    datastore = getattr(recorder, "datastore", None)
    return getattr(datastore, "pool", None) is not None and hasattr(datastore, "schema")
