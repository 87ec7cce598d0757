"""The live state as a read sees it: the newest snapshot that verifies plus the tail, read-only.

The embedded CLI's reads (`jobs`, `queue`, `explain`, ...) need the live state (who may see
whose commands, the live jobs a preview decides on) and never append: `LiveView` reads the
store file read-only through `ledger.store.embedded.EmbeddedSource` (eventsourcing's snapshot
table and its notification log), so a read loads neither eventsourcing nor the application
(~20-25 ms of CPU per command). It starts exactly as `Ledger(live=True)` does: the same rule
picks the snapshot (`snapshots.newest`), the same fold (`ledger.core.evolve.evolve`) folds the
tail. A tail so long that a live ledger would store a new snapshot after folding it is left to
`Ledger` (`LiveView.open` gives None), which stores that snapshot for every later reader.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.store import snapshots
from ledger.store.locate import LogSource, open_source
from projections.source import LogRecord, follow
from schemas.errors import EventDecodeError

if TYPE_CHECKING:
    from schemas.events import AnyEvent


def decode_at(position: int, data: bytes) -> AnyEvent:
    """The event stored at `position`; an `EventDecodeError` that names the position."""
    from schemas import codec  # (a read whose tail is empty decodes nothing)

    try:
        return codec.decode(data)
    except EventDecodeError as err:
        raise EventDecodeError(
            f"log position {position}: {err.message}",
            hint="upgrade gpu-ledger"
            if err.tag is not None and not err.known
            else "the store is corrupt",
            tag=err.tag,
            known=err.known,
            position=position,
        ) from err


class LiveView:
    """A live state folded up to `position`, for reads: `state` and `catch_up()`, what the read
    layer asks of a ledger (`ledger.reads.table`); it never writes."""

    def __init__(
        self, source: LogSource, state: State, position: int, *, owns: bool = True
    ) -> None:
        self.source = source
        self.state = state
        self.position = position
        self._owns = owns

    @classmethod
    def open(
        cls,
        home: Path,
        max_tail: int = snapshots.SNAPSHOT_EVERY,
        source: LogSource | None = None,
    ) -> LiveView | None:
        """The live state of the ledger in `home`, or None when more than `max_tail` events
        follow the newest snapshot that verifies (or the start, when none does): a live
        ledger would fold them and store a snapshot, and `Ledger(live=True)` is the one that
        stores it. `source`: the home's log opened by the caller, who closes it (a CLI read
        shares one with its projection: a PostgreSQL store's is a server session)."""
        owns = source is None
        source = open_source(home) if source is None else source
        try:
            got = snapshots.newest(
                source.snapshots(snapshots.STREAM_ID.hex, snapshots.KEEP),
                partial(_stored_at, source),
            )
            state, position = State(live_only=True), 0
            if got is not None and not snapshots.signed(
                got[0], snapshots.state_key(home, create=False)
            ):
                got = None  # not the service's (or its key is not ours to read): fold the log
            if got is not None:
                state, position = got[1], got[0].position
            if source.head() - position > max_tail:
                if owns:
                    source.close()
                return None
            view = cls(source, state, position, owns=owns)
            view.catch_up()
        except BaseException:
            if owns:
                source.close()
            raise
        return view

    def catch_up(self) -> int:
        """Fold every event appended since our position."""
        for records in follow(self.source, self.position):
            for r in records:
                evolve(self.state, decode_at(r.position, r.data))
                self.position = r.position
        return self.position

    def close(self) -> None:
        if self._owns:
            self.source.close()


def _stored_at(source: LogSource, position: int) -> LogRecord | None:
    records = source.read(position - 1, 1) if position >= 1 else []
    return records[0] if records and records[0].position == position else None
