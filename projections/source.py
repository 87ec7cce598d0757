"""Where a projector reads events from: the `EventSource` protocol and the one way to walk a log.

A source hands out *log records*: the log position, the event tag and the raw bytes, in log order.
The projector decodes the bytes itself (so a corrupt record can be named by its position). The
sources: the ledger's own store read-only (`ledger.store.embedded.EmbeddedSource`, the only
reader of eventsourcing's tables besides the store itself), the relay's Kafka topic
(`projections.kafka_source.KafkaSource`), and in-memory lists (`ListSource`). `follow` walks any
of them, and anything else that reads pages of records, by position and by tag.

This module never imports `ledger`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple, Protocol, TypeVar


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


class EventSource(Protocol):
    """An ordered event log a projector reads (the embedded store, or Kafka: `kafka_source.py`)."""

    def read(self, after: int, limit: int) -> list[LogRecord]:
        """Up to `limit` records with position > `after`, in position order."""
        ...

    def head(self) -> int:
        """The position of the last record in the log (0 when empty)."""
        ...

    def close(self) -> None: ...


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
