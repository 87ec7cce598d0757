"""An older log's large event never stops the relay for good (atk44-25 F8: a plain user's 1.2 MB
submit, taken before events were bounded, made the broker refuse the record, MessageSizeTooLarge,
and the relay retried the same transaction for ever, through restarts, its status blaming the
broker). Real broker: the topic the relay creates takes it; a topic made before with Kafka's
default limit gets everything before it and a status naming the event, and goes on once raised.
A topic whose limit is under 1 MiB takes every event that fits it: Kafka applies the limit to a
producer's batch (atk44z F4: ten 100 KB events stopped the relay for good on a 200,000-byte topic).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic

from ledger.store import relay as relay_module
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.relay import RecordTooLarge, Relay, RelayUnavailable, open_store, read_raw
from ledger.store.relay_topic import batch_bytes
from projections.kafka_wire import POSITION_HEADER, RECORD_MAX_BYTES, TOPIC_CONFIG, record_headers
from schemas import bounds
from schemas import commands as c

pytestmark = pytest.mark.kafka

GPULEDGER = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"
BIG = ("/bin/true", *["x" * 4000] * 300)  # the attack's 1.2 MB command line


def older_log(home: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """A log as the old write side left it: 3 submits, a 1.2 MB one, 2 more. Its big position."""
    ledger = Ledger(home, SimClock(1_000.0), seeded_ids(3))
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=3),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )
    job = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, command=("/bin/true",))
    for _ in range(3):
        ledger.execute(job)
    with monkeypatch.context() as m:  # the old write side had no bound on an event's size
        m.setattr(bounds, "MAX_EVENT_BYTES", 10 << 20)
        big = ledger.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, command=BIG))
    ledger.execute_all([job, job])
    ledger.close()
    return big.position


def positions(records: list[Any]) -> list[int]:
    return [int(dict(r.headers)[POSITION_HEADER]) for r in records]


def test_the_topic_the_relay_creates_takes_an_older_logs_large_event(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    read_topic: Callable[..., list[Any]],
) -> None:
    big = older_log(tmp_path, monkeypatch)
    relay = Relay(
        open_store(tmp_path), kafka_bootstrap, topic=kafka_topic, transactional_id=transactional_id
    )
    try:
        assert relay.record_limit == RECORD_MAX_BYTES
        head = big + 2
        assert relay.publish_pending() == head  # was: MessageSizeTooLargeError, for ever
    finally:
        relay.close()
    records = read_topic(kafka_topic)
    assert positions(records) == list(range(1, head + 1))
    assert len(records[big - 1].value) > 1_200_000
    follower = subprocess.run(  # a reader of the topic takes it too, to the head
        [GPULEDGER, "--home", str(tmp_path / "reader"), "project", "follow", "--kafka",
         kafka_bootstrap, "--topic", kafka_topic, "--until", str(head)],
        env={k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert follower.returncode == 0, follower.stderr
    assert follower.stdout == f"position {head:,}, {head:,} events, 0 quarantined\n"


def test_an_older_topic_with_kafkas_default_limit_is_raised_by_the_relay(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    read_topic: Callable[..., list[Any]],
) -> None:
    big = older_log(tmp_path, monkeypatch)
    older = {**TOPIC_CONFIG, "max.message.bytes": "1048588"}  # made before the relay set it
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="test-relay-sizes")
    try:
        admin.create_topics([NewTopic(kafka_topic, 1, 1, topic_configs=older)])
        relay = Relay(
            open_store(tmp_path), kafka_bootstrap, topic=kafka_topic,
            transactional_id=transactional_id,
        )  # fmt: skip
        try:
            assert relay.record_limit == 1_048_588
            assert relay.publish_pending() == big + 2  # was: MessageSizeTooLarge, for ever
            assert relay.record_limit == RECORD_MAX_BYTES
        finally:
            relay.close()
        keys = ["max.message.bytes", "retention.ms", "cleanup.policy"]
        resource = ConfigResource(ConfigResourceType.TOPIC, kafka_topic, keys)
        found = admin.describe_configs([resource], config_filter="all")["topic"][kafka_topic]
    finally:
        admin.close()
    assert {k: found[k]["value"] for k in keys} == {
        "max.message.bytes": str(RECORD_MAX_BYTES),
        "retention.ms": "-1",  # nothing else touched
        "cleanup.policy": "delete",
    }
    assert positions(read_topic(kafka_topic)) == list(range(1, big + 3))


def test_a_topic_whose_limit_the_relay_may_not_raise_gets_all_before_it_and_a_status_naming_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    read_topic: Callable[..., list[Any]],
) -> None:
    """The broker refusing the relay AlterConfigs on the topic (an ACL the development broker
    has no authorizer for) is stood in for by the one function that asks it; the broker is real."""
    big = older_log(tmp_path, monkeypatch)
    older = {**TOPIC_CONFIG, "max.message.bytes": "1048588"}
    refused = "TopicAuthorizationFailedError: no AlterConfigs on the topic"
    monkeypatch.setattr(relay_module, "raise_record_limit", lambda *_a: refused)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="test-relay-sizes")
    try:
        admin.create_topics([NewTopic(kafka_topic, 1, 1, topic_configs=older)])
        relay = Relay(
            open_store(tmp_path), kafka_bootstrap, topic=kafka_topic,
            transactional_id=transactional_id,
        )  # fmt: skip
        try:
            with pytest.raises(RecordTooLarge) as got:
                relay.publish_pending()
            assert relay.position == big - 1
            assert got.value.message == (
                f"relay waits after position {big - 1}: the event at position {big} "
                f"(job.submitted.v2) is {len(read_big(tmp_path, big)):,} bytes, more than topic "
                f"{kafka_topic} takes (max.message.bytes=1,048,588)"
            )
            assert f"--add-config max.message.bytes={RECORD_MAX_BYTES}" in (got.value.hint or "")
            assert positions(read_topic(kafka_topic)) == list(range(1, big))
            raised = {**TOPIC_CONFIG, "max.message.bytes": str(RECORD_MAX_BYTES)}
            admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, kafka_topic, raised)])
            assert relay.publish_pending() == 3  # the operator raised it: on it goes by itself
        finally:
            relay.close()
    finally:
        admin.close()
    assert positions(read_topic(kafka_topic)) == list(range(1, big + 3))


def read_big(home: Path, position: int) -> bytes:
    (record,) = read_raw(open_store(home), position - 1, 1)
    return record.data


def small_events_log(home: Path, tasks: int = 10) -> int:
    """A log as the write side takes it today: a plain user's array of `tasks` events of ~100 KB
    each (atk44z F4), then one ordinary submit. Its head."""
    ledger = Ledger(home, SimClock(1_000.0), seeded_ids(5))
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=3),
            c.AddMember(actor="root", user="bob", project="ai2/olmo"),
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )
    wide = ("/bin/true", *["z" * 4000] * 25)  # 100 KB: well under any record limit below
    ledger.execute(
        c.SubmitJob(
            actor="bob", account="ai2/olmo", gpus=1, command=wide, array=tuple(range(tasks))
        )
    )
    ledger.execute(c.SubmitJob(actor="bob", account="ai2/olmo", gpus=1, command=("/bin/true",)))
    head = ledger.execute(c.SubmitJob(actor="bob", account="ai2/olmo", gpus=1)).position
    ledger.close()
    return head


@pytest.mark.parametrize("limit", [200_000, 120_000])
def test_a_topic_whose_limit_is_under_a_mib_takes_every_event_that_fits_it(
    limit: int,
    tmp_path: Path,
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    read_topic: Callable[..., list[Any]],
) -> None:
    """Kafka's max.message.bytes bounds a producer's *batch*: ten records of 100 KB went as one
    1 MB batch to a topic of 200,000 bytes, the broker refused it and the relay stood still for
    good ("UnknownError: Future not done"), although each record fits (atk44z F4). The relay reads
    the topic's limit and sizes its batches (and its largest request) to it."""
    head = small_events_log(tmp_path)
    older = {**TOPIC_CONFIG, "max.message.bytes": str(limit)}  # made before, by an operator
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="test-relay-sizes")
    try:
        admin.create_topics([NewTopic(kafka_topic, 1, 1, topic_configs=older)])
        relay = Relay(
            open_store(tmp_path), kafka_bootstrap, topic=kafka_topic,
            transactional_id=transactional_id, timeout_s=10,
        )  # fmt: skip
        try:
            assert relay.record_limit == limit
            assert relay.publish_pending() == head  # was: RelayUnavailable, for good
            assert relay.record_limit == limit  # nothing to raise: every record fits
        finally:
            relay.close()
        resource = ConfigResource(ConfigResourceType.TOPIC, kafka_topic, ["max.message.bytes"])
        found = admin.describe_configs([resource], config_filter="all")["topic"][kafka_topic]
    finally:
        admin.close()
    assert found["max.message.bytes"]["value"] == str(limit)  # left as the operator set it
    records = read_topic(kafka_topic)
    assert positions(records) == list(range(1, head + 1))
    assert sum(len(r.value) > 100_000 for r in records) == 10


def test_a_limit_lowered_under_a_running_relay_is_read_again_at_its_next_connection(
    tmp_path: Path,
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    read_topic: Callable[..., list[Any]],
) -> None:
    """An operator lowers the topic's limit while the relay runs with batches sized to the old
    one: the broker refuses the next batch, and the relay's next connection reads the limit
    again and sizes its batches to it, instead of sending the same batch for good."""
    home = tmp_path / "home"
    head = small_events_log(home)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="test-relay-sizes")
    try:
        relay = Relay(
            open_store(home), kafka_bootstrap, topic=kafka_topic,
            transactional_id=transactional_id, timeout_s=10,
        )  # fmt: skip
        try:
            assert relay.record_limit == RECORD_MAX_BYTES
            lowered = {**TOPIC_CONFIG, "max.message.bytes": "200000"}
            admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, kafka_topic, lowered)])
            published, errors = 0, []
            for _ in range(3):
                try:
                    published = relay.publish_pending()
                    break
                except RelayUnavailable as e:  # the batch sized to 8 MiB, refused: once
                    errors.append(e)
            assert published == head, errors
            assert relay.record_limit == 200_000
            assert len(errors) <= 1
        finally:
            relay.close()
    finally:
        admin.close()
    assert positions(read_topic(kafka_topic)) == list(range(1, head + 1))


def test_an_event_whose_record_fits_the_limit_exactly_is_published_where_it_may_not_be_raised(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    read_topic: Callable[..., list[Any]],
) -> None:
    """The relay judged a record by its event's bytes and 4 KiB to spare: an event whose
    record fits the topic's limit within those 4 KiB waited for good (`RecordTooLarge`) where
    the limit may not be raised. Its record's exact size is what counts: the limit here is that
    size, to the byte, and the refusal to raise it is stood in for (as above)."""
    head = small_events_log(tmp_path, tasks=2)
    record = next(r for r in read_raw(open_store(tmp_path), 0, head) if len(r.data) > 100_000)
    limit = batch_bytes(record.key, record.data, record_headers(record.position, record.tag,
                                                                record.data))  # fmt: skip
    monkeypatch.setattr(relay_module, "raise_record_limit", lambda *_a: "no AlterConfigs")
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="test-relay-sizes")
    try:
        older = {**TOPIC_CONFIG, "max.message.bytes": str(limit)}
        admin.create_topics([NewTopic(kafka_topic, 1, 1, topic_configs=older)])
    finally:
        admin.close()
    relay = Relay(
        open_store(tmp_path), kafka_bootstrap, topic=kafka_topic,
        transactional_id=transactional_id, timeout_s=10,
    )  # fmt: skip
    try:
        assert relay.publish_pending() == head  # was: RecordTooLarge, for good
    finally:
        relay.close()
    assert positions(read_topic(kafka_topic)) == list(range(1, head + 1))
