"""The embedded store's tables, read with sqlite3, read-only: the log and the snapshots.

With `ledger.store.application` (which writes them through eventsourcing) and the relay's raw
reader (`ledger.store.relay`), this is the only module that knows eventsourcing's SQLite table
layout (`tests/unit/test_follow.py` checks it). It loads neither eventsourcing nor the
application, so a read command opens the log in a few milliseconds:

- `EmbeddedSource(home)`: the log of a ledger home as a `projections.source.EventSource` (the
  projector's, the service's, replay's, the simulation's and what-if's source), with the
  snapshots for `ledger.store.live`;
- `StoredRows`: the log's rows exactly as stored (stream version and SQLite type too), for the
  audit's hash chain;
- `project(home)`, `rebuild(home)`: bring a home's projection up to its log, or rebuild it.
"""

from __future__ import annotations

import gc
import sqlite3
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ledger.store import EVENTS_DB
from projections.errors import SourceUnavailable
from projections.source import LogRecord, Row

if TYPE_CHECKING:  # a read of the log alone loads neither DuckDB nor Arrow
    from projections.projector import CatchUp, Progress


EVENTS_TABLE = "stored_events"
"""eventsourcing's SQLite application recorder table: (originator_id, originator_version, topic,
state); the notification id is the table's rowid. `topic` holds the event tag, `state` the
msgspec JSON bytes."""


SNAPSHOTS_TABLE = "stored_snapshots"
"""eventsourcing's SQLite snapshot table (originator_id, originator_version, topic, state): the
ledger's snapshots of its folded state, one row per snapshot, version = its log position."""


_RECORD = partial(tuple.__new__, LogRecord)
"""A row (position, tag, data) as a LogRecord, without a Python-level call per row."""


class EmbeddedSource:
    """The eventsourcing SQLite store of a ledger home, opened read-only.

    Reads `SELECT rowid, topic, state FROM stored_events WHERE rowid > ? ORDER BY rowid LIMIT ?`,
    the same query eventsourcing's `select_notifications` runs, without building its objects.
    """

    def __init__(self, home: Path | str) -> None:
        self.path = Path(home) / EVENTS_DB
        if not self.path.exists():
            raise SourceUnavailable(
                f"no event log at {self.path}",
                hint="initialise the ledger first (`gpuledger init`) or check GPULEDGER_HOME",
                path=str(self.path),
            )
        try:
            # check_same_thread off: the projector reads from its reader thread (one at a time).
            self._con = sqlite3.connect(
                f"file:{self.path}?mode=ro", uri=True, timeout=30, check_same_thread=False
            )
            self._con.execute("PRAGMA query_only = ON")
        except sqlite3.Error as err:
            raise SourceUnavailable(
                f"cannot open the event log {self.path}: {err}", path=str(self.path)
            ) from err

    def read(self, after: int, limit: int) -> list[LogRecord]:
        return list(map(_RECORD, self.read_rows(after, limit)))

    def read_rows(self, after: int, limit: int) -> list[Row]:
        """What `read` returns, as the plain (position, tag, data) tuples SQLite hands out: the
        projector's reader takes columns from them, so it skips making a LogRecord per row
        (a quarter of the read)."""
        # The collector is paused: a page creates four objects per row and no cycles.
        was = gc.isenabled()
        gc.disable()
        try:
            rows: list[Row] = self._con.execute(
                f"SELECT rowid, topic, state FROM {EVENTS_TABLE} "
                "WHERE rowid > ? ORDER BY rowid LIMIT ?",
                (after, limit),
            ).fetchall()
            return rows
        except sqlite3.OperationalError as err:
            if "no such table" in str(err):
                return []  # a ledger that has not recorded anything yet
            raise SourceUnavailable(f"cannot read {self.path}: {err}", path=str(self.path)) from err
        finally:
            if was:
                gc.enable()

    def read_tagged(self, after: int, limit: int, tags: Sequence[str]) -> list[LogRecord]:
        """Up to `limit` records with position > `after` and one of `tags` (a scan of one
        column: the other records are never read)."""
        marks = ", ".join("?" * len(tags))
        try:
            rows = self._con.execute(
                f"SELECT rowid, topic, state FROM {EVENTS_TABLE} "
                f"WHERE rowid > ? AND topic IN ({marks}) ORDER BY rowid LIMIT ?",
                (after, *tags, limit),
            ).fetchall()
        except sqlite3.OperationalError as err:
            if "no such table" in str(err):
                return []
            raise SourceUnavailable(f"cannot read {self.path}: {err}", path=str(self.path)) from err
        return list(map(_RECORD, rows))

    def head(self) -> int:
        try:
            row = self._con.execute(f"SELECT max(rowid) FROM {EVENTS_TABLE}").fetchone()
        except sqlite3.OperationalError as err:
            if "no such table" in str(err):
                return 0
            raise SourceUnavailable(f"cannot read {self.path}: {err}", path=str(self.path)) from err
        return int(row[0] or 0)

    def snapshots(self, stream: str, limit: int) -> list[bytes]:
        """The stored bytes of the newest `limit` snapshots of `stream` (its originator id),
        newest first; none when the store has stored no snapshot yet."""
        try:
            rows = self._con.execute(
                f"SELECT state FROM {SNAPSHOTS_TABLE} WHERE originator_id = ? "
                "ORDER BY originator_version DESC LIMIT ?",
                (stream, limit),
            ).fetchall()
        except sqlite3.OperationalError as err:
            if "no such table" in str(err):
                return []
            raise SourceUnavailable(f"cannot read {self.path}: {err}", path=str(self.path)) from err
        return [bytes(state) for (state,) in rows]

    def snapshot_rows(self, stream: str, limit: int) -> list[tuple[int, bytes]]:
        """(position, stored bytes) of the newest `limit` snapshots of `stream`, newest first."""
        try:
            rows = self._con.execute(
                f"SELECT originator_version, state FROM {SNAPSHOTS_TABLE} WHERE originator_id = ? "
                "ORDER BY originator_version DESC LIMIT ?",
                (stream, limit),
            ).fetchall()
        except sqlite3.OperationalError as err:
            if "no such table" in str(err):
                return []
            raise SourceUnavailable(f"cannot read {self.path}: {err}", path=str(self.path)) from err
        return [(int(v), bytes(state)) for v, state in rows]

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> EmbeddedSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StoredRecord(NamedTuple):
    """A stored row exactly as the store holds it (what an audit of the store checks)."""

    position: int
    tag: str
    """The stored tag as SQLite returns it (the ledger writes text; an edited row may hold
    another type)."""
    data: object
    """The stored value as SQLite returns it (the ledger writes bytes)."""
    version: object
    """The stream version column (position and version move together in a one-stream log)."""
    stored_as: str
    """SQLite's type of the value: `blob` for everything the ledger wrote."""
    stream: object
    """The stream id column (the ledger's one stream)."""


class StoredRows:
    """The embedded store's rows with every column (stream id and version, stored type), for
    `follow`."""

    def __init__(self, source: EmbeddedSource) -> None:
        self.source = source

    def read(self, after: int, limit: int) -> list[StoredRecord]:
        try:
            rows = self.source._con.execute(
                f"SELECT rowid, topic, state, originator_version, typeof(state), originator_id "
                f"FROM {EVENTS_TABLE} WHERE rowid > ? ORDER BY rowid LIMIT ?",
                (after, limit),
            ).fetchall()
        except sqlite3.OperationalError as err:
            if "no such table" in str(err):
                return []
            raise SourceUnavailable(
                f"cannot read {self.source.path}: {err}", path=str(self.source.path)
            ) from err
        return [StoredRecord(*row) for row in rows]

    def head(self) -> int:
        return self.source.head()

    def snapshots(self, stream: str, limit: int) -> list[bytes]:
        return self.source.snapshots(stream, limit)


def project(
    home: Path | str,
    *,
    until: int | None = None,
    progress: Progress | None = None,
    batch_size: int | None = None,
) -> CatchUp:
    """Bring `<home>/projections/ledger.duckdb` up to the log of `home` (`batch_size`: events
    per transaction at most, default `store.DEFAULT_BATCH`)."""
    from ledger.store.locate import open_source  # (locate imports this module)
    from projections.projector import Projector
    from projections.store import DEFAULT_BATCH, Store

    with open_source(Path(home)) as source, Store.open(home) as store:
        return Projector(store, source, batch_size=batch_size or DEFAULT_BATCH).catch_up(
            until=until, progress=progress
        )


def rebuild(
    home: Path | str,
    *,
    progress: Progress | None = None,
    until: int | None = None,
    batch_size: int | None = None,
) -> CatchUp:
    """Drop the projection of `home` and rebuild it from its log (`projector.rebuild`), wherever
    the log is (its SQLite file, or the PostgreSQL store its `store` file names: before, a
    PostgreSQL home's rebuild looked for a SQLite file and failed)."""
    from ledger.store.locate import open_source  # (locate imports this module)
    from projections import projector
    from projections.store import DEFAULT_BATCH

    batch = batch_size or DEFAULT_BATCH
    with open_source(Path(home)) as source:
        return projector.rebuild(home, source, progress=progress, until=until, batch_size=batch)
