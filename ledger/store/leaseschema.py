"""The lease's tables in the PostgreSQL store (`ledger.store.lease`): the lease row, the servers,
the refused servers of an earlier version, the guard and the fence, made once per version.

Making them is DDL: an `ALTER TABLE` takes an ACCESS EXCLUSIVE lock on the lease row's table,
which the leader's keep and every read of the row wait behind. Before, every server's start
ran it in the transaction of its settings' check and held the lock until its answer came back:
a starting server that was slow or frozen there deposed the leader, and nobody led for as long
as it lasted (10 minutes in the reproduction, atk43ha F3). Now a start that finds the schema as
this version makes it (`SCHEMA_MARK`, the table's comment) takes no lock at all, and the first
start of a version makes it in one statement string: one transaction that the database commits
itself, whatever the client's link, under a short lock timeout (retried) so it never queues the
leader's keep behind it for long."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

from ledger.store.pgread import store_schema

LEADER_TABLE = "gpuledger_leader"
SERVERS_TABLE = "gpuledger_servers"
REFUSED_TABLE = "gpuledger_refused"
"""Servers of an earlier version whose takes and keeps of the lease the database refused
(`gpuledger_leader_guard`), with how many."""
SCHEMA_LOCK = 7346010
"""The advisory lock the store's schema is made under (the lease's tables, the recorders')."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS {leader} (
    id int PRIMARY KEY CHECK (id = 1),
    epoch bigint NOT NULL,
    holder text NOT NULL,
    address text NOT NULL,
    expires_at timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL
);
INSERT INTO {leader} VALUES (1, 0, '', '', '-infinity', now()) ON CONFLICT DO NOTHING;
ALTER TABLE {leader} ADD COLUMN IF NOT EXISTS lease_s double precision NOT NULL DEFAULT 0;
ALTER TABLE {leader} ADD COLUMN IF NOT EXISTS node_lost_s double precision;
ALTER TABLE {leader} ADD COLUMN IF NOT EXISTS node_fence_s double precision;
ALTER TABLE {leader} ADD COLUMN IF NOT EXISTS work text;
ALTER TABLE {leader} ADD COLUMN IF NOT EXISTS settings_at timestamptz;
ALTER TABLE {leader} ADD COLUMN IF NOT EXISTS held_until timestamptz;
ALTER TABLE {leader} ADD COLUMN IF NOT EXISTS admission text;
ALTER TABLE {leader} ADD COLUMN IF NOT EXISTS stamp bigint NOT NULL DEFAULT 0;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{leader}'::regclass
                   AND attname = 'admission_epoch' AND NOT attisdropped) THEN
        ALTER TABLE {leader} ADD COLUMN admission_epoch bigint;
        UPDATE {leader} SET admission_epoch = epoch WHERE stamp > 0;
    END IF;
END $$;
CREATE TABLE IF NOT EXISTS {refused} (
    holder text PRIMARY KEY,
    address text NOT NULL,
    refused bigint NOT NULL,
    last_at timestamptz NOT NULL
);
CREATE OR REPLACE FUNCTION {guard}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.stamp IS NOT DISTINCT FROM OLD.stamp
            AND (NEW.epoch <> OLD.epoch OR NEW.expires_at > OLD.expires_at) THEN
        INSERT INTO {refused} AS r VALUES (NEW.holder, NEW.address, 1, now())
            ON CONFLICT (holder) DO UPDATE SET refused = r.refused + 1,
                address = excluded.address, last_at = now();
        RAISE WARNING 'gpuledger: the lease is not taken nor kept by % (%): a server of an '
            'earlier version, which neither records nor checks the settings (docs/ha.md, '
            'Upgrading)', NEW.address, NEW.holder;
        RETURN NULL;
    END IF;
    RETURN NEW;
END $$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'gpuledger_leader_guard'
                   AND tgrelid = '{leader}'::regclass) THEN
        CREATE TRIGGER gpuledger_leader_guard BEFORE UPDATE ON {leader}
            FOR EACH ROW EXECUTE FUNCTION {guard}();
    END IF;
END $$;
CREATE TABLE IF NOT EXISTS {servers} (
    holder text PRIMARY KEY,
    address text NOT NULL,
    role text NOT NULL,
    position bigint NOT NULL,
    seen_at timestamptz NOT NULL
);
ALTER TABLE {servers} ADD COLUMN IF NOT EXISTS kept_at timestamptz;
ALTER TABLE {servers} ADD COLUMN IF NOT EXISTS node_lease_s double precision;
ALTER TABLE {servers} ADD COLUMN IF NOT EXISTS relay_state text;
ALTER TABLE {servers} ADD COLUMN IF NOT EXISTS relay_position bigint;
ALTER TABLE {servers} ADD COLUMN IF NOT EXISTS relay_error text;
CREATE OR REPLACE FUNCTION {fence}(want bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM {leader} WHERE id = 1 AND epoch = want FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'gpuledger: not the leader (epoch % was taken over)', want
            USING ERRCODE = 'raise_exception';
    END IF;
END $$;
"""

SCHEMA_MARK = "gpuledger lease schema " + hashlib.sha256(SCHEMA.encode()).hexdigest()[:16]
"""The lease row's table's comment once this version's `SCHEMA` is made (another version's
schema, or none, has another)."""
LOCK_TIMEOUT_MS = 100
"""How long the schema's DDL waits for its lock before it gives up and tries again (the
leader's keep queues behind a waiting ACCESS EXCLUSIVE lock: `Lease.answer_s` is a third of a
lease of 1 s at least)."""


def objects(schema: str) -> dict[str, str]:
    """The lease's objects in `schema`, qualified (the placeholders of `SCHEMA` and of the
    lease's statements: `qualified`)."""
    q = '"' + schema + '"'  # a plain name (`store_schema`): nothing to escape
    return {
        "leader": f"{q}.{LEADER_TABLE}",
        "servers": f"{q}.{SERVERS_TABLE}",
        "refused": f"{q}.{REFUSED_TABLE}",
        "guard": f"{q}.gpuledger_leader_guard",
        "fence": f"{q}.gpuledger_fence",
    }


def qualified(sql: str, schema: str) -> str:
    """`sql` with its lease objects (`{leader}`, `{servers}`, `{refused}`, `{guard}`,
    `{fence}`) named in `schema`, the events' own: one store has one lease whatever
    search_path a server's role or DSN gives it. Unqualified, they resolved by the session's
    search_path (`"$user", public` by default): a server whose role had a schema of its own
    name, or whose DSN set another search_path, made and took a lease row of its own there,
    and two servers led one store (atk48-ha F3, F4)."""
    return sql.format(**objects(schema))


def lock_holder(con: Any) -> tuple[int, str, str, float] | None:
    """Who holds the schema's advisory lock (`SCHEMA_LOCK`): its backend's pid, application
    name, wait event and how long its statement has run (s); None: nobody (or not visible)."""
    row = con.execute(
        "SELECT a.pid, a.application_name, coalesce(a.wait_event, ''), "
        "extract(epoch FROM clock_timestamp() - a.query_start) FROM pg_locks l "
        "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
        "AND l.objid = %s AND a.pid <> pg_backend_pid() LIMIT 1",
        (SCHEMA_LOCK,),
    ).fetchone()
    return None if row is None else (int(row[0]), str(row[1]), str(row[2]), float(row[3] or 0))


def made(con: Any, schema: str = "public") -> bool:
    """Does the store have the lease's schema as this version makes it (a read: no lock but
    ACCESS SHARE on the catalog)?"""
    row = con.execute(
        qualified("SELECT obj_description(to_regclass('{leader}'), 'pg_class') = %s", schema),
        (SCHEMA_MARK,),
    ).fetchone()
    return bool(row and row[0])


def make_schema(
    con: Any,
    within_s: float = 60.0,
    schema: str | None = None,
    run: Callable[[str], Any] | None = None,
    waiting: Callable[[Any], None] | None = None,
) -> None:
    """Make the lease's schema in the store's `schema` (`store_schema`) on the autocommit
    connection `con` unless it is made (`made`): one statement string, committed by the
    database itself, under the schema's advisory lock (concurrent starts wait for each other)
    and `LOCK_TIMEOUT_MS` (tried again until `within_s`). A store whose lease tables are in
    `public` (every store before they were qualified) keeps them there: `public` is its
    events' schema; the statements are made again in place, their objects qualified. `run`:
    how the script is sent (`lease.watched`: cancelled when its commit waits on); `waiting`:
    asked with `con` each time the lock is not had (it may raise: `lease.holder_waits`)."""
    import psycopg

    schema = store_schema() if schema is None else schema
    if made(con, schema):
        return
    script = (
        f"BEGIN; SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'; "
        "SET LOCAL statement_timeout = '30s'; "
        f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); {qualified(SCHEMA, schema)}; "
        + qualified("COMMENT ON TABLE {leader} IS ", schema)
        + f"'{SCHEMA_MARK}'; COMMIT;"
    )
    deadline = time.monotonic() + within_s
    while True:
        try:
            (run or con.execute)(script)
            return
        except psycopg.errors.LockNotAvailable:
            con.execute("ROLLBACK")
            if waiting is not None:
                waiting(con)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        except psycopg.Error:
            con.execute("ROLLBACK")
            raise
