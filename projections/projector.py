"""The projector: reads the log from the tracked position and applies it in batches.

Each batch is decoded into Arrow tables (`batch.py`) and applied by the set-based statements of
`apply.sql` in ONE DuckDB transaction that also moves the tracking position, so a crash at any
point leaves the projection exactly at a batch boundary, and the next run resumes from there.
Rows are never written one by one: every statement reads a whole batch.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import duckdb

from projections.errors import CorruptEvent, ProjectionBusy, ProjectionMismatch
from projections.source import EventSource, LogRecord, Row
from projections.store import (
    DEFAULT_BATCH,
    PROJECTION,
    Store,
    memory_limit,
    projection_path,
    sql_sections,
)

if TYPE_CHECKING:  # Arrow and the decoder load with the first Projector: reads that find the
    # projection caught up never pay for them
    import pyarrow as pa

    from projections.batch import Batch

BATCH_BYTES = 16 << 20
"""The stored bytes of a batch of large events at most (one event at least): a batch of
122,880 events of 900 KiB each is 100 GB, and `project follow` held ~10x the bytes it read
(3.5 GB for a 330 MB topic: atk44z F8; 150 events of 800 KB: 1.3 GB before, 0.67 GB in 16 MiB
batches). Each read asks for as many events as the last read's average size fits in this
(`next_count`), unless a whole batch of them fits in `WHOLE_BATCH_BYTES`."""
WHOLE_BATCH_BYTES = 128 << 20
"""Events of ~1 KiB or less on average still go in whole batches (row groups: a partial one
costs a quarter more DuckDB CPU per event, see `DEFAULT_BATCH`)."""
FIRST_READ = 16
"""Events the first read of a catch-up asks for (their size unknown yet: 16 of the largest
events are ~14 MiB)."""


def next_count(batch_size: int, batch_bytes: int, done: int, per: int | None) -> int:
    """Pure: how many events the next read asks for, after `done` events of this catch-up, the
    events read last `per` bytes each on average (None: none read yet, `FIRST_READ`): what
    completes the current `batch_size` (so batches stay whole row groups), fewer where a whole
    batch of events of that size would pass `WHOLE_BATCH_BYTES`: what fits in `batch_bytes`
    (one at least)."""
    if per is None:
        fits = FIRST_READ
    elif per * batch_size <= WHOLE_BATCH_BYTES:
        fits = batch_size
    else:
        fits = batch_bytes // per
    return max(1, min(batch_size - done % batch_size, fits))


def average_bytes(records: Sequence[Row]) -> int:
    """Pure: the average stored bytes of `records` (at least 1)."""
    return max(1, sum(len(r[2]) for r in records) // max(1, len(records)))


DEFERRED_CHECKPOINT = "1GB"
"""DuckDB's write-ahead-log size that triggers a checkpoint during a catch-up of more than one
batch (the default, 16 MB, checkpointed after nearly every batch)."""

_EMPTY: dict[str, Any] = {}


def _empty() -> dict[str, pa.Table]:
    """Empty inputs of every batch table (made once)."""
    if not _EMPTY:
        from projections.batch import empty_tables

        _EMPTY.update(empty_tables())
    return _EMPTY


@runtime_checkable
class Anchored(Protocol):
    """A source that checks each record against the last one applied (Kafka)."""

    def anchor(self, position: int, chain: str | None) -> None:
        """The position and chain hash of the last record the projection applied."""
        ...


Progress = Callable[[int, int], None]
"""Called after each batch with (position applied, log head)."""


@dataclass(frozen=True)
class CatchUp:
    """What one catch-up did."""

    applied: int
    """Events applied by this run."""
    unknown: int
    """Of those, events whose tag this code does not know (kept, otherwise ignored)."""
    position: int
    """The tracked position afterwards."""
    head: int
    """The log head this run saw."""


class Projector:
    """Applies an `EventSource` to a `Store`, batch by batch."""

    def __init__(
        self,
        store: Store,
        source: EventSource,
        *,
        batch_size: int = DEFAULT_BATCH,
        quarantine: bool = False,
        lock: threading.RLock | None = None,
        batch_bytes: int = BATCH_BYTES,
    ) -> None:
        """`quarantine`: record poison records in `dead_letters` and go on, instead of stopping
        at the first one (see `projections.quarantine`). `lock`: held by every catch-up (shared
        by the projectors of one projection, `beside`: one writes at a time)."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.lock = lock or threading.RLock()
        """Held by each catch-up; a reader that must see the projection at exactly the position
        it caught up to (the dispatcher's ranks) holds it across both."""
        self.store = store
        self.source = source
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        self.per_event: int | None = None
        """The average stored bytes of the events the last read returned (`next_count`)."""
        self.quarantine = quarantine
        recall = getattr(source, "recall_from", None)
        if recall is not None:  # a Kafka source knows exact copies of what was applied
            recall(store.con.cursor())
        sections = sql_sections("apply.sql")
        self._statements = [(n, needs, sql) for n, needs, sql in sections if needs != "setup"]
        self._events_statement = next(sql for n, _needs, sql in sections if n == _EVENTS)
        # Bind the temp tables and views the statements read: empty inputs, then the `always`
        # sections over them (empty), then the `setup` views.
        self._register(dict(_empty()))
        nothing = {"first": 0, "last": 0, "events": 0, "unknown": 0}
        for _name, needs, sql in sections:
            if needs == "always":
                store.con.execute(sql, _used(sql, nothing))
        for _name, needs, sql in sections:
            if needs == "setup":
                store.con.execute(sql)

    def _register(self, tables: dict[str, pa.Table]) -> None:
        for name, table in tables.items():
            self.store.con.register(name, table)

    def apply(self, records: Sequence[LogRecord]) -> Batch:
        """Apply records (the next ones after the tracked position) in one transaction."""
        from projections.batch import build_batch

        batch = build_batch(records)
        self.apply_batch(batch)
        return batch

    def apply_batch(self, batch: Batch) -> None:
        """Apply a decoded batch and move the tracking position, in one transaction."""
        con = self.store.con
        con.execute("BEGIN")
        try:
            self._apply_open(batch, rows_in=False)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def _insert_rows(self, rows: _Rows, tracked: int) -> bool:
        """Open the batch's transaction and insert its `events` rows (the batch's other tables
        follow in `_apply_open`). False, with nothing open, when DuckDB refuses them (bytes that
        are not JSON): the batch then goes in whole, where its decoding names the bad record.
        `tracked`: the tracked position (the catch-up's, under its lock)."""
        con = self.store.con
        con.execute("BEGIN")
        try:
            self._check_after(rows.first, tracked)
            self._register({"b_events": rows.table})
            con.execute(self._events_statement, _used(self._events_statement, _EMPTY_PARAMS))
        except duckdb.Error:
            con.execute("ROLLBACK")
            return False
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return True

    def _check_after(self, first: int, tracked: int | None = None) -> None:
        """ProjectionMismatch unless `first` comes after the tracked position (`tracked`: known
        to the caller, under the lock; None: read from the store)."""
        tracked = self.store.position() if tracked is None else tracked
        if first <= tracked:
            raise ProjectionMismatch(
                f"records from position {first} are already applied "
                f"(the projection is at {tracked})",
                hint="a source must hand out records after the tracked position",
            )

    def _apply_open(self, batch: Batch, *, rows_in: bool, tracked: int | None = None) -> None:
        """Apply a decoded batch and move the tracking position inside the open transaction;
        `rows_in`: its `events` rows are inserted already (`_insert_rows`); `tracked`: the
        tracked position when the caller knows it (`_check_after`)."""
        from projections import kept, quarantine

        con = self.store.con
        filled = {name: t for name, t in batch.tables.items() if t.num_rows}
        self._register(filled)
        try:
            self._check_after(batch.first, tracked)
            for name, needs, statement in self._statements:
                if rows_in and name == _EVENTS:
                    continue
                if needs == "always" or batch.counts.get(needs):
                    con.execute(statement, _params(statement, batch))
            if batch.events:
                kept.advance(con, batch.first, batch.last)  # the teams' ended hours
            quarantine.record(con, batch)  # a no-op unless the batch met poison records
            if batch.chain is not None:  # its row updated in place (a fourth of the CPU of
                # INSERT OR REPLACE, which deletes and inserts through the key's index)
                moved = con.execute(
                    "UPDATE chain SET position = ?, hash = ? WHERE projection = ?",
                    [batch.last, batch.chain, PROJECTION],
                ).fetchall()
                if not moved or not moved[0][0]:
                    con.execute(
                        "INSERT INTO chain VALUES (?, ?, ?)", [PROJECTION, batch.last, batch.chain]
                    )
        finally:  # drop the batch's memory now; empty inputs keep the views bound
            self._register({name: _empty()[name] for name in filled})

    def beside(self, source: EventSource) -> Projector:
        """A projector of the same projection on a connection of its own (`Store.beside`),
        reading `source` (a source of its own: a source is one thread's at a time), sharing
        this one's lock: another thread catches the projection up with it while this one's
        thread does other work (the server's reads, `ledger.server.copied`)."""
        return Projector(
            self.store.beside(),
            source,
            batch_size=self.batch_size,
            quarantine=self.quarantine,
            lock=self.lock,
        )

    def catch_up(self, *, until: int | None = None, progress: Progress | None = None) -> CatchUp:
        """Apply every record after the tracked position (up to `until`), batch by batch, under
        `lock` (`_catch_up`)."""
        with self.lock:
            return self._catch_up(until=until, progress=progress)

    def _catch_up(self, *, until: int | None, progress: Progress | None) -> CatchUp:
        """Apply every record after the tracked position (up to `until`), batch by batch.

        Reading and decoding (Python) overlaps with DuckDB applying (DuckDB releases the GIL): a
        reader thread hands each batch over in two parts, its `events` rows as soon as they are
        read (DuckDB inserts them, the largest statement, while the records decode) and then
        the decoded rest, which is applied and committed in the same transaction.
        """
        position = self.store.position()
        head = self.source.head()
        if position > head:
            raise ProjectionMismatch(
                f"the projection is at position {position} but the log ends at {head}",
                hint="it was built from another log: rebuild it (`gpuledger projection rebuild`)",
                position=position,
                head=head,
            )
        stop = head if until is None else min(until, head)
        if isinstance(self.source, Anchored):
            self.source.anchor(position, self.store.chain())
        applied = unknown = 0
        # A long catch-up checkpoints once at its end instead of after every batch whose write-
        # ahead log passed DuckDB's threshold (each of those rewrote the tables the batch
        # changed: a third of the commit's CPU). The log stays durable meanwhile.
        deferred = stop - position > self.batch_size
        if deferred:
            self.store.con.execute(f"SET checkpoint_threshold = '{DEFERRED_CHECKPOINT}'")
        # A batch comes in two parts, its `events` rows and then the rest: up to one batch ahead
        # read by a thread of its own; a catch-up of one short read (a server's read after a few
        # commands, a cycle's) is read on this thread first: no thread to start and hand over
        # to (a wait for a CPU each on a loaded machine), the same batches
        halt = threading.Event()
        if stop - position <= FIRST_READ:
            batches: queue.Queue[_Item] = queue.Queue()
            self._read_ahead(position, stop, batches, halt)
            reader = None
        else:
            batches = queue.Queue(maxsize=2)
            reader = threading.Thread(
                target=self._read_ahead, args=(position, stop, batches, halt), daemon=True
            )
            reader.start()
        con = self.store.con
        rows_in = False  # a batch's transaction is open with its `events` rows inserted
        try:
            while True:
                item = batches.get()
                if isinstance(item, _Rows):
                    rows_in = self._insert_rows(item, position)
                    continue
                if isinstance(item, _Retract):  # the batch did not decode: its rows go
                    if rows_in:
                        con.execute("ROLLBACK")
                    rows_in = False
                    continue
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                if not rows_in:
                    con.execute("BEGIN")
                try:
                    self._apply_open(item, rows_in=rows_in, tracked=position)
                    rows_in = False
                    con.execute("COMMIT")
                except BaseException:
                    rows_in = False
                    con.execute("ROLLBACK")
                    raise
                applied += item.events
                unknown += item.unknown
                position = item.last
                if progress is not None:
                    progress(position, stop)
        finally:
            if rows_in:  # stopped between a batch's two parts: nothing of it stays
                con.execute("ROLLBACK")
            halt.set()
            while reader is not None and reader.is_alive():  # unblock a reader on a full queue
                with contextlib.suppress(queue.Empty):
                    batches.get(timeout=0.05)
            if reader is not None:
                reader.join()
            if deferred:
                self.store.con.execute("RESET checkpoint_threshold")
        if deferred:
            self.store.con.execute("CHECKPOINT")
        return CatchUp(applied=applied, unknown=unknown, position=position, head=head)

    def _read_ahead(
        self,
        position: int,
        stop: int,
        out: queue.Queue[_Item],
        halt: threading.Event,
    ) -> None:
        """Reader thread: read and decode batches until `stop`, each as its `events` rows (which
        DuckDB inserts while the records decode) and then the rest; a corrupt record ends the
        run after the records before it (so the projection stops right before it)."""
        from projections import quarantine
        from projections.batch import build_batch, events_rows

        if self.quarantine:
            plain = cast("queue.Queue[Batch | BaseException | None]", out)  # whole batches only
            quarantine.read_ahead(
                self.source, position, stop, self.batch_size, plain, halt, self.batch_bytes
            )
            return
        read: Callable[[int, int], Sequence[Row]] = getattr(
            self.source, "read_rows", self.source.read
        )  # plain tuples where the source has them
        done = 0
        try:
            while position < stop and not halt.is_set():
                count = next_count(self.batch_size, self.batch_bytes, done, self.per_event)
                records = read(position, min(count, stop - position))
                if not records:
                    break
                done += len(records)
                self.per_event = average_bytes(records)
                rows = None
                with contextlib.suppress(CorruptEvent):  # found again by build_batch
                    rows = events_rows(records)
                if rows is not None:
                    out.put(_Rows(rows, records[0][0]))
                try:
                    batch = build_batch(records, rows)
                except CorruptEvent as err:
                    if rows is not None:
                        out.put(_RETRACT)
                    good = [r for r in records if r[0] < err.position]
                    if good:
                        out.put(build_batch(good))
                    out.put(quarantine.located(self.source, err))
                    return
                out.put(batch)
                position = batch.last
            out.put(None)
        except BaseException as err:  # handed to the applying thread, which raises it
            out.put(err)


@dataclass(frozen=True)
class _Rows:
    """The `events` rows of the batch that comes next, ahead of its decoded tables."""

    table: pa.Table
    first: int


class _Retract:
    """The batch whose `events` rows came ahead did not decode: roll them back."""


_RETRACT = _Retract()
if TYPE_CHECKING:
    _Item = Batch | _Rows | _Retract | BaseException | None
_EVENTS = "events"
"""The `apply.sql` section that inserts a batch's `events` rows."""
_EMPTY_PARAMS: dict[str, int] = {}


def _params(statement: str, batch: Batch) -> dict[str, int] | None:
    """The parameters a statement uses, among $first, $last, $events and $unknown."""
    values = {
        "first": batch.first,
        "last": batch.last,
        "events": batch.events,
        "unknown": batch.unknown,
    }
    return _used(statement, values)


def _used(statement: str, values: dict[str, int]) -> dict[str, int] | None:
    if "$" not in statement:
        return None
    return {k: v for k, v in values.items() if f"${k}" in statement}


def rebuild(
    home: Path | str,
    source: EventSource,
    *,
    progress: Progress | None = None,
    until: int | None = None,
    batch_size: int = DEFAULT_BATCH,
) -> CatchUp:
    """Drop the projection of `home` and rebuild it from `source`, the log.

    Builds into `ledger.duckdb.rebuild` and swaps it in only when complete, so an interrupted
    rebuild leaves the old projection in place (and removes its half-built copy, the temp file
    and its WAL, on the way out). No other process may hold the projection.
    """
    final = projection_path(home)
    _refuse_if_busy(final)
    temp = final.with_name(final.name + ".rebuild")
    for stale in (temp, _wal(temp)):
        stale.unlink(missing_ok=True)
    try:
        with Store(temp) as store:
            result = Projector(store, source, batch_size=batch_size).catch_up(
                until=until, progress=progress
            )
            store.con.execute("CHECKPOINT")
    except BaseException:  # a Ctrl-C too: the half-built copy went only to the next rebuild
        for stale in (temp, _wal(temp)):  # (2.6 MB at 13,797 events, atk61-29b F4)
            stale.unlink(missing_ok=True)
        raise
    _wal(final).unlink(missing_ok=True)
    os.replace(temp, final)
    return result


def _refuse_if_busy(path: Path) -> None:
    """ProjectionBusy if another process holds the file (swapping it would lose its writes)."""
    if not path.exists():
        return
    try:
        duckdb.connect(str(path), config={"memory_limit": memory_limit()}).close()
    except duckdb.IOException as err:
        if "lock" in str(err).lower():
            raise ProjectionBusy(
                f"the projection {path} is open in another process",
                hint="stop the projector (or the process holding it) before rebuilding",
                path=str(path),
            ) from err
        raise


def _wal(path: Path) -> Path:
    return path.with_name(path.name + ".wal")
