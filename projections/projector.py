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
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import duckdb

from projections.errors import CorruptEvent, ProjectionBusy, ProjectionMismatch
from projections.source import EmbeddedSource, EventSource, LogRecord
from projections.store import PROJECTION, Store, projection_path, sql_sections

if TYPE_CHECKING:  # Arrow and the decoder load with the first Projector: reads that find the
    # projection caught up never pay for them
    import pyarrow as pa

    from projections.batch import Batch

DEFAULT_BATCH = 122_880
"""Events per transaction: exactly one DuckDB row group (122,880 rows), so a batch's events are
written straight to the database file as a whole row group, and per-statement costs vanish. A
batch that is not a multiple of the row group (131,072 was) leaves a partial row group that goes
through the write-ahead log and is written again by the next checkpoint: a quarter more DuckDB
CPU per event. Small enough to bound memory (about 1 KB per event in flight, two batches at a
time)."""

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
    ) -> None:
        """`quarantine`: record poison records in `dead_letters` and go on, instead of stopping
        at the first one (see `projections.quarantine`)."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.store = store
        self.source = source
        self.batch_size = batch_size
        self.quarantine = quarantine
        sections = sql_sections("apply.sql")
        self._statements = [(n, needs, sql) for n, needs, sql in sections if needs != "setup"]
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
        from projections import quarantine

        con = self.store.con
        filled = {name: t for name, t in batch.tables.items() if t.num_rows}
        self._register(filled)
        try:
            con.execute("BEGIN")
            try:
                tracked = self.store.position()
                if batch.first <= tracked:
                    raise ProjectionMismatch(
                        f"records from position {batch.first} are already applied "
                        f"(the projection is at {tracked})",
                        hint="a source must hand out records after the tracked position",
                    )
                for _name, needs, statement in self._statements:
                    if needs == "always" or batch.counts.get(needs):
                        con.execute(statement, _params(statement, batch))
                quarantine.record(con, batch)  # a no-op unless the batch met poison records
                if batch.chain is not None:
                    con.execute(
                        "INSERT OR REPLACE INTO chain VALUES (?, ?, ?)",
                        [PROJECTION, batch.last, batch.chain],
                    )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        finally:  # drop the batch's memory now; empty inputs keep the views bound
            self._register({name: _empty()[name] for name in filled})

    def catch_up(self, *, until: int | None = None, progress: Progress | None = None) -> CatchUp:
        """Apply every record after the tracked position (up to `until`), batch by batch.

        Reading and decoding the next batch (Python) overlaps with DuckDB applying the current
        one (DuckDB releases the GIL): a reader thread feeds a queue of one batch.
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
        batches: queue.Queue[Batch | BaseException | None] = queue.Queue(maxsize=1)
        halt = threading.Event()
        reader = threading.Thread(
            target=self._read_ahead, args=(position, stop, batches, halt), daemon=True
        )
        reader.start()
        try:
            while True:
                item = batches.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                self.apply_batch(item)
                applied += item.events
                unknown += item.unknown
                position = item.last
                if progress is not None:
                    progress(position, stop)
        finally:
            halt.set()
            while reader.is_alive():  # unblock a reader waiting on a full queue
                with contextlib.suppress(queue.Empty):
                    batches.get(timeout=0.05)
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
        out: queue.Queue[Batch | BaseException | None],
        halt: threading.Event,
    ) -> None:
        """Reader thread: read and decode batches until `stop`; a corrupt record ends the run
        after the records before it (so the projection stops right before it)."""
        from projections import quarantine
        from projections.batch import build_batch

        if self.quarantine:
            quarantine.read_ahead(self.source, position, stop, self.batch_size, out, halt)
            return
        try:
            while position < stop and not halt.is_set():
                records = self.source.read(position, min(self.batch_size, stop - position))
                if not records:
                    break
                try:
                    batch = build_batch(records)
                except CorruptEvent as err:
                    good = [r for r in records if r.position < err.position]
                    if good:
                        out.put(build_batch(good))
                    out.put(quarantine.located(self.source, err))
                    return
                out.put(batch)
                position = batch.last
            out.put(None)
        except BaseException as err:  # handed to the applying thread, which raises it
            out.put(err)


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


def project(
    home: Path | str,
    *,
    until: int | None = None,
    progress: Progress | None = None,
    batch_size: int = DEFAULT_BATCH,
) -> CatchUp:
    """Bring `<home>/projections/ledger.duckdb` up to the log of `home` (embedded store)."""
    with EmbeddedSource(home) as source, Store.open(home) as store:
        return Projector(store, source, batch_size=batch_size).catch_up(
            until=until, progress=progress
        )


def rebuild(
    home: Path | str,
    *,
    progress: Progress | None = None,
    until: int | None = None,
    batch_size: int = DEFAULT_BATCH,
    source: EventSource | None = None,
) -> CatchUp:
    """Drop the projection and rebuild it from the log.

    Builds into `ledger.duckdb.rebuild` and swaps it in only when complete, so an interrupted
    rebuild leaves the old projection in place. No other process may hold the projection.
    """
    final = projection_path(home)
    _refuse_if_busy(final)
    temp = final.with_name(final.name + ".rebuild")
    for stale in (temp, _wal(temp)):
        stale.unlink(missing_ok=True)
    own = source is None
    src = EmbeddedSource(home) if source is None else source
    try:
        with Store(temp) as store:
            result = Projector(store, src, batch_size=batch_size).catch_up(
                until=until, progress=progress
            )
            store.con.execute("CHECKPOINT")
    finally:
        if own:
            src.close()
    _wal(final).unlink(missing_ok=True)
    os.replace(temp, final)
    return result


def _refuse_if_busy(path: Path) -> None:
    """ProjectionBusy if another process holds the file (swapping it would lose its writes)."""
    if not path.exists():
        return
    try:
        duckdb.connect(str(path)).close()
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
