"""A restarted Kafka reader resumes right after the record it applied last, never after an exact
copy of it planted later on the topic (atk47-25 F6): copies of an old record made the positions
out of order, the binary search that guessed where to read landed past the middle, and the copy
of the reader's last record at the tail carried the same link as the real one, so the reader
resumed after the copy: every real event between was skipped (exit 0, nothing set aside) and
every later one set aside. Signing did not help (the copy carries the relay's signature). Real
broker, the relay's own topic; the unit cases are tests/unit/test_kafka_resume_choice.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledger.store.application import Ledger
from projections.projector import Projector
from tests.integration.security.test_security_kafka import (
    JOB,
    KEYS,
    Topic,
    dead_offsets,
    produce,
    same_as_the_store,
    settled,
)

pytestmark = pytest.mark.kafka


def copies(record: Any, n: int) -> list[tuple[bytes | None, Any]]:
    """`n` exact copies of a record on the topic: value and headers (its signature too)."""
    return [(record.value, list(record.headers))] * n


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_a_restarted_reader_never_resumes_after_a_copy_of_its_last_record(
    org_ledger: Ledger,
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    read_topic: Any,
    tmp_path: Path,
    signed: bool,
) -> None:
    t = Topic(kafka_bootstrap, kafka_topic, transactional_id, KEYS if signed else None)
    ledger = org_ledger
    ledger.execute_all([JOB] * 30)
    t.relay(ledger.home)
    records = settled(read_topic, t.name, ledger.position)
    path = tmp_path / "reader.duckdb"
    # 1. a quarantining reader applies the first 12 records and stops
    store, source = t.reader(path)
    try:
        assert Projector(store, source, quarantine=True).catch_up(until=12).position == 12
    finally:
        source.close()
        store.close()
    # 2. a topic writer: copies of the first record (positions out of order), the relay goes
    #    on, then one exact copy of the reader's last record at the tail
    produce(t.bootstrap, t.name, copies(records[0], 1_000))
    ledger.execute_all([JOB] * 5)
    t.relay(ledger.home)
    settled(read_topic, t.name, len(records) + 1_000 + 5)
    produce(t.bootstrap, t.name, copies(records[11], 1))
    # 3. the reader restarted applies every real event after 12, sets nothing aside (the copies
    #    bring nothing new); the code before resumed after the copy: position 12, exit 0
    assert t.catch_up(path) == ledger.position
    assert dead_offsets(path) == []
    # 4. the relay goes on; the reader again
    ledger.execute_all([JOB] * 2)
    t.relay(ledger.home)
    assert t.catch_up(path) == ledger.position
    assert dead_offsets(path) == []
    same_as_the_store(path, ledger.home)
