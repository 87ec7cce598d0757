"""A relay with no relay.json in its home (a standby's first lead, a leader on another host after
a failover, a lost file) still knows its progress: the store every server shares keeps it
(`ledger.store.relay_progress`). So a topic writer's rebuilt copy of an event not yet published
(atk46-25 F3: exact bytes from `gpuledger log --json`, unsigned) is not its bookmark, and the
events before it are published (threat model T8). Real broker; the SQLite store (relay.json
lost) and PostgreSQL (a second server's home on the same store); a home from before the store
kept it (relay.json alone) seeds the store."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka import KafkaProducer

from ledger.store import locate, relay_progress
from ledger.store.application import Ledger
from ledger.store.creating import NewLedger
from ledger.store.relay import RawRecord, ensure_topic, open_store, read_raw
from ledger.store.relay_health import health_path
from ledger.store.relay_service import RelayService
from projections.kafka_source import KafkaSource
from projections.kafka_wire import header_position, record_headers
from projections.projector import Projector
from projections.store import Store
from schemas import commands as c
from tests.integration.conftest import read_all
from tests.integration.waits import wait_for

pytestmark = pytest.mark.kafka

JOB = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=0, duration_s=60)
ORG = [
    c.RegisterNode(actor="root", node="n1", gpus=8, gpu_type="h100"),
    c.OpenAccount(actor="root", path="ai2", kind="program"),
    c.OpenAccount(actor="root", path="ai2/olmo", kind="project"),
    c.AddMember(actor="root", user="alice", project="ai2/olmo"),
]


def serve_relay(home: Path, bootstrap: str, topic: str, txid: str, head: int) -> RelayService:
    """A server's relay service on `home` until the topic holds position `head`, stopped."""
    service = RelayService(home, bootstrap, topic=topic, transactional_id=txid).start()
    try:
        wait_for(
            f"the relay at position {head}",
            lambda: service.health.position >= head and service.health.state == "publishing",
            90,
            lambda: str(service.health),
        )
    finally:
        service.stop()
    return service


def rebuilt_copy(bootstrap: str, topic: str, event: RawRecord) -> int:
    """What a topic writer sends: the stored event's exact bytes and the relay's headers,
    unsigned, with a plain producer. Its offset."""
    ensure_topic(bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        headers = record_headers(event.position, event.tag, event.data, None)
        sent = producer.send(topic, value=event.data, key=event.key, headers=headers, partition=0)
        return int(sent.get(timeout=60).offset)
    finally:
        producer.close()


def no_gap(bootstrap: str, topic: str, head: int, reader: Path, forged_at: int) -> None:
    """Every position up to `head` is on the topic as the relay's record, and a quarantining
    reader applies them all, setting the rebuilt copy aside."""
    records = read_all(bootstrap, topic)
    genuine = [header_position(r.headers) for r in records if r.offset != forged_at]
    assert sorted(set(genuine)) == list(range(1, head + 1)), genuine
    store, source = Store(reader), KafkaSource(bootstrap, topic, timeout_s=60)
    try:
        assert Projector(store, source, quarantine=True).catch_up().position == head
        dead = store.con.execute("SELECT kafka_offset FROM dead_letters").fetchall()
        assert [int(o) for (o,) in dead] == [forged_at]
    finally:
        source.close()
        store.close()


@pytest.mark.parametrize("takeover", ["sqlite", "postgresql"])
def test_a_server_with_no_relay_json_publishes_the_events_before_a_rebuilt_copy(
    takeover: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
) -> None:
    """Server A's relay publishes to P and stops; three events follow (P+1..P+3) while nobody
    relays; a topic writer sends the exact bytes of P+3. Then a relay with no relay.json starts:
    SQLite, the same home with its relay.json lost; PostgreSQL, a second server's home on the
    same store. It was taking P+3 as its bookmark: P+1 and P+2 never reached the topic."""
    home = tmp_path / "a"
    if takeover == "postgresql":
        locate.remember(home, request.getfixturevalue("pg_store"))
    led = NewLedger(home, live=True)  # makes the store's tables
    try:
        led.execute(c.InitLedger(actor="root", admin="root"))
        led.execute_all(ORG + [JOB] * 5)
        published = led.position
        serve_relay(home, kafka_bootstrap, kafka_topic, transactional_id, published)
        assert relay_progress.read(open_store(home), kafka_topic) == published
        led.execute_all([JOB] * 3)
        head = led.position
    finally:
        led.close()
    assert head == published + 3
    last = read_raw(open_store(home), head - 1, 1)[0]
    forged_at = rebuilt_copy(kafka_bootstrap, kafka_topic, last)
    if takeover == "sqlite":
        health_path(home).unlink()  # lost (or never written: a new host's home)
        other = home
    else:
        other = tmp_path / "b"  # a standby's home: the same store, no relay.json
        locate.remember(other, locate.store_of(home))
    assert not health_path(other).exists()
    service = serve_relay(other, kafka_bootstrap, kafka_topic, transactional_id, head)
    no_gap(kafka_bootstrap, kafka_topic, head, tmp_path / "reader.duckdb", forged_at)
    assert service.health.skipped == (forged_at,)  # was (): the copy was its bookmark
    assert relay_progress.read(open_store(home), kafka_topic) == head


def test_a_home_from_before_the_store_kept_the_progress_seeds_it_from_relay_json(
    org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str,
    transactional_id: str,
) -> None:  # fmt: skip
    """An upgrade: the store has no progress (its table dropped, as a store of an earlier
    version has none) but the home's relay.json has it: the relay takes it (a rebuilt copy is
    foreign) and writes it to the store."""
    home = org_ledger.home
    org_ledger.execute_all([JOB] * 5)
    published = org_ledger.position
    serve_relay(home, kafka_bootstrap, kafka_topic, transactional_id, published)
    recorder = open_store(home)
    with recorder.datastore.transaction(commit=True) as cursor:
        cursor.execute(f"DROP TABLE {relay_progress.TABLE}")
    assert relay_progress.read(recorder, kafka_topic) is None
    org_ledger.execute_all([JOB] * 3)
    head = org_ledger.position
    forged_at = rebuilt_copy(kafka_bootstrap, kafka_topic, read_raw(recorder, head - 1, 1)[0])
    service = serve_relay(home, kafka_bootstrap, kafka_topic, transactional_id, head)
    assert service.health.skipped == (forged_at,)
    no_gap(kafka_bootstrap, kafka_topic, head, tmp_path / "reader.duckdb", forged_at)
    assert relay_progress.read(recorder, kafka_topic) == head


def test_a_new_ledgers_first_relay_never_takes_a_copy_sent_before_it(
    tmp_path: Path, kafka_bootstrap: str, kafka_topic: str, transactional_id: str
) -> None:
    """`gpuledger init` makes the store's progress table: nothing is published anywhere yet.
    A topic writer sends the exact bytes of the last event before the ledger's first relay ever
    ran (Kafka turned on later): it was that relay's bookmark, and nothing before it was ever
    published; now the relay publishes everything, the copy skipped."""
    from click.testing import CliRunner

    from ledger.cli import cli

    home = tmp_path / "home"
    done = CliRunner().invoke(cli, ["--home", str(home), "init", "--admin", "root"])
    assert done.exit_code == 0, done.output
    assert relay_progress.read(open_store(home), kafka_topic) == 0
    led = Ledger(home, live=True)
    try:
        led.execute_all(ORG + [JOB] * 5)
        head = led.position
    finally:
        led.close()
    last = read_raw(open_store(home), head - 1, 1)[0]
    forged_at = rebuilt_copy(kafka_bootstrap, kafka_topic, last)
    service = serve_relay(home, kafka_bootstrap, kafka_topic, transactional_id, head)
    no_gap(kafka_bootstrap, kafka_topic, head, tmp_path / "reader.duckdb", forged_at)
    assert service.health.skipped == (forged_at,)


def test_a_progress_row_raised_within_the_head_is_named_and_vouches_for_no_rebuilt_copy(
    org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str,
    transactional_id: str,
) -> None:  # fmt: skip
    """atk47-25 F1 within the head: the relay published to P and stopped; three events follow;
    someone with the store file raises the progress row to the head (`update
    gpuledger_relay_progress set position=<head>`: was taken, only a row *beyond* the head was
    refused) and sends a rebuilt copy of the head's event: it was the relay's bookmark, and
    P+1, P+2 never reached the topic. The row carries a MAC under the state key now: `audit
    verify` names the edit, the relay takes the row as no vouch, publishes every event (the
    copy skipped) and signs the row again."""
    import sqlite3

    from ledger.history import tamper
    from ledger.store import EVENTS_DB

    home = org_ledger.home
    org_ledger.execute_all([JOB] * 5)
    published = org_ledger.position
    serve_relay(home, kafka_bootstrap, kafka_topic, transactional_id, published)
    org_ledger.execute_all([JOB] * 3)
    head = org_ledger.position
    recorder = open_store(home)
    assert relay_progress.read(recorder, kafka_topic) == published
    assert not [e for e in relay_progress.edits(home, head) if kafka_topic in e]
    with sqlite3.connect(home / EVENTS_DB) as db:
        db.execute(f"UPDATE {relay_progress.TABLE} SET position = ?", (head,))
    named = [p.detail for p in tamper.verify_store(home).problems]
    assert any(
        f"{kafka_topic} (store, position {head:,}) does not verify under the state key that "
        "signed it: an edited progress" in d
        for d in named
    )
    forged_at = rebuilt_copy(kafka_bootstrap, kafka_topic, read_raw(recorder, head - 1, 1)[0])
    service = serve_relay(home, kafka_bootstrap, kafka_topic, transactional_id, head)
    no_gap(kafka_bootstrap, kafka_topic, head, tmp_path / "reader.duckdb", forged_at)
    assert service.health.skipped == (forged_at,)  # was (): the copy was its bookmark
    assert not [e for e in relay_progress.edits(home, head) if kafka_topic in e]
