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

**Tamper evidence** (docs/security.md, row T8). Someone who can write the store could raise the
row to a position not yet published (at or below the store's head) and send a rebuilt copy of
that event: the copy, within the progress, became the relay's bookmark and the events before it
never reached the topic (atk47-25 F1); or lower it and copy an old record to the tail, and
everything after it was published again. So each row carries a MAC (`mac`) under the service's
state key (`ledger.store.snapshots.state_key`, as snapshots do) over the topic, the position and
the link to the store's event at that position (`projections.chain.link`: a row is this log's,
never another ledger's). A relay with the key takes a row whose MAC does not verify (edited,
written by an earlier version, or under another server's key: share `GPULEDGER_STATE_KEY_FILE`
between the servers of a ledger) as no vouch: only records following the start of the log (or
signed) are its own, and it reads on while its best is below the row (`words`: a *floor*, so a
lowered or unverified row costs a longer read, never a gap nor a duplicate), and rewrites the
row with its own MAC at its next write. The MAC names the key that made it (`key_id`): `audit
verify` names a row whose MAC names the home's key and does not verify (`edits`: an edited
position); a row with no MAC or another key's (an earlier version's, another server's home
without a shared key file, or stripped by whoever edited it) it cannot check, and says nothing:
the relay takes such a row as no vouch all the same, so it can cost a longer read at start,
never a gap nor a duplicate.

**The record it names** (s53). A row names the topic's id and the offset of the committed
record of its position (`topic_id`, `record_offset`; in the MAC, v2), and the relay takes that
one record as the start of its bookmark (`anchor`), never a record by its signature or by a
position within the progress: a saved record of the relay's put back onto a topic made again
(signed, or unsigned within the progress) was the bookmark, and the events before it never
reached the topic (atk52-25 F1 (a), (b), (d)). A row naming another topic id says the topic was
made again since the relay's last commit (`elsewhere`): the relay publishes the log to it from
position 1, and the row is replaced at its first write there, whatever its position. On one
topic id it only goes forward: a higher position, or a later commit (a higher offset) whatever
its position: after the broker lost the end of the topic the relay publishes positions at or
below the row's again, and the row kept naming an offset that no longer held its record, every
restart reading the whole topic (atk53-25 F2). The relay takes the record the row names only
when a commit marker follows it and it carries the time the broker appended the relay's
record, which the row keeps too (`append_ms`, in the MAC: v3; the topic is `LogAppendTime`, so
the broker stamps it, not a producer): after the broker lost the end of the topic a saved record
put back at that offset, by a transactional writer too (a marker after it), reads with a later
time (`relay_tail.not_taken`, atk53-25 F1). A row without a time (v2, an earlier version's or a
`CreateTime` topic's) keeps the marker check alone; one without an id and offset (an earlier
version's, `store restore`'s) is unknown: the relay reads the topic from its start once.

An edge (the store). The rules (`trusted`, `words`, `anchor`, `elsewhere`, `due`, `mac`) are
pure.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, NamedTuple

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
    f"CREATE TABLE IF NOT EXISTS {TABLE} (topic TEXT PRIMARY KEY, position INTEGER NOT NULL, "
    "kept_at TEXT NOT NULL, mac TEXT, topic_id TEXT, record_offset INTEGER, append_ms INTEGER)"
)
_SQLITE_KEEP = (
    f"INSERT INTO {TABLE} (topic, position, kept_at, mac, topic_id, record_offset, append_ms) "
    "VALUES (?, ?, datetime('now'), ?, ?, ?, ?) "
    "ON CONFLICT (topic) DO UPDATE SET position = excluded.position, kept_at = excluded.kept_at, "
    "mac = excluded.mac, topic_id = excluded.topic_id, record_offset = excluded.record_offset, "
    "append_ms = excluded.append_ms "
    f"WHERE excluded.position > {TABLE}.position "
    f"OR (excluded.topic_id IS NOT NULL AND excluded.topic_id IS NOT {TABLE}.topic_id) "
    f"OR (excluded.record_offset IS NOT NULL AND ({TABLE}.record_offset IS NULL "
    f"OR excluded.record_offset > {TABLE}.record_offset))"
)
_PG_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (topic text PRIMARY KEY, position bigint NOT NULL, "
    "kept_at timestamptz NOT NULL, mac text, topic_id text, record_offset bigint, append_ms bigint)"
)
_PG_KEEP = (
    f"INSERT INTO {TABLE} AS kept (topic, position, kept_at, mac, topic_id, record_offset, "
    "append_ms) VALUES (%s, %s, now(), %s, %s, %s, %s) "
    "ON CONFLICT (topic) DO UPDATE SET position = excluded.position, kept_at = now(), "
    "mac = excluded.mac, topic_id = excluded.topic_id, record_offset = excluded.record_offset, "
    "append_ms = excluded.append_ms "
    "WHERE excluded.position > kept.position "
    "OR (excluded.topic_id IS NOT NULL AND excluded.topic_id IS DISTINCT FROM kept.topic_id) "
    "OR (excluded.record_offset IS NOT NULL AND (kept.record_offset IS NULL "
    "OR excluded.record_offset > kept.record_offset))"
)
"""Only forward on one topic: a higher position, or a later commit (a higher offset: the relay
published positions at or below the row's again after the broker lost the end of the topic,
atk53-25 F2; the row named an offset that no longer held its record, and every restart read the
whole topic); a row for another topic (the topic made again: another topic id) is replaced
whatever its position (the relay publishes the log again from position 1 there). A late flush of
a deposed leader's relay (an earlier commit: a lower offset) never replaces a later one's."""
_COLUMNS = (
    ("mac", "TEXT", "text"),
    ("topic_id", "TEXT", "text"),
    ("record_offset", "INTEGER", "bigint"),
    ("append_ms", "INTEGER", "bigint"),
)
"""Columns a table made by an earlier version may lack (`mac` before s47, the topic id and the
offset before s53, the append time before s54): added at the first write."""


def _pg(sql: str, recorder: Any) -> str:
    """`sql` with the table named in the store's schema (`pgread.store_schema`, the recorder's):
    unqualified, it went wherever a session's search_path put it, not beside the events."""
    schema = getattr(recorder.datastore, "schema", "") or "public"
    return sql.replace(TABLE, f'"{schema}".{TABLE}')


class Word(NamedTuple):
    """The store's row for a topic as a relay reads it."""

    position: int | None
    """As `read` gives it (None: no table)."""
    verified: bool
    """Its MAC verifies under the relay's state key and names the store's event at `position`
    (True without a key: nothing to check it with; and for 0 and None, which vouch for
    nothing)."""
    topic_id: str | None = None
    """Kafka's id of the topic the relay committed `position` to (None: unknown, a row of an
    earlier version, `store restore`'s, or none)."""
    offset: int | None = None
    """The offset of that committed record on that topic (None: unknown)."""
    stamp: int | None = None
    """The time the broker appended that record (ms since the epoch, the topic being
    `LogAppendTime`; None: unknown, a row of an earlier version or of a `CreateTime` topic)."""


class Committed(NamedTuple):
    """Where the relay committed a record: the topic's id, the record's offset and the time the
    broker appended it (None: unknown, a `CreateTime` topic)."""

    topic_id: str
    offset: int
    stamp: int | None = None


class Anchor(NamedTuple):
    """The one record a relay may take as its bookmark by its progress: its own committed record
    of `position` at `offset` on the topic whose id the progress names (atk52-25 F1: a record
    replayed onto a topic made again, signed or within the progress, was taken as the bookmark
    and the events before it never reached the topic). Anything else on the topic is taken only
    as the store's next event after one taken (`relay_tail.Scan.follows`)."""

    offset: int
    position: int
    stamp: int | None = None
    """The append time the record must read with (`relay_tail.stamped`; None: not checked)."""


def anchor(word: Word, topic_id: str, head: int) -> Anchor | None:
    """Pure: the record the store's row lets the relay take as its bookmark on the topic whose
    id is `topic_id` now: the row's, when it verifies, lies within the store's `head` and names
    this topic id and an offset (None otherwise: the relay reads the topic from its start)."""
    p = word.position
    if not p or not word.verified or p > head or word.offset is None:
        return None
    if not topic_id or word.topic_id != topic_id:
        return None
    return Anchor(word.offset, p, word.stamp)


def elsewhere(topic: str, word: Word, topic_id: str) -> str | None:
    """Pure: why the relay's last commit was to another topic than the one named `topic` now
    (None: the same, or unknown): the store's row, verified, names another topic id. The topic
    was deleted and made again since: no record on it is vouched for (a record of the progress
    position replayed onto it was the bookmark: atk52-25 F1 (a), (b), (d)); the relay reads it
    from its start and takes only the store's log in order from position 1 there (`relay_tail.
    Scan.reach`: a leader of this ledger killed after its first commit to it, before it replaced
    the row, left 1..m there, and the next one published them again: atk58 F2), then publishes
    the rest after it."""
    if not word.position or not word.verified or not word.topic_id or not topic_id:
        return None
    if word.topic_id == topic_id:
        return None
    return (
        f"topic {topic} was deleted and made again since the relay last committed to it (the "
        f"store's progress, position {word.position:,}, names topic id {word.topic_id}; the "
        f"topic's is {topic_id})"
    )


def again_after(found: int) -> str:
    """Pure: what a relay publishing the log again to a topic made again says of the records of
    the log it found there from position 1 (`found` of them; "" when none)."""
    if not found:
        return ""
    return (
        f": positions 1..{found:,} are on it already, in order (a relay of this ledger "
        "committed them there before it stopped or lost its lease)"
    )


@contextlib.contextmanager
def opened(home: Path, store: str | None = None) -> Iterator[Any]:
    """The recorder of the store of `home` (`store`: that PostgreSQL DSN instead), closed after:
    for a command that keeps or reads the progress once (init, store copy and restore)."""
    from ledger.store.relay_raw import open_store

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


def words(store: Word, home: int | None, head: int) -> tuple[int | None, int]:
    """Pure: (vouch, floor) of a relay from the store's row and the home's `relay.json` word.
    `vouch`: unsigned records equal to the store's event up to it are the relay's own
    (`relay_tail.Scan.vouched`; None: any, the residual of a store of an earlier version with
    no table, where relay.json still vouches). `floor`: the relay reads the topic on while its
    best record is below it (`relay_tail.bookmark`). A row vouches only when its MAC verifies
    and it is within the head; relay.json only for a store without the table (a home
    upgraded): beside a table it is a floor, never a vouch (raised, it made a rebuilt copy the
    bookmark: atk47-25 F4). Every word within the head is a floor: one raised costs a longer
    read (up to the whole topic), never a gap; one lowered never makes the relay stop below the
    others."""
    within = [w for w in (store.position, home) if w is not None and w <= head]
    floor = max(within, default=0)
    if store.position is None:
        return trusted(home, head=head), floor
    ok = store.verified and store.position <= head
    return (store.position if ok else 0), floor


def key_id(key: bytes) -> str:
    """Pure: which state key signed a row (a digest of it, never the key)."""
    return hashlib.sha256(b"gpuledger.state-key-id\0" + key).hexdigest()[:12]


def mac(
    key: bytes,
    topic: str,
    position: int,
    link: str,
    topic_id: str | None = None,
    offset: int | None = None,
    stamp: int | None = None,
) -> str:
    """Pure: the MAC of a progress row, `<key id>:<hex>`: HMAC-SHA256 under the state key of the
    topic, the position and the link to the store's event there ("" for 0), and (v2) the topic
    id and the offset the row names (a row without them: v1, an earlier version's), and (v3)
    the time the broker appended that record (a row without it: v2, an earlier version's or a
    `CreateTime` topic's)."""
    if topic_id is None and offset is None and stamp is None:
        text = f"gpuledger.relay-progress.v1\0{topic}\0{position}\0{link}".encode()
    elif stamp is not None:
        text = (
            f"gpuledger.relay-progress.v3\0{topic}\0{position}\0{link}\0{topic_id or ''}"
            f"\0{'' if offset is None else offset}\0{stamp}"
        ).encode()
    else:
        text = (
            f"gpuledger.relay-progress.v2\0{topic}\0{position}\0{link}\0{topic_id or ''}"
            f"\0{'' if offset is None else offset}"
        ).encode()
    return f"{key_id(key)}:{hmac.new(key, text, hashlib.sha256).hexdigest()}"


def link_at(recorder: Any, position: int) -> str | None:
    """The link to the store's event at `position` ("" for 0; None: the store has none)."""
    if position == 0:
        return ""
    from ledger.store.relay_raw import read_raw
    from projections.chain import link

    got = read_raw(recorder, position - 1, 1)
    if not got or got[0].position != position:
        return None
    return link(position, got[0].tag, got[0].data)


Verdict = Literal["signed", "edited", "unsigned"]
"""A row's MAC under a key: it verifies; it names that key and does not verify (or is not a
MAC: an edit); there is none, or it names another key (an earlier version's row, another
server's key: nothing to check it with)."""


def verdict(
    recorder: Any,
    key: bytes,
    topic: str,
    position: int,
    got: str | None,
    topic_id: str | None = None,
    offset: int | None = None,
    stamp: int | None = None,
) -> Verdict:
    """What `got`, the MAC a row for (`topic`, `position`, `topic_id`, `offset`, `stamp`)
    carries, is under `key`."""
    if not got:
        return "unsigned"
    kid, sep, _hex = got.partition(":")
    if sep and kid != key_id(key) and len(kid) == 12:
        return "unsigned"
    at = link_at(recorder, position)
    want = None if at is None else mac(key, topic, position, at, topic_id, offset, stamp)
    ok = want is not None and hmac.compare_digest(want, got)
    return "signed" if ok else "edited"


def beyond(head: int, **words: int | None) -> list[str]:
    """Pure: each named progress word beyond the store's `head`, as a phrase (empty: none)."""
    return [
        f"{name} says position {word:,}, beyond the store's head {head:,}"
        for name, word in words.items()
        if word is not None and word > head
    ]


def edits(home: Path, head: int) -> list[str]:
    """Each progress the store (its table) or the home (`relay.json`) keeps beyond the store's
    `head`, and each row of the store whose MAC names the home's state key and does not verify, as
    a phrase: an edit, since a progress is written only after a Kafka commit of the store's
    events, by a relay that signs it (`audit verify` names them; the relay takes none of them
    as a vouch, `words`)."""
    from ledger.store.relay import RelayError
    from ledger.store.relay_health import read_health
    from ledger.store.snapshots import state_key

    key = state_key(home, create=False)
    unsigned: list[str] = []
    with opened(home) as recorder:
        kept = rows(recorder)
        words = {f"the relay's progress on topic {t} (store)": p for t, p in kept}
        if key is not None:
            for topic, position in kept:
                at = read_anchor(recorder, topic)
                got = verdict(recorder, key, topic, position, read_mac(recorder, topic), *at)
                if position <= head and got == "edited":
                    unsigned.append(
                        f"the relay's progress on topic {topic} (store, position {position:,}) "
                        "does not verify under the state key that signed it: an edited "
                        "progress; the relay takes it as no word"
                    )
    try:
        health = read_health(home)
    except RelayError:
        health = None
    if health is not None:
        words[f"relay.json's position on topic {health.topic}"] = health.position
        if key is not None:
            with opened(home) as recorder:
                dropped = read(recorder, health.topic) is None
            if dropped:  # `gpuledger init` makes the table: a store of this version has one
                unsigned.append(
                    f"the store keeps no relay progress table, yet relay.json names topic "
                    f"{health.topic} (position {health.position:,}) and the home has a state "
                    "key: a dropped table; the relay takes relay.json as no vouch"
                )
    return [f"{w}: an edited progress" for w in beyond(head, **words)] + unsigned


def due(
    position: int,
    kept: int,
    since_s: float,
    every_s: float = EVERY_S,
    every_n: int = EVERY_N,
    offset: int | None = None,
    kept_offset: int | None = None,
) -> bool:
    """Pure: whether a relay at `position` (its record at `offset`, None: unknown) writes its
    progress, `kept` (at `kept_offset`) being the last it wrote (or read) on this topic id and
    `since_s` the seconds since it last wrote: only forward (a higher position, or a later
    commit: a higher offset, or one where the row named none), once every `every_s` or sooner
    once `every_n` positions past `kept` (a stopping relay passes `every_s=0`). A relay that
    publishes positions at or below the row's again (the broker lost the end of the topic: the
    same topic id, a lower end) rewrites it: else it named an offset that no longer held its
    record, and every restart read the whole topic (atk53-25 F2)."""
    later = offset is not None and position > 0 and (kept_offset is None or offset > kept_offset)
    if not (position > kept or later):
        return False
    return since_s >= every_s or position - kept >= every_n


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
            query = _pg(f"SELECT position FROM {TABLE} WHERE topic = %s", recorder)
            row = conn.execute(query, (topic,)).fetchone()
        except psycopg.errors.UndefinedTable:
            return None
    if row is None:
        return 0
    return int(row["position"] if isinstance(row, dict) else row[0])


def read_mac(recorder: Any, topic: str) -> str | None:
    """The MAC the store's row for `topic` carries (None: no row, no MAC, no such column)."""
    query = f"SELECT mac FROM {TABLE} WHERE topic = "
    if isinstance(recorder, SQLiteApplicationRecorder):
        import sqlite3

        from eventsourcing.persistence import OperationalError

        with recorder.datastore.transaction(commit=False) as cursor:
            try:
                cursor.execute(query + "?", (topic,))
            except (sqlite3.OperationalError, OperationalError):
                return None  # no table, or no column (a table of an earlier version)
            row = cursor.fetchone()
        return None if row is None or row[0] is None else str(row[0])
    if getattr(getattr(recorder, "datastore", None), "pool", None) is None:
        return None
    import psycopg

    with recorder.datastore.get_connection() as conn:
        try:
            row = conn.execute(_pg(query, recorder) + "%s", (topic,)).fetchone()
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn):
            return None
    if row is None:
        return None
    got = row["mac"] if isinstance(row, dict) else row[0]
    return None if got is None else str(got)


def read_anchor(recorder: Any, topic: str) -> tuple[str | None, int | None, int | None]:
    """The topic id, the offset and the append time the store's row for `topic` names (None
    each: no row, a row of an earlier version, no such column: a table made before it)."""
    query = f"SELECT * FROM {TABLE} WHERE topic = "
    if isinstance(recorder, SQLiteApplicationRecorder):
        import sqlite3

        from eventsourcing.persistence import OperationalError

        with recorder.datastore.transaction(commit=False) as cursor:
            try:
                cursor.execute(query + "?", (topic,))
            except (sqlite3.OperationalError, OperationalError):
                return None, None, None  # no table
            row = cursor.fetchone()  # a sqlite3.Row: its columns by name
        got = {} if row is None else dict(zip(row.keys(), tuple(row), strict=True))
    elif getattr(getattr(recorder, "datastore", None), "pool", None) is None:
        return None, None, None
    else:
        import psycopg

        with recorder.datastore.get_connection() as conn:
            try:
                cur = conn.execute(_pg(query, recorder) + "%s", (topic,))
            except psycopg.errors.UndefinedTable:
                return None, None, None
            found = cur.fetchone()
            names = [d.name for d in cur.description or ()]
        if found is None:
            got = {}
        else:
            got = dict(found) if isinstance(found, dict) else dict(zip(names, found, strict=False))
    topic_id, offset, stamp = (got.get(k) for k in ("topic_id", "record_offset", "append_ms"))
    return (
        None if topic_id is None else str(topic_id),
        None if offset is None else int(offset),
        None if stamp is None else int(stamp),
    )


def signed_rows(
    recorder: Any,
) -> list[tuple[str, int, str | None, str | None, int | None, int | None]]:
    """Every (topic, progress, MAC, topic id, offset, append time) the store keeps, by topic:
    what `gpuledger store copy` carries over (the copy holds the same events, so each MAC still
    names them, and the topic holds the same records)."""
    return [(t, p, read_mac(recorder, t), *read_anchor(recorder, t)) for t, p in rows(recorder)]


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
            got = conn.execute(_pg(query, recorder)).fetchall()
        except psycopg.errors.UndefinedTable:
            return []
    return [(str(r["topic"]), int(r["position"])) for r in got]


def begin(recorder: Any) -> None:
    """Make the table, empty, in a new store (`gpuledger init`): from then on no row for a topic
    means no relay of this ledger committed there (`read` gives 0), so a rebuilt copy of an
    event on a topic the ledger's first relay finds is never its bookmark."""
    keep(recorder, None, 0)


def keep(
    recorder: Any,
    topic: str | None,
    position: int,
    key: bytes | None = None,
    *,
    repair: bool = False,
    signature: str | None = None,
    topic_id: str | None = None,
    offset: int | None = None,
    stamp: int | None = None,
) -> None:
    """Raise the progress the store keeps for `topic` to `position` (never lower it on one
    topic id; a row naming another is replaced; `repair`: replace a row that does not verify,
    whatever it says), naming the topic's id, the offset of the committed record of `position`
    and the time the broker appended it (None: unknown), with its MAC under `key` (or
    `signature`, a row's MAC copied as it is; none without either): one statement, its own
    transaction. The table is made on the
    first write (`topic` None: only that), and a table of an earlier version given its columns."""
    if key is not None and topic is not None:
        at = link_at(recorder, position)
        signature = None if at is None else mac(key, topic, position, at, topic_id, offset, stamp)
    values = (topic, position, signature, topic_id, offset, stamp)
    where = " WHERE excluded.position > "
    if isinstance(recorder, SQLiteApplicationRecorder):
        import sqlite3

        from eventsourcing.persistence import OperationalError

        upsert = _SQLITE_KEEP if not repair else _SQLITE_KEEP.split(where)[0]
        with recorder.datastore.transaction(commit=True) as cursor:
            if topic is None:
                cursor.execute(_SQLITE_TABLE)
                return
            # the write first: a read before it (the schema) would pin a snapshot that a commit
            # meanwhile makes SQLite refuse to upgrade at once ("database is locked", no wait)
            try:
                cursor.execute(upsert, values)
            except (sqlite3.OperationalError, OperationalError) as e:
                if "no such table" in str(e):
                    cursor.execute(_SQLITE_TABLE)
                elif "column" in str(e):
                    cursor.execute(f"PRAGMA table_info({TABLE})")
                    have = {str(r[1]) for r in cursor.fetchall()}
                    for name, kind, _pg_kind in _COLUMNS:
                        if name not in have:
                            cursor.execute(f"ALTER TABLE {TABLE} ADD COLUMN {name} {kind}")
                else:
                    raise
                cursor.execute(upsert, values)
        return
    pool = getattr(getattr(recorder, "datastore", None), "pool", None)
    if pool is None:
        return
    from ledger.store.leaseschema import SCHEMA_LOCK

    upsert = _PG_KEEP if not repair else _PG_KEEP.split(where)[0]
    with recorder.datastore.get_connection() as conn:
        made = conn.execute(
            "SELECT count(*) AS n FROM information_schema.columns WHERE table_name = %s "
            "AND column_name = 'append_ms' AND table_schema = %s",
            (TABLE, getattr(recorder.datastore, "schema", "") or "public"),
        ).fetchone()
        if not (made["n"] if isinstance(made, dict) else made[0]):
            # under the schema's lock: two relays making it at once would clash in the catalog
            added = "".join(
                _pg(f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS {name} {kind}; ", recorder)
                for name, _sqlite_kind, kind in _COLUMNS
            )
            conn.execute(
                f"BEGIN; SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); "
                f"{_pg(_PG_TABLE, recorder)}; {added}COMMIT;"
            )
        if topic is not None:
            conn.execute(_pg(upsert, recorder), values)


class Kept:
    """The progress of one relay in the store: read when it connects, written as it advances
    (`advance`: at most every `every_s`; `flush`: now), failures logged, never raised; signed
    under `key` (the service's state key; None: unsigned, and every row taken as it reads)."""

    def __init__(
        self, recorder: Any, topic: str, every_s: float = EVERY_S, key: bytes | None = None
    ) -> None:
        self.recorder = recorder
        self.topic = topic
        self.every_s = every_s
        self.key = key
        self.kept = 0
        """The highest position written to (or read from, verified) the store."""
        self.kept_id: str | None = None
        """The topic id the row names, as written (or read, verified): a position on another
        topic (made again) is written whatever `kept` says."""
        self.kept_offset: int | None = None
        """The offset the row names, as written (or read, verified): a later commit on that
        topic id is written whatever `kept` says (atk53-25 F2)."""
        self._repair = False
        """The row read does not verify: the next write replaces it, whatever it says."""
        self._at = float("-inf")
        self._failing = False

    def read(self, head: int | None = None) -> int | None:
        """The store's word (raises the store's errors: the relay reconnects); a word beyond
        the store's `head` is returned but not taken as written (`trusted` drops it)."""
        return self.word(head).position

    def word(self, head: int | None = None) -> Word:
        """The store's word and whether it verifies (`Word`); one that does not (or lies
        beyond the store's `head`) is not taken as written, and is replaced at the next write."""
        got = read(self.recorder, self.topic)
        topic_id, offset, stamp = read_anchor(self.recorder, self.topic) if got else (None,) * 3
        verified = True
        if got and self.key is not None:
            mac_of = read_mac(self.recorder, self.topic)
            said = verdict(
                self.recorder, self.key, self.topic, got, mac_of, topic_id, offset, stamp
            )
            verified = said == "signed"
        if got is not None and (head is None or got <= head) and verified:
            if got > self.kept or topic_id != self.kept_id or offset != self.kept_offset:
                self.kept, self.kept_id, self.kept_offset = got, topic_id, offset
        elif got:
            self._repair = True
        return Word(got, verified, topic_id, offset, stamp)

    def _kept_on(self, at: Committed | None) -> tuple[int, int | None]:
        """What was kept on the topic of `at`, and at which offset (0: the row names another
        topic, or none)."""
        if at is None:
            return self.kept, None
        if at.topic_id != self.kept_id:
            return 0, None
        return self.kept, self.kept_offset

    def _due(self, position: int, at: Committed | None, since_s: float, every_s: float) -> bool:
        kept, kept_offset = self._kept_on(at)
        offset = None if at is None else at.offset
        return due(position, kept, since_s, every_s, offset=offset, kept_offset=kept_offset)

    def advance(self, position: int, at: Committed | None = None) -> None:
        """`at`: where the relay's record of `position` was committed (None: unknown)."""
        now = time.monotonic()
        if self._due(position, at, now - self._at, self.every_s):
            self._write(position, now, at)

    def flush(self, position: int, at: Committed | None = None) -> None:
        if self._due(position, at, 0.0, 0.0):
            self._write(position, time.monotonic(), at)

    def _write(self, position: int, now: float, at: Committed | None = None) -> None:
        self._at = now
        try:
            if link_at(self.recorder, position) is None:  # a deposed leader's relay, closing
                # after a failover that lost the tail it had read (atk52-ha F3): no row past
                # the head (unsigned, it said "edited" to the next relay)
                log.warning("relay: does not keep its progress (position %d): the store holds "
                            "no event there (a failover lost it?)", position)  # fmt: skip
                return
            keep(self.recorder, self.topic, position, self.key, repair=self._repair,
                 topic_id=None if at is None else at.topic_id,
                 offset=None if at is None else at.offset,
                 stamp=None if at is None else at.stamp)  # fmt: skip
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
        self._repair = False
        if at is not None and (
            at.topic_id != self.kept_id or self.kept_offset is None or at.offset > self.kept_offset
        ):  # another topic id, or a later commit on it (`due`): the row names this one now
            self.kept, self.kept_id, self.kept_offset = position, at.topic_id, at.offset
        else:
            self.kept = max(self.kept, position)
