"""The relay: publishes the event store's notification log to the Kafka topic `gpuledger.events`.

An edge (network). Guarantees, with the reasons:
- *No gap, no duplicate, same order.* One partition; every record carries its log position in
  a header; on start the relay reads the last committed record on the topic and resumes after it.
- *Atomic batches.* Each batch is one Kafka transaction: a relay killed mid-batch leaves an
  aborted transaction that read_committed consumers never see, and the next relay resends it.
- *One publisher.* The transactional id fences: when a second relay calls init_transactions,
  the first one's next commit fails with ProducerFencedError and it stops.
Record timestamps are the wall clock (Kafka 4 rejects timestamps over an hour in the future);
event time stays in the payload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eventsourcing.persistence import ApplicationRecorder, InfrastructureFactory
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, ProducerFencedError, TopicAlreadyExistsError

from schemas.errors import LedgerError

TOPIC = "gpuledger.events"
POSITION_HEADER = "gpuledger.position"
TAG_HEADER = "gpuledger.tag"
TOPIC_CONFIG = {
    "retention.ms": "-1",  # the default deletes events after 7 days
    "retention.bytes": "-1",
    "cleanup.policy": "delete",
    "message.timestamp.type": "CreateTime",
    "min.insync.replicas": "1",
}


class RelayError(LedgerError):
    code = "relay"


class RelayFenced(RelayError):
    """Another relay with the same transactional id took over: this one must stop."""

    code = "fenced"


@dataclass(frozen=True)
class RawRecord:
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
    return [
        RawRecord(n.id, n.topic, n.state, str(n.originator_id).encode())
        for n in recorder.select_notifications(start=after + 1, limit=limit)
    ]


def client_config(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Standard client security settings (SASL, SSL) pass straight through from GPULEDGER_KAFKA_*
    environment variables, e.g. GPULEDGER_KAFKA_SECURITY_PROTOCOL=SASL_SSL."""
    import os

    keys = (
        "security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
        "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname",
    )
    cfg: dict[str, Any] = {}
    for k in keys:
        v = os.environ.get(f"GPULEDGER_KAFKA_{k.upper()}")
        if v is not None:
            cfg[k] = v if k != "ssl_check_hostname" else v.lower() in ("1", "true", "yes")
    cfg.update(extra or {})
    return cfg


def ensure_topic(bootstrap: str, topic: str = TOPIC, config: Mapping[str, Any] | None = None) -> None:
    """Create the topic explicitly: one partition, unlimited retention. Idempotent."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="gpuledger-admin", **client_config(config))
    try:
        admin.create_topics(
            [NewTopic(topic, num_partitions=1, replication_factor=1, topic_configs=TOPIC_CONFIG)]
        )
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


def last_published(bootstrap: str, topic: str = TOPIC, config: Mapping[str, Any] | None = None) -> int:
    """The log position in the last committed record on the topic (0 when empty)."""
    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        client_id="gpuledger-relay-probe",
        **client_config(config),
    )
    try:
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        back = 16
        while True:
            start = max(0, end - back)
            consumer.seek(tp, start)
            last = 0
            while consumer.position(tp) < end:
                batch = consumer.poll(timeout_ms=1000)
                for rec in batch.get(tp, []):
                    last = max(last, _position(rec.headers))
                if not batch and consumer.position(tp) < end:
                    # only control records or aborted data remain before `end`
                    break
            if last or start == 0:
                return last
            back *= 16
    finally:
        consumer.close()


def _position(headers: list[tuple[str, bytes]] | None) -> int:
    for k, v in headers or []:
        if k == POSITION_HEADER:
            return int(v)
    raise RelayError(f"a record on {TOPIC} has no {POSITION_HEADER} header", hint="is another producer writing to the topic?")


class Relay:
    """Publishes the store's notification log to Kafka in transactional batches."""

    def __init__(
        self,
        recorder: ApplicationRecorder,
        bootstrap: str,
        *,
        topic: str = TOPIC,
        transactional_id: str = "gpuledger-relay",
        batch: int = 5_000,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.recorder = recorder
        self.bootstrap = bootstrap
        self.topic = topic
        self.batch = batch
        self.config = dict(config or {})
        ensure_topic(bootstrap, topic, self.config)
        self.transactional_id = transactional_id
        self.producer = self._connect()

    def _connect(self) -> KafkaProducer:
        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap,
            transactional_id=self.transactional_id,
            acks="all",
            linger_ms=5,
            batch_size=1 << 20,
            max_request_size=16 << 20,
            client_id="gpuledger-relay",
            **client_config(self.config),
        )
        producer.init_transactions()  # fences any older relay; aborts its open transaction
        self.position = last_published(self.bootstrap, self.topic, self.config)
        return producer

    def publish_pending(self) -> int:
        """Publish everything after our position, one transaction per batch. Returns the count."""
        total = 0
        while True:
            records = read_raw(self.recorder, self.position, self.batch)
            if not records:
                return total
            try:
                self.producer.begin_transaction()
                for r in records:
                    self.producer.send(
                        self.topic,
                        value=r.data,
                        key=r.key,
                        headers=[(POSITION_HEADER, str(r.position).encode()), (TAG_HEADER, r.tag.encode())],
                        partition=0,
                    )
                self.producer.commit_transaction()
            except ProducerFencedError as e:
                raise RelayFenced(
                    f"relay fenced at position {self.position}: another relay took over",
                    hint="run one relay per ledger",
                ) from e
            except KafkaError as e:
                raise RelayError(
                    f"relay stopped at position {self.position}: {type(e).__name__}: {e}",
                    hint="another relay may have taken over (fenced), or the broker is unreachable",
                ) from e
            self.position = records[-1].position
            total += len(records)

    def run(self, stop: Any, interval_s: float = 0.05, on_error: Any = None) -> None:
        """Publish until `stop.is_set()`. A broker outage is retried with a fresh producer (its
        init_transactions aborts the half-sent batch, and the position is re-read from the
        topic); fencing is fatal."""
        while not stop.is_set():
            try:
                self.publish_pending()
            except RelayFenced:
                raise
            except (RelayError, KafkaError) as e:
                if on_error is not None:
                    on_error(e)
                self._reconnect(stop)
            stop.wait(interval_s)

    def _reconnect(self, stop: Any) -> None:
        delay = 0.2
        self.producer.close(timeout=1)
        while not stop.is_set():
            try:
                self.producer = self._connect()
                return
            except KafkaError:
                stop.wait(delay)
                delay = min(delay * 2, 5.0)

    def close(self) -> None:
        self.producer.close(timeout=5)
