"""A relay restarting on a topic whose tail holds large foreign records keeps a few of them in
memory at once, not every record of each window it reads back (atk45-25 F2: 30 forged 7 MB
records gave a restarting relay a 1 GB peak). Real broker; the peak is Python's own allocations
(tracemalloc), kafka-python's fetch buffers included."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from kafka import KafkaProducer

from ledger.store.application import Ledger
from ledger.store.embedded import EmbeddedSource
from ledger.store.relay import Relay, ensure_topic, open_store
from projections.kafka_wire import POSITION_HEADER, TAG_HEADER
from schemas import commands as c

pytestmark = pytest.mark.kafka

BIG = 7_000_000
JOB = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=0, duration_s=60)


def forge(bootstrap: str, topic: str, position: int, tag: str, n: int) -> list[int]:
    """`n` forged records of 7 MB claiming the positions after `position`; their offsets."""
    ensure_topic(bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=8 << 20)
    try:
        sent = []
        for i in range(n):
            value = json.dumps({"prev_hash": "0" * 64, "pad": "x" * BIG}).encode()
            headers = [(POSITION_HEADER, str(position + 1 + i).encode()), (TAG_HEADER, tag)]
            sent.append(producer.send(topic, value=value, key=b"k", headers=headers, partition=0))
            producer.flush(timeout=60)  # one record a batch: each fetch returns one of them
        return [int(f.get(timeout=60).offset) for f in sent]
    finally:
        producer.close()


def test_a_relay_restarting_behind_thirty_forged_7_mb_records_holds_a_few_of_them(
    org_ledger: Ledger, kafka_bootstrap: str, kafka_topic: str, transactional_id: str
) -> None:
    org_ledger.execute_all([JOB] * 10)
    home = org_ledger.home

    def relay() -> Relay:
        return Relay(
            open_store(home), kafka_bootstrap, topic=kafka_topic, transactional_id=transactional_id
        )

    first = relay()
    first.publish_pending()
    first.close()
    n = org_ledger.position
    with EmbeddedSource(home) as src:
        tag = src.read(n - 1, 1)[0].tag.encode()
    foreign = forge(kafka_bootstrap, kafka_topic, n, tag, 30)
    org_ledger.execute_all([JOB] * 3)
    tracemalloc.start()
    try:
        again = relay()
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    try:
        assert (again.position, again.skipped) == (n, tuple(foreign))
        assert again.publish_pending() == 3
    finally:
        again.close()
    assert peak < 16 * BIG, f"{peak / 1e6:.0f} MB"  # 43 MB; was 344 MB (every window kept)
