"""Kafka as an event source: the relay's topic (`gpuledger.events`) read back in log order.

`KafkaSource(bootstrap, topic)` implements `EventSource` over partition 0 of the topic the relay
(`ledger/store/relay.py`) writes, records as `projections.kafka_wire` states them: one record per
event, value = the stored event bytes, headers `gpuledger.position` (the log position, ASCII
decimal) and `gpuledger.tag` (the event tag).

- **read_committed, manual assignment, no group.** The relay publishes in transactions; only
  committed records are read (an aborted half batch is never seen). The consumer has no group and
  commits no offsets: the projection's position lives in DuckDB with its rows (`tracking`), in the
  same transaction, and is the only bookmark.
- **Positions, not offsets.** Offsets differ from positions: every transaction leaves a commit
  marker, and aborted batches take offsets too. `read(after, limit)` maps a position to an offset
  like this: after a read that returned records up to position P, the consumer is left right
  after P's record, so the next `read(P, ...)` continues from there (the common case: the
  projector reads page after page). Any other `after` (first call, restart, a reader that went
  back) is located by *binary search over offsets*: probe offset o, take the first committed
  record at or after it that has a position header; about log2(offsets) probes (one fetch each)
  narrow the answer to 64 offsets, then the records from 64 offsets before that are read in
  order, accepting positions the way `read` does, to find the record at `after` itself. The
  search relies on positions increasing with offsets, which the relay guarantees (one partition,
  one idempotent transactional producer); if a stray record with an out-of-order position
  (poison written by another producer) misleads it, that final read does not find `after` and
  the topic is read in order from its first offset instead (slow, never wrong). No record at
  `after` on the topic means the projection belongs to another log: `ProjectionMismatch`.
- **head()** is the largest position among the last committed records: when the reading
  consumer is close behind the last stable offset (the usual case when following), it fetches
  the few records it lacks (the next `read` hands them out) and takes the last one's position;
  otherwise it reads backwards from the end in growing windows; cached while the end offset does
  not move.
- **Poison.** A record without a value, without a tag header, or with a missing, garbled or
  non-increasing position header cannot be handed out: `read` returns the records before it and
  the next `read` raises `PoisonRecord` naming topic, partition and offset (and the position when
  it is readable). A value that does not decode is found by the projector, which names it the
  same way through `where()`. `skip()` steps past a poison record once a quarantining projector
  has recorded it (`projections/quarantine.py`). Nothing else is ever skipped.
- **Security settings** (SASL, SSL) come from the same `GPULEDGER_KAFKA_*` environment variables
  as the relay (`kafka_wire.client_config`), or as keyword arguments
  (`security_protocol="SASL_SSL"`, ...).

`follow()` keeps a projection up to date with the topic (the loop of `gpuledger project follow`).

This module never imports `ledger`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from projections.chain import START, Tip, names
from projections.errors import (
    PoisonRecord,
    ProjectionMismatch,
    SourceUnavailable,
)
from projections.kafka_wire import (
    PARTITION,
    TOPIC,
    SigningKeys,
    client_config,
    envelope,
    reader_config,
    signing_keys,
    unreachable,
)
from projections.projector import CatchUp, Progress, Projector
from projections.quarantine import KAFKA_HINT, Where
from projections.source import LogRecord

DEFAULT_TIMEOUT_S = 30.0
_CLOSE = 5_000
"""head() fetches with the reading consumer when it is at most this many offsets behind."""
_SCAN = 64
"""The binary search stops when this few offsets are left, and reads from this far before them
in order (a fetch or two)."""

log = logging.getLogger("gpuledger.kafka_source")


class KafkaSource:
    """Partition 0 of a topic the relay writes, as an `EventSource` (see the module docstring).

    Not thread-safe: one caller at a time (the projector's reader thread and its main thread take
    turns). `timeout_s` bounds every wait for the broker; past it the call raises
    `SourceUnavailable` (kafka-python reconnects by itself, so the next call may succeed).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str = TOPIC,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float | None = None,
        max_poll_records: int = 10_000,
        keys: SigningKeys | None = None,
        **config: Any,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.timeout_s = timeout_s
        self.connect_timeout_s = timeout_s if connect_timeout_s is None else connect_timeout_s
        """How long finding the broker may take before it counts as unreachable."""
        self.tp = TopicPartition(topic, PARTITION)
        self._config = client_config(config)
        self._max_poll_records = max_poll_records
        self._consumer = self._new_consumer(
            "gpuledger-projector",
            max_poll_records=max_poll_records,
            max_partition_fetch_bytes=8 << 20,
            fetch_max_bytes=32 << 20,
            # A fetch waiting at the end of the topic delays the fetch after a seek until it
            # returns: keep the broker's wait short (new records still end it at once).
            fetch_max_wait_ms=100,
        )
        self._probe: Any = None
        """A second consumer for head() and the binary search, so that the reading consumer
        keeps its position and its prefetched records."""
        self._exists = False
        self.keys = keys if keys is not None else signing_keys()
        """Signing keys: when set, only records signed with one of them are accepted."""
        self._after: int | None = None
        """The position the reading consumer continues after (None: not positioned yet)."""
        self._tip = START
        """The record at `_after` as the chain sees it (what the next record must link to)."""
        self._anchor: tuple[int, str] | None = None
        """(position, chain hash) of the last record the projection applied (`anchor`)."""
        self._buffer: collections.deque[Any] = collections.deque()
        """Records polled but not handed out yet (the next ones after `_after`)."""
        self._offsets: dict[int, int] = {}
        """Position -> offset of the records the last read returned (for `where`)."""
        self._head: tuple[int, int] | None = None
        """(end offset, head position) of the last head() call."""
        self._end_hint: int | None = None
        """The end offset head() just read, for the read() that follows it (the projector's
        pattern: head, then read up to it), which saves a round trip."""

    # --- the EventSource protocol -----------------------------------------------------------------

    def read(self, after: int, limit: int) -> list[LogRecord]:
        """Up to `limit` committed records with position > `after`, in order: what has been
        committed up to now (waits only for records the broker already has). Raises
        `PoisonRecord` when the first record after `after` cannot be handed out."""
        if limit < 1 or not self._ready():
            return []
        self._seek_after(after)
        out: list[LogRecord] = []
        offsets: dict[int, int] = {}
        previous, tip = after, self._tip
        end, self._end_hint = self._end_hint, None
        deadline = time.monotonic() + self.timeout_s
        buffer = self._buffer
        while len(out) < limit:
            if not buffer:
                if end is None:
                    end = self._end()
                if self._consumer.position(self.tp) >= end:
                    break  # caught up with everything committed when this read started
                if self._fill(min(1.0, deadline - time.monotonic())):
                    deadline = time.monotonic() + self.timeout_s  # progress: no time-out
                else:
                    self._check_deadline(deadline, "reading")
                continue
            rec = buffer[0]
            position, tag, problem = envelope(rec.headers, rec.value, previous)
            if problem is None:
                problem = self._foreign(rec, tip)
            if problem is not None:
                if out:
                    break
                raise self._poison(rec, position, tag, problem)
            buffer.popleft()
            assert position is not None and tag is not None
            out.append(LogRecord(position, tag, rec.value))
            offsets[position] = rec.offset
            previous, tip = position, tip.after(position, tag, rec.value)
        self._offsets = offsets
        if out:
            self._after, self._tip = previous, tip
        return out

    def head(self) -> int:
        """The position of the last committed record (0 when the topic is empty or absent).

        When the reading consumer holds a record after its position that carries no readable
        position (poison at the tail), the head is at least one past it, so that a reader meets
        that record (and stops at it, or sets it aside) instead of waiting for it forever."""
        if not self._ready():
            return 0
        end = self._end_hint = self._end()
        if self._head is not None and self._head[0] == end:
            position = self._head[1]
        else:
            found = self._known_head(end)
            if found is None and self._close_behind(end):
                # Fetch the few records left with the reading consumer: `read` hands them out
                # next, so this costs no more than the probe fetch it saves.
                self._fill_to(end)
                found = self._known_head(end)
            position = self._last_position(end) if found is None else found
            self._head = (end, position)
        if self._buffer and self._after is not None and position <= self._after:
            return self._after + 1
        return position

    def close(self) -> None:
        for consumer in (self._consumer, self._probe):
            if consumer is not None:
                consumer.close()

    def __enter__(self) -> KafkaSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- beyond the protocol ----------------------------------------------------------------------

    def where(self, position: int) -> Where | None:
        """Topic, partition and offset of the record at `position` of the last page read."""
        offset = self._offsets.get(position)
        return None if offset is None else Where(self.topic, PARTITION, offset)

    def anchor(self, position: int, chain: str | None) -> None:
        """The last record the projection applied: its position and chain hash (None: unknown,
        e.g. a projection file older than the chain table). The next record read after
        `position` must link to it; seeking to `position` looks for that very record."""
        self._anchor = None if chain is None else (position, chain)
        if chain is not None and self._after == position and not self._tip.named_by(chain):
            self._after = None  # positioned after another record of that position: seek again

    def skip(self, poison: PoisonRecord) -> None:
        """Step past the poison record the last `read` raised (the caller recorded it)."""
        if not self._buffer or self._buffer[0].offset != poison.offset:
            raise ValueError(f"offset {poison.offset} is not the next record of {self.topic}")
        self._buffer.popleft()

    def wait(self, after: int, timeout_s: float) -> bool:
        """Block until a committed record after position `after` can be read, or `timeout_s`
        passes (a long poll: it returns as soon as the broker has one). True if one is there."""
        if not self._ready():
            time.sleep(min(timeout_s, 0.5))
            return False
        self._seek_after(after)
        return bool(self._buffer) or self._fill(timeout_s)

    # --- internals --------------------------------------------------------------------------------

    def _new_consumer(self, client_id: str, **extra: Any) -> Any:
        why = unreachable(self.bootstrap, self.connect_timeout_s)
        if why is not None:
            raise SourceUnavailable(
                f"Kafka at {self.bootstrap} is unreachable ({why})",
                hint="is the broker up? (`scripts/kafka/kafka status`)",
                topic=self.topic,
            )
        try:
            return KafkaConsumer(
                **reader_config(
                    self.bootstrap,
                    client_id,
                    self.connect_timeout_s,
                    auto_offset_reset="earliest",
                    **extra,
                    **self._config,
                )
            )
        except KafkaError as e:
            raise self._unavailable(e) from e

    def _ready(self) -> bool:
        """Whether the topic exists (checked until it does); refuses a topic with more than one
        partition (it would not keep the log's order)."""
        if self._exists:
            return True
        try:
            partitions = self._consumer.partitions_for_topic(self.topic)
        except KafkaError as e:
            raise self._unavailable(e) from e
        if not partitions:
            return False
        if partitions != {PARTITION}:
            raise SourceUnavailable(
                f"topic {self.topic} has {len(partitions)} partitions; the event log is one",
                hint="read the topic the relay writes (it creates it with one partition)",
                topic=self.topic,
            )
        self._consumer.assign([self.tp])
        self._exists = True
        return True

    def _end(self) -> int:
        """The last stable offset: everything before it is committed or aborted."""
        try:
            return int(
                self._consumer.end_offsets([self.tp], timeout_ms=int(self.timeout_s * 1000))[
                    self.tp
                ]
            )
        except KafkaError as e:
            raise self._unavailable(e) from e

    def _fill(self, timeout_s: float) -> bool:
        """Poll once into the buffer; True if records arrived."""
        try:
            polled = self._consumer.poll(
                timeout_ms=max(0, int(timeout_s * 1000)), max_records=self._max_poll_records
            )
        except KafkaError as e:
            raise self._unavailable(e) from e
        records = polled.get(self.tp)
        if records:
            self._buffer.extend(records)
            return True
        return False

    def _seek_after(self, after: int) -> None:
        """Put the reading consumer right after the record at position `after`."""
        if after == self._after:
            return
        offset, self._tip = self._offset_after(after)
        self._consumer.seek(self.tp, offset)
        self._buffer.clear()
        self._after = after

    def _foreign(self, rec: Any, tip: Tip) -> str | None:
        """Why a well-formed record is not the log's next one: not signed by our keys, or it
        does not link to `tip`, the record before it (None: it continues the log)."""
        if self.keys is not None:
            problem = self.keys.problem(rec.headers, rec.value)
            if problem is not None:
                return problem
        return tip.problem(rec.value)

    def _offset_after(self, after: int) -> tuple[int, Tip]:
        """The offset right after the record at position `after` (see the module docstring),
        and that record as the chain sees it."""
        probe = self._probe_consumer()
        try:
            begin = int(
                probe.beginning_offsets([self.tp], timeout_ms=int(self.timeout_s * 1000))[self.tp]
            )
        except KafkaError as e:
            raise self._unavailable(e) from e
        if after == 0:
            return begin, START
        end = self._end()
        # 1. binary search: the answer (smallest offset whose first positioned record is past
        #    `after`) stays in [lo, hi]
        lo, hi = begin, end
        while hi - lo > _SCAN:
            mid = (lo + hi) // 2
            found = self._first_from(mid, end)
            if found is None or found[1] > after:
                hi = mid
            else:
                lo = found[0] + 1
        # 2. read the neighbourhood in order, as a reader would, to find the record itself
        start = self._locate_in(max(begin, lo - _SCAN), end, after)
        if start is None:
            # a record out of order (poison) misled the search: read from the beginning
            start = self._locate_in(begin, end, after)
        if start is None:
            raise ProjectionMismatch(
                f"topic {self.topic} has no record at position {after}, where the projection "
                "stands",
                hint="the projection was built from another log: rebuild it from this topic "
                "(delete the projection file and follow again)",
                position=after,
                topic=self.topic,
            )
        return start

    def _scan(self, start: int, stop: int, batch: int) -> Iterator[Any]:
        """The committed records with offsets in [start, stop), in order (probe consumer)."""
        probe = self._probe_consumer()
        probe.seek(self.tp, start)
        deadline = time.monotonic() + self.timeout_s
        try:
            while probe.position(self.tp) < stop:
                got = probe.poll(timeout_ms=500, max_records=batch).get(self.tp, [])
                for rec in got:
                    if rec.offset >= stop:
                        return
                    yield rec
                if got:
                    deadline = time.monotonic() + self.timeout_s
                self._check_deadline(deadline, "searching")
        except KafkaError as e:
            raise self._unavailable(e) from e

    def _first_from(self, offset: int, end: int) -> tuple[int, int] | None:
        """(offset, position) of the first committed record at or after `offset` that carries a
        readable position header; None when there is none before `end`."""
        for rec in self._scan(offset, end, 64):
            position, _tag, _problem = envelope(rec.headers, b"", None)
            if position is not None:
                return rec.offset, position
        return None

    def _locate_in(self, start: int, end: int, after: int) -> tuple[int, Tip] | None:
        """Read from `start` accepting records as `read` does (a well-formed record that
        continues the last accepted one; the first one is taken as it is): the offset right after
        the accepted record at position `after`, with its tip, or None when there is none
        before the first one past it. With an anchor at `after`, the record at `after` must be
        the one the projection applied (the record its chain link names)."""
        want = self._anchor[1] if self._anchor and self._anchor[0] == after else None
        tip: Tip | None = None
        found = None
        for rec in self._scan(start, end, 5_000):
            position, tag, problem = envelope(
                rec.headers, rec.value, None if tip is None else tip.position
            )
            if problem is None and tip is not None:
                problem = self._foreign(rec, tip)
            elif problem is None and self.keys is not None:
                problem = self.keys.problem(rec.headers, rec.value)
            if want is not None:
                if (
                    position == after
                    and tag is not None
                    and rec.value is not None
                    and names(want, position, tag, rec.value)
                ):
                    return rec.offset + 1, Tip.of(position, tag, rec.value)
                if position is not None and position > after and problem is None:
                    break
                continue
            if problem is None and position is not None and tag is not None:
                if position > after:
                    break
                tip = (
                    Tip.of(position, tag, rec.value)
                    if tip is None
                    else tip.after(position, tag, rec.value)
                )
                found = (rec.offset + 1, tip) if position == after else None
        return found

    def _close_behind(self, end: int) -> bool:
        return (
            self._after is not None
            and len(self._buffer) < self._max_poll_records
            and end - self._consumer.position(self.tp) <= _CLOSE
        )

    def _fill_to(self, end: int) -> None:
        """Poll the reading consumer until it has fetched up to `end` (bounded, like a read)."""
        deadline = time.monotonic() + self.timeout_s
        while self._consumer.position(self.tp) < end and len(self._buffer) < 2 * _CLOSE:
            if self._fill(min(1.0, deadline - time.monotonic())):
                deadline = time.monotonic() + self.timeout_s
            else:
                self._check_deadline(deadline, "reading")

    def _known_head(self, end: int) -> int | None:
        """The head from what the reading consumer holds, when it has fetched up to `end`:
        every committed record before `end` is then either at or before `_after` or buffered."""
        if self._after is None or self._consumer.position(self.tp) < end:
            return None
        return _head_of(self._buffer, self._after)

    def _last_position(self, end: int) -> int:
        """The largest position among the last committed records before `end` (0: none)."""
        probe = self._probe_consumer()
        try:
            begin = int(
                probe.beginning_offsets([self.tp], timeout_ms=int(self.timeout_s * 1000))[self.tp]
            )
            back = 16
            deadline = time.monotonic() + self.timeout_s
            while True:
                start = max(begin, end - back)
                probe.seek(self.tp, start)
                window: list[Any] = []
                while probe.position(self.tp) < end:
                    got = probe.poll(timeout_ms=500).get(self.tp, [])
                    window += [rec for rec in got if rec.offset < end]
                    self._check_deadline(deadline, "reading the end of")
                best = _head_of(window, 0)
                if best or start == begin:
                    return best
                back *= 16
        except KafkaError as e:
            raise self._unavailable(e) from e

    def _probe_consumer(self) -> Any:
        if self._probe is None:
            self._probe = self._new_consumer(
                "gpuledger-projector-probe",
                max_poll_records=64,
                max_partition_fetch_bytes=64 << 10,
                fetch_max_wait_ms=10,  # probes seek often: never leave a long fetch in flight
            )
            self._probe.assign([self.tp])
        return self._probe

    def _check_deadline(self, deadline: float, doing: str) -> None:
        if time.monotonic() > deadline:
            raise SourceUnavailable(
                f"{doing} topic {self.topic} at {self.bootstrap} took over {self.timeout_s:g} s",
                hint="is the broker up and reachable? (`scripts/kafka/kafka status`)",
                topic=self.topic,
            )

    def _poison(
        self, rec: Any, position: int | None, tag: str | None, problem: str
    ) -> PoisonRecord:
        where = Where(self.topic, PARTITION, rec.offset)
        at = f", log position {position}" if position is not None else ""
        return PoisonRecord(
            f"{where}{at}: {problem}",
            topic=self.topic,
            partition=PARTITION,
            offset=rec.offset,
            position=position,
            tag=tag,
            reason=problem,
            data=rec.value,
            hint=KAFKA_HINT,
        )

    def _unavailable(self, e: BaseException) -> SourceUnavailable:
        return SourceUnavailable(
            f"Kafka at {self.bootstrap}, topic {self.topic}: {type(e).__name__}: {e}",
            hint="is the broker up? (`scripts/kafka/kafka status`)",
            topic=self.topic,
        )


def _head_of(records: Iterable[Any], after: int) -> int:
    """Pure: the head of a log whose records up to position `after` are followed by `records`:
    the largest position they carry, or one past it when the last record is not the one that
    carries it (poison at the tail: a reader reading up to the head then meets it)."""
    best = after
    last: int | None = after
    for rec in records:
        last, _tag, _problem = envelope(rec.headers, b"", None)
        if last is not None and last > best:
            best = last
    return best if last == best else best + 1


# --- following a topic ----------------------------------------------------------------------------


def follow(
    projector: Projector,
    stop: threading.Event,
    *,
    until: int | None = None,
    once: bool = False,
    wait_s: float = 0.5,
    progress: Progress | None = None,
    on_error: Callable[[SourceUnavailable], None] | None = None,
) -> int:
    """Keep `projector`'s store up to date with its source until `stop` is set; returns the
    tracked position at the end.

    `until`: return once the projection reaches that position. `once`: return after catching up
    with the log as it is now. Between catch-ups it blocks in the source's long poll (`wait`),
    so a new event is applied as soon as the broker hands it out. A broker that is away is
    reported to `on_error` once per outage and retried (backing off 0.2 s to 2 s; the retries are
    logged at DEBUG level); poison stops the loop with its error, unless the projector
    quarantines it.
    """
    source = projector.source
    delay = 0.2
    position = projector.store.position()
    failing = False

    def failed(err: SourceUnavailable) -> None:
        nonlocal failing
        if not failing and on_error is not None:
            on_error(err)
        else:
            log.debug("still unavailable: %s", err.line())
        failing = True

    while not stop.is_set():
        try:
            result: CatchUp = projector.catch_up(until=until, progress=progress)
        except SourceUnavailable as err:  # poison and mismatches end the loop
            failed(err)
            stop.wait(delay)
            delay = min(delay * 2, 2.0)
            continue
        if failing:
            log.warning("kafka: reachable again, at position %d", result.position)
            failing = False
        delay = 0.2
        position = result.position
        if (until is not None and position >= until) or once:
            break
        if result.applied == 0 or position >= result.head:
            waiter = getattr(source, "wait", None)
            try:
                if waiter is None:
                    stop.wait(wait_s)
                else:
                    waiter(position, wait_s)
            except SourceUnavailable as err:
                failed(err)
                stop.wait(delay)
    return position
