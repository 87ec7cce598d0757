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
  back) is located by reading the topic from its first offset: the reading starts right after
  the *first* record, in offset order, at `after` that the projection's kept link (its anchor)
  names, the one the relay wrote (an exact copy of it carries the same link and can only come
  after it). A binary search over the position headers used to guess where to read from; copies
  of old records (positions out of order) misled it onto a copy of the record planted at the
  tail, and the reader resumed after the copy, skipping every event between (atk47-25 F6).
  Without an anchor, the chain is verified from the start. No record at `after` on the topic
  means the projection belongs to another log: `ProjectionMismatch`.
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
  has recorded it (`projections/quarantine.py`). Nothing else is ever skipped, but records
  passed over as no news: an exact copy of a record applied already, and (with signing keys)
  the relay's own record sent before its turn when that turn comes later on the topic
  (`projections.early`: a topic made again under a relay before s52).
- **Security settings** (SASL, SSL) come from the same `GPULEDGER_KAFKA_*` environment variables
  as the relay (`kafka_wire.client_config`), or as keyword arguments
  (`security_protocol="SASL_SSL"`, ...).

`projections.kafka_follow.follow()` keeps a projection up to date with the topic (the loop of
`gpuledger project follow`).

This module never imports `ledger`.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterator
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from projections.chain import START, Tip, link
from projections.early import EarlyCopies
from projections.errors import (
    LogForked,
    PoisonRecord,
    ProjectionMismatch,
    QuarantineStopped,
    SourceUnavailable,
    wrong_keys,
)
from projections.kafka_resume import RECENT, first_anchored, fork_error, head_of
from projections.kafka_wire import (
    PARTITION,
    SIGNATURE_HEADER,
    TOPIC,
    SigningKeys,
    client_config,
    envelope,
    header_position,
    is_signature_problem,
    reader_config,
    signing_keys,
    unreachable,
)
from projections.quarantine import AHEAD_SIGNED, KAFKA_HINT, Where
from projections.source import LogRecord

DEFAULT_TIMEOUT_S = 30.0
MAX_DEAD_RUN = 20
"""A quarantining reader of an unsigned topic stops once it has set aside this many records in a
row (with signing keys a record that fails the signature is never the relay's: no stop)."""
_CLOSE = 5_000
"""head() fetches with the reading consumer when it is at most this many offsets behind."""

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
        max_dead_run: int = MAX_DEAD_RUN,
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
        """A second consumer for head() and the search for a resume point, so that the reading
        consumer keeps its position and its prefetched records."""
        self._exists = False
        self.keys = keys if keys is not None else signing_keys()  # set: only signed records
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
        self._head: tuple[int, int] | None = None  # (end offset, head position) of head()
        self._end_hint: int | None = None
        """The end offset head() just read, for the read() that follows it (the projector's
        pattern: head, then read up to it), which saves a round trip."""
        self.max_dead_run = max_dead_run
        """Unsigned topics: `skip` stops (QuarantineStopped) at this many set aside in a row."""
        self._run: list[str] = []  # why each record set aside since the last accepted one was
        self._aside: Tip | None = None
        """The last record set aside for its signature alone (see `_refused`)."""
        self._holding = False  # records chained under a key id it lacks set aside (`_refused`)
        self._recent: dict[int, Tip] = {}
        """The last accepted records by position (`RECENT` of them) and their offsets:"""
        self._offsets_of: dict[int, int] = {}
        self._recall: Any = None  # a cursor of the projection this source feeds (`recall_from`)
        self.early = EarlyCopies(topic, self.keys)
        """The relay's own records sent before their turn, passed over (`projections.early`)."""
        self.copies: set[int] = set()
        """Offsets of the exact copies of records applied already that reads passed over (a
        restore names them: it said nothing of the relay's replayed records, atk54-25 F7)."""
        self.signed_seen = 0
        """Without keys: records handed out that carry a signature header (`gpuledger.sig`),
        none of them verified. A keyless restore of such a topic took a topic writer's unsigned
        record as the log's next one, "chain verified" (atk54-25 F5): it refuses on this."""

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
                problem = self._foreign(rec, tip, position, tag)
            if problem is not None and self._applied_copy(rec, position, tag, tip):
                buffer.popleft()  # a copy of a record applied already: no news
                self.copies.add(rec.offset)
                continue
            if problem is not None and self.early.early(
                rec, position, tag, tip, self._scan_all, self._end
            ):
                buffer.popleft()  # the relay's own sent before its turn, its turn to come
                continue  # (`projections.early`)
            if problem is not None:
                if out:
                    break
                raise self._refused(rec, position, tag, problem, tip)
            buffer.popleft()
            assert position is not None and tag is not None
            if self.keys is None and signature_carried(rec.headers):
                self.signed_seen += 1
            out.append(LogRecord(position, tag, rec.value))
            offsets[position] = rec.offset
            previous, tip = position, tip.after(position, tag, rec.value)
            self._remember(tip, rec.offset)
        self._offsets = offsets
        if out:
            self._after, self._tip = previous, tip
            self._run, self._aside, self._holding = [], None, False
        return out

    def head(self) -> int:
        """The position of the last committed record (0 when the topic is empty or absent).

        When records after the reader's position are left before the end and the last ones
        claim no position past it (poison at the tail, a forged low one), the head is past it by
        as many as are left: a reader meets them instead of waiting or stopping short."""
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
        if self._after is not None and position <= self._after:
            # records not handed out yet, one position each at most (F5: forged records at the
            # tail claiming a low one stopped a reader there); none: at its own position
            return (
                self._after
                + len(self._buffer)
                + max(0, end - int(self._consumer.position(self.tp)))
            )
        return position

    def read_to(self, end: int) -> bool:
        """Whether every record before offset `end` has been handed out (or set aside)."""
        done = self._after is not None and self._consumer.position(self.tp) >= end
        return done and (not self._buffer or self._buffer[0].offset >= end)

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
        """Topic, partition and offset of the record at `position` of the last page read, or of
        the last records accepted (a page of replayed copies alone after it: `store restore`
        named no record, atk55-25 F4)."""
        offset = self._offsets.get(position, self._offsets_of.get(position))
        return None if offset is None else Where(self.topic, PARTITION, offset)

    def anchor(self, position: int, chain: str | None) -> None:
        """The last record the projection applied: its position and chain hash (None: unknown,
        e.g. a projection file older than the chain table). The next record read after
        `position` must link to it; seeking to `position` looks for that very record."""
        self._anchor = None if chain is None else (position, chain)
        if chain is not None and self._after == position and not self._tip.named_by(chain):
            self._after = None  # positioned after another record of that position: seek again

    def skip(self, poison: PoisonRecord) -> None:
        """Step past the poison record the last `read` raised (the caller recorded it). Raises
        QuarantineStopped on an unsigned topic once `max_dead_run` records in a row have been
        set aside: a reader never sets aside a run of real records and reports success."""
        if not self._buffer or self._buffer[0].offset != poison.offset:
            raise ValueError(f"offset {poison.offset} is not the next record of {self.topic}")
        rec = self._buffer.popleft()
        if self.keys is None:  # signed: what does not verify is never the relay's
            self._run.append(poison.reason)
        self._aside = None
        if is_signature_problem(poison.reason) and poison.position is not None and poison.tag:
            self._aside = Tip.of(poison.position, poison.tag, rec.value or b"")
        if self._run and len(self._run) >= self.max_dead_run:
            reasons = sorted(set(self._run))
            raise QuarantineStopped(
                f"{len(self._run)} records in a row set aside on topic {self.topic}, the last at "
                f"offset {poison.offset} (after position {self._after or 0}): "
                f"{'; '.join(reasons[:3])}{' ...' if len(reasons) > 3 else ''}",
                hint="a damaged or foreign stretch of the topic, or a reader that is not reading "
                "what the relay writes (its topic, its signing keys); nothing after position "
                f"{self._after or 0} is applied",
                topic=self.topic,
                offset=poison.offset,
                position=self._after or 0,
            )

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
        self._recent, self._offsets_of, self._holding = {}, {}, False
        offset, self._tip = self._offset_after(after)
        self._consumer.seek(self.tp, offset)
        self._buffer.clear()
        self._after = after

    def _foreign(self, rec: Any, tip: Tip, position: int | None, tag: str | None) -> str | None:
        """Why a well-formed record is not the log's next one: not signed by our keys, or it
        does not link to `tip`, the record before it (None: it continues the log)."""
        if self.keys is not None:
            problem = self.keys.problem(rec.headers, rec.value, position, tag)
            if problem is not None:
                return problem
        return tip.problem(rec.value)

    def _remember(self, tip: Tip, offset: int) -> None:
        self._recent[tip.position] = tip
        self._offsets_of[tip.position] = offset
        if len(self._recent) > 2 * RECENT:  # keep the newest
            for p in sorted(self._recent)[:-RECENT]:
                del self._recent[p]
                self._offsets_of.pop(p, None)

    def _applied_copy(self, rec: Any, position: int | None, tag: str | None, tip: Tip) -> bool:
        """Whether `rec` is an exact copy of a record applied already (its position, tag and
        bytes, so its chain link, and with signing keys a good signature): a relay that
        published a batch twice (a restart while another producer's open transaction hid its
        last records). A no-op, never poison: nothing in it is new."""
        if position is None or tag is None or rec.value is None:
            return False
        if position > tip.position:
            return False
        applied = self._recent.get(position)
        if applied is not None:
            same = applied.named_by(link(position, tag, rec.value))
        else:  # applied before this reader (re)started: its bytes, as the projection keeps them
            same = self._recalled(position) == (tag, bytes(rec.value))
        if not same:
            return False
        return self.keys is None or self.keys.problem(rec.headers, rec.value, position, tag) is None

    def recall_from(self, con: Any) -> None:
        """A connection (a cursor of its own) to the projection this source feeds: an exact
        copy of a record applied before a restart is known by the bytes it keeps (`events`)."""
        self._recall = con

    def _recalled(self, position: int) -> tuple[str, bytes] | None:
        if self._recall is None:
            return None
        row = self._recall.execute(
            "SELECT tag, raw FROM events WHERE position = ?", [position]
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]).encode())

    def _refused(
        self, rec: Any, position: int | None, tag: str | None, problem: str, tip: Tip
    ) -> Exception:
        """The error for a record that does not continue the log: a fork (a second record that
        links to the record before a position already applied), wrong keys, or poison. Wrong
        keys need evidence (docs/kafka.md): a reader that verified nothing stops at two chained
        records from the topic's start; past a verified record, a bad signature is a forgery,
        and records chained under a key id it lacks are set aside while it holds, saying so
        once, until a verified record follows (they stopped it at the tail: a topic writer could
        stop every reader while the ledger was quiet, atk44-25 F4)."""
        signed = (
            None if self.keys is None else self.keys.problem(rec.headers, rec.value, position, tag)
        )
        if position is not None and tag is not None and rec.value is not None:
            if 0 < position <= tip.position:
                before = START if position == 1 else self._recent.get(position - 1)
                applied = self._recent.get(position)
                same = applied is not None and applied.named_by(link(position, tag, rec.value))
                if before is not None and before.problem(rec.value) is None and signed is None:
                    if same:
                        problem = f"a copy of position {position}, which is applied already"
                    else:
                        raise self._fork(rec, position)
            aside = self._aside
            if (
                aside is not None
                and signed is not None
                and is_signature_problem(signed)
                and position == aside.position + 1
                and aside.problem(rec.value) is None
            ):
                if tip.position == 0:
                    what = f"the records at positions {aside.position} and {position} continue"
                    return wrong_keys(
                        self.topic,
                        f"{what} the log one after the other but fail the signature check "
                        f"({signed})",
                        position,
                        self._after or 0,
                    )
                if signed.startswith("signed with unknown") and not self._holding:
                    self._holding = True  # a forger's key id, or a rotation it was not told of
                    log.warning(
                        "topic %s: the records at positions %d and %d continue the log %s: set "
                        "aside; holding at position %d until a verified record follows (if the "
                        "relay signs with that key now, give it to this reader: "
                        "GPULEDGER_KAFKA_SIGNING_KEYS)",
                        self.topic, aside.position, position, signed, self._after or 0,
                    )  # fmt: skip
        if (
            signed is None
            and self.keys is not None
            and position is not None
            and position > tip.position + 1
        ):  # the relay's own record past a gap: the topic lacks the positions before it
            problem += f" ({AHEAD_SIGNED})"
        return self._poison(rec, position, tag, problem)

    def _fork(self, rec: Any, position: int) -> LogForked:
        return fork_error(
            self.topic, position, rec.offset, self._offsets_of.get(position), self.keys is not None
        )

    def _offset_after(self, after: int) -> tuple[int, Tip]:
        """The offset right after the record at position `after` (see the module docstring),
        and that record as the chain sees it. The record is found by a link kept outside the
        topic (the projection's anchor): never by what the first record that claims the
        position says; without an anchor, by verifying the chain from the topic's start."""
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
        want = self._anchor[1] if self._anchor and self._anchor[0] == after else None
        if want is None:  # no link kept: the chain from the start is the only proof
            start = self._verified_from_start(begin, end, after)
        else:
            # The first record in offset order that the anchor names: the one the relay wrote
            # (an exact copy carries the same link, and a copy can only come after it). A
            # binary search over position headers was a hint that copies of old records
            # (positions out of order) misled onto a copy at the tail: the reader resumed
            # after it, skipping every event between (atk47-25 F6).
            start = self._anchored_in(begin, end, after, want)
        if start is None:
            raise ProjectionMismatch(
                f"topic {self.topic} has no record at position {after} that the projection "
                "applied" + ("" if want is None else " (none its kept link names)"),
                hint="the projection was built from another log: rebuild it from this topic "
                "(delete the projection file and follow again)",
                position=after,
                topic=self.topic,
            )
        return start

    def _anchored_in(self, start: int, end: int, after: int, want: str) -> tuple[int, Tip] | None:
        """The offset right after the first record at position `after` that the link `want`
        names, reading from `start` (None: no such record before `end`). The records it links
        back to (up to `RECENT`) are remembered too, so a second record for one of their
        positions is named a fork after a restart as before it."""
        found = first_anchored(self._scan(start, end, 5_000), after, want)
        if found is None:
            return None
        rec, linked = found
        position, tag, _problem = envelope(rec.headers, rec.value, None)
        assert position is not None and tag is not None
        self._check_anchor_signed(rec, position, tag)
        tip = Tip.of(position, tag, rec.value)
        self._recent, self._offsets_of = {}, {}
        self._remember(tip, rec.offset)
        for before, offset in linked:
            self._remember(before, offset)
        return rec.offset + 1, tip

    def _check_anchor_signed(self, rec: Any, position: int, tag: str) -> None:
        """The record the projection applied must verify with the reader's keys, or they are
        not the relay's."""
        if self.keys is None:
            return
        problem = self.keys.problem(rec.headers, rec.value, position, tag)
        if problem and is_signature_problem(problem) and "unknown key id" not in problem:
            raise wrong_keys(  # not for an unknown id: its key dropped after a rotation
                self.topic,
                f"the record at position {position} (offset {rec.offset}), the last one this "
                f"projection applied, fails the signature check ({problem})",
                position,
                position,
            )

    def _verified_from_start(self, begin: int, end: int, after: int) -> tuple[int, Tip] | None:
        """Read from the topic's start accepting records as `read` does (each must continue
        the last one accepted, from the start of the log): the offset right after the accepted
        record at position `after`, with its tip."""
        tip = START
        self._recent, self._offsets_of = {}, {}
        for rec in self._scan(begin, end, 5_000):
            position, tag, problem = envelope(rec.headers, rec.value, tip.position)
            if problem is None:
                problem = self._foreign(rec, tip, position, tag)
            if problem is not None:
                continue
            assert position is not None and tag is not None
            tip = tip.after(position, tag, rec.value)
            self._remember(tip, rec.offset)
            if position == after:
                return rec.offset + 1, tip
        return None

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

    def _scan_all(self, start: int, stop: int) -> Iterator[Any]:
        return self._scan(start, stop, 5_000)

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
        return head_of((header_position(r.headers) for r in self._buffer), self._after)

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
                window: list[int | None] = []  # positions: a window of values is never held
                while probe.position(self.tp) < end:
                    got = probe.poll(timeout_ms=500).get(self.tp, [])
                    window += [header_position(rec.headers) for rec in got if rec.offset < end]
                    self._check_deadline(deadline, "reading the end of")
                best = head_of(window, 0)
                if best or start == begin:
                    return best
                back *= 16
        except KafkaError as e:
            raise self._unavailable(e) from e

    def first_offset(self) -> int:
        """The topic's first offset (its log start): above 0, records before it were deleted."""
        probe = self._probe_consumer()
        try:
            return int(
                probe.beginning_offsets([self.tp], timeout_ms=int(self.timeout_s * 1000))[self.tp]
            )
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
        """The record as poison (its `reason` what a quarantine keeps in dead_letters)."""
        where = Where(self.topic, PARTITION, rec.offset)
        at = f", log position {position}" if position is not None else ""
        hint = KAFKA_HINT
        if AHEAD_SIGNED in problem:
            hint = (
                f"the topic lacks positions {(self._after or 0) + 1} to {(position or 1) - 1}, "
                "and this record carries the relay's signature: the topic's start was deleted, "
                "or it was made again; setting records aside will not bring those positions "
                "(`--quarantine --once` stops, saying so): read a topic the relay wrote from its "
                "start, or restore the store and publish to a new topic"
            )
        elif is_signature_problem(problem) and position == (self._after or 0) + 1:
            hint = (
                "it would continue the log but fails the signature check: the reader's "
                "GPULEDGER_KAFKA_SIGNING_KEYS are not the relay's, or another producer forged "
                "it; the projector stops there (`--quarantine` sets forgeries aside and "
                "applies the relay's record for the position when it comes)"
            )
        return PoisonRecord(
            f"{where}{at}: {problem}",
            topic=self.topic,
            partition=PARTITION,
            offset=rec.offset,
            position=position,
            tag=tag,
            reason=problem,
            data=rec.value,
            hint=hint,
        )

    def _unavailable(self, e: BaseException) -> SourceUnavailable:
        return SourceUnavailable(
            f"Kafka at {self.bootstrap}, topic {self.topic}: {type(e).__name__}: {e}",
            hint="is the broker up? (`scripts/kafka/kafka status`)",
            topic=self.topic,
        )


def signature_carried(headers: Any) -> bool:
    """Pure: whether a record's headers hold the relay's signature header (verified or not)."""
    return any(name == SIGNATURE_HEADER for name, _value in headers or ())
