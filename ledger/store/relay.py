"""The relay: publishes the event store's notification log to the Kafka topic `gpuledger.events`.

An edge (network, files). Guarantees, with the reasons (docs/kafka.md has the long version):

- *No gap, no duplicate, same order.* One partition, so Kafka keeps the log order. Every record
  carries its log position in a header. The relay keeps no offsets of its own: on start (and
  after every error) it reads the position of its last *committed* record on the topic and
  resumes right after it, so the topic itself is the relay's bookmark. Which records are its own
  is its progress's word: the last record a relay of this ledger committed there (its position,
  the topic's id and its offset), kept in the store every server shares (`relay_progress`), and
  what follows it as the store's next events (signatures decide nothing alone: atk52-25 F1).
- *Atomic batches.* Each batch is one Kafka transaction: a relay that dies mid-batch leaves an
  open transaction; the next relay's `init_transactions` aborts it before reading the bookmark,
  so read_committed consumers never see the half batch, and the next relay sends it again.
- *One publisher.* The transactional id fences: when a second relay calls `init_transactions`,
  the first one's next transaction fails with ProducerFencedError and it raises `RelayFenced`.
- *The right topic.* The topic is created explicitly (one partition, unlimited retention,
  delete policy: every record has the same key, so compaction would keep only the last one);
  an existing topic with another shape is refused, and so is a topic that carries another log
  (a record that continues the chain without being the store's event: another ledger's topic)
  and one whose start is gone (its first offset above 0: `relay_topic.start_gone`, which
  `store restore` and `audit verify --kafka` refuse too, naming the same fix).
- *Foreign records are skipped, not obeyed.* The bookmark is the relay's last record (its key,
  tag header and value equal to the store's event at its position, its headers the relay's
  own); records another producer wrote after it are skipped with a warning naming their
  offsets: the store is the source of truth.
- *Never silent.* `RelayService` (`ledger/store/relay_service.py`) runs the relay in its own
  thread for the service: every error is logged (once per outage) and kept in its health
  (`<home>/relay.json`, `gpuledger relay status`); scheduling never waits on it; `stop()` flushes
  every committed event (bounded).

The producer (its settings, the bounded commit, fencing, discarding one) is `relay_producer`'s.
The topic, the record headers and the client settings are `projections.kafka_wire`'s, which every
reader shares. Record timestamps are the broker's append time (`LogAppendTime`: the progress
keeps its last record's, `relay_tail.stamped`), never the event time, which is in the payload.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from eventsourcing.persistence import ApplicationRecorder
from kafka.errors import KafkaError

from ledger.store.confirmed import publishable
from ledger.store.relay_producer import (
    commit,
    discard,
    fenced,
    init_transactions,
    new_producer,
)
from ledger.store.relay_progress import (
    Committed,
    Kept,
    again_after,
    elsewhere,
)
from ledger.store.relay_raw import RawRecord, RawSource, open_store, read_raw, too_large
from ledger.store.relay_tail import (
    Found,
    held_at,
    held_text,
    last_published,
    unavailable,
)
from ledger.store.relay_topic import (
    DEFAULT_TIMEOUT_S,
    TOPIC_CHECK_S,
    ConnectEnded,
    RecordTooLarge,
    RelayError,
    RelayFenced,
    RelayHeld,
    RelayUnavailable,
    TopicMark,
    asks_broker,
    create_time_text,
    ensure_topic,
    offsets_text,
    open_admin,
    raise_record_limit,
    remade,
    sent_elsewhere,
    start_gone,
    topic_id_of,
    topic_mark,
    transactional_id_for,
    unkept,
)
from projections.kafka_wire import (
    DEFAULT_CONNECT_TIMEOUT_S,
    PARTITION,
    RECORD_MAX_BYTES,
    RECORD_OVERHEAD,
    TOPIC,
    SigningKeys,
    record_headers,
    signing_keys,
)
from projections.source import follow

__all__ = [  # the relay's errors and its topic's creation live in relay_topic, the store's
    # records as bytes in relay_raw; named here too
    "DEFAULT_TIMEOUT_S",
    "ConnectEnded",
    "RawRecord",
    "RawSource",
    "RecordTooLarge",
    "Relay",
    "RelayError",
    "RelayFenced",
    "RelayHeld",
    "RelayUnavailable",
    "ensure_topic",
    "held_at",
    "held_text",
    "last_published",
    "open_store",
    "read_raw",
]

DEFAULT_BATCH = 5_000
ANSWERED_EVERY = 100
"""Every this many records sent, the answer to one restarts `Relay.waiting_since`."""

log = logging.getLogger("gpuledger.relay")


class Relay:
    """Publishes the store's notification log to Kafka in transactional batches.

    `publish_pending()` publishes everything the store has beyond the topic; `run(stop)` keeps
    doing that until `stop` is set, reconnecting after broker errors. One relay per ledger: a
    second relay with the same transactional id fences this one (`RelayFenced`).
    """

    def __init__(
        self,
        recorder: ApplicationRecorder,
        bootstrap: str,
        *,
        topic: str = TOPIC,
        transactional_id: str | None = None,
        batch: int = DEFAULT_BATCH,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        config: Mapping[str, Any] | None = None,
        keys: SigningKeys | None = None,
        progress: int | None = None,
        state_key: bytes | None = None,
        check_s: float = TOPIC_CHECK_S,
        remade: str | None = None,
        going_on: Callable[[], bool] | None = None,
        deadline: Callable[[], float | None] | None = None,
        stopped: Callable[[], bool] = lambda: False,
        holds: Callable[[], bool] | None = None,
    ) -> None:
        self.recorder = recorder
        self.bootstrap = bootstrap
        self.topic = topic
        self.transactional_id = transactional_id or transactional_id_for(topic)
        self.batch = batch
        self.timeout_s = timeout_s
        """How long one batch (send + commit) or one reconnect step may take before it counts
        as an error."""
        self.connect_timeout_s = connect_timeout_s
        """How long finding the broker may take before it counts as unreachable."""
        self.config = dict(config or {})
        self.keys = keys if keys is not None else signing_keys()
        """Signing keys: when set, every record is signed with the first one."""
        self.progress = progress
        """The highest position the caller knows this ledger's relay committed (the service's
        `<home>/relay.json`: a home's word from before the store kept it); None: no word. It
        vouches only for a store that keeps no progress (an earlier version's); beside the
        store's row it is a floor (`relay_progress.words`)."""
        self.kept = Kept(recorder, topic, key=state_key)
        """The relay's progress in the store every server shares (`relay_progress`): read at
        each connect, raised as it publishes (once a second, or 5,000 positions) and when it
        closes, signed under the service's `state_key` (a row that does not verify vouches for
        nothing: atk47-25 F1 at or below the head)."""
        self.position = 0
        """The log position of the last event known to be committed on the topic."""
        self._offset: int | None = None
        """The offset of the relay's record of `position` on the topic (None: none, unknown)."""
        self._stamp: int | None = None
        """The time the broker appended that record (None: unknown, a `CreateTime` topic)."""
        self.skipped: tuple[int, ...] = ()
        """Offsets of foreign records found after our last record when we last connected."""
        self._stale = False
        self._fenced_by: RelayFenced | None = None
        self.check_s = check_s
        """How often a publishing relay asks whether its topic is still the one it published
        to (`relay_topic.remade`)."""
        self.mark: TopicMark | None = None
        """The topic's id and offsets when the relay last connected."""
        self._published_end = 0
        """The offset after the relay's last committed record (or the topic's end at connect)."""
        self._checked = time.monotonic()
        self._admin: Any = None
        self._last_sent: Any = None
        """The future of the last record sent (its offset, once committed)."""
        self.waiting_since: float | None = None
        """Since when (monotonic) the relay waits on the broker for a batch's sends or its commit
        with no answer (None: it waits on none). Each answered part of the batch restarts it:
        the service's `stalled` times this, not the round (a 2-minute republish moving every
        7 s was `stalled` all along: atk55-25 F1)."""
        self._first_sent: Any = None
        self._going_on: Callable[[], bool] | None = going_on
        self._deadline: Callable[[], float | None] = deadline or (lambda: None)
        """The round's `going_on` and `deadline` (`publish_pending`; the first connect's here:
        it ends at its next step once told, `ConnectEnded`)."""
        self._stopped = stopped
        """Whether its service was told to stop: an `init_transactions` under way ends then."""
        self._holds = holds
        """The store's answer on the lease its server publishes under (None: no lease), asked
        before its producer's `init_transactions` and before each transaction: an ex-leader
        whose connect went on after the takeover fenced the new leader's relay (atk58 F5)."""
        self._refused: RelayError | None = None
        """Why it publishes no more on this topic (`refuse`)."""
        self._remade: str | None = remade
        """Why the next connect publishes the store's log from its start (the topic was
        deleted and made again, or truncated, under the relay; `remade`: under the relay it
        replaces, whose service saw it: its first connect reads no bookmark, atk52-25 F1c)."""
        self.remade_note = ""
        """The last time the topic was found made again or truncated: why (`relay status`)."""
        self.remakes = 0
        self.remade_from = 1
        """The position it published the log again from then (m+1: 1..m on the topic already)."""
        """How many times the relay published from the start for it (its position went back)."""
        self.record_limit = self._topic_limit()
        """The largest record the topic takes: a larger event is never sent (RecordTooLarge)."""
        self.producer = self._connect()

    # --- connecting -----------------------------------------------------------------------------

    def _topic_limit(self) -> int:
        try:
            return ensure_topic(self.bootstrap, self.topic, self.config, self.connect_timeout_s)
        except KafkaError as e:
            raise unavailable(self.bootstrap, e) from e

    def _connect(self) -> Any:
        """A fresh transactional producer, and our position read back from the topic.

        The order matters: init_transactions first (it fences older relays and aborts or
        completes their open transaction), then read the last committed record.
        """
        self._connecting()
        try:
            producer = new_producer(
                self.bootstrap,
                self.transactional_id,
                self.record_limit,
                self._bounded(self.timeout_s),
                self.connect_timeout_s,
                self.config,
            )
        except KafkaError as e:
            raise unavailable(self.bootstrap, e) from e
        try:
            if not self._held():  # the store's answer, not this server's clock (atk58 F5)
                raise ConnectEnded(f"relay: connect ended on {self.topic} before its producer "
                                   "was initialised: the store says the lease is not this "
                                   "server's")  # fmt: skip
            # in steps: a stop or the lease's end cuts it (its own wait is the producer's)
            if not init_transactions(producer, self._bounded(self.timeout_s), self._goes_on,
                                     self._stopped):  # fmt: skip
                raise ConnectEnded(f"relay: connect ended on {self.topic} (a stop, or the lease)")
            self._connecting()
            held = held_at(self.bootstrap, self.topic, self.config,
                           self._bounded(self.timeout_s), self.connect_timeout_s)  # fmt: skip
            if held is not None:  # our last records may sit behind it, unseen: never guess
                raise RelayHeld(
                    held_text(self.topic, held) + "; the relay waits for it before it reads its "
                    "last position, so that it never publishes an event twice",
                    hint="find the producer (its transactional id) and stop it; give only the "
                    "relay Write on the topic",
                )
            self._connecting()
            mark = self._mark_now()
            self._connecting()
            if mark is None:
                raise RelayUnavailable(
                    f"topic {self.topic} does not exist", hint="it is made at the next try"
                )
            refusal = unkept(self.topic, mark)
            if refusal is not None:
                raise refusal
            if mark.begin > 0:
                raise start_gone(self.topic, mark.begin)
            why = self._remade
            if why is None and self.mark is not None:
                why = remade(self.topic, self.mark, mark, self._published_end)
            if why is None:  # made again while no relay of ours looked (atk52-25 F1 a, b, d)
                why = elsewhere(self.topic, self.kept.word(self.store_head()), mark.topic_id)
            # made again: no record vouched for, the topic read from its start (atk58 F2)
            found, foreign = self._bookmark(mark.topic_id, fresh=bool(why))
        except BaseException as e:
            discard(producer)
            if isinstance(e, KafkaError):
                raise unavailable(self.bootstrap, e) from e
            raise
        if why:
            log.warning("relay: %s: publishing the store's log to it again from position %d "
                        "(%d events)%s", why, found.position + 1, self.store_head(),
                        again_after(found.position))  # fmt: skip
            self.remade_note, self._remade = why, None
            self.remade_from = found.position + 1
            self.remakes += 1
        if not mark.appended and (self.mark is None or self.mark.appended):
            log.warning("%s", create_time_text(self.topic))  # once, and again after a change
        self.mark, self._published_end = mark, mark.end
        self._checked = time.monotonic()
        last = found.position
        if foreign:
            log.warning(
                "relay: %d foreign record(s) after position %d on %s skipped (offsets %s): not "
                "its next: another producer's, or its own out of order (sent into a topic made "
                "again before it noticed, or left by compaction); the store is the source of truth",
                len(foreign),
                last,
                self.topic,
                offsets_text(foreign),
            )
        self.position, self._offset, self._stamp = last, found.offset, found.stamp
        self.skipped = tuple(foreign)
        return producer

    def _connecting(self) -> None:
        """Raises ConnectEnded once the round may not go on: each step of a connect (8-18 s at
        load 40) and its bookmark's read (`tail_windows`' `check`) ask (atk56-25 F2)."""
        if not self._goes_on():
            raise ConnectEnded(f"relay: connect ended on {self.topic} (a stop, or the lease)")

    def _committed(self) -> Committed | None:
        """Where the relay's record of its position is (None: nowhere known), for its progress."""
        mark, offset = self.mark, self._offset
        if mark is None or not mark.topic_id or offset is None or not self.position:
            return None
        return Committed(mark.topic_id, offset, self._stamp if mark.appended else None)

    def _bookmark(self, topic_id: str = "", fresh: bool = False) -> tuple[Found, list[int]]:
        """Our last committed record on the topic and the foreign offsets after it
        (`relay_bookmark.read_bookmark`)."""
        from ledger.store.relay_bookmark import read_bookmark

        return read_bookmark(self, topic_id, fresh)

    # --- publishing -----------------------------------------------------------------------------

    def publish_pending(
        self,
        going_on: Callable[[], bool] | None = None,
        deadline: float | Callable[[], float | None] | None = None,
    ) -> int:
        """Publish everything after our position, one transaction per batch. Returns the count.

        `going_on`: asked before each batch, every `ANSWERED_EVERY` records sent and before each
        commit; once false the round ends there, the batch in hand left uncommitted (the next
        producer's init_transactions aborts it): a relay whose server lost its lease, or that is
        stopped, ends its round at once, not after its whole backlog (a stepped-down relay went
        on publishing and was fenced, and its server's SIGTERM waited on it: atk55-25 F3).
        `deadline` (monotonic, or what tells it: read before each batch, flush and commit, so a
        deadline set after the round began, by a stop, binds it too; a round under way at SIGTERM
        flushed with the full `timeout_s`: atk56-25 F1): no flush or commit waits past it, and
        the round ends at it.

        Raises RelayFenced when another relay took over (and from then on), RelayUnavailable on
        broker errors. After RelayUnavailable the next call starts with a fresh producer: its
        init_transactions aborts the abandoned transaction and the position is read again from
        the topic, so calling this again is always safe.
        """
        if self._fenced_by is not None:
            raise self._fenced_by
        if self._refused is not None:
            raise self._refused
        self._going_on = going_on
        if callable(deadline):
            self._deadline = deadline
        else:
            fixed: float | None = deadline
            self._deadline = lambda: fixed
        if not self._goes_on():
            return 0
        if self._stale:
            self._reopen()
        self.kept.advance(self.position, self._committed())  # an earlier call's, once due
        total = 0
        until = publishable(self.recorder, self.position)  # PostgreSQL: confirmed rows only
        pages = follow(RawSource(self.recorder), self.position, until, page=self.batch)
        records = next(pages, [])
        # asked while events wait (an idle relay never waits on the broker: the service's
        # watchers ask then, `RelayService._watch_topic`, and `flag` it)
        if records and time.monotonic() - self._checked >= self.check_s and self._check_topic():
            pages = follow(RawSource(self.recorder), self.position, until, page=self.batch)
            records = next(pages, [])
        while records:
            if not self._goes_on():
                break
            fits = self._fitting(records)
            try:
                with self._transaction():
                    self._send(fits)
                    # Read the next batch while the producer's thread ships this one.
                    following = records[len(fits) :] or next(pages, [])
            except _Ended:  # not committed: the next round's producer aborts it
                log.info("relay: round ended after position %d (stopping)", self.position)
                self._stale = True
                break
            except _SentElsewhere:  # not committed: the log again from position 1
                self._reopen()
                pages = follow(RawSource(self.recorder), self.position, until, page=self.batch)
                records = next(pages, [])
                continue
            self.position = fits[-1].position
            end = self._sent_end()
            self._offset = end - 1 if end else None
            self._stamp = self._sent_stamp()
            self._published_end = max(self._published_end, end)
            self.kept.advance(self.position, self._committed())  # after the commit, never before
            total += len(fits)
            records = following
        return total

    def _held(self) -> bool:
        """Whether the store says its server holds the lease (True: no lease to hold)."""
        return self._holds is None or self._holds()

    def _goes_on(self) -> bool:
        """Whether the round goes on (`publish_pending`'s `going_on` and `deadline`)."""
        deadline = self._deadline()
        if deadline is not None and time.monotonic() >= deadline:
            return False
        return self._going_on is None or self._going_on()

    def _bounded(self, timeout_s: float) -> float:
        """`timeout_s`, cut at the round's deadline (at least 0.1 s)."""
        deadline = self._deadline()
        if deadline is None:
            return timeout_s
        return max(0.1, min(timeout_s, deadline - time.monotonic()))

    @asks_broker
    def _check_topic(self) -> bool:
        """Whether the topic is still the one the relay published to: one made again or
        truncated gets the log again from position 1 at the next connect (atk50-25 F1); one
        whose settings no longer keep every event is refused (`unkept`). Whether it reopened."""
        self._checked = time.monotonic()
        if self.mark is None:
            return False
        try:
            now = self._mark_now()
        except KafkaError as e:
            self._stale = True
            raise unavailable(self.bootstrap, e) from e
        refusal = unkept(self.topic, now) if now is not None else None
        if refusal is not None:  # compacted or given a retention under it (atk51-25 F1, F4)
            self.refuse(refusal)
            raise refusal
        why = remade(self.topic, self.mark, now, self._published_end)
        if why:
            self._remade = why
            self._reopen()
        return bool(why)

    @property
    def published_mark(self) -> tuple[TopicMark | None, int]:
        """The topic's mark at the last connect and the offset after the last commit: read
        them before asking the broker (both only grow on one topic), then `remade()`."""
        return self.mark, self._published_end

    def refuse(self, refusal: RelayError) -> None:
        """The topic would not keep every event (`unkept`): every later publish raises it."""
        log.error("relay: %s", refusal.line())
        self._refused = refusal

    def flag(self, why: str) -> None:
        """Another thread found the topic made again (`remade`): the next publish reconnects and
        publishes the store's log from position 1."""
        self._remade = why
        self._stale = True

    def _mark_now(self) -> TopicMark | None:
        if self._admin is None:
            self._admin = open_admin(self.bootstrap, self.config, self.connect_timeout_s)
        try:
            return topic_mark(self._admin, self.topic, self._bounded(self.timeout_s))
        except BaseException:
            self._close_admin()
            raise

    def _close_admin(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()

    def _check_sent(self) -> None:
        """After the flush, before the commit: whether the batch went to the topic the relay
        published to (`sent_elsewhere`: atk51-25 F2). If not, raises _SentElsewhere with the
        transaction left open (the next producer's init_transactions aborts it: no reader sees
        it) and the next connect publishes the log from position 1. One metadata request."""
        if self.mark is None:
            return
        try:
            if self._admin is None:
                self._admin = open_admin(self.bootstrap, self.config, self.connect_timeout_s)
            topic_id = topic_id_of(self._admin, self.topic)
        except KafkaError:
            self._close_admin()
            raise
        offset = getattr(getattr(self._first_sent, "value", None), "offset", None)
        first = int(offset) if isinstance(offset, int) and offset >= 0 else None
        why = sent_elsewhere(self.topic, self.mark, topic_id, first, self._published_end)
        if why:
            log.warning("relay: %s: the batch sent to it is not committed", why)
            self._remade, self._stale = why, True
            raise _SentElsewhere(why)

    def _sent_end(self) -> int:
        """The offset after the last record sent, once its transaction committed (0: unknown)."""
        offset = getattr(getattr(self._last_sent, "value", None), "offset", None)
        return int(offset) + 1 if isinstance(offset, int) and offset >= 0 else 0

    def _sent_stamp(self) -> int | None:
        """The time the broker appended the last record sent, once committed (None: unknown;
        on a `CreateTime` topic kafka-python reports the producer's time: never taken)."""
        stamp = getattr(getattr(self._last_sent, "value", None), "timestamp", None)
        ok = self.mark is not None and self.mark.appended and isinstance(stamp, int)
        return int(stamp) if ok and stamp is not None and stamp >= 0 else None

    def _fitting(self, records: list[RawRecord], tried: bool = False) -> list[RawRecord]:
        """The records before the first the topic would refuse for its size (the broker fails
        the whole transaction, and the relay retried it for good: atk44-25 F8). When that is the
        first, an older topic's limit is raised (`relay_topic`), else RecordTooLarge names it."""
        limit = self.record_limit
        big = next((i for i, r in enumerate(records) if too_large(r, limit, self.keys)), None)
        if big is None or big > 0:
            return records if big is None else records[:big]
        r = records[0]
        if not tried and len(r.data) <= RECORD_MAX_BYTES - RECORD_OVERHEAD:  # an older topic
            raise_record_limit(self.bootstrap, self.topic, self.config, self.timeout_s)
            self._reopen()  # the limit read back (whoever raised it, or not), batches sized to it
            return self._fitting(records, tried=True)
        raise RecordTooLarge(
            f"relay waits after position {self.position}: the event at position {r.position} "
            f"({r.tag}) is {len(r.data):,} bytes, more than topic {self.topic} takes "
            f"(max.message.bytes={self.record_limit:,})",
            hint=f"kafka-configs.sh --alter --entity-type topics --entity-name {self.topic} "
            f"--add-config max.message.bytes={RECORD_MAX_BYTES}; the relay goes on by itself",
        )

    def _send(self, records: list[RawRecord]) -> None:
        send, topic = self.producer.send, self.topic
        keys = self.keys
        self._first_sent = None
        self.waiting_since = time.monotonic()
        for i, r in enumerate(records, 1):
            self._last_sent = sent = send(
                topic,
                value=r.data,
                key=r.key,
                headers=record_headers(r.position, r.tag, r.data, keys),
                partition=PARTITION,
            )
            if self._first_sent is None:
                self._first_sent = sent
            if i % ANSWERED_EVERY == 0 and not self._goes_on():
                raise _Ended
            if i == len(records):  # all answered (one partition: in order), none waited on
                sent.add_callback(lambda _: setattr(self, "waiting_since", None))
            elif i % ANSWERED_EVERY == 0:
                sent.add_callback(self._answered)

    def _answered(self, _: Any) -> None:
        """A part of the batch was answered: the wait on the broker starts again."""
        if self.waiting_since is not None:
            self.waiting_since = time.monotonic()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """Begin; run the body; flush and commit. Kafka errors become RelayFenced or
        RelayUnavailable and leave the transaction open, for the next producer's
        init_transactions (or the broker's transaction timeout) to abort."""
        producer = self.producer
        if not self._held():  # nothing begun: the new leader's relay publishes it (atk58 F5)
            raise _Ended
        try:
            producer.begin_transaction()
            yield
            producer.flush(timeout=self._bounded(self.timeout_s))
            self.waiting_since = time.monotonic()  # the topic's id, then the commit
            self._check_sent()
            if not self._goes_on():
                raise _Ended
            commit(producer, self._bounded(self.timeout_s))
        except KafkaError as e:
            if fenced(producer, e):
                self._fenced_by = RelayFenced(
                    f"relay fenced after position {self.position}: another relay with "
                    f"transactional id {self.transactional_id!r} took over",
                    hint="run one relay per ledger",
                )
                raise self._fenced_by from e
            self._stale = True
            raise RelayUnavailable(
                f"relay stopped after position {self.position}: {type(e).__name__}: {e}",
                hint="the broker is unreachable or failed the transaction; it is retried",
            ) from e
        finally:
            self.waiting_since = None

    @asks_broker
    def _reopen(self) -> None:
        """Replace a producer that failed (raises RelayUnavailable while Kafka is away), sized to
        the topic's limit read again: an operator may have lowered it since (atk44z F4)."""
        self._stale = True  # until the new one is connected, whatever fails on the way
        discard(self.producer)
        self.record_limit = self._topic_limit()
        self.producer = self._connect()
        self._stale = False

    def run(
        self,
        stop: threading.Event,
        interval_s: float = 0.05,
        on_error: Callable[[RelayError], None] | None = None,
    ) -> None:
        """Publish until `stop` is set, polling the store every `interval_s`.

        Broker errors (and any unexpected error, as RelayUnavailable) are reported to
        `on_error` and retried with a fresh producer, backing off from 0.2 s to 2 s between
        attempts. Fencing and wrong topics are raised.
        """
        delay = 0.2
        while not stop.is_set():
            try:
                published = self.publish_pending()
            except RelayUnavailable as e:
                if on_error is not None:
                    on_error(e)
                stop.wait(delay)
                delay = min(delay * 2, 2.0)
                continue
            except RelayError:
                raise
            except Exception as e:  # a failure we did not foresee: report it, start afresh
                if on_error is not None:
                    on_error(self.failed(e))
                stop.wait(delay)
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.2
            if not published:
                stop.wait(interval_s)

    def failed(self, e: BaseException) -> RelayUnavailable:
        """After an unexpected error: the next publish starts with a fresh producer (its
        init_transactions aborts whatever this one left open). Returns the error to report."""
        log.debug("relay: unexpected error", exc_info=e)
        self._stale = True
        return RelayUnavailable(
            f"relay failed after position {self.position}: {type(e).__name__}: {e}",
            hint="retried with a fresh producer; run with --log-level debug for the traceback",
        )

    def store_head(self) -> int:
        return int(self.recorder.max_notification_id() or 0)

    @property
    def reconnects(self) -> bool:
        """Whether the next publish starts with a fresh producer (after an error)."""
        return self._stale

    def close(self) -> None:
        """Close the producer; the progress published so far is kept in the store."""
        discard(self.producer)
        self._close_admin()
        self.kept.flush(self.position, self._committed())


class _Ended(Exception):
    """The round was told to end (`publish_pending`'s `going_on`, `deadline`): the batch in hand
    is not committed."""


class _SentElsewhere(Exception):
    """The batch flushed went to a topic made again (`Relay._check_sent`): never committed."""
