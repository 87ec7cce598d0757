"""A restarting relay reads the end of the topic back to find its last record (`Relay._bookmark`):
it keeps a digest of each record, never a window of values, however large the foreign records
at the tail (atk45-25 F2: 30 forged 7 MB records gave it a 1 GB peak), and its verdicts are the
ones it gave when it kept the values (unit: a fake consumer and a fake store; the real broker's
cases are in tests/integration/test_kafka_failures.py and security/test_security_kafka.py)."""

from __future__ import annotations

import json
import sys
import tracemalloc
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, ClassVar, NamedTuple

import msgspec
import pytest

from ledger.store.relay import Relay, RelayError
from ledger.store.relay_progress import Kept, Word
from ledger.store.relay_tail import tail_windows
from projections.chain import link
from projections.kafka_wire import (
    POSITION_HEADER,
    TAG_HEADER,
    SigningKeys,
    parse_keys,
    record_headers,
)

TAG = "job.submitted.v2"
KEYS = parse_keys("k1:relay-secret")
BIG = 7_000_000


def event(position: int, prev: str, pad: int = 0) -> bytes:
    return json.dumps({"prev_hash": prev, "n": position, "pad": "x" * pad}).encode()


def chain(n: int, first: int = 1, prev: str = "", pad: int = 0) -> list[tuple[int, bytes]]:
    """`n` events from position `first` on, each linked to the one before."""
    out = []
    for position in range(first, first + n):
        data = event(position, prev, pad)
        out.append((position, data))
        prev = link(position, TAG, data)
    return out


class Rec(NamedTuple):
    offset: int
    headers: list[tuple[str, bytes]]
    value: bytes | None
    key: bytes | None = b"o"
    """The relay's key: the stream's id (`Recorder`'s "o")."""
    timestamp: int = 0
    timestamp_type: int = 0
    """1: the broker's append time (`LogAppendTime`); 0: the producer's (`CreateTime`)."""


class Spec(NamedTuple):
    """A record on the fake topic; its value is made when it is polled (`make`), so the test
    measures what the relay keeps, not what the test holds."""

    headers: list[tuple[str, bytes]]
    make: Callable[[], bytes | None]
    key: bytes | None = b"o"
    stamp: int | None = None
    """The time the broker appended it (a `LogAppendTime` topic; None: `CreateTime`)."""


def ours(records: list[tuple[int, bytes]], keys: SigningKeys | None) -> list[Spec]:
    return [Spec(record_headers(p, TAG, d, keys), lambda d=d: d) for p, d in records]


class Topic:
    """What `tail_windows` asks of a KafkaConsumer, over a list of specs."""

    specs: ClassVar[list[Spec]] = []
    polled = 0

    def __init__(self, **_config: Any) -> None:
        self.at = 0

    def assign(self, _tps: Any) -> None:
        pass

    def end_offsets(self, tps: Any, timeout_ms: int = 0) -> dict[Any, int]:
        return {tp: len(self.specs) for tp in tps}

    def beginning_offsets(self, tps: Any, timeout_ms: int = 0) -> dict[Any, int]:
        return {tp: 0 for tp in tps}

    def seek(self, _tp: Any, offset: int) -> None:
        self.at = offset

    def position(self, _tp: Any) -> int:
        return self.at

    def poll(self, timeout_ms: int = 0, **_kw: Any) -> dict[Any, list[Rec]]:
        """Two offsets a poll: the consumer's own fetch is bounded (its fetch sizes); a
        `MARKER` is never handed out (a transaction's control record)."""
        from kafka import TopicPartition

        offsets = range(self.at, min(self.at + 2, len(self.specs)))
        got = [
            Rec(
                o,
                self.specs[o].headers,
                self.specs[o].make(),
                self.specs[o].key,
                self.specs[o].stamp or 0,
                0 if self.specs[o].stamp is None else 1,
            )
            for o in offsets
            if self.specs[o] is not MARKER
        ]
        self.at += len(offsets)
        Topic.polled += len(got)
        return {TopicPartition(TOPIC, 0): got} if got else {}

    def close(self) -> None:
        pass


TOPIC = "t"
MARKER = Spec([], lambda: None)
"""A transaction's commit marker: an offset no consumer is handed (the relay's last record of a
batch is followed by one, `relay_tail.not_taken`)."""


class Recorder:
    """The store's two calls the bookmark makes (not a SQLite recorder: the generic path)."""

    def __init__(self, records: list[tuple[int, bytes]]) -> None:
        self.records = records

    def max_notification_id(self) -> int:
        return self.records[-1][0] if self.records else 0

    def select_notifications(self, start: int, limit: int) -> list[Any]:
        return [
            SimpleNamespace(id=p, topic=TAG, state=d, originator_id="o")
            for p, d in self.records
            if p >= start
        ][:limit]


def bookmark(
    monkeypatch: pytest.MonkeyPatch,
    store: list[tuple[int, bytes]],
    topic: list[Spec],
    keys: SigningKeys | None = None,
    progress: int | None = None,
    offset: int | None = None,
    stamp: int | None = None,
) -> tuple[int, list[int]]:
    """`progress`: the store's row, verified (relay.json vouches for nothing beside a table, and
    with signing on not without one either: atk49-25 F9; None: the fake store keeps none);
    `offset`: the offset of the committed record it names, on this topic's id (None: a row of
    an earlier version, which names none: the topic is read from its start)."""
    monkeypatch.setattr(sys.modules[tail_windows.__module__], "KafkaConsumer", Topic)
    monkeypatch.setattr(Topic, "specs", topic)
    relay = object.__new__(Relay)
    relay.recorder = Recorder(store)  # type: ignore[assignment]
    relay.bootstrap, relay.topic, relay.config = "127.0.0.1:9", TOPIC, {}
    relay.timeout_s, relay.connect_timeout_s, relay.keys = 30.0, 3.0, keys
    relay.progress, relay.position, relay.mark, relay._offset = None, 0, None, None
    relay._going_on, relay._deadline = None, lambda: None  # no round's end (a connect's)
    relay.kept = Kept(relay.recorder, TOPIC) if progress is None else Row(progress, offset, stamp)
    last, foreign = relay._bookmark(TOPIC_ID)
    return last if isinstance(last, int) else last.position, foreign


TOPIC_ID = "topic-id-1"


class Row:
    """The store's progress row as `Kept` reads it: `position`, its MAC verified, naming this
    topic's id and `offset` (None: no offset, a row of an earlier version)."""

    key = None

    def __init__(self, position: int, offset: int | None = None, stamp: int | None = None) -> None:
        self.position = position
        self.offset = offset
        self.stamp = stamp

    def word(self, head: int | None = None) -> Word:
        topic_id = None if self.offset is None else TOPIC_ID
        return Word(self.position, True, topic_id, self.offset, self.stamp)


def forged(position: int, pad: int = 0) -> Spec:
    headers = [(POSITION_HEADER, str(position).encode()), (TAG_HEADER, TAG.encode())]
    return Spec(headers, lambda: event(position, "0" * 64, pad))


def test_thirty_forged_7_mb_records_at_the_tail_are_read_back_holding_a_few_of_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = chain(5)
    topic = [*ours(store, None), MARKER, *(forged(p, BIG) for p in range(6, 36))]
    Topic.polled = 0
    tracemalloc.start()
    try:
        got = bookmark(monkeypatch, store, topic, progress=5, offset=4)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == (5, list(range(6, 36)))
    assert Topic.polled == 1 + 16 + 35  # its marker's look, the last 16, then the whole topic
    assert peak < 8 * BIG, f"{peak / 1e6:.0f} MB held"  # 35 MB; was 336 MB: every window's values


@pytest.mark.parametrize("keys", [None, KEYS], ids=["unsigned", "signed"])
def test_the_verdicts_the_bookmark_gave_when_it_kept_the_values(
    monkeypatch: pytest.MonkeyPatch, keys: SigningKeys | None
) -> None:
    store = chain(40)
    mine = ours(store, keys)
    # empty topic; only ours; ours then foreign (garbled, forged next, old copy)
    assert bookmark(monkeypatch, store, []) == (0, [])
    assert bookmark(monkeypatch, store, mine, keys) == (40, [])
    garbled = Spec([(POSITION_HEADER, b"\xff"), (TAG_HEADER, TAG.encode())], lambda: store[-1][1])
    tail = [garbled, forged(41), mine[2], Spec([], lambda: None)]
    assert bookmark(monkeypatch, store, mine + tail, keys) == (40, [40, 41, 42, 43])
    # ours far back (past the first window of 16) behind foreign records
    assert bookmark(
        monkeypatch, store[:10], mine[:10] + [forged(p) for p in range(11, 41)], keys
    ) == (
        10,
        list(range(10, 40)),
    )
    # a topic of foreign records only, not chained: all skipped
    assert bookmark(monkeypatch, store, [forged(p) for p in range(1, 5)], keys) == (
        0,
        [0, 1, 2, 3],
    )


def test_a_topic_that_holds_another_log_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    store = chain(10)
    other = chain(8, pad=1)  # another ledger: it chains from the start, none of it ours
    with pytest.raises(RelayError, match="differs from the store at position 8"):
        bookmark(monkeypatch, store, ours(other, None))
    # with keys: ours, then a record of ours that continues it, signed (the store is older)
    more = chain(12)
    with pytest.raises(RelayError, match="ahead of the store: it has position 12") as err:
        bookmark(monkeypatch, store, ours(more, KEYS), KEYS)
    assert err.value.fields["published"] == 10
    # unsigned, the same continuation is foreign: skipped (ours unsigned: within our progress)
    assert bookmark(monkeypatch, store, ours(more, None), KEYS, progress=10) == (10, [10, 11])


def test_a_readers_head_probe_behind_forged_7_mb_records_holds_a_few_of_them() -> None:
    """The same read back, a reader's (`KafkaSource.head()` on its first call): it kept each
    window's records, values included, to take their positions."""
    from kafka import TopicPartition

    from projections.kafka_source import KafkaSource

    Topic.specs = ours(chain(5), None) + [forged(p, BIG) for p in range(6, 36)]
    source = object.__new__(KafkaSource)
    source._probe, source.tp = Topic(), TopicPartition(TOPIC, 0)
    source.topic, source.bootstrap, source.timeout_s = TOPIC, "127.0.0.1:9", 30.0
    tracemalloc.start()
    try:
        head = source._last_position(len(Topic.specs))
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        Topic.specs = []
    assert head == 35
    assert peak < 8 * BIG, f"{peak / 1e6:.0f} MB held"  # 42 MB, the fake's polls; was 126 MB


@pytest.mark.parametrize("keys", [None, KEYS], ids=["unsigned", "signed"])
def test_a_rebuilt_copy_of_an_event_not_yet_published_is_not_the_bookmark(
    monkeypatch: pytest.MonkeyPatch, keys: SigningKeys | None
) -> None:
    """atk46-25 F3: a topic writer rebuilds the exact bytes of event 13 (the relay published up
    to 10) and sends it unsigned: it was the bookmark, and 11, 12 were never published. It is
    ours only with our signature, or (unsigned) within the relay's own progress."""
    store = chain(20)
    rebuilt = ours([store[12]], None)  # exact bytes and headers, no signature
    topic = ours(store[:10], keys) + rebuilt
    progress = 10 if keys is None else None  # signed: the signature alone decides
    assert bookmark(monkeypatch, store, topic, keys, progress) == (10, [10])
    # the relay's own records past a progress it had not written yet follow its last one: taken
    # (every position up to them is on the topic), not published again (was: (10, [10, 11]))
    assert bookmark(monkeypatch, store, ours(store[:12], None), None, progress=10) == (12, [])
    # a rebuilt copy right after the last record is the event itself, exactly: taken, no gap
    assert bookmark(monkeypatch, store, ours(store[:11], None), None, progress=10) == (11, [])
    # signed records of ours past it are ours (a topic signed since: unsigned within it too)
    mixed = ours(store[:5], None) + ours(store[5:12], KEYS)
    assert bookmark(monkeypatch, store, mixed, KEYS, progress=5) == (12, [])
    assert bookmark(monkeypatch, store, ours(store[:5], None), KEYS, progress=5) == (5, [])


@pytest.mark.parametrize("keys", [None, KEYS], ids=["unsigned", "signed"])
def test_copies_of_an_old_record_at_the_tail_do_not_move_the_bookmark_back(
    monkeypatch: pytest.MonkeyPatch, keys: SigningKeys | None
) -> None:
    """atk46-25 F4: 16 copies of position 5 after the relay's last record (60) made the first
    window's best 5: the relay published 6..60 again. Below its progress it looks further."""
    store = chain(60)
    topic = ours(store, keys) + ours([store[4]], keys) * 16
    assert bookmark(monkeypatch, store, topic, keys, progress=60) == (60, list(range(60, 76)))


def test_the_service_takes_its_progress_from_the_health_it_left(tmp_path: Any) -> None:
    from ledger.store.relay_health import RelayHealth, _previous, health_path

    assert _previous(tmp_path, TOPIC) is None
    health = RelayHealth(state="exited", bootstrap="127.0.0.1:9", topic=TOPIC, position=84)
    health_path(tmp_path).write_bytes(msgspec.json.encode(health))
    assert _previous(tmp_path, TOPIC) == 84
    assert _previous(tmp_path, "another") is None
    # a service starting writes its health at once: it keeps the progress (was: position 0, so
    # a service killed while it connected left every record of ours beyond its progress)
    from ledger.store.relay_service import RelayService

    service = RelayService(tmp_path, "127.0.0.1:9", topic=TOPIC)
    assert service.health.position == 84 and service._position() == 84
    assert RelayService(tmp_path, "127.0.0.1:9", topic="another").health.position == 0


def test_a_readers_head_behind_forged_low_positions_at_the_tail_reaches_the_records_left() -> None:
    """atk46-25 F5: forged records at the tail claiming position 50 made a reader's head 50, so
    `project follow --once` stopped there (exit 0) with 103 events on the topic. With records
    left before the end, the head is past the reader's position by as many as are left."""
    import collections

    from kafka import TopicPartition

    from projections.kafka_source import KafkaSource

    Topic.specs = ours(chain(103), None) + [forged(50) for _ in range(20)]
    source = object.__new__(KafkaSource)
    source._probe, source.tp = Topic(), TopicPartition(TOPIC, 0)
    source._consumer = Topic()
    source._consumer.at = 50  # it handed out positions 1..50 (offsets 0..49)
    source.topic, source.bootstrap, source.timeout_s = TOPIC, "127.0.0.1:9", 30.0
    source._exists, source._after, source._head, source._buffer = (
        True,
        50,
        None,
        collections.deque(),
    )
    source._max_poll_records = 0  # never "close behind": the probe's read of the tail decides,
    # as for a reader more than 5,000 records behind (`_close_behind`) or a fresh one
    try:
        assert source._last_position(len(Topic.specs)) == 50  # the tail's claim
        assert source.head() == 50 + 73  # was 50: the reader stopped short
        assert not source.read_to(len(Topic.specs))
        source._consumer.at, source._after = len(Topic.specs), 103
        assert source.head() == 103 and source.read_to(len(Topic.specs))
    finally:
        Topic.specs = []


def test_the_tail_search_has_a_deadline_per_poll_not_one_for_the_whole_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """atk46-25 F6: ~4 million tiny forged records after the relay's last one took longer than
    the search's single 30 s deadline to read: every restart timed out and retried, for good.
    A clock moving 1 s per look: 240 forged records (120 polls) outlast 30 s; each poll that
    brings records restarts the deadline. A broker that hands out nothing still times out."""
    from ledger.store import relay_tail

    now = [0.0]

    def tick() -> float:
        now[0] += 1.0
        return now[0]

    monkeypatch.setattr(relay_tail.time, "monotonic", tick)
    store = chain(5)
    assert bookmark(monkeypatch, store, ours(store, None) + [forged(9) for _ in range(240)]) == (
        5,
        list(range(5, 245)),
    )
    monkeypatch.setattr(Topic, "poll", lambda self, timeout_ms=0, **_kw: {})
    with pytest.raises(RelayError, match="no record came for 30 s"):
        bookmark(monkeypatch, store, ours(store, None))


@pytest.mark.parametrize("keys", [None, KEYS], ids=["unsigned", "signed"])
def test_a_progress_beyond_the_store_head_is_no_word(
    monkeypatch: pytest.MonkeyPatch, keys: SigningKeys | None
) -> None:
    """atk47-25 F1, F4: the store's progress row (or relay.json) raised to 1,000 with the store's
    head at 27, and a rebuilt unsigned copy of event 27 after the relay's last record (24): the
    copy was taken "within the progress", 25 and 26 never reached the topic, and `relay status`
    said 0 behind. A progress is written only after a commit of the store's events: one beyond
    the head is an edit, no word; the relay's last record is 24 and it publishes 25..27."""
    store = chain(27)
    topic = ours(store[:24], keys) + ours([store[26]], None)
    assert bookmark(monkeypatch, store, topic, keys, progress=1_000) == (24, [24])
    # a word up to the head vouches for the one record it names, never for a record within it
    # (atk52-25 F1 (a); with keys an unsigned record never did, atk50-25 F2): the copy is not it
    assert bookmark(monkeypatch, store, topic, keys, progress=27) == (24, [24])
    assert bookmark(monkeypatch, store, topic, keys, progress=27, offset=23) == (24, [24])


@pytest.mark.parametrize("keys", [None, KEYS], ids=["unsigned", "signed"])
def test_more_copies_of_an_old_record_than_the_reach_do_not_move_the_bookmark_back(
    monkeypatch: pytest.MonkeyPatch, keys: SigningKeys | None
) -> None:
    """atk47-25 F3: 70,000 copies of the genuine record of position 1 at the tail (7 s of a
    topic writer's work) and a restarting relay with its progress at 24: past 65,536 offsets
    (`REACH`) "the best found stands", so it resumed after 1 and published 2..24 again, signing
    on or off. It reads on to the whole topic while its best is below its progress."""
    store = chain(24)
    topic = ours(store, keys) + ours([store[0]], keys) * 70_000
    assert bookmark(monkeypatch, store, topic, keys, progress=24) == (
        24,
        list(range(24, 70_024)),
    )


def relabelled(spec: Spec, *headers: tuple[str, bytes], key: bytes | None = b"o") -> Spec:
    """A copy of `spec` (the store's bytes, its position) whose headers after the position are
    `headers` instead, and whose key is `key`."""
    return Spec([spec.headers[0], *headers], spec.make, key)


@pytest.mark.parametrize("keys", [None, KEYS], ids=["unsigned", "signed"])
def test_a_copy_of_the_next_event_under_another_tag_header_is_not_the_bookmark(
    monkeypatch: pytest.MonkeyPatch, keys: SigningKeys | None
) -> None:
    """atk49-25 F1: the store's exact bytes of event 11 at position 11, its tag header relabelled
    (or a second tag header, an extra header, another key), sent before the relay published 11:
    the relay took it as its own record 11 (a digest of the value alone) and never published
    the store's 11, while every reader stopped at 12 for good. The whole record is compared."""
    store = chain(20)
    mine = ours(store[:10], keys)
    nxt = ours([store[10]], None)[0]
    tag = nxt.headers[1]
    for copy in (
        relabelled(nxt, (TAG_HEADER, b"zz.unknown.v1")),
        relabelled(nxt, (TAG_HEADER, b"job.cancelled.v1")),
        relabelled(nxt, tag, (TAG_HEADER, b"zz.unknown.v1")),
        relabelled(nxt, (TAG_HEADER, b"zz.unknown.v1"), tag),
        relabelled(nxt, tag, ("x-extra", b"1")),
        relabelled(nxt, tag, key=b"another"),
        relabelled(nxt, tag, key=None),
    ):
        assert bookmark(monkeypatch, store, [*mine, copy], keys, progress=10) == (10, [10]), copy
    # the control: the exact record (key, tag header, value) right after ours is the event
    if keys is None:
        assert bookmark(monkeypatch, store, [*mine, nxt], None, progress=10) == (11, [])


def test_a_topic_made_again_with_unsigned_copies_up_to_the_progress_last_relabelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """atk49-25 F8, signing on: the topic lost and made again by a topic writer, holding unsigned
    copies of 1..P (P the relay's signed progress), P's tag header relabelled: all were taken
    within the progress, P as the bookmark, and the store's P was never published. The
    relabelled P is foreign now: the relay publishes the store's P, signed, after it."""
    store = chain(20)
    copies = ours(store[:10], None)
    copies[-1] = relabelled(copies[-1], (TAG_HEADER, b"zz.unknown.v1"))
    assert bookmark(monkeypatch, store, copies, KEYS, progress=10) == (9, [9])


def test_with_keys_an_unsigned_copy_of_the_progress_position_alone_is_not_the_bookmark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """atk50-25 F2, signing on: the relay's progress is 22 (signed), the topic is made again (or
    truncated to its end) and holds ONE unsigned exact copy of event 22: it was vouched for
    "within the progress", the bookmark, and 1..21 never reached the topic, "0 behind". With
    keys an unsigned record is the relay's only in an unsigned prefix from the start of the log
    (a topic signed since), never for its progress: the relay publishes 1..24 after it."""
    store = chain(24)
    copy = ours([store[21]], None)
    assert bookmark(monkeypatch, store, copy, KEYS, progress=22) == (0, [0])
    # the same copy after a signed record of ours is no prefix either
    assert bookmark(monkeypatch, store, ours(store[:5], KEYS) + copy, KEYS, progress=22) == (
        5,
        [5],
    )
    # an unsigned prefix from the start (published before signing was turned on) is taken,
    # progress or not, and the relay's signed records after it
    assert bookmark(monkeypatch, store, ours(store[:7], None), KEYS, progress=None) == (7, [])
    mixed = ours(store[:7], None) + ours(store[7:9], KEYS)
    assert bookmark(monkeypatch, store, mixed, KEYS, progress=3) == (9, [])


def test_a_topic_made_again_or_truncated_under_the_relay_is_named() -> None:
    """atk50-25 F1: a running relay published on into a topic deleted and made again, every
    earlier event never on it. `remade` names what changed since it connected: the topic gone,
    another topic id, an end below what it published, a first offset raised."""
    from ledger.store.relay_topic import TopicMark, remade

    before = TopicMark("id-1", 0, 30)
    assert remade(TOPIC, before, TopicMark("id-1", 0, 40), 40) is None
    assert remade(TOPIC, before, TopicMark("", 0, 40), 40) is None  # a broker without ids
    assert "no longer exists" in str(remade(TOPIC, before, None, 40))
    assert "made again (topic id id-2, was id-1)" in str(
        remade(TOPIC, before, TopicMark("id-2", 0, 50), 40)
    )
    assert "ends at offset 3, below the 40" in str(remade(TOPIC, before, TopicMark("", 0, 3), 40))
    assert "start of topic" in str(remade(TOPIC, before, TopicMark("id-1", 5, 40), 40))


def test_a_batch_flushed_into_a_topic_made_again_is_named_before_its_commit() -> None:
    """atk51-25 F2: a batch sent into a topic made again under the relay was committed at its
    offset 0 before the relay's check (its "early copies"). `sent_elsewhere` is asked after the
    flush: the topic gone, another id, or (a broker without ids) the batch's first record at an
    offset below the relay's last commit name it; the topic it published to does not."""
    from ledger.store.relay_topic import TopicMark, sent_elsewhere

    before = TopicMark("id-1", 0, 30)
    assert sent_elsewhere(TOPIC, before, "id-1", 42, 40) is None
    assert sent_elsewhere(TOPIC, before, "id-1", None, 40) is None  # offset unknown
    assert sent_elsewhere(TOPIC, TopicMark("", 0, 30), "", 40, 40) is None
    assert "no longer exists" in str(sent_elsewhere(TOPIC, before, None, 42, 40))
    assert "made again (topic id id-2, was id-1)" in str(
        sent_elsewhere(TOPIC, before, "id-2", 42, 40)
    )
    assert "next record at offset 0, below the 40" in str(
        sent_elsewhere(TOPIC, TopicMark("", 0, 30), "", 0, 40)
    )


def test_a_topic_whose_settings_no_longer_keep_every_event_is_refused_naming_the_fix() -> None:
    """atk51-25 F1/F4: the settings were read only at connect, and the fix named was to set
    them back, which leaves a compacted topic's lost records lost (a new reader stops at the
    ones left). `unkept` refuses; setting back is named only where nothing can be lost yet."""
    from ledger.store.relay_topic import START_GONE_HINT, TopicMark, unkept

    keep = (("retention.ms", "-1"), ("retention.bytes", "-1"), ("cleanup.policy", "delete"))
    assert unkept(TOPIC, TopicMark("id", 0, 30, keep)) is None
    assert unkept(TOPIC, TopicMark("id", 0, 30)) is None  # not asked
    compact = (*keep[:2], ("cleanup.policy", "compact"))
    refused = unkept(TOPIC, TopicMark("id", 0, 30, compact))
    assert refused is not None and refused.hint == START_GONE_HINT
    assert f"topic {TOPIC} has cleanup.policy=compact: it would not keep" in refused.message
    assert "does not bring them back" in refused.message
    empty = unkept(TOPIC, TopicMark("id", 0, 0, compact))  # nothing to lose yet
    assert empty is not None and empty.hint.startswith("set cleanup.policy=delete on the topic")
    short = (("retention.ms", "1000"), *keep[1:])
    kept = unkept(TOPIC, TopicMark("id", 0, 30, short))  # its start still there
    assert kept is not None and kept.hint.startswith("set retention.ms=-1 on the topic at once")
    gone = unkept(TOPIC, TopicMark("id", 7, 30, short))  # the broker deleted by it already
    assert gone is not None and gone.hint == START_GONE_HINT


@pytest.mark.parametrize("keys", [KEYS, None], ids=["signed", "unsigned"])
@pytest.mark.parametrize(("early", "run"), [(2, 3), (2, 0), (20, 0), (20, 5), (3, 26)])
def test_a_relay_restarted_while_it_publishes_again_is_not_misled_by_its_early_copies(
    early: int, run: int, keys: SigningKeys | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """s50 F1 residual: a topic made again under a running relay gets the relay's next events
    (`early` of them, up to 28) before it notices, then the store's log again from position 1
    (`run` of it so far). Restarted in between, the relay took its highest record, 28, as its
    bookmark: 1..27 (or run+1..27) never reached the topic, "0 behind". Its bookmark is where a
    reader taking its records in order stands: the end of the run (0 before it began)."""
    store = chain(30)
    topic = ours(store[28 - early : 28], keys) + ours(store[:run], keys)
    last, foreign = bookmark(monkeypatch, store, topic, keys, progress=28)
    assert last == run  # was 28
    assert foreign == ([] if run else list(range(early)))


def test_a_topic_whose_first_record_is_position_1_reads_only_its_tail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check costs a look at the topic's start: a topic of the whole log is still read from
    its end back only as far as its last record (not whole)."""
    store = chain(300)
    Topic.polled = 0
    got = bookmark(monkeypatch, store, [*ours(store, KEYS), MARKER], KEYS, 300, offset=299)
    assert got == (300, [])
    assert Topic.polled < 40  # 16 from the end, and the first record or two
