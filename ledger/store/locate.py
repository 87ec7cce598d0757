"""Where a ledger's log lives: the SQLite file in its home (the embedded default), or a
PostgreSQL store named by a DSN.

A home whose log is in PostgreSQL says so in its `store` file (the DSN, mode 0600: it may hold a
password), written by `gpuledger init --store` and `serve --store`; every command that works on the
data directory (reads, replay, audit, projection rebuild, the relay) then opens that store. The
projection, the socket and the job files stay in the home: each server keeps its own.
"""

from __future__ import annotations

import os
from pathlib import Path

from ledger.store import EVENTS_DB, STORE_FILE, recorded
from ledger.store.embedded import EmbeddedSource, StoredRows
from ledger.store.pgread import PgSource, PgStoredRows, connect_params, is_postgres, redacted
from schemas.errors import InvalidCommand


def store_of(home: Path, store: str | None = None) -> str | None:
    """The PostgreSQL DSN of the ledger in `home` (`store` when given), or None for SQLite."""
    if store is not None and store.strip() and store.strip() != "sqlite":
        if not is_postgres(store):
            raise InvalidCommand(
                f"invalid store {redacted(store)!r}",  # a key=value DSN's password too
                hint="use a PostgreSQL DSN (postgresql://USER@HOST[:PORT][,HOST2]/DB) or 'sqlite'",
            )
        connect_params(store.strip())  # a DSN libpq cannot read: one line, now
        return store.strip()
    if store is not None:
        return None
    return recorded(home)


def remember(home: Path, dsn: str | None) -> None:
    """Record in `home` where its log lives (None: its SQLite file). Refuses to point a home
    that has a SQLite log of its own at PostgreSQL (that would hide it): copy it first."""
    if dsn is None:
        return
    if (home / EVENTS_DB).exists() and recorded(home) is None:
        raise InvalidCommand(
            f"{home} holds a SQLite ledger; its log would be hidden by {redacted(dsn)}",
            hint="move it with `gpuledger store copy` and use another data directory",
        )
    if recorded(home) == dsn:
        return
    home.mkdir(parents=True, exist_ok=True)
    path = home / STORE_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(dsn + "\n")
    os.chmod(path, 0o600)


LogSource = EmbeddedSource | PgSource
"""A log read-only, wherever it lives."""


def open_source(home: Path, store: str | None = None, *, light: bool = False) -> LogSource:
    """The log of the ledger in `home`, read-only (no eventsourcing, no application). `light`:
    for a process that reads once and ends (a CLI read): a PostgreSQL store is read through
    libpq alone, without loading psycopg (`PgSource(light=True)`)."""
    dsn = store_of(home, store)
    return EmbeddedSource(home) if dsn is None else PgSource(dsn, light=light)


def stored_rows(source: LogSource) -> StoredRows | PgStoredRows:
    """The rows of `source` exactly as stored (for the audit's chain)."""
    return StoredRows(source) if isinstance(source, EmbeddedSource) else PgStoredRows(source)


def describe(home: Path, store: str | None = None) -> str:
    """Where the log is, for humans: the SQLite file, or the DSN without its password."""
    dsn = store_of(home, store)
    return str(home / EVENTS_DB) if dsn is None else redacted(dsn)
