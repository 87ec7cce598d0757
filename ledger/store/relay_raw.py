"""The event store's records as the relay publishes them: bytes untouched, never decoded
(`read_raw`), and the store's recorder opened for readers that need bytes, not folded state
(`open_store`). Split from `relay.py` along this seam (the relay, its progress and `audit`/`store`
commands read the store this way).

An edge (the store)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from eventsourcing.persistence import ApplicationRecorder, InfrastructureFactory
from eventsourcing.sqlite import SQLiteApplicationRecorder

from ledger.store import EVENTS_DB, recorded
from ledger.store.relay_topic import RelayError, batch_bytes
from projections.kafka_wire import RECORD_OVERHEAD, SigningKeys, record_headers


class RawRecord(NamedTuple):
    """One stored event as the relay publishes it: bytes untouched, never decoded.

    A NamedTuple: the relay builds one per event, and a frozen dataclass costs twice as much."""

    position: int
    tag: str
    data: bytes
    key: bytes


def too_large(r: RawRecord, limit: int, keys: SigningKeys | None) -> bool:
    """Whether the record of `r` alone passes a topic's `limit` (`max.message.bytes`; its exact
    size is asked only of events near it: its headers are signed)."""
    if len(r.data) <= limit - RECORD_OVERHEAD:
        return False
    return batch_bytes(r.key, r.data, record_headers(r.position, r.tag, r.data, keys)) > limit


def open_store(home: Path, store: str | None = None) -> ApplicationRecorder:
    """The event store's recorder, for readers that need bytes, not folded state (the SQLite
    file of `home`, or the PostgreSQL store it records: `ledger.store.locate`; `store`: that
    PostgreSQL DSN instead)."""
    dsn = store or recorded(home)
    if dsn is not None:
        from eventsourcing.utils import Environment

        env = Environment("gpuledger", {
            "PERSISTENCE_MODULE": "ledger.store.postgres:LedgerPostgresFactory",
            "GPULEDGER_STORE_DSN": dsn,
        })  # fmt: skip
        return InfrastructureFactory.construct(env).application_recorder()
    db = home / EVENTS_DB
    if not db.exists():
        raise RelayError(f"no event store at {db}", hint="run `gpuledger init` first")
    factory = InfrastructureFactory.construct(
        {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(db)}
    )
    return factory.application_recorder()


class RawSource:
    """The store's records as the relay publishes them, for `projections.source.follow`."""

    def __init__(self, recorder: ApplicationRecorder) -> None:
        self.recorder = recorder

    def read(self, after: int, limit: int) -> list[RawRecord]:
        return read_raw(self.recorder, after, limit)

    def head(self) -> int:
        return int(self.recorder.max_notification_id() or 0)


def read_raw(recorder: ApplicationRecorder, after: int, limit: int) -> list[RawRecord]:
    """Up to `limit` stored events after position `after`, in log order."""
    if isinstance(recorder, SQLiteApplicationRecorder):
        return _read_raw_sqlite(recorder, after, limit)
    return [
        RawRecord(n.id, n.topic, n.state, str(n.originator_id).encode())
        for n in recorder.select_notifications(start=after + 1, limit=limit)
    ]


def _read_raw_sqlite(
    recorder: SQLiteApplicationRecorder, after: int, limit: int
) -> list[RawRecord]:
    """`select_notifications` without a UUID object per row, which took a fifth of the relay's
    time: the log is one stream, so its id is converted once per call."""
    keys: dict[str, bytes] = {}
    out = []
    with recorder.datastore.transaction(commit=False) as cursor:
        cursor.execute(
            f"SELECT rowid, originator_id, topic, state FROM {recorder.events_table_name} "
            "WHERE rowid>? ORDER BY rowid LIMIT ?",
            (after, limit),
        )
        rows = cursor.fetchall()
    for position, originator_id, topic, state in rows:
        key = keys.get(originator_id)
        if key is None:
            key = keys[originator_id] = str(recorder.convert_originator_id(originator_id)).encode()
        if not isinstance(state, bytes):  # a hand-edited row (`audit verify` names it)
            state = _as_bytes(state)
        out.append(RawRecord(position, topic, state, key))
    return out


def _as_bytes(value: object) -> bytes:
    """A stored value as the bytes `audit verify` reads in it: a row rewritten as TEXT (the
    same bytes) stopped the relay for good with a TypeError from the Kafka client, nothing of
    the batch published (atk49-25 F5); `audit verify` names the row as stored as text."""
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    return b"" if value is None else str(value).encode()
