"""The write side's application: the eventsourcing store, the fold, optimistic concurrency.

One ordered stream holds the whole ledger, so the stream version and the notification id (the
*position*) move together and the recorder's unique (stream, version) constraint is the
concurrency check: two writers that decided on the same state cannot both append. The loser
catches up and decides again, or, when its command carried an `expected_position` and a change
since then touches what it depends on, is rejected with `Conflict`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.application import Application
from eventsourcing.persistence import IntegrityError, Mapper, StoredEvent, Transcoder

from ledger.clock import Clock, IdSource, SystemClock, random_ids
from ledger.domain import State, command_keys, decide, event_keys, evolve
from schemas import codec
from schemas.commands import AnyCommand
from schemas.errors import Conflict, EventDecodeError
from schemas.events import AnyEvent, tag_of

STREAM_ID = uuid5(NAMESPACE_URL, "gpuledger:ledger")
EVENTS_DB = "events.sqlite"


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


@dataclass(frozen=True)
class Appended:
    events: list[AnyEvent]
    position: int
    """The log position of the last event appended (the head after this command)."""


class Ledger(Application[UUID]):
    """The one writer of the event log. Keeps the folded `State` in memory."""

    name = "gpuledger"
    env = {  # noqa: RUF012 (eventsourcing reads this class attribute)
        "PERSISTENCE_MODULE": "eventsourcing.sqlite",
        "MAPPER_TOPIC": "ledger.application:StructMapper",
        "TRANSCODER_TOPIC": "ledger.application:PassThroughTranscoder",
        "SQLITE_LOCK_TIMEOUT": "30",
    }
    page = 10_000
    retries = 20

    def __init__(self, home: Path, clock: Clock | None = None, ids: IdSource | None = None) -> None:
        home.mkdir(parents=True, exist_ok=True)
        super().__init__({"SQLITE_DBNAME": str(home / EVENTS_DB)})
        self.home = home
        self.clock = clock or SystemClock()
        self.ids = ids or random_ids()
        self.state = State()
        self.version = 0
        self.position = 0
        self.catch_up()

    # --- reading --------------------------------------------------------------------------------

    def read(self, after: int, limit: int) -> list[tuple[int, AnyEvent]]:
        """Decoded events after `after`, in log order, as (position, event)."""
        out = []
        for n in self.recorder.select_notifications(start=after + 1, limit=limit):
            try:
                out.append((n.id, codec.decode(n.state)))
            except EventDecodeError as err:
                raise EventDecodeError(
                    f"log position {n.id}: {err.message}",
                    hint="upgrade gpu-ledger" if not err.known else "the store is corrupt",
                    tag=err.tag,
                    known=err.known,
                    position=n.id,
                ) from err
        return out

    def head(self) -> int:
        return self.recorder.max_notification_id() or 0

    def catch_up(self) -> int:
        """Fold every event appended since our position (by us or another writer)."""
        while True:
            page = self.read(self.position, self.page)
            for pos, ev in page:
                evolve(self.state, ev)
                self.position = pos
                self.version += 1
            if len(page) < self.page:
                return self.position

    # --- writing --------------------------------------------------------------------------------

    def execute(self, cmd: AnyCommand) -> Appended:
        return self.execute_all([cmd])

    def execute_all(self, cmds: Sequence[AnyCommand]) -> Appended:
        """Decide every command against the current state and append all events atomically.

        A rejected command raises a LedgerError and nothing is appended, for the whole batch.
        """
        for _ in range(self.retries):
            self.catch_up()
            self._check_conflicts(cmds)
            now = self.clock.now()
            if len(cmds) == 1:
                scratch, events = self.state, decide(self.state, cmds[0], now, self.ids)
            else:
                scratch, events = self.state.copy(), []
                for cmd in cmds:
                    decided = decide(scratch, cmd, now, self.ids)
                    for ev in decided:
                        evolve(scratch, ev)
                    events += decided
            if not events:
                return Appended(events=[], position=self.position)
            envelopes = [
                Recorded(STREAM_ID, self.version + i + 1, ev) for i, ev in enumerate(events)
            ]
            try:
                recordings = self.save(*envelopes)
            except IntegrityError:
                continue  # another writer appended first: catch up and decide again
            if scratch is self.state:
                for ev in events:
                    evolve(self.state, ev)
            else:
                self.state = scratch
            self.version += len(events)
            self.position = recordings[-1].notification.id
            return Appended(events=events, position=self.position)
        raise Conflict("the log kept moving under this command", hint="retry it")

    def _check_conflicts(self, cmds: Sequence[AnyCommand]) -> None:
        for cmd in cmds:
            expected = cmd.expected_position
            if expected is None or expected >= self.position:
                continue
            wanted = command_keys(self.state, cmd)
            for pos, ev in self.read(expected, self.position - expected):
                clash = wanted & event_keys(ev)
                if clash:
                    raise Conflict(
                        f"stale command: position {pos} changed {', '.join(sorted(clash))} "
                        f"after the expected position {expected}",
                        hint="read again and retry",
                        position=pos,
                        expected=expected,
                    )
