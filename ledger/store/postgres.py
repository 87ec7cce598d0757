"""The PostgreSQL store: eventsourcing's PostgreSQL persistence (psycopg 3 and its pool), with
the ledger's rules.

The same log as the SQLite store, position for position: one stream, and each event's
notification id (its *position*) is written as its stream version, so positions have no gaps
(a sequence would skip the numbers of a transaction the unique constraint rejected) and a copy or
a restore reproduces them exactly. The primary key (stream, version) is the concurrency check, as
in SQLite: two servers that decided on the same state cannot both append.

- `LedgerPostgresFactory`: eventsourcing's factory, configured by one libpq DSN
  (`GPULEDGER_STORE_DSN`: `postgresql://user@host1:5432,host2:5432/db?target_session_attrs=read-write`
  follows a promoted standby) instead of eventsourcing's POSTGRES_* settings, which take one host.
- `prune_snapshots`: keep the newest snapshots (the SQLite store's rule, in PostgreSQL's SQL).

The reader that needs neither eventsourcing nor the application is `ledger.store.pgread`.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Any

from eventsourcing.persistence import (
    BaseInfrastructureFactory,
    InterfaceError,
    OperationalError,
    StoredEvent,
)
from eventsourcing.postgres import (
    PostgresApplicationRecorder,
    PostgresDatastore,
    PostgresFactory,
)
from eventsourcing.utils import retry
from psycopg.rows import dict_row
from psycopg.sql import SQL, Identifier
from psycopg_pool import ConnectionPool

from ledger.store.pgread import EVENTS_TABLE, connect, connect_params


class LedgerPostgresRecorder(PostgresApplicationRecorder):
    """eventsourcing's application recorder, writing each event's position as its stream version
    (the log is one stream: no gaps, the same positions as the SQLite store); with `fence_epoch`
    set (a leader of several servers, `ledger.store.lease`), every append first checks in its own
    transaction that the lease still holds that epoch.

    An append is ONE statement in autocommit (one round trip, its own transaction: the fence, the
    rows, the commit), where eventsourcing's takes three (BEGIN, LOCK TABLE, NOTIFY and the INSERT
    pipelined; a sync; COMMIT). What its table lock is for (a reader tailing the log must never
    pass a position that a slower transaction fills in later) holds here without it: positions
    are stream versions, so a writer appends position n+1 only after it saw position n committed
    (or appends both), and the (stream, version) key makes a second writer of n+1 wait for the
    first and fail; the committed rows are always a prefix of the log. Nothing LISTENs, so no
    NOTIFY (whose commit-time lock serialises every notifying transaction in the database)."""

    fence_epoch: int | None = None

    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = EVENTS_TABLE):
        super().__init__(datastore, events_table_name=events_table_name)
        rows = SQL(
            "INSERT INTO {schema}.{table} ("
            "originator_id, originator_version, topic, state, notification_id) "
            "SELECT i, v, t, s, v FROM unnest(%b::uuid[], %b::int8[], %b::text[], %b::bytea[]) "
            "AS e(i, v, t, s)"
        ).format(schema=Identifier(self.datastore.schema), table=Identifier(self.events_table_name))
        # rendered once: a Composed query is rendered again at every execute (the identifiers
        # escaped through libpq each time: ~10% of a group commit's CPU)
        self.append_sql = (rows + SQL(" RETURNING notification_id")).as_bytes()
        # the fence in the same statement: one row (or an error) joined to every inserted row,
        # its share lock on the lease row held to the commit (a takeover waits for this append)
        self.fenced_append_sql = (
            SQL("WITH fence AS MATERIALIZED (SELECT gpuledger_fence(%b::int8) AS ok) ")
            + rows
            + SQL(", fence RETURNING notification_id")
        ).as_bytes()

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> list[int]:
        """Append `stored_events` in one statement; their positions, in order. A retry after a
        lost answer meets its own rows (an IntegrityError the ledger tells by the bytes)."""
        if not stored_events:
            return []
        params: list[Any] = [
            [se.originator_id for se in stored_events],
            [se.originator_version for se in stored_events],
            [se.topic for se in stored_events],
            [se.state for se in stored_events],
        ]
        query = self.append_sql
        if self.fence_epoch is not None:
            query, params = self.fenced_append_sql, [self.fence_epoch, *params]
        with self.datastore.get_connection() as conn:
            assert conn.autocommit
            rows = conn.execute(query, params, prepare=True).fetchall()
        return sorted(int(row["notification_id"]) for row in rows)


PING_AFTER_S = 1.0
"""A pooled connection idle for longer than this is checked (one round trip) before it is lent:
a primary that died while nothing was written is noticed before the next transaction, not during
it. One that was used within the last second is lent as it is (under load, the check cost a
round trip per append); if it broke meanwhile, the append fails on it, the pool drops it and
`insert_events` retries on a new connection."""

_returned: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def _note_returned(conn: Any) -> None:
    _returned[conn] = time.monotonic()


def _check_if_idle(conn: Any) -> None:
    if time.monotonic() - _returned.get(conn, 0.0) > PING_AFTER_S:
        ConnectionPool.check_connection(conn)


class LedgerPostgresFactory(PostgresFactory):
    """eventsourcing's PostgreSQL factory configured by one DSN (`GPULEDGER_STORE_DSN`), so libpq
    multi-host lists and `target_session_attrs` work; the pool checks a connection that has been
    idle before lending it (`PING_AFTER_S`)."""

    application_recorder_class = LedgerPostgresRecorder

    def __init__(self, env: Any) -> None:
        BaseInfrastructureFactory.__init__(self, env)  # not the POSTGRES_* settings: one DSN
        dsn = self.env.get("GPULEDGER_STORE_DSN") or ""
        params = connect_params(dsn)
        connect(dsn).close()  # one clear line with libpq's own cause (a wrong password, nobody
        # listening), not the pool's "couldn't get a connection" after its timeout
        self.datastore = PostgresDatastore(
            dbname=str(params.get("dbname", "")),
            host="",
            port="",
            user="",
            password="",
            # how long a transaction waits for a connection: a store that does not answer is
            # an error in seconds (a write refused with 503, reads go on from what is held)
            connect_timeout=float(self.env.get("GPULEDGER_PG_POOL_TIMEOUT") or 3),
            idle_in_transaction_session_timeout=10,
            pool_size=int(self.env.get("GPULEDGER_PG_POOL_SIZE") or 4),
            max_overflow=4,
            pre_ping=True,
            lock_timeout=int(self.env.get("GPULEDGER_PG_LOCK_TIMEOUT") or 10),
            schema=str(self.env.get("GPULEDGER_PG_SCHEMA") or ""),
        )
        # no append waits for a lock (the lease row during a takeover, a position another
        # writer holds) longer than this; eventsourcing's LOCK TABLE had it, this path has none
        lock_timeout = f"-c lock_timeout={self.datastore.lock_timeout}s"
        params["options"] = f"{params.get('options', '')} {lock_timeout}".strip()
        pool = self.datastore.pool
        pool.kwargs = {**params, "row_factory": dict_row}
        pool._check, pool._reset = _check_if_idle, _note_returned  # (not yet open)


def prune_snapshots(recorder: Any, stream: str, keep: int) -> None:
    """Keep the `keep` newest snapshots of `stream` in eventsourcing's PostgreSQL snapshot table."""
    table = SQL("{}.{}").format(
        Identifier(recorder.datastore.schema), Identifier(recorder.events_table_name)
    )
    with recorder.datastore.transaction(commit=True) as cursor:
        cursor.execute(
            SQL(
                "DELETE FROM {t} WHERE originator_id = %s AND originator_version < (SELECT "
                "min(originator_version) FROM (SELECT originator_version FROM {t} WHERE "
                "originator_id = %s ORDER BY originator_version DESC LIMIT %s) AS newest)"
            ).format(t=table),
            (stream, stream, keep),
        )
