"""The PostgreSQL store read with psycopg alone (no eventsourcing, no application), read-only:
what `ledger.store.embedded` is for the SQLite store, for reads, the projector and the audit.

With `ledger.store.postgres` (which writes the tables through eventsourcing),
`ledger.store.embedded` and the relay's raw reader, this is the only module that knows
eventsourcing's table layout (`tests/unit/test_follow.py` checks it).

A store is PostgreSQL when it is named by a libpq DSN (`postgresql://...`); positions are the
events' stream versions there as in SQLite (`ledger.store.postgres`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit
from uuid import UUID

from ledger.store import pgdeadline
from ledger.store.embedded import StoredRecord
from ledger.store.sessions import own_name
from projections.errors import SourceUnavailable
from projections.source import LogRecord, Row

SCHEMES = ("postgresql://", "postgres://")

APP_NAME = "gpuledger"
"""The application's name, eventsourcing's table prefix."""
EVENTS_TABLE = f"{APP_NAME}_events"
"""eventsourcing's PostgreSQL application recorder table: (originator_id uuid, originator_version,
topic, state bytea, notification_id); the ledger writes notification_id = originator_version."""
SNAPSHOTS_TABLE = f"{APP_NAME}_snapshots"
"""eventsourcing's PostgreSQL snapshot table (originator_id, originator_version, topic, state)."""


SCHEMA_VARIABLE = "GPULEDGER_PG_SCHEMA"
"""The one setting of the PostgreSQL schema a store's tables live in (`store_schema`)."""


def store_schema(env: Mapping[str, str] | None = None) -> str:
    """The PostgreSQL schema of the store's tables: `GPULEDGER_PG_SCHEMA`, else `public`
    (eventsourcing's default). The one place every entry point reads it (the server's append
    path, its lease, the CLI's reads, the audit, replay, the projection, the relay, `store
    copy`): before, only the server honoured it, and the CLI's reads and `audit verify` read
    `public` while the servers wrote another schema (atk48-ha, issue 28)."""
    name = str((os.environ if env is None else env).get(SCHEMA_VARIABLE) or "").strip()
    name = name or "public"
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]{0,62}", name):
        from schemas.errors import InvalidCommand

        raise InvalidCommand(
            f"{SCHEMA_VARIABLE} {name!r} is not a plain PostgreSQL name",
            hint="use letters, digits and underscores (the schema of the store's tables)",
        )
    if name != name.lower():  # `CREATE SCHEMA Led` makes `led`; the ledger names it quoted
        from schemas.errors import InvalidCommand

        raise InvalidCommand(
            f"{SCHEMA_VARIABLE} {name!r} has upper-case letters: PostgreSQL folds an unquoted "
            f"name to lower case (`CREATE SCHEMA {name}` makes {name.lower()!r}), and a quoted "
            "one is another schema (atk49 F6)",
            hint=f"use {SCHEMA_VARIABLE}={name.lower()} (a store made in a quoted upper-case "
            f'schema: ALTER SCHEMA "{name}" RENAME TO {name.lower()})',
        )
    return name


def no_ledger(path: str, schema: str) -> Exception:
    """The one line for a PostgreSQL store whose `schema` holds no ledger (`path`: redacted)."""
    from schemas.errors import InvalidCommand

    return InvalidCommand(
        f"the PostgreSQL store {path} holds no ledger in schema {schema!r}",
        hint=f"set {SCHEMA_VARIABLE} to the schema it was initialised in (or run `gpuledger "
        "init --store` first); nothing was created",
    )


def is_postgres(store: str | None) -> bool:
    """Is `store` a PostgreSQL DSN (a URL, or a key=value conninfo starting `host=`...)?"""
    if not store:
        return False
    s = store.strip()
    return s.lower().startswith(SCHEMES) or any(
        s.startswith(k + "=") for k in ("host", "dbname", "service")
    )


SECRETS = ("password", "sslpassword")
"""libpq's parameters that hold a secret: the password, the client key's pass phrase (atk49 F5:
`sslpassword` was shown in clear in errors and the server's log)."""


def redacted(dsn: str) -> str:
    """`dsn` without its password, for logs, status and errors, however libpq lets it be
    written (atk48-ha F1), and `sslpassword` alike (`SECRETS`): a URL's user info or
    `password` query item (its key percent-encoded or not, any case), a key=value conninfo's
    `password` as libpq itself parses it (spaces around `=`, a quoted value with spaces). A
    conninfo libpq cannot parse is shown by its keys only."""
    if "://" in dsn:
        try:
            parts = urlsplit(dsn)
        except ValueError:
            return re.sub(r"//[^@/]*@", "//***@", dsn).split("?")[0]
        if parts.password is not None:
            user = parts.username or ""
            netloc = f"{user}:***@" + parts.netloc.rpartition("@")[2]
            parts = parts._replace(netloc=netloc)
        query = "&".join(
            f"{q.partition('=')[0]}=***" if unquote(q.partition("=")[0]).strip().lower() in SECRETS
            else q
            for q in parts.query.split("&")
            if q
        )  # fmt: skip
        shown = urlunsplit(parts._replace(query=query))
        if not parts.netloc:  # urlunsplit drops the `//` of an empty host
            shown = shown.replace(f"{parts.scheme}:", f"{parts.scheme}://", 1)
        return shown
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        params = dict(conninfo_to_dict(dsn))
    except Exception:
        keys = re.findall(r"([A-Za-z_]+)\s*=", dsn)
        return " ".join(f"{k}=..." for k in keys) or "(a DSN that does not parse)"
    for key in SECRETS:
        if key in params:
            params[key] = "***"
    return make_conninfo("", **params)


def connect_params(dsn: str) -> dict[str, Any]:
    """The DSN as psycopg connection parameters, with the settings a ledger relies on: a connect
    timeout (a host that does not answer is skipped for the next one), TCP keepalives and a TCP
    user timeout (a server whose network is gone is noticed in seconds, not hours)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        params: dict[str, Any] = dict(conninfo_to_dict(dsn))
    except Exception as err:
        from schemas.errors import InvalidCommand

        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        for secret in re.findall(r"://[^:/@\s]*:([^@\s]+)@|password=([^\s&]+)", dsn):
            for word in (w for w in secret if w):  # libpq's words may quote the whole DSN
                why = why.replace(word, "***")
        raise InvalidCommand(
            f"invalid PostgreSQL DSN {redacted(dsn)!r}: {why}",
            hint="use postgresql://USER[:PASSWORD]@HOST[:PORT][,HOST2[:PORT2]]/DBNAME",
        ) from err
    return {**connect_defaults(), **params}


def connect_defaults() -> dict[str, str]:
    """What a ledger's connections use unless the DSN says otherwise (`connect_params`)."""
    return {
        "connect_timeout": os.environ.get("GPULEDGER_PG_CONNECT_TIMEOUT", "3"),
        "keepalives": "1",
        "keepalives_idle": "5",
        "keepalives_interval": "2",
        "keepalives_count": "2",
        "tcp_user_timeout": "5000",  # sent and never acknowledged: a cut network
        # this process's, as its lease's and start's are named (`sessions.own_name`): a
        # statement its pool left waiting for a synchronous standby after it died is cancelled
        # by the next start on this host (they were all plain `gpuledger`: atk50b-ha F3)
        "application_name": own_name("pool"),
    }


def connect(dsn: str, **extra: Any) -> Any:
    """One psycopg connection to the store (autocommit), or `SourceUnavailable` in one line.
    `options` in `extra` add to the DSN's own (its `-c search_path=...`), never replace them:
    every connection of a ledger sees the same schema (atk48-ha F3: the lease's connection
    dropped the DSN's search_path and fenced appends against another schema's lease row)."""
    import psycopg

    params = connect_params(dsn)
    if "options" in extra and params.get("options"):
        extra = {**extra, "options": f"{params['options']} {extra['options']}"}
    try:
        return psycopg.connect(**{**params, **extra}, autocommit=True)
    except psycopg.Error as err:
        raise SourceUnavailable(
            f"cannot reach the PostgreSQL store {redacted(dsn)}: {connect_error(str(err))}",
            hint="is PostgreSQL up? check the DSN (`store` in the config)",
            path=redacted(dsn),
        ) from err


UNDEFINED_TABLE = "42P01"


def _libpq_loads() -> bool:
    from ledger.store.libpq import load

    return load() is not None


MULTIPLE = "Multiple connection attempts failed. All failures were:"
"""psycopg's line before each host's own error, when a DSN of several hosts failed on each."""
_ATTEMPT = re.compile(r"^- host: '([^']*)', port: '([^']*)'(?:, hostaddr: '[^']*')?: (.*)$")
_SERVER_AT = re.compile(r'^connection failed: connection to server at "[^"]*", port \d+ failed: ')


def connect_error(text: str) -> str:
    """Pure: psycopg's connection error in one line; with several hosts (a multi-host DSN) every
    host's own cause, `HOST:PORT: cause`, in the DSN's order. psycopg's first line is the last
    host's alone: a primary that timed out was said as its standby's "session is read-only"
    (atk50b-ha F4)."""
    lines = text.strip().splitlines()
    if MULTIPLE not in lines:
        return lines[0] if lines else "connection failed"
    tried = [f"{m[1]}:{m[2]}: {_SERVER_AT.sub('', m[3])}" for line in lines
             if (m := _ATTEMPT.match(line))]  # fmt: skip
    return "each host failed: " + "; ".join(tried) if tried else lines[0]


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PgSource:
    """The PostgreSQL store of a ledger read with psycopg (one connection, autocommit, reads only):
    what `ledger.store.embedded.EmbeddedSource` is for SQLite. The projector's, the audit's,
    replay's and the reads' source. `schema`: where the tables are (default `store_schema()`,
    the servers' own).

    `light=True` (a CLI's direct read, a process that lives for one command): through libpq
    alone (`ledger.store.libpq`), without importing psycopg (~90 ms of CPU per command), when
    libpq loads; the same statements, rows and errors."""

    def __init__(self, dsn: str, schema: str | None = None, *, light: bool = False) -> None:
        self.dsn = dsn
        schema = store_schema() if schema is None else schema
        self.path = redacted(dsn)
        self._light = light and _libpq_loads()
        self.schema = schema
        self._events = f"{_ident(schema)}.{_ident(EVENTS_TABLE)}"
        self._snapshots = f"{_ident(schema)}.{_ident(SNAPSHOTS_TABLE)}"
        self._con = self._connect()

    def _connect(self) -> Any:
        if not self._light:
            return connect(self.dsn)
        from ledger.store.libpq import Connection, PqError

        try:
            return Connection(self.dsn, connect_defaults())
        except PqError as err:
            raise SourceUnavailable(
                f"cannot reach the PostgreSQL store {self.path}: {err}",
                hint="is PostgreSQL up? check the DSN (`store` in the config)",
                path=self.path,
            ) from err

    def _rows(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """The query's rows. A connection that broke (the server restarted, a standby was
        promoted) is replaced once, through the DSN's hosts; a store that does not answer is
        `SourceUnavailable`, and the next read tries a new connection again."""
        if self._light:
            return self._light_rows(query, params)
        import psycopg

        for attempt in (0, 1):
            try:
                if self._con.closed:
                    self._con = connect(self.dsn)
                pgdeadline.lend(self._con)  # bounded in a server (`pgdeadline`, atk61-ha F1)
                try:
                    with self._con.cursor() as cur:
                        cur.execute(query, params, prepare=True)
                        rows: list[tuple[Any, ...]] = cur.fetchall()
                        return rows
                finally:
                    pgdeadline.returned(self._con)
            except psycopg.errors.UndefinedTable as err:
                return self._no_table(query, err)
            except psycopg.Error as err:
                broken = isinstance(err, psycopg.OperationalError) or self._con.closed
                abandoned = pgdeadline.abandoned(self._con)
                if broken:
                    self._con.close()
                    if attempt == 0 and abandoned is None:
                        continue
                raise SourceUnavailable(
                    f"cannot read the PostgreSQL store {self.path}: "
                    f"{abandoned or _first_line(err)}",
                    path=self.path,
                ) from err
        raise AssertionError("unreachable")

    def _light_rows(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """`_rows` through libpq: the same retry, the same errors."""
        from ledger.store.libpq import PqError

        for attempt in (0, 1):
            try:
                if self._con.closed:
                    self._con = self._connect()
                rows: list[tuple[Any, ...]] = self._con.rows(query, params)
                return rows
            except PqError as err:
                if err.sqlstate == UNDEFINED_TABLE:
                    return self._no_table(query, err)
                if err.broken:
                    self._con.close()
                    if attempt == 0:
                        continue
                raise SourceUnavailable(
                    f"cannot read the PostgreSQL store {self.path}: {_first_line(err)}",
                    path=self.path,
                ) from err
        raise AssertionError("unreachable")

    def _no_table(self, query: str, err: BaseException) -> list[tuple[Any, ...]]:
        """No snapshots table: no snapshots. No events table: no ledger in this schema, said
        in one line (a read run without GPULEDGER_PG_SCHEMA, the ledger in another schema,
        read an empty log: "chain intact over 0 events", an empty job list: atk49 F3)."""
        if self._events not in query:
            return []
        raise no_ledger(self.path, self.schema) from err

    def read(self, after: int, limit: int) -> list[LogRecord]:
        return [LogRecord(p, t, d) for p, t, d in self.read_rows(after, limit)]

    def read_rows(self, after: int, limit: int) -> list[Row]:
        rows = self._rows(
            f"SELECT notification_id, topic, state FROM {self._events} "
            "WHERE notification_id > %s ORDER BY notification_id LIMIT %s",
            (after, limit),
        )
        return [(p, t, bytes(d)) for p, t, d in rows]

    def read_tagged(self, after: int, limit: int, tags: Sequence[str]) -> list[LogRecord]:
        rows = self._rows(
            f"SELECT notification_id, topic, state FROM {self._events} "
            "WHERE notification_id > %s AND topic = ANY(%s) ORDER BY notification_id LIMIT %s",
            (after, list(tags), limit),
        )
        return [LogRecord(p, t, bytes(d)) for p, t, d in rows]

    def read_stored(self, after: int, limit: int) -> list[tuple[int, str, bytes, int, str]]:
        """Rows as stored: (position, tag, state, stream version, originator id)."""
        rows = self._rows(
            "SELECT notification_id, topic, state, originator_version, originator_id::text "
            f"FROM {self._events} WHERE notification_id > %s ORDER BY notification_id LIMIT %s",
            (after, limit),
        )
        return [(p, t, bytes(d), v, o) for p, t, d, v, o in rows]

    def head(self) -> int:
        rows = self._rows(f"SELECT max(notification_id) FROM {self._events}", ())
        return int(rows[0][0] or 0) if rows else 0

    def snapshots(self, stream: str, limit: int) -> list[bytes]:
        rows = self._rows(
            f"SELECT state FROM {self._snapshots} WHERE originator_id = %s "
            "ORDER BY originator_version DESC LIMIT %s",
            (stream, limit),
        )
        return [bytes(state) for (state,) in rows]

    def snapshot_rows(self, stream: str, limit: int) -> list[tuple[int, bytes]]:
        """(position, stored bytes) of the newest `limit` snapshots of `stream`, newest first."""
        rows = self._rows(
            f"SELECT originator_version, state FROM {self._snapshots} "
            "WHERE originator_id = %s ORDER BY originator_version DESC LIMIT %s",
            (stream, limit),
        )
        return [(int(v), bytes(state)) for v, state in rows]

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> PgSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PgStoredRows:
    """The PostgreSQL store's rows with their stream version, for `follow` (the audit's chain):
    what `ledger.store.embedded.StoredRows` is for SQLite (a bytea column holds only bytes)."""

    def __init__(self, source: PgSource) -> None:
        self.source = source

    def read(self, after: int, limit: int) -> list[StoredRecord]:
        return [
            StoredRecord(p, t, d, v, "blob", UUID(o).hex)
            for p, t, d, v, o in self.source.read_stored(after, limit)
        ]

    def head(self) -> int:
        return self.source.head()

    def snapshots(self, stream: str, limit: int) -> list[bytes]:
        return self.source.snapshots(stream, limit)
