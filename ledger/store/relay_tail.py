"""The end of the relay's topic read back: where the relay's last record is (its bookmark), which
records after it are foreign, whether a transaction is held open on the topic.

An edge (network). The tail is read in growing windows (16, 256, ... offsets from the end) until
one holds the relay's last record. A window is never kept: each record is reduced as it is
polled to what the verdict needs (`Seen`: its offset, position, a digest of the whole record,
key, tag header and value, the link its value carries, the link to it and whether our key
signed it), and those are compared with the store a chunk at a time (`Scan`). So a restarting
relay holds a few records' values at once however large the records after its own are: thirty
forged 7 MB records at the tail gave it a 1 GB peak when it kept each window's records
(atk45-25 F2).
"""

from __future__ import annotations

import hashlib
import logging
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from typing import Any, NamedTuple

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from ledger.store.relay_progress import Anchor
from ledger.store.relay_topic import DEFAULT_TIMEOUT_S, RelayError, RelayUnavailable
from projections.chain import START, Tip, prev_hash, rule
from projections.kafka_wire import (
    DEFAULT_CONNECT_TIMEOUT_S,
    PARTITION,
    TOPIC,
    SigningKeys,
    envelope,
    header_position,
    reader_config,
    relay_shaped,
)

log = logging.getLogger("gpuledger.relay")

CHUNK = 1024
"""Records compared with the store at once: their digests are all a window keeps besides the
foreign records' offsets."""
PAGE = 512
"""Store events read at once."""
DENSE = 16
"""A chunk's positions are read from the store as one range (in pages) when it spans at most
DENSE store events per position (plus a page), else one position at a time: forged positions
spread over the log cost a read each, never the log between them."""
REACH = 16**4
"""A window of the tail this wide (offsets) or wider is logged as it is read: the bookmark reads
on while its best is below the relay's floor (old copies at the tail: atk46-25 F4), up to the
whole topic (past this it let the best found stand: 70,000 copies of an old record made a
restarting relay publish everything after it again, atk47-25 F3)."""


def tail_windows(
    bootstrap: str,
    topic: str = TOPIC,
    config: Mapping[str, Any] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    from_start: bool = False,
    check: Callable[[], None] | None = None,
) -> Iterator[tuple[bool, Iterator[Any]]]:
    """The last committed records of the topic in growing windows (16, 256, ... offsets from the
    end; `from_start`: only the last, the whole topic), each as (reaches the first offset, its
    records in offset order, polled as they are taken: read each window to its end before asking for
    the next); the caller stops when it has seen enough. read_committed skips aborted records and
    markers, and its end offset stops before any open transaction. Raises RelayUnavailable when the
    broker hands out no record for `timeout_s` (a deadline per poll that brings records, not one for
    the whole search: four million tiny forged records at the tail outlasted a single 30 s and the
    relay retried for good, atk46-25 F6). `check`: asked before each window and every
    `CHECK_EVERY` records read; it raises to end the read (a relay's connect told to end)."""
    tp = TopicPartition(topic, PARTITION)
    try:
        consumer = KafkaConsumer(
            **reader_config(bootstrap, "gpuledger-relay-probe", connect_timeout_s, **(config or {}))
        )
    except KafkaError as e:
        raise unavailable(bootstrap, e) from e

    def window(start: int, end: int) -> Iterator[Any]:
        if end - start >= REACH:
            log.info("relay: reading the last %d offsets of %s for its last record", end - start,
                     topic)  # fmt: skip
        records = polled(consumer, bootstrap, topic, start, end, timeout_s, "the end")
        return records if check is None else _checked(records, check)

    try:
        consumer.assign([tp])
        ms = int(timeout_s * 1000)
        end = consumer.end_offsets([tp], timeout_ms=ms)[tp]
        begin = consumer.beginning_offsets([tp], timeout_ms=ms)[tp]
        back = end - begin if from_start else 16
        while True:
            start = max(begin, end - back)
            if check is not None:
                check()
            yield start == begin, window(start, end)
            if start == begin:
                return
            back *= 16
    except KafkaError as e:
        raise unavailable(bootstrap, e) from e
    finally:
        consumer.close()


CHECK_EVERY = 500
"""Records a bookmark's read takes between two asks whether it goes on (`tail_windows`)."""


def _checked(records: Iterator[Any], check: Callable[[], None]) -> Iterator[Any]:
    """`records`, `check` asked every `CHECK_EVERY` of them (it raises to end the read)."""
    for i, rec in enumerate(records, 1):
        if i % CHECK_EVERY == 0:
            check()
        yield rec


def last_published(
    bootstrap: str, topic: str = TOPIC, config: Mapping[str, Any] | None = None
) -> int:
    """The log position in the last committed record on the topic that carries a readable one
    (0 when there is none)."""
    for _whole, records in tail_windows(bootstrap, topic, config):
        last = 0
        for rec in records:
            last = header_position(rec.headers) or last
        if last:
            return last
    return 0


FIRST_LOOK = 4096
"""Records read from the topic's first offset for one with a readable position (`first_position`);
none among them: the relay reads the whole topic for its bookmark."""


def first_position(
    bootstrap: str,
    topic: str = TOPIC,
    config: Mapping[str, Any] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> int | None:
    """The position of the first committed record of the topic that carries a readable one,
    among its first FIRST_LOOK (None: none; the topic's first offset is where it starts)."""
    tp = TopicPartition(topic, PARTITION)
    try:
        consumer = KafkaConsumer(
            **reader_config(bootstrap, "gpuledger-relay-probe", connect_timeout_s, **(config or {}))
        )
    except KafkaError as e:
        raise unavailable(bootstrap, e) from e
    try:
        consumer.assign([tp])
        ms = int(timeout_s * 1000)
        end = consumer.end_offsets([tp], timeout_ms=ms)[tp]
        begin = consumer.beginning_offsets([tp], timeout_ms=ms)[tp]
        records = polled(consumer, bootstrap, topic, begin, end, timeout_s, "the start")
        for rec in islice(records, FIRST_LOOK):
            position = header_position(rec.headers)
            if position is not None:
                return position
        return None
    except KafkaError as e:
        raise unavailable(bootstrap, e) from e
    finally:
        consumer.close()


LOG_APPEND_TIME = 1
"""A record's timestamp type when the broker stamped it with its clock at the append (the topic's
`message.timestamp.type=LogAppendTime`); 0 is `CreateTime`, the producer's."""


def stamped(record: Any, stamp: int | None) -> str | None:
    """Pure: why `record` (a ConsumerRecord, None: no record at that offset) is not the one the
    relay committed with the broker's append time `stamp` (None: the row names none, a row of
    an earlier version or of a `CreateTime` topic: nothing to check). On a `LogAppendTime`
    topic the broker, not the producer, stamps every batch it appends, so no topic writer can
    make a record read as appended at a time it chose: a saved record of the relay's put back
    at the offset its progress names after the broker lost the end of the topic is appended
    later, by a transactional writer too (a commit marker after it), and was the bookmark
    (atk53-25 F1)."""
    if stamp is None:
        return None
    if record is None:
        return "holds no record"
    kind = getattr(record, "timestamp_type", None)
    if kind != LOG_APPEND_TIME:
        return (
            f"carries no append time (its timestamp type is {kind}, CreateTime: the topic's "
            "setting changed, or it was written again)"
        )
    if record.timestamp != stamp:
        return (
            f"was appended at {record.timestamp} ms, not at the {stamp} ms the relay's record "
            "was (written again after the broker lost the end of the topic?)"
        )
    return None


def not_taken(
    bootstrap: str,
    offset: int,
    topic: str = TOPIC,
    config: Mapping[str, Any] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    stamp: int | None = None,
) -> str | None:
    """Why the record at `offset` is not the relay's record its progress names (None: it may
    be, the store's bytes decide). The offset after it must hold no record at all, committed,
    aborted or open, and lie within the topic: a control record, the marker of the transaction
    the record at `offset` ended, as the relay's last record of a batch (what its progress
    names) is followed by its commit. A saved record of the relay's that a topic writer put at
    that offset after the broker lost the end of the topic (its data restored from an older
    copy: the same topic id) was taken as the bookmark, and the events between the topic's new
    end and it never reached the topic, "publishing, 0 behind" (atk53-25 F1): a record sent
    outside a transaction is followed by the topic's end or by the next record, never by a
    marker. Read uncommitted, so an aborted record there counts too. A record of the relay's
    whose commit another producer's record preceded is refused as well: the topic is read from
    its start (time, never a gap). A transactional producer can put a marker after its record:
    with `stamp` (the append time the progress names) the record must carry it too
    (`stamped`); without, that is the remaining limit (docs/kafka.md)."""
    why, record = marked(bootstrap, offset, topic, config, timeout_s, connect_timeout_s)
    return why if why is not None else stamped(record, stamp)


def marked(
    bootstrap: str,
    offset: int,
    topic: str = TOPIC,
    config: Mapping[str, Any] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> tuple[str | None, Any]:
    """`not_taken`'s commit-marker check: (why the record at `offset` is not followed by a
    commit marker, None: it is; the record, None: none read). `store restore` keeps the
    record's append time (`appended`) in its progress row."""
    tp = TopicPartition(topic, PARTITION)
    extra = {**(config or {}), "isolation_level": "read_uncommitted"}
    unmarked = (
        "is not followed by a commit marker (a record put there outside a transaction after "
        "the broker lost the end of the topic?)"
    )
    try:
        consumer = KafkaConsumer(
            **reader_config(bootstrap, "gpuledger-relay-probe", connect_timeout_s, **extra)
        )
    except KafkaError as e:
        raise unavailable(bootstrap, e) from e
    try:
        consumer.assign([tp])
        end = consumer.end_offsets([tp], timeout_ms=int(timeout_s * 1000))[tp]
        if end <= offset + 1:
            return unmarked, None
        part = "the record after its progress"
        records = list(polled(consumer, bootstrap, topic, offset, offset + 2, timeout_s, part))
        if any(rec.offset == offset + 1 for rec in records):
            return unmarked, None
        return None, next((r for r in records if r.offset == offset), None)
    except KafkaError as e:
        raise unavailable(bootstrap, e) from e
    finally:
        consumer.close()


def polled(
    consumer: Any, bootstrap: str, topic: str, start: int, end: int, timeout_s: float, part: str
) -> Iterator[Any]:
    """The committed records of the topic's partition (assigned to `consumer`) with offsets in
    [start, end), in order, polled as they are taken (the one poll loop of the tail's windows
    and of `first_position`: two near-copies before, duplicates D7). read_committed skips
    aborted records and markers, and the position only moves forward, past them too, so the
    loop ends at `end`; an empty poll means "not yet", never "nothing left". Raises
    RelayUnavailable when the broker hands out no record for `timeout_s` (a deadline per poll
    that brings records, not one for the whole read: four million tiny forged records at the
    tail outlasted a single 30 s and the relay retried for good, atk46-25 F6). `part`: what is
    read, for the error ("the end", "the start")."""
    tp = TopicPartition(topic, PARTITION)
    try:
        consumer.seek(tp, start)
        deadline = time.monotonic() + timeout_s
        while consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise RelayUnavailable(
                    f"reading {part} of {topic} (offsets {start:,} to {end:,}, at "
                    f"{consumer.position(tp):,}): no record came for {timeout_s:g} s",
                    hint="is the broker overloaded or restarting?",
                )
            got = consumer.poll(timeout_ms=500).get(tp, [])
            if got:
                deadline = time.monotonic() + timeout_s
            for rec in got:
                if rec.offset < end:
                    yield rec
    except KafkaError as e:
        raise unavailable(bootstrap, e) from e


def unavailable(bootstrap: str, e: BaseException) -> RelayUnavailable:
    return RelayUnavailable(
        f"Kafka at {bootstrap}: {type(e).__name__}: {e}",
        hint="is the broker up? (`scripts/kafka/kafka status`)",
    )


# --- the bookmark -------------------------------------------------------------------------------


class Seen(NamedTuple):
    """What the bookmark keeps of one record of the tail: never its value."""

    offset: int
    position: int | None
    """From its header (None: none readable)."""
    digest: bytes | None
    """The whole record's digest (`identity`: its key, tag header and value; None: no value),
    compared with the store's event at `position`; one that could not be the relay's (no tag
    header or two of them, a header the relay never writes or one written twice) has one that
    equals no stored event's."""
    tip: Tip | None
    """The link to it, what a record after it must carry (None: no readable position, tag or
    value)."""
    link: str | None
    """The `prev_hash` its value carries: a link, "" (the first event), "?" (not a link: never
    kept, whatever its length) or None (none readable)."""
    signed: bool
    """Signed by one of our keys (False without keys)."""
    stamp: int | None = None
    """The broker's append time (`LogAppendTime`; None: the producer's time, `CreateTime`)."""


UNLIKE = b"not a stored event"
"""The digest of a record that cannot be the relay's: it equals no SHA-256."""


def identity(key: bytes | None, tag: str, value: bytes) -> bytes:
    """Pure: the digest of a record as the relay would write it (its key, its tag header, its
    value; the position is where it is compared): a copy of the store's event with another tag
    header was taken as the relay's own by a digest of its value (atk49-25 F1)."""
    h = hashlib.sha256()
    for part in (key or b"", tag.encode(), value):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


def seen(rec: Any, keys: SigningKeys | None) -> Seen:
    """Pure: the record `rec` (a ConsumerRecord) reduced to what the bookmark needs."""
    value: bytes | None = rec.value
    position, tag, _problem = envelope(rec.headers, value, None)
    if value is None:
        return Seen(rec.offset, position, None, None, None, False, appended(rec))
    if tag is not None and relay_shaped(rec.headers):
        digest = identity(getattr(rec, "key", None), tag, value)
    else:
        digest = UNLIKE
    got = prev_hash(value)
    if got is not None and got != "" and rule(got) is None:
        got = "?"
    tip = Tip.of(position, tag, value) if position is not None and tag is not None else None
    signed = keys is not None and keys.problem(rec.headers, value, position, tag) is None
    return Seen(rec.offset, position, digest, tip, got, signed, appended(rec))


def appended(rec: Any) -> int | None:
    """Pure: the time the broker appended `rec` (None: it carries the producer's time)."""
    if getattr(rec, "timestamp_type", None) != LOG_APPEND_TIME:
        return None
    return int(rec.timestamp)


class Found(NamedTuple):
    """The relay's last record on the topic: its position (0: none), offset (None: none) and
    the broker's append time (None: none, a `CreateTime` record)."""

    position: int
    offset: int | None
    stamp: int | None = None

    @classmethod
    def of(cls, rec: Seen | None) -> Found:
        return cls(0, None) if rec is None else cls(rec.position or 0, rec.offset, rec.stamp)


def continues(rec: Seen, before: Seen | None) -> bool:
    """Pure: whether `rec` is the event after the record `before` in a log (None: the start),
    by its position and its link (its signature is the caller's)."""
    tip = START if before is None else before.tip
    if tip is None or rec.position != tip.position + 1:
        return False
    return tip.problem_of(rec.link) is None


class Scan:
    """One window's records, taken in offset order a chunk at a time with the store's digests
    at their positions; its verdict is `best` (our last record: the highest position whose
    record, key, tag header and value, equals the store's), `after` (the offsets after it:
    foreign) and the facts a refusal rests on."""

    def __init__(self, signing: bool, anchor: Anchor | None = None) -> None:
        self.signing = signing
        self.anchor = anchor
        """The record this relay knows it committed (its durable progress: the offset and the
        position the store's row names on this topic id; None: none known). A record equal to
        the store's event is ours only when it is that one, or the store's next event after one
        taken (`follows`): anyone who can write the topic can rebuild a not-yet-published
        event's bytes (atk46-25 F3) or put back a saved record of the relay's, signed or not,
        onto a topic made again (atk52-25 F1: taken by its signature, or as a position within
        the progress, the events before it never reached the topic)."""
        self.best: Seen | None = None
        self.after = array("q")
        """Offsets after `best` (every offset while there is none)."""
        self.continued = False
        """A record after `best` continues it with our signature (only counted with keys)."""
        self.chained = False
        """Two records of the window in a row continue one another (or the first continues
        the start of a log), signatures aside: a log, though not ours."""
        self.formed: Seen | None = None
        """The last record with a readable position and a value, for `chained`."""
        self.equal = False
        """A record equal to the store's event at its position, vouched for or not: the topic
        holds this ledger's log (one its progress does not reach: published by a relay that
        kept none), never another ledger's."""
        self.last_position = 0
        """The last readable position in the window (what a refusal names)."""
        self.reach: Seen | None = None
        """Where a reader taking our records in offset order from the window's start stands
        (each the next position: `take`); the bookmark of a window that reaches the topic's
        first offset. A relay restarted while it published its log again on a topic made again
        took its own copies of later events sent before it noticed ([27, 28, 1, 2, 3]) as its
        bookmark, the highest: 4..26 were never on the topic, "0 behind" (s50 F1 residual)."""
        self.reach_after = array("q")
        """Offsets after `reach` (every offset while there is none)."""

    def vouched(self, rec: Seen, position: int) -> bool:
        """Whether a record equal to the store's event at `position` is the one our progress
        names (`anchor`: that offset, that position, on the topic id it names). Nothing else
        vouches: not our signature (a saved signed record put back onto a topic made again,
        atk52-25 F1 (b)), not a position within the progress (an unsigned copy, atk50-25 F2,
        atk52-25 F1 (a))."""
        got = self.anchor
        if self.signing and not rec.signed:  # a topic writer's unsigned record the row names
            return False  # (a keyless restore's, atk54-25 F5): the topic is read from its start
        return got is not None and rec.offset == got.offset and position == got.position

    def follows(self, best: Seen | None, rec: Seen, position: int) -> bool:
        """Whether a record equal to the store's event at `position` comes right after our last
        one (`best`; None: the start of the log): then every position up to it is on the topic,
        in order, as the store's bytes, whoever sent it, so taking it leaves no gap for any
        reader, and our own records past a progress not yet written are not published again (the
        store's progress is written once a second at most). A rebuilt copy of an event not yet
        published lies past a gap (atk46-25 F3): never. With keys, after a signed record of ours
        only a signed one (an unsigned prefix from the start of the log: a topic signed since;
        signed readers set an unsigned record after a signed one aside)."""
        if self.signing and best is not None and best.signed and not rec.signed:
            return False
        return position == (0 if best is None else best.position or 0) + 1

    def take(self, chunk: Iterable[Seen], stored: Mapping[int, bytes]) -> None:
        for rec in chunk:
            position = rec.position
            if position is None:
                self.after.append(rec.offset)
                self.reach_after.append(rec.offset)
                continue
            self.last_position = position
            if rec.digest is not None:  # formed
                self.chained = self.chained or continues(rec, self.formed)
                self.formed = rec
            equal = rec.digest is not None and stored.get(position) == rec.digest
            self.equal = self.equal or equal
            reach = self.reach
            if (
                equal
                and position == (0 if reach is None else reach.position or 0) + 1
                and (self.vouched(rec, position) or self.follows(reach, rec, position))
            ):
                self.reach, self.reach_after = rec, array("q")
            else:
                self.reach_after.append(rec.offset)
            best = self.best
            ours = equal and (self.vouched(rec, position) or self.follows(best, rec, position))
            if ours and (best is None or position > (best.position or 0)):
                self.best, self.after, self.continued = rec, array("q"), False
                continue
            self.after.append(rec.offset)
            if self.signing and best is not None and rec.signed and continues(rec, best):
                self.continued = True


def bookmark(
    windows: Iterable[tuple[bool, Iterable[Any]]],
    digests: Callable[[set[int]], Mapping[int, bytes]],
    keys: SigningKeys | None,
    refusal: Callable[[int, int], RelayError],
    anchor: Anchor | None = None,
    floor: int | None = None,
    starts: Callable[[], bool] = lambda: True,
) -> tuple[Found, list[int]]:
    """Our last record (its position and offset) among the `windows` of the tail
    (`tail_windows`), and the offsets of the foreign records after it. `digests(positions)` gives
    the store's digests at those of `positions` it holds; `refusal(position, ours)` the error for a
    topic that holds another log (`position`: the last one the window names; `ours`: our last
    record's).

    With signing keys, a record after ours that continues the chain from it *and* carries our
    signature is no forgery: the topic holds events this store lacks, and it is refused. So it
    is when the whole topic holds none of our records but records that chain, none of them
    equal to the store's event at its position (another ledger's topic: records equal to ours
    that nothing vouches for, say a relay's that kept no progress, are foreign, published
    again after).

    Our last record is the highest record equal to the store's event that is the `anchor` (the
    record our progress names: its offset on this topic id, `Scan.vouched`) or follows it, not the
    first window's: while that is below the anchor (or `floor`, a word that vouches for nothing:
    `relay_progress.words`), wider windows are read, up to the whole topic, so copies of an old
    record of ours at the tail do not make the relay publish everything after it again, however many
    (atk47-25 F3: past 65,536 offsets the best found stood). Reading on costs time, never a gap or a
    duplicate: a progress is written only after a commit, so our record at it is on the topic
    (unless the topic was made again).

    A window that reaches the topic's first offset is the whole topic: there our last record is
    where a reader taking our records in offset order stands (`Scan.reach`), not the highest:
    a topic made again under a running relay gets the relay's next events before it notices
    ([27, 28]) and then the log again from position 1; restarted in between, the relay took 28
    as its bookmark and 3..26 never reached the topic. A narrower window's best stands only
    when `starts()`, asked once: the topic's first record is position 1 (so no such copies lie
    at its start); otherwise the whole topic is read (once a topic got them, each restart reads
    it whole: time, never a gap). Without an anchor (no progress, a row of an earlier version, or
    one that does not verify) only the whole topic is read: the bookmark is where the store's
    log, taken from the topic's start, ends (atk52-25 F1: never a record by its signature or its
    position alone)."""
    floor = max(0 if anchor is None else anchor.position, floor or 0)
    back = 16
    started: bool | None = None
    for whole, records in windows:
        if anchor is None and not whole:
            continue  # read from the start only (`tail_windows(from_start=True)` skips them)
        scan = Scan(signing=keys is not None, anchor=anchor)
        taken = (seen(rec, keys) for rec in records)
        while chunk := list(islice(taken, CHUNK)):
            scan.take(chunk, digests({r.position for r in chunk if r.position is not None}))
        if scan.best is not None:
            position = scan.best.position or 0
            if scan.continued:
                raise refusal(scan.last_position, position)
            if whole:
                return Found.of(scan.reach), scan.reach_after.tolist()
            # A wider window holds this one: its best is never lower. Look on while ours is
            # below our floor (copies of an old record of ours at the tail), to the whole topic.
            if position >= floor:
                if started is None:
                    started = starts()
                if started:
                    return Found.of(scan.best), scan.after.tolist()
        elif whole:
            if scan.chained and not scan.equal:  # another ledger's (ours unvouched: foreign)
                raise refusal(scan.last_position, 0)
            return Found(0, None), scan.after.tolist()
        back *= 16
    return Found(0, None), []  # not reached: the last window is the whole topic


def store_digests(
    read: Callable[[int, int, int], Iterable[Iterable[Any]]], head: int, positions: set[int]
) -> dict[int, bytes]:
    """The digests (`identity`) of the store's events at `positions` (those it has, up to
    `head`) as the relay writes them, read by `read(after, until, page)` (pages of RawRecords)
    a page at a time."""
    wanted = {p for p in positions if 0 < p <= head}
    if not wanted:
        return {}
    lo, hi = min(wanted), max(wanted)
    if hi - lo < DENSE * len(wanted) + PAGE:
        spans = [(lo - 1, hi, PAGE)]
    else:
        spans = [(p - 1, p, 1) for p in sorted(wanted)]
    return {
        r.position: identity(r.key, r.tag, r.data)
        for after, until, page in spans
        for records in read(after, until, page)
        for r in records
        if r.position in wanted
    }


def held_at(
    bootstrap: str,
    topic: str = TOPIC,
    config: Mapping[str, Any] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> tuple[int, int] | None:
    """(last stable offset, end offset) when a transaction is open on the topic (the first is
    where read_committed readers stop), None when none is. Our own relay's is settled by its
    `init_transactions`: an open one after that is another producer's."""
    tp = TopicPartition(topic, PARTITION)
    ms = int(timeout_s * 1000)
    ends = []
    for isolation in ("read_committed", "read_uncommitted"):
        try:
            consumer = KafkaConsumer(
                **reader_config(
                    bootstrap,
                    "gpuledger-relay-probe",
                    connect_timeout_s,
                    **{**(config or {}), "isolation_level": isolation},
                )
            )
        except KafkaError as e:
            raise unavailable(bootstrap, e) from e
        try:
            ends.append(int(consumer.end_offsets([tp], timeout_ms=ms)[tp]))
        except KafkaError as e:
            raise unavailable(bootstrap, e) from e
        finally:
            consumer.close()
    stable, end = ends
    return (stable, end) if stable < end else None


def held_text(topic: str, held: tuple[int, int]) -> str:
    stable, end = held
    return (
        f"another producer holds a transaction open on {topic} at offset {stable} "
        f"({end - stable:,} offset(s) behind it): readers see nothing after it until the broker "
        "ends it (within the broker's transaction.max.timeout.ms: a minute with scripts/kafka, "
        "15 by Kafka's default)"
    )
