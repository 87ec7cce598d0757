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

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from eventsourcing.persistence import (
    BaseInfrastructureFactory,
    InterfaceError,
    OperationalError,
    StoredEvent,
)
from eventsourcing.postgres import (
    PostgresAggregateRecorder,
    PostgresApplicationRecorder,
    PostgresDatastore,
    PostgresFactory,
)
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg.sql import SQL, Identifier, Literal
from psycopg_pool import ConnectionPool
from psycopg_pool.base import AttemptWithBackoff

from ledger.store import pgarrays, pgdeadline
from ledger.store.appended import LogBehind
from ledger.store.lease import NOT_COMMITTING, SCHEMA_LOCK, SYNC_WAIT
from ledger.store.pgread import (
    EVENTS_TABLE,
    connect,
    connect_params,
    no_ledger,
    redacted,
    store_schema,
)
from projections.chain import FRAME
from schemas.errors import Unavailable

RETRY_FOR_S = 4.0
"""How long a read or an append is tried again after a connection error (eventsourcing's own
rule, ten tries each waiting up to the pool's 3 s, held a worker ~32 s per statement while the
store was down: a stop took ~1.5 min, and a server that took the lease back after an outage led
~30 s later; atk33-28 F4, F7). A broken connection is retried on a new one at once; a store that
does not answer fails the statement within this, and the ledger reads its state back later."""
RETRY_WAIT_S = 0.2
WATCH_S = 0.25
"""How often an append in flight is looked at, to cancel it once `give_up()` says so."""


class _Bounded:
    """eventsourcing's recorder statements, tried again after a connection error for at most
    `RETRY_FOR_S` (ten tries), and not at all once `give_up()` says so (a server stopping, a
    leader whose lease ran out: its appends would be refused by the fence anyway)."""

    give_up: Callable[[], bool] = staticmethod(lambda: False)

    def call_began(self, thread: int | None) -> float | None:
        """monotonic time the statement under way on `thread` (its retries included) began
        (None: none): a leader's worker held by a slow read stalls its writes as an append
        does (`Leadership.stalled`)."""
        return None if thread is None else self.__dict__.get("_calls", {}).get(thread)

    def _bounded(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        calls: dict[int, float] = self.__dict__.setdefault("_calls", {})
        me = threading.get_ident()
        if me in calls:  # a statement inside another (its time is the outer one's)
            return self._tried(fn, *args, **kwargs)
        calls[me] = time.monotonic()
        try:
            return self._tried(fn, *args, **kwargs)
        finally:
            calls.pop(me, None)

    def _tried(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        began, tries = time.monotonic(), 0
        while True:
            try:
                return fn(self, *args, **kwargs)
            except (InterfaceError, OperationalError):
                tries += 1
                spent = time.monotonic() - began
                if tries >= 10 or spent + RETRY_WAIT_S > RETRY_FOR_S or self.give_up():
                    raise
                time.sleep(RETRY_WAIT_S)

    def create_table(self) -> None:
        """eventsourcing's tables, types and functions, made under the ledger's advisory lock:
        servers started together replaced its function at once and one died at start ("tuple
        concurrently updated"; its CREATE TYPE: a duplicate key) (atk39-28 F4). Made only by
        what makes a ledger (`init --store`, `store copy`: `may_create`); a table that is there
        is read, never made again (a read-only command made tables in `public`, and every
        start committed DDL: atk49 F3, F7); a ledger's events table that is not there is one
        line naming the schema, nothing created."""
        import psycopg

        store = self.datastore  # type: ignore[attr-defined]
        table = f'"{store.schema}"."{self.events_table_name}"'  # type: ignore[attr-defined]
        with psycopg.connect(**store.pool.kwargs, autocommit=True) as con:
            row = con.execute("SELECT to_regclass(%s) IS NOT NULL AS t", (table,)).fetchone()
            if row and row["t"]:
                store.register_type_adapters()  # as eventsourcing's create_table ends
                return
            if not getattr(store, "may_create", False) and self.events_table_name == EVENTS_TABLE:  # type: ignore[attr-defined]
                raise no_ledger(redacted(store.dsn), store.schema)
            con.execute(f"SELECT pg_advisory_lock({SCHEMA_LOCK})")  # let go with the connection
            super().create_table()  # type: ignore[misc]

    def select_events(self, *args: Any, **kwargs: Any) -> Any:
        fn = PostgresAggregateRecorder.select_events.__wrapped__
        return self._bounded(fn, *args, **kwargs)


class LedgerAggregateRecorder(_Bounded, PostgresAggregateRecorder):
    """eventsourcing's aggregate recorder (the snapshots), with bounded retries (`_Bounded`):
    a snapshot's insert too (eventsourcing's ten tries of 3 s each held a stop ~32 s while the
    store was down: atk49 F2)."""

    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = EVENTS_TABLE):
        super().__init__(datastore, events_table_name=events_table_name)
        self.packed_insert_sql = (
            SQL(
                "INSERT INTO {schema}.{table} (originator_id, originator_version, topic, state) "
                "SELECT * FROM unnest(%b::uuid[], %b::int8[], %b::text[], %b::bytea[])"
            ).format(
                schema=Identifier(self.datastore.schema), table=Identifier(self.events_table_name)
            )
        ).as_bytes()

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Any:
        fn = PostgresAggregateRecorder.insert_events.__wrapped__
        return self._bounded(fn, stored_events, **kwargs)

    def _insert_stored_events(
        self, curs: Any, stored_events: Sequence[StoredEvent], **_: Any
    ) -> None:
        """The rows as eventsourcing's insert writes them, their states sent in binary: its
        composite type's array is dumped as text, a snapshot's megabytes escaped in Python
        (~90 ms of CPU and ~0.4 s of the worker thread for 3 MB at load ~10, 2026-12-07)."""
        curs.execute(
            self.packed_insert_sql,
            [
                pgarrays.uuids([se.originator_id for se in stored_events]),
                pgarrays.int8s([se.originator_version for se in stored_events]),
                pgarrays.texts([se.topic for se in stored_events]),
                pgarrays.byteas([se.state for se in stored_events]),
            ],
        )


class LedgerPostgresRecorder(_Bounded, PostgresApplicationRecorder):
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
    append_began: float | None = None
    """monotonic time the append under way began, its retries included (None: none under
    way): a leader whose append waits too long hands its lease over (`Leadership.stalled`)."""

    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = EVENTS_TABLE):
        super().__init__(datastore, events_table_name=events_table_name)
        where = {"schema": Identifier(self.datastore.schema),
                 "table": Identifier(self.events_table_name)}  # fmt: skip
        rows = SQL(
            "INSERT INTO {schema}.{table} ("
            "originator_id, originator_version, topic, state, notification_id) "
            "SELECT i, v, t, s, v FROM unnest(%b::uuid[], %b::int8[], %b::text[], %b::bytea[]) "
            "AS e(i, v, t, s)"
        ).format(**where)
        # the row the append builds on is in the store, with the link the writer folded (its
        # v2 link, `projections.chain.link`, computed here): no row is inserted otherwise (a
        # failover to a standby without the last commits: the writer had folded rows the store
        # no longer has, and appended over the gap; atk51-ha F2). Position 0 builds on nothing.
        builds_on = SQL(
            " WHERE %b::int8 = 0 OR EXISTS (SELECT 1 FROM {schema}.{table} AS p WHERE "
            "p.originator_id = e.i AND p.originator_version = %b::int8 AND 'v2:' || encode("
            "sha256({frame} || int8send(p.notification_id) || "
            "int8send(p.originator_version) || int4send(octet_length(convert_to(p.topic, "
            "'UTF8'))) || convert_to(p.topic, 'UTF8') || p.state), 'hex') = %b::text)"
        ).format(frame=Literal(FRAME), **where)
        # rendered once: a Composed query is rendered again at every execute (the identifiers
        # escaped through libpq each time: ~10% of a group commit's CPU)
        self.append_sql = (rows + builds_on + SQL(" RETURNING notification_id")).as_bytes()
        # the fence in the same statement: one row (or an error) joined to every inserted row,
        # its share lock on the lease row held to the commit (a takeover waits for this append).
        # A lease that ran out fences too (epoch -1 is never held), in the database's clock when
        # the statement runs: an append sent before PostgreSQL hung and run when it woke, after
        # the server had answered 503 and before anyone took the lease, committed a write its
        # client was told was not taken (a lease's holder never appends past its row's expiry:
        # its own deadline passes a fifth of the lease before it, docs/ha.md)
        self.fenced_append_sql = (
            SQL(
                "WITH fence AS MATERIALIZED (SELECT {schema}.gpuledger_fence(CASE WHEN (SELECT "
                "expires_at > clock_timestamp() FROM {schema}.gpuledger_leader WHERE id = 1) "
                "THEN %b::int8 ELSE -1 END) AS ok) "
            ).format(schema=Identifier(self.datastore.schema))  # the lease's (atk48-ha F4)
            + rows
            + SQL(", fence")
            + builds_on
            + SQL(" RETURNING notification_id")
        ).as_bytes()

    def insert_events(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        builds_on: tuple[int, str] = (0, ""),
        **kwargs: Any,
    ) -> list[int]:
        """Append `stored_events` in one statement; their positions, in order. A retry after a
        lost answer meets its own rows (an IntegrityError the ledger tells by the bytes).
        `builds_on`: the position before the first event and the link the writer folded there
        (0: not checked); `LogBehind` when the store has no such row (nothing inserted)."""
        self.append_began = time.monotonic()
        try:
            return self._bounded(type(self)._insert_once, stored_events, builds_on)  # type: ignore[no-any-return]
        finally:
            self.append_began = None

    def select_notifications(self, *args: Any, **kwargs: Any) -> Any:
        fn = PostgresApplicationRecorder.select_notifications.__wrapped__
        return self._bounded(fn, *args, **kwargs)

    def max_notification_id(self) -> Any:
        fn = PostgresApplicationRecorder.max_notification_id.__wrapped__
        return self._bounded(fn)

    def _insert_once(
        self, stored_events: Sequence[StoredEvent], builds_on: tuple[int, str] = (0, "")
    ) -> list[int]:
        if not stored_events:
            return []
        notices: list[str] = []

        def heard(diag: Any) -> None:  # read in the callback: psycopg empties it after (the
            notices.append(str(diag.message_primary or ""))  # warning went unseen: atk51-ha F1)

        params: list[Any] = [  # packed here: psycopg's dumping of lists was most of the cost
            pgarrays.uuids([se.originator_id for se in stored_events]),
            pgarrays.int8s([se.originator_version for se in stored_events]),
            pgarrays.texts([se.topic for se in stored_events]),
            pgarrays.byteas([se.state for se in stored_events]),
            builds_on[0],
            builds_on[0],
            builds_on[1],
        ]
        query = self.append_sql
        if self.fence_epoch is not None:
            query, params = self.fenced_append_sql, [self.fence_epoch, *params]
        with self.datastore.get_connection() as conn:
            assert conn.autocommit
            conn.add_notice_handler(heard)
            self._watch(conn)
            try:
                rows = conn.execute(query, params, prepare=True).fetchall()
            finally:
                self._watched = None
                conn.remove_notice_handler(heard)
        if any(SYNC_WAIT in n for n in notices):
            # cancelled while its commit waited for the synchronous standby: committed here
            # only, unconfirmed: not acknowledged (the ledger reads its state back)
            waited = round(time.monotonic() - self._watched_at, 1)
            raise Unavailable(
                NOT_COMMITTING.format(waited)
                + ": this write is committed on the primary, unconfirmed (stored once the "
                "standby confirms it)",
                hint="send it again under its idempotency key once the synchronous standby is "
                "back (answered, not stored twice); reads answer",
                outcome="unknown",
            )
        if not rows:  # the row it builds on is not the one the writer folded: nothing written
            at, linked = builds_on
            raise LogBehind(
                f"the store's log has no row at position {at} with the link this server folded "
                f"there ({linked[:15]}...): it is behind what was folded (a failover to a standby "
                "without the last commits?)"
            )
        return sorted(int(row["notification_id"]) for row in rows)

    _watched: Any = None
    _watched_at: float = 0.0
    _watcher: threading.Thread | None = None

    def _watch(self, conn: Any) -> None:
        """Cancel the append on `conn` once `give_up()` says so (a commit waiting for a
        synchronous standby that is down waits forever, whatever the timeouts: a leader whose
        lease ran out, or a server stopping, would wait with it: atk33-28 F4, F10). One thread
        per recorder looks every `WATCH_S`; an append costs two assignments."""
        self._watched, self._watched_at = conn, time.monotonic()
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watching, name="append-watch",
                                             daemon=True)  # fmt: skip
            self._watcher.start()

    def _watching(self) -> None:
        while True:
            time.sleep(WATCH_S)
            conn = self._watched
            if (
                conn is not None
                and time.monotonic() - self._watched_at > WATCH_S
                and (self.give_up())
            ):
                with contextlib.suppress(Exception):
                    conn.cancel_safe(timeout=2)


PING_AFTER_S = 1.0
"""A pooled connection idle for longer than this is checked (one round trip) before it is lent:
a primary that died while nothing was written is noticed before the next transaction, not during
it. One that was used within the last second is lent as it is (under load, the check cost a
round trip per append); if it broke meanwhile, the append fails on it, the pool drops it and
`insert_events` retries on a new connection."""

_returned: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

RECONNECT_MAX_S = 0.5
"""The longest pause between the pool's attempts to connect again. psycopg_pool doubles it from
1 s without bound: after a minute's outage its next attempt came up to ~32 s after PostgreSQL was
back, and every statement meanwhile waited its 3 s for a connection and failed (a server that
took the lease back led ~30 s late: atk33-28 F7). A refused connection costs next to nothing."""


class _Attempt(AttemptWithBackoff):
    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, RECONNECT_MAX_S)


def _capped_backoff(pool: Any) -> None:
    """Make `pool` (eventsourcing's psycopg pool, not yet open) try to connect again at least
    every `RECONNECT_MAX_S`."""
    base = type(pool)

    class Pool(base):  # type: ignore[misc, valid-type]
        def _add_connection(self, attempt: Any, growing: bool = False) -> None:
            if attempt is None:
                attempt = _Attempt(timeout=self.reconnect_timeout)
            super()._add_connection(attempt, growing=growing)

        def _putconn(self, conn: Any, from_getconn: bool) -> None:
            # a pool with a reset hook (ours notes the time: `_note_returned`) hands every
            # returned connection to its worker thread (a queue put, a wake-up, a thread
            # switch per append, and the connection lent again only once that thread ran:
            # ~5% of the ledger worker's time under bench_pg, 2026-12-07); an idle one needs
            # no work (no rollback) and goes back here, the rest as before on that thread
            if conn.pgconn.transaction_status == TransactionStatus.IDLE:
                self._return_connection(conn, from_getconn=from_getconn)
            else:
                super()._putconn(conn, from_getconn)

    pool.__class__ = Pool


def _note_returned(conn: Any) -> None:
    _returned[conn] = time.monotonic()


def _check_if_idle(conn: Any) -> None:
    if time.monotonic() - _returned.get(conn, 0.0) > PING_AFTER_S:
        pgdeadline.lend(conn)  # its round trip is bounded as a statement is
        try:
            ConnectionPool.check_connection(conn)
        finally:
            pgdeadline.returned(conn)


def _deadlined(get_connection: Callable[[], Any]) -> Callable[[], Any]:
    """The datastore's `get_connection`, each connection watched while it is lent
    (`pgdeadline`): one whose socket the deadline shut fails in its words, one line."""

    @contextlib.contextmanager
    def lent() -> Iterator[Any]:
        held = None
        try:
            with get_connection() as conn:  # (it turns psycopg's errors into its own)
                held = conn
                pgdeadline.lend(conn)
                try:
                    yield conn
                finally:
                    pgdeadline.returned(conn)
        except (InterfaceError, OperationalError) as err:
            why = None if held is None else pgdeadline.abandoned(held)
            if why is None:
                raise
            raise OperationalError(why) from err

    return lent


def _schema_exists(con: Any, dsn: str) -> None:
    """The store's schema (`store_schema`) exists, or InvalidCommand in one line (eventsourcing
    made its tables there and failed with an internal error)."""
    from schemas.errors import InvalidCommand

    schema = store_schema()
    row = con.execute("SELECT to_regnamespace(%s) IS NOT NULL", ('"' + schema + '"',)).fetchone()
    if not (row and row[0]):
        raise InvalidCommand(
            f"the PostgreSQL store {redacted(dsn)} has no schema {schema!r} (GPULEDGER_PG_SCHEMA)",
            hint=f"create it first (CREATE SCHEMA {schema}), or unset GPULEDGER_PG_SCHEMA",
        )


class LedgerPostgresFactory(PostgresFactory):
    """eventsourcing's PostgreSQL factory configured by one DSN (`GPULEDGER_STORE_DSN`), so libpq
    multi-host lists and `target_session_attrs` work; the pool checks a connection that has been
    idle before lending it (`PING_AFTER_S`)."""

    application_recorder_class = LedgerPostgresRecorder
    aggregate_recorder_class = LedgerAggregateRecorder

    def __init__(self, env: Any) -> None:
        BaseInfrastructureFactory.__init__(self, env)  # not the POSTGRES_* settings: one DSN
        dsn = self.env.get("GPULEDGER_STORE_DSN") or ""
        params = connect_params(dsn)
        with connect(dsn) as con:  # one clear line with libpq's own cause (a wrong password,
            # nobody listening), not the pool's "couldn't get a connection" after its timeout
            _schema_exists(con, dsn)
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
            schema=store_schema(),  # the one setting every entry point reads (not `self.env`:
            # the relay's factory is given the DSN alone, and wrote `public` meanwhile)
        )
        self.datastore.dsn = dsn  # type: ignore[attr-defined]
        self.datastore.may_create = bool(self.env.get("GPULEDGER_STORE_CREATE"))  # type: ignore[attr-defined]
        # no append waits for a lock (the lease row during a takeover, a position another
        # writer holds) longer than this; eventsourcing's LOCK TABLE had it, this path has none
        lock_timeout = f"-c lock_timeout={self.datastore.lock_timeout}s"
        params["options"] = f"{params.get('options', '')} {lock_timeout}".strip()
        pool = self.datastore.pool
        pool.kwargs = {**params, "row_factory": dict_row}
        pool._check, pool._reset = _check_if_idle, _note_returned  # (not yet open)
        self.datastore.get_connection = _deadlined(self.datastore.get_connection)  # type: ignore[method-assign]
        _capped_backoff(pool)


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
