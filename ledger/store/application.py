"""The write side's application: the eventsourcing store, the fold, optimistic concurrency.

One ordered stream holds the whole ledger, so the stream version and the notification id (the
*position*) move together and the recorder's unique (stream, version) constraint is the
concurrency check: two writers that decided on the same state cannot both append. The loser
catches up and decides again, or, when its command carried an `expected_position` and a change
since then touches what it depends on, is rejected with `Conflict`. How events are mapped and
stored by eventsourcing (the mapper, the SQLite factory, the notifications as log records) is
`ledger.store.mapping`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence, Set
from pathlib import Path
from typing import Any
from uuid import UUID

import msgspec
from eventsourcing.application import Application
from eventsourcing.persistence import IntegrityError, PersistenceError, StoredEvent

from ledger.core import conflicts
from ledger.core.decide import decide_parts
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.store import EVENTS_DB, locate, requests, snapshots
from ledger.store.appended import Appended, LogBehind
from ledger.store.clock import Clock, IdSource, SystemClock, random_ids
from ledger.store.live import decode_at
from ledger.store.mapping import LedgerSQLiteFactory as LedgerSQLiteFactory
from ledger.store.mapping import PassThroughTranscoder as PassThroughTranscoder
from ledger.store.mapping import Recorded as Recorded
from ledger.store.mapping import StoreSource as StoreSource
from ledger.store.mapping import StructMapper as StructMapper
from ledger.store.mapping import _private
from ledger.store.requests import KEY_PART, Requests, keyed_id
from projections.chain import V2, link
from projections.source import LogRecord, follow
from schemas import codec
from schemas.bounds import check_written
from schemas.commands import AnyCommand, ApplyDecision
from schemas.errors import Conflict, EventDecodeError, InvalidCommand, LedgerError, Unavailable
from schemas.events import AnyEvent, tag_of

STREAM_ID = snapshots.STREAM_ID
log = logging.getLogger("gpuledger.ledger")
_Evs = list[AnyEvent]

RECENT = 8192
"""How many of the events it folded last a ledger keeps decoded for `follow` (its own readers
read what it just appended: a simulation's loop and rank source, the cycle's utilisation)."""


class Ledger(Application[UUID]):
    """The one writer of the event log. Keeps the folded `State` in memory.

    `live=True` keeps a live state (`State.live_only`: finished jobs leave memory) and starts
    from the newest snapshot that verifies plus the tail (`ledger.store.snapshots`), taking a new
    one every `snapshot_every` events and on `close()`. The full state (`live=False`, for what-if
    and tools that read finished jobs from the fold) always folds the whole log."""

    is_snapshotting_enabled = True

    name = "gpuledger"
    env = {  # noqa: RUF012 (eventsourcing reads this class attribute)
        "PERSISTENCE_MODULE": "ledger.store.mapping:LedgerSQLiteFactory",
        "MAPPER_TOPIC": "ledger.store.mapping:StructMapper",
        "TRANSCODER_TOPIC": "ledger.store.mapping:PassThroughTranscoder",
        "SQLITE_LOCK_TIMEOUT": "30",
    }
    page = 10_000
    retries = 20

    def __init__(
        self,
        home: Path,
        clock: Clock | None = None,
        ids: IdSource | None = None,
        *,
        live: bool = False,
        snapshot_every: int = snapshots.SNAPSHOT_EVERY,
        store: str | None = None,
        memory: bool = False,
        bounded: bool = True,
    ) -> None:
        """`store`: a PostgreSQL DSN (default: the one `home` records, else the SQLite file in
        `home`; `ledger.store.locate`). `memory`: the same SQLite store held in memory until
        `write_out()` writes it to `home` (a simulation's: nothing else reads it meanwhile).
        `bounded`: what a request writes is bounded (`bounds.check_written`); a simulation's
        or a what-if's log, which nothing relays and which replays a state, is not."""
        home.mkdir(parents=True, exist_ok=True)
        self.bounded = bounded
        if memory and (home / EVENTS_DB).exists():
            raise InvalidCommand(f"{home} already holds a ledger", hint="pass a new home")
        self.dsn = None if memory else locate.store_of(home, store)
        if self.dsn is None and not memory:
            _private(home / EVENTS_DB)
        self.memory = memory
        db = f"file:gpuledger-{os.getpid()}-{id(self)}?mode=memory&cache=shared"
        env = {
            "SQLITE_DBNAME": db if memory else str(home / EVENTS_DB),
            "GPULEDGER_DURABILITY": os.environ.get("GPULEDGER_DURABILITY", "normal"),
        }
        if self.dsn is not None:
            env |= {
                "PERSISTENCE_MODULE": "ledger.store.postgres:LedgerPostgresFactory",
                "GPULEDGER_STORE_DSN": self.dsn,
            }
        super().__init__(env)
        self.home = home
        self.ending = False
        """Set by a server that stops: a batch the store did not take is not read back then."""
        self.stale = False
        """The state may hold folds of a batch the store did not take and could not be read back
        (the store went away): `refresh()` reads it back before anything decides on it."""
        self.rewound = 0
        """How often the log turned out behind what this ledger folded (a failover to a standby
        without the last commits): the state was read back; a projection follows (`ServiceLoop`)."""
        self.behind = False
        """The log was found behind what was folded: the next read back (`_reload`) rescans the
        idempotency keys too, and folds without checking links meanwhile."""
        self.requests = Requests()
        """Recent commands' idempotency keys (`execute_each(keys=...)`): a retry is answered
        with what the first try appended, never appended twice."""
        self.clock = clock or SystemClock()
        self.ids = ids or random_ids()
        self.state = State(live_only=live)
        self.version = 0
        self.position = 0
        self.last_hash = ""
        self.snapshot_every = snapshot_every
        self.snapshot_position = 0
        self.admit: Callable[[State, AnyCommand], AnyCommand] | None = None
        """The edge's look at a command before it is decided (`ledger.core.runas.admit`: who a
        job runs as, system accounts as members, secrets in a job's environment); a refusal is
        a LedgerError like the domain's. None: commands go to `decide` as they are."""
        self.restored_from = 0
        """The position of the snapshot this ledger started from (0: folded from the start)."""
        self._recent: list[tuple[int, AnyEvent]] = []
        """The events this ledger folded last, decoded from their stored bytes, contiguous up to
        `position` (`follow` reads them here instead of the store; at most `RECENT`)."""
        self.state_key = snapshots.state_key(home, create=live) if live else None
        """The key snapshots are signed and trusted with (`snapshots.state_key`)."""
        self.refused_snapshot: str | None = None
        """Why the newest snapshot was refused at start (its state is not the log's), if so."""
        if live:
            self._restore()
        self.requests.scan(self.follow_raw(max(0, self.position - requests.SCANNED), self.head()))
        self.catch_up()

    def fence(self, epoch: int | None) -> None:
        """Fence every append by the lease's `epoch` (None: no fence; a PostgreSQL store only)."""
        if self.dsn is not None:
            self.recorder.fence_epoch = epoch  # type: ignore[attr-defined]

    def append_began(self) -> float | None:
        """monotonic time the append under way began (None: none, or not a PostgreSQL store)."""
        return getattr(self.recorder, "append_began", None) if self.dsn is not None else None

    def store_call_began(self, thread: int | None) -> float | None:
        """monotonic time the oldest store call that writes wait behind began: the append under
        way, or any statement of `thread` (the worker's: a read, a fold) (None: none, or not a
        PostgreSQL store). A read held a leader's writes until its lease ran out, where an
        append handed the lease over after `ha.append_stall_s` (s61)."""
        if self.dsn is None:
            return None
        began = [self.append_began(), self.recorder.call_began(thread)]  # type: ignore[attr-defined]
        return min((b for b in began if b is not None), default=None)

    def lock_timeout_s(self) -> float:
        """A PostgreSQL store's lock timeout (s; 0: not a PostgreSQL store)."""
        if self.dsn is None:
            return 0.0
        return float(self.recorder.datastore.lock_timeout)  # type: ignore[attr-defined]

    def give_up_when(self, stop: Callable[[], bool]) -> None:
        """A PostgreSQL store's statements are tried again after a connection error only while
        `stop()` is false (a server stopping, a leader whose lease ran out; bounded anyway:
        `ledger.store.postgres.RETRY_FOR_S`)."""
        if self.dsn is not None:
            self.recorder.give_up = stop  # type: ignore[attr-defined]
            if self.snapshots is not None:
                self.snapshots.recorder.give_up = stop  # type: ignore[attr-defined]

    def source(self) -> locate.LogSource:
        """This ledger's log, read-only, on a connection of its own (the projector's source)."""
        return locate.open_source(self.home, self.dsn or "sqlite")

    # --- snapshots ------------------------------------------------------------------------------

    def _restore(self) -> None:
        """Start from the newest snapshot that verifies; skip (with a warning) any that does not."""
        assert self.snapshots is not None
        found = self.snapshots.recorder.select_events(STREAM_ID, desc=True, limit=snapshots.KEEP)
        got = snapshots.newest((stored.state for stored in found), self._stored_at)
        if got is None:
            return
        snap, state = got
        if not snapshots.signed(snap, self.state_key):  # not the service's: check it by folding
            self.catch_up(until=snap.position)
            if self.position != snap.position or not snapshots.same(self.state, state):
                self.refused_snapshot = (
                    f"the snapshot at position {snap.position} is not the fold of the log up to "
                    "it: it was forged or edited in the store; started from the log instead "
                    "(`gpuledger audit verify` names it)"
                )
                log.error("snapshot refused: %s", self.refused_snapshot)
                return
        at = self._stored_at(snap.position)
        assert at is not None  # `newest` found it there
        self.state, self.position, self.version = state, snap.position, snap.version
        self.last_hash = link(at.position, at.tag, at.data)  # the current rule, whatever the
        # snapshot's anchor was written under
        self.snapshot_position = self.restored_from = snap.position

    def _stored_at(self, position: int) -> LogRecord | None:
        """The stored event at `position` (None: the log has none there)."""
        rows = self.recorder.select_notifications(start=position, limit=1)
        if not rows or rows[0].id != position:
            return None
        return LogRecord(rows[0].id, rows[0].topic, rows[0].state)

    def snapshot_state(self) -> bool:
        """Store a snapshot of the live state at our position (False: nothing new to store)."""
        if not self.state.live_only or self.position in (0, self.snapshot_position):
            return False
        assert self.snapshots is not None
        data = snapshots.encode(
            self.state, self.position, self.version, self.last_hash, self.state_key
        )
        stored = StoredEvent(
            originator_id=STREAM_ID,
            originator_version=self.position,
            topic=snapshots.SNAPSHOT_TOPIC,
            state=data,
        )
        with contextlib.suppress(IntegrityError):  # another process stored this position's
            self.snapshots.recorder.insert_events([stored])
        self.snapshot_position = self.position
        self._prune_snapshots()
        return True

    def _prune_snapshots(self) -> None:
        """Keep the `snapshots.KEEP` newest snapshots."""
        assert self.snapshots is not None
        recorder: Any = self.snapshots.recorder
        if self.dsn is not None:
            from ledger.store.postgres import prune_snapshots

            prune_snapshots(recorder, STREAM_ID.hex, snapshots.KEEP)
            return
        with recorder.datastore.transaction(commit=True) as cursor:
            cursor.execute(
                f"DELETE FROM {recorder.events_table_name} WHERE originator_id = ? AND "
                f"originator_version < (SELECT min(originator_version) FROM (SELECT "
                f"originator_version FROM {recorder.events_table_name} WHERE originator_id = ? "
                f"ORDER BY originator_version DESC LIMIT {snapshots.KEEP}))",
                (STREAM_ID.hex, STREAM_ID.hex),
            )

    def _maybe_snapshot(self) -> None:
        if self.state.live_only and self.position - self.snapshot_position >= self.snapshot_every:
            self.snapshot_state()

    def write_out(self) -> None:
        """Write a store held in memory (`memory=True`) to `home`'s SQLite file, whole (SQLite's
        online backup: the same database, page for page, as the file store would hold)."""
        if not self.memory:
            return
        path = self.home / EVENTS_DB
        path.unlink(missing_ok=True)
        _private(path)
        target = sqlite3.connect(path)
        try:
            with self.recorder.datastore.get_connection(commit=False) as conn:  # type: ignore[attr-defined]
                conn._sqlite_conn.backup(target)
            target.execute("PRAGMA journal_mode=WAL")
        finally:
            target.close()

    def close(self) -> None:
        """A clean stop: a live ledger snapshots what it folded since the last snapshot (not a
        server's that stops: it did or, its store away, did not: atk49 F2, 32 s of retries)."""
        if self.state.live_only and not self.ending:
            try:
                self.snapshot_state()
            except Exception as err:  # a failed snapshot must not turn a stop into a crash
                log.warning("no snapshot at close: %s", err)
        super().close()

    # --- reading --------------------------------------------------------------------------------

    def read(self, after: int, limit: int) -> list[tuple[int, AnyEvent]]:
        """Decoded events after `after`, in log order, as (position, event)."""
        return [
            (n.id, self._decode(n.id, n.state))
            for n in self.recorder.select_notifications(start=after + 1, limit=limit)
        ]

    def follow(
        self,
        after: int,
        until: int | None = None,
        *,
        tags: Sequence[str] | None = None,
        page: int = 10_000,
    ) -> Iterator[tuple[int, AnyEvent]]:
        """The events with `after` < position <= `until` (default: our position), decoded, in
        log order; with `tags`, only those (the store filters by tag, so the others are never
        read or decoded). The in-process form of `projections.source.follow`."""
        stop = self.position if until is None else until
        recent = self._recent
        if recent and recent[0][0] <= after + 1 and stop <= recent[-1][0]:
            wanted = set(tags) if tags is not None else None
            for pos, ev in recent[after + 1 - recent[0][0] :]:
                if pos > stop:
                    return
                if wanted is None or tag_of(type(ev)) in wanted:
                    yield pos, ev
            return
        for records in follow(StoreSource(self.recorder), after, stop, tags=tags, page=page):
            for r in records:
                yield r.position, self._decode(r.position, r.data)

    def _remember(self, folded: Sequence[tuple[int, AnyEvent]]) -> None:
        """Keep events just folded for `follow` (dropped unless they continue the kept ones)."""
        recent = self._recent
        if not folded:
            return
        if folded[-1][0] - folded[0][0] + 1 != len(folded):  # a gap in the positions
            recent.clear()
            return
        if recent and recent[-1][0] + 1 != folded[0][0]:
            recent.clear()
        recent += folded
        if len(recent) > RECENT:
            del recent[: len(recent) - RECENT // 2]

    def kept(self, after: int, until: int) -> list[tuple[int, AnyEvent]] | None:
        """The events with `after` < position <= `until` kept decoded (`_recent`), or None when
        not all are; safe on another thread than the folding one (the list copied whole first)."""
        recent = list(self._recent)
        if not recent or recent[0][0] > after + 1 or recent[-1][0] < until:
            return None
        start = after + 1 - recent[0][0]
        got = recent[start : start + max(0, until - after)]
        if got and (got[0][0] != after + 1 or got[-1][0] != until):
            return None  # not contiguous: never guess
        return got

    def follow_raw(
        self,
        after: int,
        until: int | None = None,
        *,
        tags: Sequence[str] | None = None,
        page: int = 10_000,
    ) -> Iterator[tuple[int, bytes]]:
        """`follow` without decoding: (position, stored bytes)."""
        stop = self.position if until is None else until
        for records in follow(StoreSource(self.recorder), after, stop, tags=tags, page=page):
            for r in records:
                yield r.position, r.data

    @staticmethod
    def _decode(position: int, data: bytes) -> AnyEvent:
        return decode_at(position, data)

    def head(self) -> int:
        return self.recorder.max_notification_id() or 0

    def catch_up(self, until: int | None = None) -> int:
        """Fold every event appended since our position (by us or another writer; up to
        position `until` when given)."""
        source = StoreSource(self.recorder)
        stop = source.head() if until is None else until
        if stop < self.position and until is None and not self.behind:
            return self.rewind(f"the log ends at position {stop}")
        for records in follow(source, self.position, stop, page=self.page):
            folded: list[tuple[int, AnyEvent]] = []
            for r in records:
                ev = self._decode(r.position, r.data)
                if not folded and not self._links(ev):
                    return self.rewind(f"position {r.position} does not link to the event this "
                                       f"server folded at {self.position}")  # fmt: skip
                evolve(self.state, ev)
                self.requests.note(ev.event_id, r.position)
                self.position = r.position
                self.version += 1
                folded.append((r.position, ev))
            self._remember(folded)
            last = records[-1]
            self.last_hash = link(last.position, last.tag, last.data)
        if until is None:
            self._maybe_snapshot()
        return self.position

    def _links(self, ev: AnyEvent) -> bool:
        """Whether `ev`, the next event of the log, links to the last one folded (an older
        rule's link, or a state read back meanwhile, is not checked)."""
        return self.behind or not ev.prev_hash.startswith(V2) or ev.prev_hash == self.last_hash

    def rewind(self, why: str) -> int:
        """The log is behind what this ledger folded, or holds other events where it folded
        (a failover to a standby that never got the last commits, whose rows the old primary
        showed to every session: atk51-ha F2): read the state, and the idempotency keys, back
        from the log. Returns the position."""
        log.error("the log is not the one this server folded (%s): reading the state back", why)
        self.rewound += 1
        self.behind = True
        self._reload()
        return self.position

    # --- writing --------------------------------------------------------------------------------

    def execute(self, cmd: AnyCommand) -> Appended:
        return self.execute_all([cmd])

    def execute_all(self, cmds: Sequence[AnyCommand]) -> Appended:
        """Decide every command against the current state and append all events atomically.

        A rejected command raises a LedgerError and nothing is appended, for the whole batch.
        Single-writer fast path: decide on the in-memory state without asking the store first;
        the (stream, version) constraint catches another writer, and a rejection is confirmed
        against the latest log before it is raised.
        """
        if self.stale:
            self._reload()
        for _ in range(self.retries):
            try:
                scratch, events, free = self._decide(cmds)
            except LedgerError:
                if self.position == self.catch_up():
                    raise  # rejected by the latest state
                continue  # another writer moved the log: decide again
            if not events:
                return Appended(events=[], position=self.position)
            bounded = self.bounded and _bounded(cmds)
            stored, events, back = self._stored(events, bounded=bounded, free=free)
            ids = self._insert(stored)
            if ids is None:
                self.refresh()  # another writer appended first: catch up and decide again
                continue
            del scratch  # decided on; the state folds the chained events that were stored
            for ev in events:
                evolve(self.state, ev)
            self.version += len(events)
            self.position = ids[-1] if ids else self.head()
            if ids and len(ids) == len(back):
                self._remember(list(zip(ids, back, strict=True)))
            else:
                self._recent.clear()
            self.last_hash = _link_of(stored[-1])
            self._maybe_snapshot()
            return Appended(events=events, position=self.position)
        raise Conflict("the log kept moving under this command", hint="retry it")

    def execute_each(
        self, cmds: Sequence[AnyCommand], keys: Sequence[str | None] | None = None
    ) -> list[Appended | LedgerError]:
        """Group commit: decide each command on its own, in order, each seeing the ones before it
        that were accepted, and append all accepted events in ONE store transaction. A rejected
        command gets its LedgerError in its slot and changes nothing; its neighbours go on.

        Single-writer fast path, as `execute_all`: decide on the in-memory state without asking
        the store first; the (stream, version) constraint catches another writer, and rejections
        are confirmed against the latest log before they are answered. The state itself folds
        each accepted command's events as it goes (no copy of it per batch: a copy cost ~60 us
        at 6k live jobs and grew with them); when the batch is not stored after all (another
        writer, a store error), the state is read back from the log (`_reload`) before anything
        else sees it.

        `keys`: each command's idempotency key (None: none); a command whose key the log already
        holds (`ledger.store.requests`) is answered with the event its first try appended."""
        for attempt in range(self.retries):
            if attempt or self.stale:
                self._reload()
            try:
                done = self._fold_each(cmds, keys or [None] * len(cmds))
            except BaseException:
                if self.ending:  # a server stopping folds nothing more: no wait on a store
                    self.stale = True  # that went away (atk33-28 F4)
                    raise
                self._reload()  # a bug in a fold: the state may hold part of a batch
                raise
            if done is not None:
                return done
        self._reload()
        raise Conflict("the log kept moving under these commands", hint="retry them")

    def _fold_each(
        self, cmds: Sequence[AnyCommand], keys: Sequence[str | None]
    ) -> list[Appended | LedgerError] | None:
        """One attempt of `execute_each` (None: the log moved; the state holds folds to undo)."""
        version, prev = self.version, self.last_hash
        now = self.clock.now()
        outcomes: list[tuple[int, list[AnyEvent]] | LedgerError | Appended] = []
        stored: list[StoredEvent] = []
        backs: list[AnyEvent] = []  # the stored events as read back, for `_remember`
        batch: dict[str, int] = {}  # keyed event id -> its outcome's slot in this batch
        for cmd, key in zip(cmds, keys, strict=True):
            eid = keyed_id(cmd.actor, key, _request_bytes(cmd)) if key else None
            if eid is not None and (eid[:KEY_PART] in batch or self.requests.find(eid) is not None):
                outcomes.append(self._answered(eid, batch, outcomes))
                continue
            try:
                self._check_conflicts([cmd])
                decided, free = self._decide_one(self.state, cmd, now)
                if eid is not None and decided:
                    decided[0] = msgspec.structs.replace(decided[0], event_id=eid)
                    batch[eid[:KEY_PART]] = len(outcomes)
                bounded = self.bounded and _bounded([cmd])
                mine, chained, read_back = self._stored(decided, version, prev, bounded, free)
            except LedgerError as err:
                outcomes.append(err)
                continue
            except Exception as err:  # a bug must not fail the neighbours: this one only
                log.exception("command %s failed", type(cmd).__name__)
                outcomes.append(LedgerError(f"internal error: {type(err).__name__}"))
                continue
            for ev in chained:  # the next command sees this one
                evolve(self.state, ev)
            if mine:
                prev = _link_of(mine[-1])
            version += len(mine)
            stored += mine
            backs += read_back
            outcomes.append((len(stored), chained))
        if any(isinstance(o, LedgerError) for o in outcomes) and self.head() != self.position:
            return None  # rejected on a state another writer has moved since: decide again
        if not stored:
            return [o if isinstance(o, LedgerError | Appended) else Appended(o[1], self.position)
                    for o in outcomes]  # fmt: skip
        ids = self._insert(stored)
        if ids is None:
            return None  # another writer appended first: catch up and decide again
        self.version, self.last_hash = version, prev
        self.position = ids[-1] if ids else self.head()
        if ids and len(ids) == len(backs):  # kept for `follow` and `kept`, as `execute_all`
            self._remember(list(zip(ids, backs, strict=True)))
        else:
            self._recent.clear()
        first = self.position - len(stored)
        for slot in batch.values():
            done = outcomes[slot]
            if isinstance(done, tuple):
                self.requests.note(done[1][0].event_id, first + done[0] - len(done[1]) + 1)
        self._maybe_snapshot()
        return [o if isinstance(o, LedgerError | Appended) else Appended(o[1], first + o[0])
                for o in outcomes]  # fmt: skip

    def _answered(
        self,
        eid: str,
        batch: dict[str, int],
        outcomes: list[tuple[int, list[AnyEvent]] | LedgerError | Appended],
    ) -> tuple[int, list[AnyEvent]] | LedgerError | Appended:
        """The answer to a command whose key was seen: what its first try appended (its first
        event), or what the first try's slot in this batch gets: its very outcome, answered as
        the first copy's after the commit (atk49 F1: not refused while the first commits)."""
        slot = batch.get(eid[:KEY_PART])
        if slot is not None:
            first = outcomes[slot]
            if isinstance(first, tuple) and first[1] and first[1][0].event_id != eid:
                return Conflict(
                    "this key was used for a different request",
                    hint="use a new Idempotency-Key for each command; a retry sends the same one",
                )
            return first
        position = self.requests.find(eid)
        if not self.requests.same_request(eid):
            return self._key_held(position)
        assert position is not None
        return Appended([ev for _, ev in self.read(position - 1, 1)], position)

    def _key_held(self, position: int | None) -> Conflict:
        """A key sent with another request than its first: what the key holds, named (a retry
        from a changed shell, its job's environment another, was told to take a new key, and a
        new key made a second job: atk51-ha F4)."""
        held = [ev for _, ev in self.read(position - 1, 1)] if position else []
        job = getattr(held[0], "job_id", None) if held else None
        what = f"job {job}" if job is not None else f"the event at position {position}"
        return Conflict(
            f"this key was used for a different request: it holds {what}",
            hint=f"`gpuledger jobs` and `gpuledger log` show {what}; it is the first request's "
            "answer (a retry from another shell or directory differs in its job's environment); "
            "a new key makes a new command",
        )

    def _insert(self, stored: list[StoredEvent]) -> Sequence[int] | None:
        """Append `stored` (None: another writer holds these versions). A store that committed
        but whose answer was lost (a retried insert then meets its own rows) is told from a
        competing writer by the bytes: the rows at those versions are ours, byte for byte."""
        try:
            if self.dsn is None:  # one SQLite file: nothing else shows rows it may lose
                return self.recorder.insert_events(stored)
            first = stored[0].originator_version
            return self.recorder.insert_events(stored, builds_on=(first - 1, self.last_hash))
        except LogBehind as err:
            log.error("%s: reading the state back from the log", err)
            self.rewound += 1
            self.behind = self.stale = True  # read back before the next decision (`execute_*`)
            return None
        except IntegrityError:
            first = stored[0].originator_version
            there = self.recorder.select_notifications(start=first, limit=len(stored))
            if [n.state for n in there] == [se.state for se in stored]:
                log.warning("positions %d-%d were committed by this server's own retry",
                            first, first + len(stored) - 1)  # fmt: skip
                return [n.id for n in there]
            return None
        except PersistenceError as err:
            if "gpuledger: not the leader" not in str(err):
                raise
            raise Unavailable(
                "this server is not the leader any more: another server took over (the store "
                "fenced its append: nothing of it was written)",
                hint="retry: clients find the leader",
            ) from err

    def _reload(self) -> None:
        """The state as the log holds it: from the newest snapshot (a live ledger) or the start,
        then every event after it (after folds that were not stored).

        Built aside (on a shallow copy of this ledger, sharing its store) and put in place
        whole: while the store is away the reload waits on it, and other threads (the server's
        reads, its token checks, the node leases it keeps for its agents) go on seeing the
        state that was folded, never an empty one (atk33-28 F1/F2: an empty state while a
        reload waited answered valid tokens 401 and let running jobs' node leases lapse)."""
        self.stale = True  # until the log is read back whole (a store that is down: later)
        fresh = _Aside.__new__(_Aside)
        fresh.__dict__.update(self.__dict__)
        fresh._recent = []
        fresh.state = State(live_only=self.state.live_only)
        fresh.version = fresh.position = fresh.snapshot_position = 0
        fresh.last_hash = ""
        if fresh.state.live_only:
            fresh._restore()
        fresh.restored_from = self.restored_from
        fresh.catch_up()
        self.state, self.version, self.position = fresh.state, fresh.version, fresh.position
        self.snapshot_position, self.last_hash = fresh.snapshot_position, fresh.last_hash
        self.refused_snapshot = fresh.refused_snapshot
        self._recent = fresh._recent
        self.stale = False
        if self.behind:  # keys of events the log lost are no one's now
            self.requests = Requests()
            self.requests.scan(self.follow_raw(max(0, self.position - requests.SCANNED)))
            self.behind = False

    def refresh(self) -> int:
        """Fold what the log gained since our position; after a write the store failed midway
        (`stale`), read the state back from the log first."""
        if self.stale:
            self._reload()
            return self.position
        return self.catch_up()

    def _decide(self, cmds: Sequence[AnyCommand]) -> tuple[State, list[AnyEvent], set[str]]:
        self._check_conflicts(cmds)
        now = self.clock.now()
        if len(cmds) == 1:
            return self.state, *self._decide_one(self.state, cmds[0], now)
        scratch, events, free = self.state.copy(), [], set()
        for cmd in cmds:
            decided, ends = self._decide_one(scratch, cmd, now)
            for ev in decided:
                evolve(scratch, ev)
            events += decided
            free |= ends
        return scratch, events, free

    def _decide_one(self, state: State, cmd: AnyCommand, now: float) -> tuple[_Evs, set[str]]:
        """`decide` after the edge's `admit` (when set), and its dependents' ends' event ids."""
        if self.admit is not None:
            cmd = self.admit(state, cmd)
        own, ends = decide_parts(state, cmd, now, self.ids)
        return own + ends, {ev.event_id for ev in ends}

    def _stored(
        self,
        decided: list[AnyEvent],
        version: int | None = None,
        prev: str | None = None,
        bounded: bool = True,
        free: Set[str] = frozenset(),
    ) -> tuple[list[StoredEvent], list[AnyEvent], list[AnyEvent]]:
        """Chain, encode through the mapper once, and prove every event reads back as itself:
        what the store cannot hold faithfully (inf, NaN, lone surrogates) is rejected, and,
        `bounded`, what a reader could not take (`bounds.check_written`: an event past the relay's
        record size, a request writing more than its bound; the events `free` names, dependents'
        ends a job's end drags along, to the event's bound only: atk46-25 F1). Returns the stored
        events, the chained events and the chained events as read back."""
        out, events, back, written = [], [], [], 0
        prev = self.last_hash if prev is None else prev
        version = self.version if version is None else version
        for i, unchained in enumerate(decided):
            ev = msgspec.structs.replace(unchained, prev_hash=prev)
            events.append(ev)
            try:
                se = self.mapper.to_stored_event(Recorded(STREAM_ID, version + i + 1, ev))
                read = codec.decode(se.state)
                faithful = read == ev
            except (UnicodeEncodeError, EventDecodeError, ValueError) as err:
                raise InvalidCommand(
                    f"{tag_of(type(ev))} cannot be stored: {err}",
                    hint="use finite numbers and valid UTF-8 text",
                ) from err
            if not faithful:
                raise InvalidCommand(
                    f"{tag_of(type(ev))} would not read back as written",
                    hint="use finite numbers (no inf or NaN)",
                )
            if bounded and ev.event_id in free:
                check_written(tag_of(type(ev)), len(se.state), 0)
            elif bounded:
                check_written(tag_of(type(ev)), len(se.state), written)
                written += len(se.state)
            out.append(se)
            back.append(read)
            prev = _link_of(se)
        return out, events, back

    def _check_conflicts(self, cmds: Sequence[AnyCommand]) -> None:
        """Conflict for a command whose keys an event after its `expected_position` changed: the
        log after the oldest read once, from the events kept decoded (`conflicts.oldest`)."""
        oldest = conflicts.oldest(cmds, self.position)
        if oldest is not None:
            conflicts.check(self.state, cmds, list(self.follow(oldest)))


def _bounded(cmds: Sequence[AnyCommand]) -> bool:
    """Whether the bounds of what a request writes apply: to everything but the dispatcher's
    decision records (a cycle is never refused for its size)."""
    return not any(isinstance(cmd, ApplyDecision) for cmd in cmds)  # and `Ledger.bounded`


def _request_bytes(cmd: AnyCommand) -> bytes:
    """What tells one keyed request from another (an admin's `--as` included)."""
    return msgspec.json.encode(cmd)


def _link_of(stored: StoredEvent) -> str:
    """The link to an event about to be stored: its position is its stream version (one stream:
    they move together, and the audit checks every row for it)."""
    return link(stored.originator_version, stored.topic, stored.state, stored.originator_version)


class _Aside(Ledger):
    """A ledger's shallow copy that a reload builds the state in (`Ledger._reload`): it shares
    the ledger's store, which it never closes (an `Application` closes its store when it is
    collected)."""

    def __del__(self) -> None:
        pass
