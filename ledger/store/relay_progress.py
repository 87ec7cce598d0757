"""The relay's progress kept in the event store: per topic, the highest log position a relay of
this ledger knows it committed there (`gpuledger_relay_progress`, one row per topic).

The progress decides which unsigned records on the topic may be the relay's own (its bookmark,
`relay_tail.Scan.vouched`): anyone who can write the topic can rebuild the exact bytes of an
event not yet published, and taken as the bookmark the events before it were never published
(atk46-25 F3). Kept in the server's `<home>/relay.json` alone, a server with no such file (a
standby's first lead, a leader on another host after a failover, a lost file) had no progress
and trusted the topic. The store is what every server of a ledger shares (the SQLite file of
the home; the PostgreSQL database, beside the lease's row), so any leader on any host finds it.

Written *after* the Kafka commit it names, never before (a progress ahead of the topic would
vouch for a forged copy of an event not yet published), as one upsert that only raises it
(`max`: two relays, say a deposed leader's last commit and the new one's, never lower it),
once every `EVERY_S` while the relay advances (sooner, every `EVERY_N` positions) and once
more when it stops. A progress behind the topic costs nothing: the relay's own records beyond it
follow its last one within it and are taken too (`relay_tail.Scan.follows`); at worst (none
within it in the windows read) they are published again, duplicates readers pass over, never a
gap. So a failed write is logged and retried at the next one, never a stop. `gpuledger init`
makes the table (`begin`): no row then means nothing published (0), not "no word" (None, a store
of an earlier version).

An edge (the store). The rules (`trusted`, `due`) are pure.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eventsourcing.sqlite import SQLiteApplicationRecorder

log = logging.getLogger("gpuledger.relay")

TABLE = "gpuledger_relay_progress"
EVERY_S = 1.0
"""How often at most the progress is written while the relay advances: one small write a
second, whatever the batches (a committed batch can be one event, twenty a second at the
relay's 50 ms poll); a relay killed between two writes leaves at most a second of its records
past its progress, which the next one takes by following (no duplicate)."""
EVERY_N = 5_000
"""... or sooner, once the relay is this many positions past the last write (a full batch of
the relay's: a catch-up at ~100k events a second would leave a second's 100k records past the
progress, which a restart reads back to find one within it; one write per 5,000 events costs
about a microsecond an event)."""

_SQLITE_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} "
    "(topic TEXT PRIMARY KEY, position INTEGER NOT NULL, kept_at TEXT NOT NULL)"
)
_SQLITE_KEEP = (
    f"INSERT INTO {TABLE} (topic, position, kept_at) VALUES (?, ?, datetime('now')) "
    "ON CONFLICT (topic) DO UPDATE SET position = excluded.position, kept_at = excluded.kept_at "
    f"WHERE excluded.position > {TABLE}.position"
)
_PG_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} "
    "(topic text PRIMARY KEY, position bigint NOT NULL, kept_at timestamptz NOT NULL)"
)
_PG_KEEP = (
    f"INSERT INTO {TABLE} (topic, position, kept_at) VALUES (%s, %s, now()) "
    "ON CONFLICT (topic) DO UPDATE SET position = excluded.position, kept_at = now() "
    f"WHERE excluded.position > {TABLE}.position"
)


@contextlib.contextmanager
def opened(home: Path, store: str | None = None) -> Iterator[Any]:
    """The recorder of the store of `home` (`store`: that PostgreSQL DSN instead), closed after:
    for a command that keeps or reads the progress once (init, store copy and restore)."""
    from ledger.store.relay import open_store

    recorder = open_store(home, store)
    try:
        yield recorder
    finally:
        recorder.datastore.close()  # type: ignore[attr-defined]


def trusted(*known: int | None, head: int | None = None) -> int | None:
    """Pure: the relay's progress from the words it has (the store's row, the service's
    `relay.json`, ...), each a position committed on the topic or None (no word): the highest,
    or None when none has a word. A word beyond the store's `head` is no word: a progress is
    written only after a Kafka commit of the store's events, so it is an edit (a store row or a
    relay.json raised to 1,000 with the head at 27 made a rebuilt copy of event 27 the relay's
    bookmark, and 25-26 never reached the topic while `relay status` said 0 behind: atk47-25
    F1, F4); with no other word the progress is 0 (only the relay's records that follow the
    start of the log are its own: at worst duplicates, never a gap), not None (any matching
    record would be taken)."""
    words = [k for k in known if k is not None]
    kept = [k for k in words if head is None or k <= head]
    return max(kept) if kept else (0 if words else None)


def beyond(head: int, **words: int | None) -> list[str]:
    """Pure: each named progress word beyond the store's `head`, as a phrase (empty: none)."""
    return [
        f"{name} says position {word:,}, beyond the store's head {head:,}"
        for name, word in words.items()
        if word is not None and word > head
    ]


def edits(home: Path, head: int) -> list[str]:
    """Each progress the store (its table) or the home (`relay.json`) keeps beyond the store's
    `head`, as a phrase: an edit, since a progress is written only after a Kafka commit of the
    store's events (`audit verify` names them; the relay takes none of them, `trusted`)."""
    from ledger.store.relay import RelayError
    from ledger.store.relay_service import read_health

    with opened(home) as recorder:
        words = {f"the relay's progress on topic {t} (store)": p for t, p in rows(recorder)}
    try:
        health = read_health(home)
    except RelayError:
        health = None
    if health is not None:
        words[f"relay.json's position on topic {health.topic}"] = health.position
    return [f"{w}: an edited progress" for w in beyond(head, **words)]


def due(
    position: int, kept: int, since_s: float, every_s: float = EVERY_S, every_n: int = EVERY_N
) -> bool:
    """Pure: whether a relay at `position` writes its progress, `kept` being the last it wrote
    (or read) and `since_s` the seconds since it last wrote: only forward, once every `every_s`
    or sooner once `every_n` positions past `kept` (a stopping relay passes `every_s=0`)."""
    return position > kept and (since_s >= every_s or position - kept >= every_n)


def read(recorder: Any, topic: str) -> int | None:
    """The progress the store keeps for `topic`: its row; 0 when the table has none for it (the
    table is made with the store, `begin`, or by the first write: no relay of this ledger
    committed there since); None when there is no table (a store of an earlier version whose
    relay has written none yet) or the store keeps none (a test's recorder)."""
    if isinstance(recorder, SQLiteApplicationRecorder):
        import sqlite3

        from eventsourcing.persistence import OperationalError

        with recorder.datastore.transaction(commit=False) as cursor:
            try:
                cursor.execute(f"SELECT position FROM {TABLE} WHERE topic = ?", (topic,))
            except (sqlite3.OperationalError, OperationalError) as e:
                if "no such table" in str(e):
                    return None
                raise
            row = cursor.fetchone()
        return 0 if row is None else int(row[0])
    pool = getattr(getattr(recorder, "datastore", None), "pool", None)
    if pool is None:  # a store that keeps no progress (a test's recorder)
        return None
    import psycopg

    with recorder.datastore.get_connection() as conn:
        try:
            query = f"SELECT position FROM {TABLE} WHERE topic = %s"
            row = conn.execute(query, (topic,)).fetchone()
        except psycopg.errors.UndefinedTable:
            return None
    if row is None:
        return 0
    return int(row["position"] if isinstance(row, dict) else row[0])


def rows(recorder: Any) -> list[tuple[str, int]]:
    """Every (topic, progress) the store keeps, by topic (none: no table, or a store that keeps
    none): what `gpuledger store copy` carries over."""
    query = f"SELECT topic, position FROM {TABLE} ORDER BY topic"
    if isinstance(recorder, SQLiteApplicationRecorder):
        import sqlite3

        from eventsourcing.persistence import OperationalError

        with recorder.datastore.transaction(commit=False) as cursor:
            try:
                cursor.execute(query)
            except (sqlite3.OperationalError, OperationalError) as e:
                if "no such table" in str(e):
                    return []
                raise
            return [(str(t), int(p)) for t, p in cursor.fetchall()]
    if getattr(getattr(recorder, "datastore", None), "pool", None) is None:
        return []
    import psycopg

    with recorder.datastore.get_connection() as conn:
        try:
            got = conn.execute(query).fetchall()
        except psycopg.errors.UndefinedTable:
            return []
    return [(str(r["topic"]), int(r["position"])) for r in got]


def begin(recorder: Any) -> None:
    """Make the table, empty, in a new store (`gpuledger init`): from then on no row for a topic
    means no relay of this ledger committed there (`read` gives 0), so a rebuilt copy of an
    event on a topic the ledger's first relay finds is never its bookmark."""
    keep(recorder, None, 0)


def keep(recorder: Any, topic: str | None, position: int) -> None:
    """Raise the progress the store keeps for `topic` to `position` (never lower it): one
    statement, its own transaction. The table is made on the first write (`topic` None: only
    that)."""
    if isinstance(recorder, SQLiteApplicationRecorder):
        with recorder.datastore.transaction(commit=True) as cursor:
            cursor.execute(_SQLITE_TABLE)
            if topic is not None:
                cursor.execute(_SQLITE_KEEP, (topic, position))
        return
    pool = getattr(getattr(recorder, "datastore", None), "pool", None)
    if pool is None:
        return
    from ledger.store.leaseschema import SCHEMA_LOCK

    with recorder.datastore.get_connection() as conn:
        made = conn.execute("SELECT to_regclass(%s) IS NOT NULL AS made", (TABLE,)).fetchone()
        if not (made["made"] if isinstance(made, dict) else made[0]):
            # under the schema's lock: two relays making it at once would clash in the catalog
            conn.execute(
                f"BEGIN; SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); {_PG_TABLE}; COMMIT;"
            )
        if topic is not None:
            conn.execute(_PG_KEEP, (topic, position))


class Kept:
    """The progress of one relay in the store: read when it connects, written as it advances
    (`advance`: at most every `every_s`; `flush`: now), failures logged, never raised."""

    def __init__(self, recorder: Any, topic: str, every_s: float = EVERY_S) -> None:
        self.recorder = recorder
        self.topic = topic
        self.every_s = every_s
        self.kept = 0
        """The highest position written to (or read from) the store."""
        self._at = float("-inf")
        self._failing = False

    def read(self, head: int | None = None) -> int | None:
        """The store's word (raises the store's errors: the relay reconnects); a word beyond
        the store's `head` is returned but not taken as written (`trusted` drops it)."""
        got = read(self.recorder, self.topic)
        if got is not None and (head is None or got <= head):
            self.kept = max(self.kept, got)
        return got

    def advance(self, position: int) -> None:
        now = time.monotonic()
        if due(position, self.kept, now - self._at, self.every_s):
            self._write(position, now)

    def flush(self, position: int) -> None:
        if due(position, self.kept, 0.0, every_s=0.0):
            self._write(position, time.monotonic())

    def _write(self, position: int, now: float) -> None:
        self._at = now
        try:
            keep(self.recorder, self.topic, position)
        except Exception as e:  # behind costs duplicates, never a gap: go on publishing
            (log.debug if self._failing else log.warning)(
                "relay: cannot keep its progress (position %d) in the store: %s: %s; tried "
                "again in %g s (a restart publishes again what it has not kept)",
                position,
                type(e).__name__,
                e,
                self.every_s,
            )
            self._failing = True
            return
        if self._failing:
            log.warning("relay: its progress is kept in the store again (position %d)", position)
        self._failing = False
        self.kept = max(self.kept, position)
