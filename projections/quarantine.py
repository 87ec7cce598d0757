"""Poison records: name them where they sit, or set them aside in `dead_letters` and go on.

A *poison record* is one the projector cannot apply: bytes that are not JSON, a known tag whose
fields do not validate (`CorruptEvent`, found while a batch decodes), or, on a Kafka topic, a
record without a readable, increasing position header, tag header or value (`PoisonRecord`,
found by the source). An unknown tag whose bytes are a JSON object is not poison: it is kept.

- **By default** the projector stops right before the first poison record; the error names it by
  log position and, for a source that can say where a record sits (`Locates`, e.g. Kafka), by
  topic, partition and offset. Nothing after it is applied; a rerun stops at the same place.
- **In quarantine mode** (`Projector(..., quarantine=True)`, `gpuledger project follow
  --quarantine`) each poison record becomes a row of `dead_letters`, written in the same
  transaction as the rest of its batch; the tracking position moves past it (when it has one)
  and the projector goes on. Only poison is set aside, and every poison record is recorded:
  nothing else is ever skipped. Recording is idempotent (a record met again after a restart is
  not recorded twice).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import duckdb
import pyarrow as pa

from projections.batch import SCHEMAS, Batch, build_batch, decode_records, empty_tables
from projections.chain import link
from projections.errors import CorruptEvent, PoisonRecord
from projections.source import EventSource, LogRecord
from projections.store import PROJECTION, scalar

log = logging.getLogger("gpuledger.quarantine")


class Where(NamedTuple):
    """Where a record sits in a Kafka topic."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"topic {self.topic}, partition {self.partition}, offset {self.offset}"


@runtime_checkable
class Locates(Protocol):
    """A source that can say where the records of its last page sit (Kafka)."""

    def where(self, position: int) -> Where | None:
        """Where the record at `position` of the last page read sits (None: unknown)."""
        ...


@runtime_checkable
class Skips(Protocol):
    """A source that raises `PoisonRecord` for records it cannot hand out, and can step past
    one once the caller has recorded it."""

    def skip(self, poison: PoisonRecord) -> None:
        """Step past the poison record the last `read` raised."""
        ...


class DeadLetter(NamedTuple):
    """One poison record as `dead_letters` keeps it."""

    topic: str | None
    kafka_partition: int | None
    kafka_offset: int | None
    position: int | None
    """The log position it carried (None: no readable one)."""
    tag: str | None
    reason: str
    data: bytes | None

    def text(self) -> str:
        """One line naming the record (where it sits, the position it carried) and why."""
        where = (
            ""
            if self.topic is None
            else f"{Where(self.topic, self.kafka_partition or 0, self.kafka_offset or 0)}, "
        )
        at = "" if self.position is None else f"log position {self.position}: "
        return f"{where}{at}{self.reason}"


DEAD_LETTERS = pa.schema(
    [
        ("topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("position", pa.int64()),
        ("tag", pa.string()),
        ("reason", pa.string()),
        ("data", pa.binary()),
    ]
)


@dataclass(frozen=True)
class QuarantineBatch(Batch):
    """A batch with the poison records met while reading it. `first`/`last` span every record
    read (poison included), so the tracking position moves past poison that has a position;
    `events`/`tables` hold the valid records only."""

    dead: tuple[DeadLetter, ...] = ()


# --- naming a poison record (default mode) --------------------------------------------------------

KAFKA_HINT = (
    "the topic is damaged at that offset; the projector stops there and skips nothing: fix or "
    "remove the producer that wrote it, or run `gpuledger project follow --quarantine` to record "
    "it in dead_letters and go on"
)


AHEAD_SIGNED = "it carries the relay's signature: the positions before it are not on the topic"
"""Added to the reason of a record set aside that claims a position past the reader's next one
and verifies under its signing keys: evidence of a gap in the topic (its start deleted, a topic
made again), not of a forgery (atk50-25 F5)."""


def located(source: EventSource, err: CorruptEvent) -> CorruptEvent:
    """`err` with the record's topic, partition and offset in its message and fields, when the
    source can tell (call it right after the read that returned the record)."""
    where = source.where(err.position) if isinstance(source, Locates) else None
    if where is None:
        return err
    out = CorruptEvent(
        f"{where}, {err.message}",
        position=err.position,
        tag=err.tag,
        known=err.known,
        hint=KAFKA_HINT,
    )
    out.fields.update(topic=where.topic, partition=where.partition, offset=where.offset)
    out.__cause__ = err
    return out


# --- quarantine mode ------------------------------------------------------------------------------


def split(
    records: Sequence[LogRecord],
) -> tuple[list[LogRecord], list[tuple[LogRecord, CorruptEvent]]]:
    """Pure: the records that decode and validate, and the others with their error, in order.

    Decodes the whole page once; only a page with poison in it is decoded again after each
    poison record found."""
    good: list[LogRecord] = []
    bad: list[tuple[LogRecord, CorruptEvent]] = []
    rest = list(records)
    while rest:
        try:
            decode_records(rest)
        except CorruptEvent as err:
            i = next(i for i, r in enumerate(rest) if r.position == err.position)
            good += rest[:i]
            bad.append((rest[i], err))
            rest = rest[i + 1 :]
        else:
            good += rest
            break
    return good, bad


def _reason(err: CorruptEvent) -> str:
    """The error's message without the `log position N: ` prefix (the row has the position)."""
    prefix = f"log position {err.position}: "
    return err.message.removeprefix(prefix)


def letter_of_poison(p: PoisonRecord) -> DeadLetter:
    return DeadLetter(p.topic, p.partition, p.offset, p.position, p.tag, p.reason, p.data)


def quarantine_batch(
    records: Sequence[LogRecord],
    poison: Sequence[DeadLetter],
    after: int,
    where: Callable[[int], Where | None],
) -> QuarantineBatch:
    """Pure: the batch of `records` (read after position `after`) with every record that does
    not validate moved to `dead`, after the `poison` the source reported."""
    good, bad = split(records)
    dead = list(poison)
    for rec, err in bad:
        w = where(rec.position)
        dead.append(
            DeadLetter(
                w.topic if w else None,
                w.partition if w else None,
                w.offset if w else None,
                rec.position,
                rec.tag,
                _reason(err),
                rec.data,
            )
        )
    first = records[0].position if records else after + 1
    last = records[-1].position if records else after
    # the chain moves past every record the source handed out (they continue the log, even
    # those that do not validate), never past poison the source set aside
    tail = records[-1] if records else None
    chain = link(tail.position, tail.tag, tail.data) if tail is not None else None
    if good:
        b = build_batch(good)
        return QuarantineBatch(
            first, last, b.events, b.unknown, b.tables, b.counts, chain, dead=tuple(dead)
        )
    counts = {name: 0 for name in SCHEMAS} | {"b_jobev": 0}
    return QuarantineBatch(first, last, 0, 0, empty_tables(), counts, chain, dead=tuple(dead))


POISON_BYTES = 16 << 20
"""A run of poison (a reader holding while a topic writer appends records under a key id it
lacks, each up to the topic's 8 MiB) goes to the applying thread in batches of about this many
bytes of it: held whole until a record was handed out, 60 records of 7 MB grew a reader to
3.3 GB (atk45-25 F1)."""


def read_ahead(
    source: EventSource,
    position: int,
    stop: int,
    batch_size: int,
    out: queue.Queue[Batch | BaseException | None],
    halt: threading.Event,
    batch_bytes: int | None = None,
) -> None:
    """The projector's reader thread in quarantine mode: like the default one, but poison goes
    into the batches as dead letters instead of ending the run. With `batch_bytes`, batches of
    large events are bounded in bytes as the default one's (`projector.next_count`)."""
    from projections.projector import average_bytes, next_count

    where = source.where if isinstance(source, Locates) else (lambda _position: None)
    done, per = 0, None
    try:
        while position < stop and not halt.is_set():
            poison: list[DeadLetter] = []
            count = batch_size
            if batch_bytes is not None:
                count = next_count(batch_size, batch_bytes, done, per)
            records: list[LogRecord] = []
            held = 0  # bytes of the poison set aside for this batch
            while held < POISON_BYTES:
                try:
                    records = source.read(position, min(count, stop - position))
                    break
                except PoisonRecord as p:
                    if not isinstance(source, Skips):
                        raise
                    poison.append(letter_of_poison(p))
                    held += len(p.data or b"")
                    source.skip(p)
            if not records and not poison:
                break
            if records:
                done, per = done + len(records), average_bytes(records)
            batch = quarantine_batch(records, poison, position, where)
            for letter in batch.dead:
                log.warning("dead letter: %s", letter.text())
            out.put(batch)
            position = batch.last
        out.put(None)
    except BaseException as err:  # handed to the applying thread, which raises it
        out.put(err)


_RECORD = """
INSERT INTO dead_letters
SELECT * FROM b_dead d
WHERE NOT EXISTS (
    SELECT 1 FROM dead_letters x
    WHERE x.topic IS NOT DISTINCT FROM d.topic
      AND x.kafka_partition IS NOT DISTINCT FROM d.kafka_partition
      AND x.kafka_offset IS NOT DISTINCT FROM d.kafka_offset
      AND x.position IS NOT DISTINCT FROM d.position
)
"""


def record(con: duckdb.DuckDBPyConnection, batch: Batch) -> None:
    """Inside the batch's transaction: insert its dead letters (each once) and move the tracking
    position past poison at the end of the batch. A no-op for a plain batch."""
    if not isinstance(batch, QuarantineBatch):
        return
    if batch.dead:
        table = pa.Table.from_pylist([d._asdict() for d in batch.dead], schema=DEAD_LETTERS)
        con.register("b_dead", table)
        try:
            con.execute(_RECORD)
        finally:
            con.unregister("b_dead")
    con.execute(
        "UPDATE tracking SET position = greatest(position, ?) WHERE projection = ?",
        [batch.last, PROJECTION],
    )


def quarantined(con: duckdb.DuckDBPyConnection) -> int | None:
    """Rows of dead_letters (None: a projection file made before the table existed, which cannot
    quarantine)."""
    if not scalar(con, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'dead_letters'"):
        return None
    return int(scalar(con, "SELECT count(*) FROM dead_letters"))


def signed_ahead(con: duckdb.DuckDBPyConnection, position: int) -> tuple[int, int, int] | None:
    """The records set aside past `position` that carry the relay's signature (`AHEAD_SIGNED`):
    (how many, the first's offset, the first's position), or None when there are none."""
    row = con.execute(
        "SELECT count(*), min(kafka_offset), min(position) FROM dead_letters "
        "WHERE position > ? AND contains(reason, ?)",
        [position, AHEAD_SIGNED],
    ).fetchone()
    if row is None or not row[0]:
        return None
    return int(row[0]), int(row[1]), int(row[2])
