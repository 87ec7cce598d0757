"""The broker lost the end of the relay's topic (its data restored from an older copy, an unclean
election, a power loss of its only replica: the same topic id, a lower end), and a topic writer
put a saved record of the relay's at the offset its progress names (atk53-25 F1). Real broker,
real store: the store's row is written as the relay wrote it before the loss (the position, the
topic id and the offset, signed under the state key), the loss itself is left out (the attacker's
scripts restored the broker's data directory; the row is what the relay reads of it)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from ledger.store.application import Ledger
from ledger.store.relay import open_store, read_raw
from ledger.store.relay_health import read_health
from ledger.store.relay_progress import keep, read_anchor
from ledger.store.relay_service import RelayService
from ledger.store.relay_tail import LOG_APPEND_TIME, not_taken
from ledger.store.relay_topic import TIMESTAMP_TYPE
from ledger.store.snapshots import state_key
from projections.kafka_wire import (
    KEYS_ENV,
    TOPIC_CONFIG,
    header_position,
    record_headers,
    signing_keys,
)
from tests.integration.conftest import read_all, unique_name
from tests.integration.test_relay_forgeries import KEYS_TEXT, relay_to, run
from tests.integration.test_relay_progress import JOB
from tests.integration.test_relay_remade import topic_id
from tests.integration.test_relay_settings import alter
from tests.integration.waits import wait_for

pytestmark = pytest.mark.kafka


def end_offset(bootstrap: str, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="gpuledger-test-end")
    try:
        return int(consumer.end_offsets([tp])[tp])
    finally:
        consumer.close()


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_a_saved_record_at_the_offset_the_progress_names_is_not_the_bookmark(
    signed: bool, org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str,
    transactional_id: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The relay published 1..k; the topic's end is where the broker's restored copy ends. Its
    progress names its record of P at offset O (committed before the loss). A topic writer fills
    the offsets up to O with junk and puts the relay's record of P at O, outside a transaction.
    The restarted relay took it as its bookmark (the row names it): k+1..P-1 never reached the
    topic, "publishing, 0 behind", and readers stopped at the gap. Now a record the row names
    must be followed by a commit marker (the relay's last record of a batch is): the relay reads
    the topic from its start and publishes k+1..P after the junk."""
    env = {KEYS_ENV: KEYS_TEXT} if signed else {}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    home = org_ledger.home
    org_ledger.execute_all([JOB] * 3)
    k = org_ledger.position
    relay_to(home, kafka_bootstrap, kafka_topic, transactional_id, k)
    org_ledger.execute_all([JOB] * 6)
    head = org_ledger.position
    at = end_offset(kafka_bootstrap, kafka_topic) + 6  # where the relay's record of P sat
    (event,) = read_raw(open_store(home), head - 1, 1)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        sent = -1
        while sent < at - 1:  # junk up to the offset the row names
            sent = producer.send(kafka_topic, value=b"{}", key=event.key, partition=0)
            sent = int(sent.get(timeout=60).offset)
        headers = record_headers(event.position, event.tag, event.data, signing_keys())
        got = producer.send(kafka_topic, value=event.data, key=event.key, headers=headers,
                            partition=0)  # fmt: skip
        assert int(got.get(timeout=60).offset) == at
    finally:
        producer.close()
    recorder = open_store(home)
    keep(recorder, kafka_topic, head, state_key(home), repair=True,
         topic_id=topic_id(kafka_bootstrap, kafka_topic), offset=at)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="gpuledger.relay"):
        relay_to(home, kafka_bootstrap, kafka_topic, transactional_id, head)
    positions = [header_position(r.headers) for r in read_all(kafka_bootstrap, kafka_topic)]
    assert positions[: k + 1] == [*range(1, k + 1), None], positions
    assert positions[-(head - k) :] == list(range(k + 1, head + 1)), positions  # was: ..., P
    said = [r.getMessage() for r in caplog.records if "commit marker" in r.getMessage()]
    assert len(said) == 1 and f"offset {at}" in said[0], said
    row = read_anchor(open_store(home), kafka_topic)
    assert row[1] is not None and row[1] > at  # the row names the relay's record of P now
    out = run("--home", str(tmp_path / "reader"), "project", "follow", "--kafka",
              kafka_bootstrap, "--topic", kafka_topic, "--once", "--quarantine",
              env=env)  # fmt: skip
    assert out.splitlines()[-1].startswith(f"position {head}, "), out


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_a_saved_record_a_transactional_writer_commits_at_the_offset_is_not_the_bookmark(
    signed: bool, org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str,
    transactional_id: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The same loss, the topic writer a *transactional* producer: its junk and the relay's saved
    record of P at O in one transaction, committed, so a commit marker follows it. The relay
    took it as its bookmark (k+1..P-1 never on the topic; the limit docs/kafka.md named). The
    relay's topic is `LogAppendTime` and its progress keeps the time the broker appended its
    record (checked here against the relay's own row, as a reader reads it back); the copy
    was appended later: the relay warns, reads the topic from its start and publishes k+1..P."""
    env = {KEYS_ENV: KEYS_TEXT} if signed else {}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    home = org_ledger.home
    org_ledger.execute_all([JOB] * 3)
    k = org_ledger.position
    relay_to(home, kafka_bootstrap, kafka_topic, transactional_id, k)
    # the relay's row names the time the broker appended its record of k, as a reader reads it
    _id, last, then = read_anchor(open_store(home), kafka_topic)
    (mine,) = [r for r in read_all(kafka_bootstrap, kafka_topic) if r.offset == last]
    assert mine.timestamp_type == LOG_APPEND_TIME and then == mine.timestamp, (mine, then)
    assert last is not None and not_taken(kafka_bootstrap, last, kafka_topic, stamp=then) is None
    org_ledger.execute_all([JOB] * 6)
    head = org_ledger.position
    at = end_offset(kafka_bootstrap, kafka_topic) + 6  # where the relay's record of P sat
    (event,) = read_raw(open_store(home), head - 1, 1)
    writer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all",
                           transactional_id=unique_name("test-writer"))  # fmt: skip
    try:
        writer.init_transactions()
        writer.begin_transaction()
        sent = -1
        while sent < at - 1:  # junk up to the offset the row names
            sent = writer.send(kafka_topic, value=b"{}", key=event.key, partition=0)
            sent = int(sent.get(timeout=60).offset)
        headers = record_headers(event.position, event.tag, event.data, signing_keys())
        got = writer.send(kafka_topic, value=event.data, key=event.key, headers=headers,
                          partition=0)  # fmt: skip
        assert int(got.get(timeout=60).offset) == at
        writer.commit_transaction()  # a marker after the copy, as after the relay's record
    finally:
        writer.close()
    # the row as the relay wrote it before the loss: its record of P at O, appended then
    keep(open_store(home), kafka_topic, head, state_key(home), repair=True,
         topic_id=topic_id(kafka_bootstrap, kafka_topic), offset=at, stamp=then)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="gpuledger.relay"):
        relay_to(home, kafka_bootstrap, kafka_topic, transactional_id, head)
    positions = [header_position(r.headers) for r in read_all(kafka_bootstrap, kafka_topic)]
    assert positions[: k + 1] == [*range(1, k + 1), None], positions
    assert positions[-(head - k) :] == list(range(k + 1, head + 1)), positions  # was: ..., P
    said = [r.getMessage() for r in caplog.records if "progress names" in r.getMessage()]
    assert len(said) == 1 and f"offset {at}) was appended at " in said[0], said
    assert f"not at the {then} ms" in said[0], said
    row = read_anchor(open_store(home), kafka_topic)
    assert row[1] is not None and row[1] > at and row[2] is not None and row[2] > then, row
    out = run("--home", str(tmp_path / "reader"), "project", "follow", "--kafka",
              kafka_bootstrap, "--topic", kafka_topic, "--once", "--quarantine",
              env=env)  # fmt: skip
    assert out.splitlines()[-1].startswith(f"position {head}, "), out


def test_a_create_time_topic_is_warned_of_once_and_its_row_names_no_time(
    org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str,
    transactional_id: str, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A topic made before the relay set `LogAppendTime` (CreateTime): one warning naming the
    setting and the command that sets it, the relay publishes (the commit-marker check alone),
    and its row names no append time (its sends report the producer's time there). A restore
    of it, and `relay status` over it, say that no append time is known and what follows (they
    said nothing of it, stop 54)."""
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="gpuledger-test")
    try:
        older = {**TOPIC_CONFIG, TIMESTAMP_TYPE: "CreateTime"}
        admin.create_topics([NewTopic(kafka_topic, 1, 1, topic_configs=older)])
    finally:
        admin.close()
    org_ledger.execute_all([JOB] * 3)
    with caplog.at_level(logging.WARNING, logger="gpuledger.relay"):
        relay_to(org_ledger.home, kafka_bootstrap, kafka_topic, transactional_id,
                 org_ledger.position)  # fmt: skip
        org_ledger.execute_all([JOB] * 2)
        relay_to(org_ledger.home, kafka_bootstrap, kafka_topic, transactional_id,
                 org_ledger.position)  # fmt: skip
    said = [r.getMessage() for r in caplog.records if TIMESTAMP_TYPE in r.getMessage()]
    assert len(said) == 2 and "CreateTime" in said[0] and "--add-config" in said[0], said
    positions = [header_position(r.headers) for r in read_all(kafka_bootstrap, kafka_topic)]
    assert positions == list(range(1, org_ledger.position + 1)), positions
    _id, offset, stamp = read_anchor(open_store(org_ledger.home), kafka_topic)
    assert offset is not None and stamp is None
    dst = tmp_path / "restored"
    out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
              "--to", str(dst))  # fmt: skip
    said = f"the record at offset {offset:,} (topic id {_id}); its append time is not known"
    assert said in out and "had message.timestamp.type=CreateTime)" in out, out  # was nothing
    assert "1970" not in out and read_anchor(open_store(dst), kafka_topic)[2] is None, out
    # atk55-25 F8: the topic set to LogAppendTime since: it is the record that carries the
    # producer's time, not the topic's setting (it said "the topic stamps its records with the
    # producer's time")
    alter(kafka_bootstrap, kafka_topic, **{TIMESTAMP_TYPE.replace(".", "_"): "LogAppendTime"})
    again = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
                "--to", str(tmp_path / "again"))  # fmt: skip
    assert "the record carries the producer's time, not the broker's" in again, again
    assert "the topic stamps" not in again and "1970" not in again, again
    assert read_anchor(open_store(tmp_path / "again"), kafka_topic)[2] is None, again
    alter(kafka_bootstrap, kafka_topic, **{TIMESTAMP_TYPE.replace(".", "_"): "CreateTime"})
    service = RelayService(dst, kafka_bootstrap, topic=kafka_topic,
                           transactional_id=transactional_id).start()  # fmt: skip
    try:

        def connected() -> bool:  # relay.json as `relay status` reads it (written after)
            health = read_health(dst)
            return (
                health is not None and health.state == "publishing" and health.appended is not None
            )

        wait_for("the relay connected", connected, 60, lambda: str(service.health))
        line = run("--home", str(dst), "relay", "status")
    finally:
        service.stop()
    assert service.health.appended is False, service.health
    assert "keeps no append time (message.timestamp.type=CreateTime)" in line, line
