"""Moving a ledger between stores, and rebuilding one from the Kafka topic.

`gpuledger store copy SRC DST` (SQLite <-> PostgreSQL, either way) and `gpuledger store restore
--from-kafka` write a log into an empty store exactly as it was: each event's bytes, tag, stream
and position untouched, so the copy is the original byte for byte (its audit, its Kafka topic
and every replay agree with the original's). On the way every record is checked: positions
without gaps from 1, each event linked to the one before by the hash chain (a broken link stops
the copy before anything past it is written). A restore reads the topic through the same
`projections.kafka_source.KafkaSource` every reader uses, so a record that is not the relay's
(foreign, unsigned when keys are set) is refused as it is everywhere else.

The events go in pages, one transaction each; the snapshots of the source (when it has some)
follow, so the copy starts as fast as the original.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eventsourcing.persistence import StoredEvent

from ledger.store import snapshots
from projections.chain import START, broken_link
from projections.source import LogRecord
from schemas.errors import LedgerError

PAGE = 5_000


class CopyError(LedgerError):
    """A log cannot be copied: the destination is not empty, or the source's chain breaks."""

    code = "copy"


@dataclass(frozen=True)
class Copied:
    events: int
    head: int
    last_hash: str
    """The link to the last event copied (`projections.chain`, the current rule): the same in
    both stores."""
    snapshots: int = 0


def write_log(
    pages: Iterable[Sequence[LogRecord]],
    home: Path,
    store: str | None,
    *,
    snapshot_rows: Sequence[tuple[int, bytes]] = (),
    progress: Callable[[int], None] | None = None,
    resume: str = "",
) -> Copied:
    """Write the log `pages` hold into the empty store of `home` (`store`: a PostgreSQL DSN, or
    None / "sqlite" for the SQLite file in `home`), checking positions and the chain as it goes;
    then the snapshots (position, bytes) whose position it holds. `resume` (what to run again,
    for the refusal): a store that already holds the start of that log, byte for byte (an
    earlier run killed while it wrote: the events go in pages, one transaction each), gets the
    rest; any other store that is not empty is refused, naming what it holds."""
    from ledger.store.creating import NewLedger

    ledger = NewLedger(home, store=store or "sqlite")
    try:
        held = ledger.head()
        if held and not resume:
            raise CopyError(
                f"the destination already holds {held} events",
                hint="copy into an empty store (a new database or data directory)",
            )
        mine = _Held(ledger.recorder, held, resume)
        from ledger.store import relay_progress

        # the relay's progress table before the events: a copy or restore killed after its
        # write left every event and no table, which a relay took for a dropped one (atk50-25
        # F7); empty, it says no relay published anywhere yet (the caller keeps the rows)
        relay_progress.begin(ledger.recorder)
        position, tip = 0, START
        for page in pages:
            stored = []
            for rec in page:
                if rec.position != position + 1:
                    raise CopyError(
                        f"the source jumps from position {position} to {rec.position}",
                        hint="the source is not a whole log",
                    )
                why = broken_link(rec.data, tip)
                if why is not None:
                    raise CopyError(f"position {rec.position}: {why}", hint="audit the source")
                stored.append(
                    StoredEvent(
                        originator_id=snapshots.STREAM_ID,
                        originator_version=rec.position,
                        topic=rec.tag,
                        state=bytes(rec.data),
                    )
                )
                position, tip = rec.position, tip.after(rec.position, rec.tag, rec.data)
                if position <= held:  # written by the run before: the same bytes, or refused
                    mine.same(rec)
                    stored.pop()
            if stored:
                ledger.recorder.insert_events(stored)
                if progress is not None:
                    progress(position)
        mine.ended(position)
        kept = [
            StoredEvent(
                originator_id=snapshots.STREAM_ID,
                originator_version=at,
                topic=snapshots.SNAPSHOT_TOPIC,
                state=data,
            )
            for at, data in snapshot_rows
            if at <= position
        ]
        if kept:
            assert ledger.snapshots is not None
            ledger.snapshots.recorder.insert_events(
                sorted(kept, key=lambda s: s.originator_version)
            )
        return Copied(events=position, head=position, last_hash=tip.current, snapshots=len(kept))
    finally:
        ledger.close()


class _Held:
    """The events a store held before a resumed restore (`write_log(resume=...)`), compared
    with the log's as they come: any difference refuses the run before it writes."""

    def __init__(self, recorder: Any, head: int, again: str) -> None:
        self.recorder, self.head, self.again = recorder, head, again
        self.page: deque[Any] = deque()

    def same(self, rec: LogRecord) -> None:
        from ledger.store.relay import read_raw

        if not self.page:
            self.page.extend(read_raw(self.recorder, rec.position - 1, PAGE))
        got = self.page.popleft() if self.page else None
        mine = None if got is None else (got.position, got.tag, bytes(got.data))
        if mine != (rec.position, rec.tag, bytes(rec.data)):
            self.refuse(f"its event at position {rec.position} is not the log's")

    def ended(self, position: int) -> None:
        if position < self.head:
            self.refuse(f"the log ends at position {position}")

    def refuse(self, why: str) -> None:
        raise CopyError(
            f"the destination already holds {self.head:,} events and {why}: it is not a "
            "restore of this log stopped half-way; nothing was written",
            hint=f"{self.again} into an empty store (move its events.sqlite away, or drop "
            "its PostgreSQL schema), or restore into a new data directory",
        )


def same_log(a: Iterable[Sequence[LogRecord]], b: Iterable[Sequence[LogRecord]]) -> int | None:
    """The first position where two logs differ (tag or bytes), or None when they are equal."""
    left = (r for page in a for r in page)
    right = (r for page in b for r in page)
    n = 0
    while True:
        x, y = next(left, None), next(right, None)
        if x is None and y is None:
            return None
        n += 1
        if (
            x is None
            or y is None
            or (x.position, x.tag, bytes(x.data))
            != (
                y.position,
                y.tag,
                bytes(y.data),
            )
        ):
            return n
