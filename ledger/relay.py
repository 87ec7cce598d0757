"""The relay: publishes the event store's notification log to the Kafka topic `gpuledger.events`.

An edge (network, files). Guarantees, with the reasons (docs/kafka.md has the long version):

- *No gap, no duplicate, same order.* One partition, so Kafka keeps the log order. Every record
  carries its log position in a header. The relay keeps no state of its own: on start (and after
  every error) it reads the position of the last *committed* record on the topic and resumes
  right after it, so the topic itself is the relay's bookmark and cannot disagree with it.
- *Atomic batches.* Each batch is one Kafka transaction: a relay that dies mid-batch leaves an
  open transaction; the next relay's `init_transactions` aborts it before reading the bookmark,
  so read_committed consumers never see the half batch, and the next relay sends it again.
- *One publisher.* The transactional id fences: when a second relay calls `init_transactions`,
  the first one's next transaction fails with ProducerFencedError and it raises `RelayFenced`.
- *The right topic.* The topic is created explicitly (one partition, unlimited retention,
  delete policy: every record has the same key, so compaction would keep only the last one);
  an existing topic with another shape is refused, and so is a topic whose last record is not
  byte-equal to the store's event at that position (another ledger's topic).

Record timestamps are the wall clock at publish time (Kafka 4 rejects timestamps more than an
hour in the future, and simulations run far ahead); the event time stays in the payload.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from eventsourcing.persistence import ApplicationRecorder, InfrastructureFactory
from eventsourcing.sqlite import SQLiteApplicationRecorder
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import KafkaError, KafkaTimeoutError, ProducerFencedError, TopicAlreadyExistsError

from schemas.errors import LedgerError

TOPIC = "gpuledger.events"
POSITION_HEADER = "gpuledger.position"
TAG_HEADER = "gpuledger.tag"
TOPIC_CONFIG = {
    "retention.ms": "-1",  # the broker default deletes events after 7 days
    "retention.bytes": "-1",
    "cleanup.policy": "delete",  # never compact: every record has the same key (the stream id)
    "message.timestamp.type": "CreateTime",
    # Replication factor and min.insync.replicas come from the broker's defaults, so acks=all
    # means what the cluster's operators set (1 on the development broker).
}
REQUIRED_CONFIG = ("retention.ms", "retention.bytes", "cleanup.policy")
"""Topic settings an existing topic must have, or the topic is not a full copy of the log."""

DEFAULT_TRANSACTIONAL_ID = "gpuledger-relay"
DEFAULT_BATCH = 5_000
DEFAULT_TIMEOUT_S = 30.0


class RelayError(LedgerError):
    """The relay cannot go on: a wrong topic, a topic that disagrees with the store, ..."""

    code = "relay"


class RelayUnavailable(RelayError):
    """Kafka did not answer in time or failed a request: retry with a fresh producer."""

    code = "unavailable"


class RelayFenced(RelayError):
    """Another relay with the same transactional id took over: this one must stop."""

    code = "fenced"


class RawRecord(NamedTuple):
    """One stored event as the relay publishes it: bytes untouched, never decoded.

    A NamedTuple: the relay builds one per event, and a frozen dataclass costs twice as much."""

    position: int
    tag: str
    data: bytes
    key: bytes


def open_store(home: Path) -> ApplicationRecorder:
    """The event store's recorder, for readers that need bytes, not folded state."""
    db = home / "events.sqlite"
    if not db.exists():
        raise RelayError(f"no event store at {db}", hint="run `gpuledger init` first")
    factory = InfrastructureFactory.construct(
        {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(db)}
    )
    return factory.application_recorder()


def read_raw(recorder: ApplicationRecorder, after: int, limit: int) -> list[RawRecord]:
    """Up to `limit` stored events after position `after`, in log order."""
    if isinstance(recorder, SQLiteApplicationRecorder):
        return _read_raw_sqlite(recorder, after, limit)
    return [
        RawRecord(n.id, n.topic, n.state, str(n.originator_id).encode())
        for n in recorder.select_notifications(start=after + 1, limit=limit)
    ]


def _read_raw_sqlite(
    recorder: SQLiteApplicationRecorder, after: int, limit: int
) -> list[RawRecord]:
    """`select_notifications` without a UUID object per row, which took a fifth of the relay's
    time: the log is one stream, so its id is converted once per call."""
    keys: dict[str, bytes] = {}
    out = []
    with recorder.datastore.transaction(commit=False) as cursor:
        cursor.execute(
            f"SELECT rowid, originator_id, topic, state FROM {recorder.events_table_name} "
            "WHERE rowid>? ORDER BY rowid LIMIT ?",
            (after, limit),
        )
        rows = cursor.fetchall()
    for position, originator_id, topic, state in rows:
        key = keys.get(originator_id)
        if key is None:
            key = keys[originator_id] = str(recorder.convert_originator_id(originator_id)).encode()
        out.append(RawRecord(position, topic, state, key))
    return out


def record_headers(record: RawRecord) -> list[tuple[str, bytes]]:
    """The Kafka headers of a published event: its log position and its event tag."""
    return [(POSITION_HEADER, str(record.position).encode()), (TAG_HEADER, record.tag.encode())]


def client_config(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Standard client security settings (SASL, SSL) pass straight through from GPULEDGER_KAFKA_*
    environment variables, e.g. GPULEDGER_KAFKA_SECURITY_PROTOCOL=SASL_SSL."""
    keys = (
        "security_protocol",
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "ssl_cafile",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_check_hostname",
    )
    cfg: dict[str, Any] = {}
    for k in keys:
        v = os.environ.get(f"GPULEDGER_KAFKA_{k.upper()}")
        if v is not None:
            cfg[k] = v if k != "ssl_check_hostname" else v.lower() in ("1", "true", "yes")
    cfg.update(extra or {})
    return cfg


def _patience(timeout_s: float) -> dict[str, int]:
    """Client settings that bound how long a connect may take and keep reconnects quick.

    kafka-python's defaults back off up to 30 s between reconnects and wait 30 s to bootstrap,
    so a broker back after a restart would sit unused for up to half a minute.
    """
    return {"bootstrap_timeout_ms": int(timeout_s * 1000), "reconnect_backoff_max_ms": 1_000}


def ensure_topic(
    bootstrap: str, topic: str = TOPIC, config: Mapping[str, Any] | None = None
) -> None:
    """Create the topic explicitly: one partition, unlimited retention. Idempotent.

    An existing topic must have one partition and the settings in REQUIRED_CONFIG; otherwise
    this raises RelayError rather than publish into a topic that reorders or forgets events.
    """
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id="gpuledger-admin",
        **_patience(DEFAULT_TIMEOUT_S),
        **client_config(config),
    )
    try:
        try:
            admin.create_topics(
                {
                    topic: {
                        "num_partitions": 1,
                        "replication_factor": -1,  # the broker's default.replication.factor
                        "configs": TOPIC_CONFIG,
                    }
                },
                wait_for_metadata=True,
            )
            return
        except TopicAlreadyExistsError:
            pass
        _check_topic(admin, topic)
    finally:
        admin.close()


def _check_topic(admin: Any, topic: str) -> None:
    (described,) = admin.describe_topics([topic])
    partitions = len(described["partitions"])
    if partitions != 1:
        raise RelayError(
            f"topic {topic} has {partitions} partitions; the relay needs exactly 1 to keep order",
            hint="delete the topic (or pick another name) and let the relay create it",
        )
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, list(REQUIRED_CONFIG))
    found = admin.describe_configs([resource], config_filter="all")["topic"][topic]
    wrong = {k: found[k]["value"] for k in REQUIRED_CONFIG if found[k]["value"] != TOPIC_CONFIG[k]}
    if wrong:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(wrong.items()))
        raise RelayError(
            f"topic {topic} has {shown}: it would not keep every event",
            hint=f"set {', '.join(f'{k}={TOPIC_CONFIG[k]}' for k in sorted(wrong))} on the topic",
        )


@dataclass(frozen=True)
class Published:
    """The last committed record on the topic: its log position and its bytes."""

    position: int
    data: bytes


def last_committed(
    bootstrap: str,
    topic: str = TOPIC,
    config: Mapping[str, Any] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Published:
    """The last committed record on the topic (position 0, no bytes, when there is none).

    Reads backwards in growing windows from the end: the last record is almost always in the
    last few offsets (only a commit marker follows it), but aborted batches can sit in between.
    read_committed skips aborted records and markers, and its end offset stops before any open
    transaction. Raises RelayUnavailable when the broker does not answer within `timeout_s`.
    """
    tp = TopicPartition(topic, 0)
    deadline = time.monotonic() + timeout_s
    try:
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            isolation_level="read_committed",
            client_id="gpuledger-relay-probe",
            **_patience(timeout_s),
            **client_config(config),
        )
    except KafkaError as e:
        raise _unavailable(bootstrap, e) from e
    try:
        consumer.assign([tp])
        end = consumer.end_offsets([tp], timeout_ms=int(timeout_s * 1000))[tp]
        back = 16
        while True:
            start = max(0, end - back)
            consumer.seek(tp, start)
            last = Published(0, b"")
            # The position only moves forward, past aborted data and markers too, so this
            # loop ends at `end`; an empty poll means "not yet", never "nothing left".
            while consumer.position(tp) < end:
                if time.monotonic() > deadline:
                    raise RelayUnavailable(
                        f"reading the end of {topic} took over {timeout_s:g} s",
                        hint="is the broker overloaded or restarting?",
                    )
                for rec in consumer.poll(timeout_ms=500).get(tp, []):
                    if rec.offset < end:
                        last = Published(_position(topic, rec.headers), rec.value)
            if last.position or start == 0:
                return last
            back *= 16
    except KafkaError as e:
        raise _unavailable(bootstrap, e) from e
    finally:
        consumer.close()


def last_published(
    bootstrap: str, topic: str = TOPIC, config: Mapping[str, Any] | None = None
) -> int:
    """The log position in the last committed record on the topic (0 when empty)."""
    return last_committed(bootstrap, topic, config).position


def _position(topic: str, headers: list[tuple[str, bytes]] | None) -> int:
    for k, v in headers or []:
        if k == POSITION_HEADER:
            return int(v)
    raise RelayError(
        f"a record on {topic} has no {POSITION_HEADER} header",
        hint="is another producer writing to the topic? only the relay may write to it",
    )


def _unavailable(bootstrap: str, e: BaseException) -> RelayUnavailable:
    return RelayUnavailable(
        f"Kafka at {bootstrap}: {type(e).__name__}: {e}",
        hint="is the broker up? (`scripts/kafka/kafka status`)",
    )


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
        transactional_id: str = DEFAULT_TRANSACTIONAL_ID,
        batch: int = DEFAULT_BATCH,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.recorder = recorder
        self.bootstrap = bootstrap
        self.topic = topic
        self.transactional_id = transactional_id
        self.batch = batch
        self.timeout_s = timeout_s
        """How long one batch (send + commit) or one reconnect step may take before it counts
        as an error."""
        self.config = dict(config or {})
        self.position = 0
        """The log position of the last event known to be committed on the topic."""
        self._stale = False
        self._fenced_by: RelayFenced | None = None
        try:
            ensure_topic(bootstrap, topic, self.config)
        except KafkaError as e:
            raise _unavailable(bootstrap, e) from e
        self.producer = self._connect()

    # --- connecting -----------------------------------------------------------------------------

    def _connect(self) -> Any:
        """A fresh transactional producer, and our position read back from the topic.

        The order matters: init_transactions first (it fences older relays and aborts or
        completes their open transaction), then read the last committed record.
        """
        ms = int(self.timeout_s * 1000)
        try:
            producer = KafkaProducer(
                bootstrap_servers=self.bootstrap,
                transactional_id=self.transactional_id,
                enable_idempotence=True,
                acks="all",
                linger_ms=5,
                batch_size=1 << 20,
                max_request_size=16 << 20,
                max_block_ms=ms,
                request_timeout_ms=min(ms, 30_000),
                delivery_timeout_ms=max(ms, 30_000) + 5_000,  # > linger + request timeout
                client_id="gpuledger-relay",
                **_patience(self.timeout_s),
                **client_config(self.config),
            )
        except KafkaError as e:
            raise _unavailable(self.bootstrap, e) from e
        try:
            producer.init_transactions()
            last = last_committed(self.bootstrap, self.topic, self.config, self.timeout_s)
            self._check_resume(last)
        except BaseException as e:
            _discard(producer)
            if isinstance(e, KafkaError):
                raise _unavailable(self.bootstrap, e) from e
            raise
        self.position = last.position
        return producer

    def _check_resume(self, last: Published) -> None:
        """The topic's last record must be the store's event at that position, byte for byte."""
        if last.position == 0:
            return
        stored = read_raw(self.recorder, last.position - 1, 1)
        if not stored or stored[0].position != last.position:
            raise RelayError(
                f"topic {self.topic} is ahead of the store: it has position {last.position}, "
                f"the store ends at {self.recorder.max_notification_id() or 0}",
                hint="the topic belongs to another ledger, or the store was replaced; "
                "publish to a new topic",
            )
        if stored[0].data != last.data:
            raise RelayError(
                f"topic {self.topic} differs from the store at position {last.position}",
                hint="the topic belongs to another ledger; publish to a new topic",
            )

    # --- publishing -----------------------------------------------------------------------------

    def publish_pending(self) -> int:
        """Publish everything after our position, one transaction per batch. Returns the count.

        Raises RelayFenced when another relay took over (and from then on), RelayUnavailable on
        broker errors. After RelayUnavailable the next call starts with a fresh producer: its
        init_transactions aborts the abandoned transaction and the position is read again from
        the topic, so calling this again is always safe.
        """
        if self._fenced_by is not None:
            raise self._fenced_by
        if self._stale:
            self._reopen()
        total = 0
        records = read_raw(self.recorder, self.position, self.batch)
        while records:
            with self._transaction():
                self._send(records)
                # Read the next batch while the producer's thread ships this one.
                following = read_raw(self.recorder, records[-1].position, self.batch)
            self.position = records[-1].position
            total += len(records)
            records = following
        return total

    def _send(self, records: list[RawRecord]) -> None:
        send, topic = self.producer.send, self.topic
        for r in records:
            send(topic, value=r.data, key=r.key, headers=record_headers(r), partition=0)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """Begin; run the body; flush and commit. Kafka errors become RelayFenced or
        RelayUnavailable and leave the transaction open, for the next producer's
        init_transactions (or the broker's transaction timeout) to abort."""
        producer = self.producer
        try:
            producer.begin_transaction()
            yield
            # flush has a timeout, commit_transaction has none: flushing first bounds the wait
            # to the small EndTxn round trip.
            producer.flush(timeout=self.timeout_s)
            producer.commit_transaction()
        except KafkaError as e:
            if _fenced(producer, e):
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

    def _reopen(self) -> None:
        """Replace a producer that failed (raises RelayUnavailable while Kafka is away)."""
        _discard(self.producer)
        self.producer = self._connect()
        self._stale = False

    def run(
        self,
        stop: threading.Event,
        interval_s: float = 0.05,
        on_error: Callable[[RelayError], None] | None = None,
    ) -> None:
        """Publish until `stop` is set, polling the store every `interval_s`.

        Broker errors are reported to `on_error` and retried with a fresh producer, backing off
        from 0.2 s to 2 s between attempts. Fencing and wrong topics are raised.
        """
        delay = 0.2
        while not stop.is_set():
            try:
                published = self.publish_pending()
            except RelayFenced:
                raise
            except RelayUnavailable as e:
                if on_error is not None:
                    on_error(e)
                stop.wait(delay)
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.2
            if not published:
                stop.wait(interval_s)

    def close(self) -> None:
        _discard(self.producer)


def _fenced(producer: Any, e: BaseException) -> bool:
    """Whether `e` means another producer took our transactional id.

    kafka-python raises ProducerFencedError once; later calls on the same producer raise a plain
    KafkaError ("... in an error state: ProducerFencedError"), so look at its last error too.
    """
    if isinstance(e, ProducerFencedError):
        return True
    manager = getattr(producer, "_transaction_manager", None)
    return isinstance(getattr(manager, "last_error", None), ProducerFencedError)


def _discard(producer: Any) -> None:
    """Close a producer without waiting long: a half-sent transaction is left to be aborted
    by the next producer's init_transactions (or by the broker's transaction timeout)."""
    try:
        producer.close(timeout=1)
    except KafkaTimeoutError:
        # close() flushes first and gives up with the sender thread still running; stop it.
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            with contextlib.suppress(Exception):
                sender.force_close()
                sender.join(5)
