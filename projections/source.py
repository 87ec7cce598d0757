"""Where a projector reads events from: a small interface and the embedded notification log.

A source hands out *log records*: the log position, the event tag and the raw bytes, in log order.
The projector decodes the bytes itself (so a corrupt record can be named by its position). The
embedded source reads the eventsourcing SQLite store `<home>/events.sqlite` read-only; a Kafka
source will implement the same `EventSource` protocol (position = the notification id each record
carries, tag = its key or header, data = its value).

This module never imports `ledger`: it reads the store through its documented table.
"""

from __future__ import annotations

import gc
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar

from projections.errors import SourceUnavailable

EVENTS_DB = "events.sqlite"
"""The embedded event log inside a ledger home (the eventsourcing SQLite store)."""

EVENTS_TABLE = "stored_events"
"""eventsourcing's SQLite application recorder table: (originator_id, originator_version, topic,
state); the notification id is the table's rowid. `topic` holds the event tag, `state` the
msgspec JSON bytes."""


SNAPSHOTS_TABLE = "stored_snapshots"
"""eventsourcing's SQLite snapshot table (originator_id, originator_version, topic, state): the
ledger's snapshots of its folded state, one row per snapshot, version = its log position."""


class LogRecord(NamedTuple):
    """One event as the log stores it."""

    position: int
    """Offset in the event log (the eventsourcing notification id, 1-based)."""
    tag: str
    """The event tag, e.g. `job.started.v1`."""
    data: bytes
    """The event's JSON bytes."""


Row = tuple[int, str, bytes]
"""A record as a plain tuple (position, tag, data): what a `LogRecord` is without its names."""

_RECORD = partial(tuple.__new__, LogRecord)
"""A row (position, tag, data) as a LogRecord, without a Python-level call per row."""


class EventSource(Protocol):
    """An ordered event log a projector reads (the embedded store, or Kafka: `kafka_source.py`)."""

    def read(self, after: int, limit: int) -> list[LogRecord]:
        """Up to `limit` records with position > `after`, in position order."""
        ...

    def head(self) -> int:
        """The position of the last record in the log (0 when empty)."""
        ...

    def close(self) -> None: ...


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

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> EmbeddedSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


FOLLOW_PAGE = 131_072


class Positioned(Protocol):
    """What the follower needs of a record: its log position and its event tag."""

    @property
    def position(self) -> int: ...

    @property
    def tag(self) -> str: ...


R = TypeVar("R", bound=Positioned, covariant=True)


class Pages(Protocol[R]):
    """Anything that hands out a log's records in pages: an `EventSource`, the store's own
    recorder (`ledger.store.application`), the relay's raw reader, the audit's stored rows."""

    def read(self, after: int, limit: int) -> Sequence[R]:
        """Up to `limit` records with position > `after`, in position order."""
        ...

    def head(self) -> int:
        """The position of the last record in the log (0 when empty)."""
        ...


def follow(
    source: Pages[R],
    after: int = 0,
    until: int | None = None,
    *,
    tags: Sequence[str] | None = None,
    page: int = FOLLOW_PAGE,
) -> Iterator[list[R]]:
    """The one way to walk a log: pages of records with `after` < position <= `until` (default:
    the head when the walk starts), in order; with `tags`, only records of those tags (read by
    tag where the source can, else filtered)."""
    stop = source.head() if until is None else until
    tagged = getattr(source, "read_tagged", None) if tags is not None else None
    wanted = frozenset(tags) if tags is not None else None
    position = after
    while position < stop:
        if tagged is not None:
            got: Sequence[R] = tagged(position, page, tags)
            records = [r for r in got if r.position <= stop]
        else:
            records = list(source.read(position, min(page, stop - position)))
        if not records:
            return
        position = records[-1].position
        if wanted is not None and tagged is None:
            records = [r for r in records if r.tag in wanted]
        if records:
            yield records
        if tagged is not None and len(got) < page:
            return


class StoredRecord(NamedTuple):
    """A stored row exactly as the store holds it (what an audit of the store checks)."""

    position: int
    tag: str
    data: object
    """The stored value as SQLite returns it (the ledger writes bytes)."""
    version: object
    """The stream version column (position and version move together in a one-stream log)."""
    stored_as: str
    """SQLite's type of the value: `blob` for everything the ledger wrote."""


class StoredRows:
    """The embedded store's rows with their stream version and stored type, for `follow`."""

    def __init__(self, source: EmbeddedSource) -> None:
        self.source = source

    def read(self, after: int, limit: int) -> list[StoredRecord]:
        try:
            rows = self.source._con.execute(
                f"SELECT rowid, topic, state, originator_version, typeof(state) "
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


class ListSource:
    """An in-memory log (tests, replays of a slice): records given in position order."""

    def __init__(self, records: list[LogRecord]) -> None:
        self.records = records

    def read(self, after: int, limit: int) -> list[LogRecord]:
        out = [r for r in self.records if r.position > after]
        return out[:limit]

    def read_tagged(self, after: int, limit: int, tags: Sequence[str]) -> list[LogRecord]:
        return [r for r in self.records if r.position > after and r.tag in tags][:limit]

    def head(self) -> int:
        return self.records[-1].position if self.records else 0

    def close(self) -> None:
        pass


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (reference counting still frees everything)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
