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

from typing import Any

from eventsourcing.persistence import BaseInfrastructureFactory
from eventsourcing.postgres import (
    PostgresApplicationRecorder,
    PostgresDatastore,
    PostgresFactory,
)
from psycopg.rows import dict_row
from psycopg.sql import SQL, Identifier

from ledger.store.lease import FENCE_SQL
from ledger.store.pgread import EVENTS_TABLE, connect, connect_params


class LedgerPostgresRecorder(PostgresApplicationRecorder):
    """eventsourcing's application recorder, writing each event's position as its stream version
    (the log is one stream: no gaps, the same positions as the SQLite store); with `fence_epoch`
    set (a leader of several servers, `ledger.store.lease`), every append first checks in its own
    transaction that the lease still holds that epoch."""

    fence_epoch: int | None = None

    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = EVENTS_TABLE):
        super().__init__(datastore, events_table_name=events_table_name)
        self.insert_events_statement = SQL(
            "INSERT INTO {schema}.{table} AS t ("
            "originator_id, originator_version, topic, state, notification_id) "
            "SELECT originator_id, originator_version, topic, state, originator_version "
            "FROM unnest(%s::{schema}.{stored_event_type}[]) RETURNING notification_id"
        ).format(
            schema=Identifier(self.datastore.schema),
            table=Identifier(self.events_table_name),
            stored_event_type=Identifier(self.stored_event_type_name),
        )

    def _insert_events(self, curs: Any, stored_events: Any, **kwargs: Any) -> None:
        if self.fence_epoch is not None:
            curs.execute(FENCE_SQL, (self.fence_epoch,), prepare=True)
        super()._insert_events(curs, stored_events, **kwargs)


class LedgerPostgresFactory(PostgresFactory):
    """eventsourcing's PostgreSQL factory configured by one DSN (`GPULEDGER_STORE_DSN`), so libpq
    multi-host lists and `target_session_attrs` work; the pool checks a connection before lending
    it (a primary that died is noticed before the next transaction, not during it)."""

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
        self.datastore.pool.kwargs = {**params, "row_factory": dict_row}


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
