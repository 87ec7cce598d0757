"""How the ledger's events are stored by eventsourcing: the mapper (an event Struct to a stored
event: its tag and canonical JSON), the transcoder that leaves those bytes alone, the SQLite
factory with the durability setting, and the store's notifications as log records
(`StoreSource`). The PostgreSQL factory is `ledger.store.postgres`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.persistence import Mapper, StoredEvent, Transcoder
from eventsourcing.sqlite import SQLiteConnection, SQLiteConnectionPool, SQLiteFactory

from projections.source import LogRecord
from schemas import codec
from schemas.errors import InvalidCommand
from schemas.events import AnyEvent, tag_of


@dataclass(frozen=True)
class Recorded:
    """An event in its place in the stream (the eventsourcing domain-event protocol)."""

    originator_id: UUID
    originator_version: int
    event: AnyEvent


class PassThroughTranscoder(Transcoder):
    """The mapper encodes with msgspec itself; bytes go through untouched."""

    def encode(self, obj: Any) -> bytes:
        assert isinstance(obj, bytes)
        return obj

    def decode(self, data: bytes) -> Any:
        return data


class StructMapper(Mapper[UUID]):
    """Maps msgspec event Structs to stored events: topic = event tag, state = canonical JSON."""

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        assert isinstance(domain_event, Recorded)
        return StoredEvent(
            originator_id=domain_event.originator_id,
            originator_version=domain_event.originator_version,
            topic=tag_of(type(domain_event.event)),
            state=codec.encode(domain_event.event),
        )

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        oid = stored_event.originator_id
        return Recorded(
            originator_id=oid if isinstance(oid, UUID) else UUID(oid),
            originator_version=stored_event.originator_version,
            event=codec.decode(stored_event.state),
        )


class _DurabilityPool(SQLiteConnectionPool):
    """eventsourcing's pool, plus the `synchronous` pragma on every connection it opens."""

    def __init__(self, *, synchronous: str, **kwargs: Any) -> None:
        self.synchronous = synchronous
        super().__init__(**kwargs)

    def _create_connection(self) -> SQLiteConnection:
        conn = super()._create_connection()
        conn._sqlite_conn.execute(f"PRAGMA synchronous={self.synchronous}")
        return conn


class LedgerSQLiteFactory(SQLiteFactory):
    """eventsourcing's SQLite factory with a durability setting (GPULEDGER_DURABILITY):

    - `normal` (default): WAL with synchronous=NORMAL, SQLite's recommended WAL setting. Durable
      against process crashes; a power loss or OS crash may roll back the last transactions
      (never corrupt the store). The Kafka broker's default (no fsync per write) makes the
      same trade.
    - `full`: fsync on every commit; durable against power loss, at the disk's fsync rate.
    """

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        mode = (self.env.get("GPULEDGER_DURABILITY") or "normal").lower()
        if mode not in ("normal", "full"):
            raise InvalidCommand(
                f"invalid GPULEDGER_DURABILITY {mode!r}", hint="use 'normal' or 'full'"
            )
        old = self.datastore.pool
        self.datastore.pool = _DurabilityPool(
            synchronous=mode.upper(), db_name=old.db_name, lock_timeout=old.lock_timeout
        )
        old.close()


class StoreSource:
    """The store's notifications as log records: what `projections.source.follow` walks. The
    one place that reads eventsourcing's notification log (the relay reads raw bytes)."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

    def read(self, after: int, limit: int) -> list[LogRecord]:
        return [
            LogRecord(n.id, n.topic, n.state)
            for n in self.recorder.select_notifications(start=after + 1, limit=limit)
        ]

    def read_tagged(self, after: int, limit: int, tags: Sequence[str]) -> list[LogRecord]:
        return [
            LogRecord(n.id, n.topic, n.state)
            for n in self.recorder.select_notifications(
                start=after + 1, limit=limit, topics=list(tags)
            )
        ]

    def head(self) -> int:
        return int(self.recorder.max_notification_id() or 0)


def _private(path: Path) -> None:
    """Create the store's file readable by its owner only (0600) when it does not exist yet:
    it holds every job's command and secrets (docs/security.md, row T13). SQLite gives its
    -wal and -shm files the database file's mode. An existing file keeps its mode."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
