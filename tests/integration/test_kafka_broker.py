"""Smoke test against a real Apache Kafka broker.

The broker address comes from ``GPULEDGER_KAFKA`` (``host:port[,host:port...]``), e.g.::

    export GPULEDGER_KAFKA=$(scripts/kafka/kafka up)
    python -m pytest tests/integration/test_kafka_broker.py -q

A missing or unreachable broker is a test failure, never a skip: a ``kafka``-marked run
must not pass silently without a broker.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
import warnings
from typing import Any

import pytest

# kafka-python 3.0.x loads its protocol schemas with importlib.resources.read_text/open_text,
# which warn with DeprecationWarning on Python 3.11+ (errors under filterwarnings=error).
_KAFKA_PY_DEPRECATION = r".* is deprecated\. Use files\(\) instead"
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=_KAFKA_PY_DEPRECATION, category=DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import ConfigResource, ConfigResourceType

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.filterwarnings(f"ignore:{_KAFKA_PY_DEPRECATION}:DeprecationWarning"),
]

N_RECORDS = 100
TIMEOUT_S = 60.0
TIMEOUT_MS = int(TIMEOUT_S * 1000)


def _bootstrap() -> str:
    """Return ``$GPULEDGER_KAFKA`` after checking a TCP connect works; fail the test otherwise."""
    bootstrap = os.environ.get("GPULEDGER_KAFKA", "").strip()
    if not bootstrap:
        pytest.fail(
            "GPULEDGER_KAFKA is not set; start a broker with `scripts/kafka/kafka up` "
            "and export GPULEDGER_KAFKA=127.0.0.1:19092",
            pytrace=False,
        )
    problems = []
    for server in (s.strip() for s in bootstrap.split(",") if s.strip()):
        host, _, port = server.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
                return bootstrap
        except (OSError, ValueError) as exc:
            problems.append(f"{server}: {exc}")
    pytest.fail(
        f"Kafka broker GPULEDGER_KAFKA={bootstrap!r} is unreachable ({'; '.join(problems)}); "
        "is `scripts/kafka/kafka up` running?",
        pytrace=False,
    )


def test_broker_round_trip_keeps_order_and_content() -> None:
    bootstrap = _bootstrap()
    run_id = uuid.uuid4().hex
    topic = f"gpuledger-smoke-{run_id}"
    group = f"gpuledger-smoke-{run_id}"
    expected = [
        (f"k-{i:03d}".encode(), f"event-{i:03d}-{run_id}".encode()) for i in range(N_RECORDS)
    ]

    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap, client_id="gpuledger-smoke", request_timeout_ms=TIMEOUT_MS
    )
    try:
        admin.create_topics(
            {
                topic: {
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "configs": {"retention.ms": "-1"},
                }
            },
            timeout_ms=TIMEOUT_MS,
            wait_for_metadata=True,
        )
        try:
            described = admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic, ["retention.ms"])]
            )
            assert described["topic"][topic]["retention.ms"]["value"] == "-1"

            producer = KafkaProducer(
                bootstrap_servers=bootstrap,
                acks="all",
                enable_idempotence=True,
                linger_ms=5,
                request_timeout_ms=TIMEOUT_MS // 2,
                max_block_ms=TIMEOUT_MS,
            )
            try:
                futures = [producer.send(topic, key=k, value=v) for k, v in expected]
                producer.flush(timeout=TIMEOUT_S)
                metadata = [f.get(timeout=TIMEOUT_S) for f in futures]
            finally:
                producer.close(timeout=TIMEOUT_S)
            assert [(m.topic, m.partition) for m in metadata] == [(topic, 0)] * N_RECORDS
            assert [m.offset for m in metadata] == list(range(N_RECORDS))

            consumer = KafkaConsumer(
                bootstrap_servers=bootstrap,
                group_id=group,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                request_timeout_ms=TIMEOUT_MS // 2 + 1000,
            )
            records: list[Any] = []
            try:
                consumer.subscribe([topic])
                deadline = time.monotonic() + TIMEOUT_S
                while len(records) < N_RECORDS and time.monotonic() < deadline:
                    for batch in consumer.poll(timeout_ms=500).values():
                        records.extend(batch)
            finally:
                consumer.close()

            assert len(records) == N_RECORDS, f"consumed {len(records)} of {N_RECORDS} records"
            assert [r.offset for r in records] == list(range(N_RECORDS))
            assert [(r.key, r.value) for r in records] == expected
            assert {(r.topic, r.partition) for r in records} == {(topic, 0)}
        finally:
            admin.delete_topics([topic], timeout_ms=TIMEOUT_MS)  # raises on any error code
            # The group never committed offsets; removing it is housekeeping only.
            with contextlib.suppress(Exception):
                admin.delete_groups([group])
    finally:
        admin.close()
