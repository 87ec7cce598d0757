"""A topic writer (and someone with the store file) against the relay, the restore and the audit of
the copy (atk49-25, threat model T7-T9 in docs/security.md). Real broker, real store:

- F1: a copy of the store's next event with another tag header (or two) sent before the relay
  published it was taken as the relay's own record: the store's event never reached the topic;
  `audit verify --kafka` blamed the genuine next position.
- F2: `store restore --from-kafka` while another producer holds a transaction open restored to
  it, said "read back equal", and signed the progress at the short head.
- F3: one unsigned record on a signed topic stopped a restore half-way, leaving a partial store
  that verified intact and blocked a rerun.
- F9: the progress table dropped made relay.json (no MAC) vouch again for a copy of the head.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from kafka import KafkaProducer

from ledger.cli import cli
from ledger.store import EVENTS_DB, relay_progress
from ledger.store.application import Ledger
from ledger.store.relay import RawRecord, Relay, ensure_topic, open_store, read_raw
from ledger.store.relay_health import health_path
from ledger.store.relay_service import RelayService
from projections.kafka_wire import (
    KEYS_ENV,
    POSITION_HEADER,
    TAG_HEADER,
    header_position,
    parse_keys,
    record_headers,
)
from tests.integration.conftest import read_all
from tests.integration.test_relay_progress import JOB
from tests.integration.waits import wait_for

pytestmark = pytest.mark.kafka

KEYS_TEXT = "k1:relay-secret"
KEYS = parse_keys(KEYS_TEXT)


def relay_to(home: Path, bootstrap: str, topic: str, txid: str, head: int) -> RelayService:
    """The server's relay service on `home` until the topic holds position `head`, stopped."""
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


def send(bootstrap: str, topic: str, event: RawRecord, headers: list[tuple[str, bytes]]) -> int:
    """A topic writer's record: the stored event's exact value and key, with `headers`."""
    ensure_topic(bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        got = producer.send(topic, value=event.data, key=event.key, headers=headers, partition=0)
        return int(got.get(timeout=60).offset)
    finally:
        producer.close()


def relays_records(bootstrap: str, topic: str, home: Path, forged: set[int]) -> None:
    """Every store event is on the topic once as the relay wrote it (key, tag header, value),
    the `forged` offsets aside."""
    events = read_raw(open_store(home), 0, 1_000_000)
    got = [
        (header_position(r.headers), dict(r.headers)[TAG_HEADER].decode(), bytes(r.value), r.key)
        for r in read_all(bootstrap, topic)
        if r.offset not in forged
    ]
    assert got == [(e.position, e.tag, bytes(e.data), e.key) for e in events]


def run(*args: str, code: int = 0, env: dict[str, str] | None = None) -> str:
    done = CliRunner().invoke(cli, list(args), env=env)
    assert done.exit_code == code, done.output
    return done.output


@pytest.mark.parametrize(
    "headers",
    [
        [(TAG_HEADER, b"zz.unknown.v1")],
        [(TAG_HEADER, b"job.cancelled.v1")],
        [None, (TAG_HEADER, b"zz.unknown.v1")],  # None: the right tag header, then a second
    ],
    ids=["unknown-tag", "cancelled-tag", "two-tags"],
)
def test_a_copy_of_the_next_event_under_another_tag_header_is_skipped_and_named(
    headers: list[tuple[str, bytes] | None], org_ledger: Ledger, tmp_path: Path,
    kafka_bootstrap: str, kafka_topic: str, transactional_id: str,
) -> None:  # fmt: skip
    """F1, unsigned: the relay published to P and stopped; P+1, P+2 follow; a topic writer sends
    the store's exact bytes of P+1 with another tag header. The relay took it as its own P+1
    (the digest of its value matched): the store's P+1 never reached the topic. Now the relay
    skips it and publishes P+1; `audit verify --kafka` names its offset, not P+2."""
    home = org_ledger.home
    org_ledger.execute_all([JOB] * 3)
    published = org_ledger.position
    relay_to(home, kafka_bootstrap, kafka_topic, transactional_id, published)
    org_ledger.execute_all([JOB] * 2)
    head = org_ledger.position
    nxt = read_raw(open_store(home), published, 1)[0]
    right = record_headers(nxt.position, nxt.tag, nxt.data)
    forged = [(POSITION_HEADER, str(nxt.position).encode())]
    forged += [right[1] if h is None else h for h in headers]
    forged_at = send(kafka_bootstrap, kafka_topic, nxt, forged)
    service = relay_to(home, kafka_bootstrap, kafka_topic, transactional_id, head)
    assert service.health.skipped == (forged_at,)  # was (): the copy was its record P+1
    relays_records(kafka_bootstrap, kafka_topic, home, {forged_at})
    out = run("--home", str(home), "audit", "verify", "--kafka", kafka_bootstrap, "--topic",
              kafka_topic, code=1)  # fmt: skip
    assert f"offset {forged_at}" in out and "foreign" in out, out
    assert "broken-link" not in out and f"position {head}:" not in out, out


def test_a_restore_while_another_producer_holds_a_transaction_open_is_refused(
    org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str,
    transactional_id: str,
) -> None:  # fmt: skip
    """F2: the relay published to P; another producer opens a transaction on the topic and holds
    it; the relay commits P+1, P+2 behind it. A restore read to P (read_committed stops at the
    open transaction), said "read back equal" and signed the progress at P: P+1, P+2 lost.
    Now it is refused in one line and writes nothing; once the transaction ends it restores
    everything."""
    home = org_ledger.home
    org_ledger.execute_all([JOB] * 3)
    relay = Relay(open_store(home), kafka_bootstrap, topic=kafka_topic,
                  transactional_id=transactional_id, keys=None)  # fmt: skip
    holder = None
    try:
        relay.publish_pending()
        published = org_ledger.position
        holder = KafkaProducer(bootstrap_servers=kafka_bootstrap,
                               transactional_id=transactional_id + "-mallory")  # fmt: skip
        holder.init_transactions()
        holder.begin_transaction()
        holder.send(kafka_topic, value=b"junk", headers=[(POSITION_HEADER, b"1")], partition=0)
        holder.flush()
        org_ledger.execute_all([JOB] * 2)
        assert relay.publish_pending() == 2
    finally:
        relay.close()
    head = org_ledger.position
    dst = tmp_path / "restored"
    try:
        out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
                  "--to", str(dst), code=1)  # fmt: skip
        assert "another producer holds a transaction open" in out, out
        assert f"would stop at position {published}" in out and out.count("\n") <= 2, out
        assert not (dst / EVENTS_DB).exists()
        out = run("--home", str(home), "audit", "verify", "--kafka", kafka_bootstrap, "--topic",
                  kafka_topic)  # fmt: skip
        assert "2 events behind the store" in out, out
        assert "note: another producer holds a transaction open" in out, out
    finally:
        holder.abort_transaction()
        holder.close()
    out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
              "--to", str(dst))  # fmt: skip
    assert f"restored {head} events (positions 1-{head})" in out, out
    assert relay_progress.read(open_store(dst), kafka_topic) == head


def test_a_restore_sets_unsigned_records_on_a_signed_topic_aside(
    org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str,
    transactional_id: str,
) -> None:  # fmt: skip
    """F3: signing on; an unsigned relabelled copy of P+1 sent before the relay's P+1 and an
    unsigned copy of the head under head+1 after the tail. A restore stopped at the first
    (a partial store of P events that verified intact and refused a rerun); now it sets both
    aside, as a signed quarantining reader does, names them, and restores every event."""
    home = org_ledger.home
    org_ledger.execute_all([JOB] * 3)
    relay = Relay(open_store(home), kafka_bootstrap, topic=kafka_topic,
                  transactional_id=transactional_id, keys=KEYS)  # fmt: skip
    try:
        relay.publish_pending()
        published = org_ledger.position
        org_ledger.execute_all([JOB] * 2)
        nxt = read_raw(open_store(home), published, 1)[0]
        mid = send(kafka_bootstrap, kafka_topic, nxt,
                   record_headers(nxt.position, "zz.unknown.v1", nxt.data))  # fmt: skip
        relay.publish_pending()
    finally:
        relay.close()
    head = org_ledger.position
    last = read_raw(open_store(home), head - 1, 1)[0]
    tail = send(kafka_bootstrap, kafka_topic, last, record_headers(head + 1, last.tag, last.data))
    dst = tmp_path / "restored"
    env = {KEYS_ENV: KEYS_TEXT}
    out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
              "--to", str(dst), env=env)  # fmt: skip
    assert f"restored {head} events (positions 1-{head})" in out, out
    assert f"set aside 2 record(s) of {kafka_topic}" in out and f"{mid}, {tail}" in out, out
    relays_records(kafka_bootstrap, kafka_topic, dst, {mid, tail})


def test_a_restore_that_stops_writes_nothing(
    org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str,
    transactional_id: str,
) -> None:  # fmt: skip
    """F3, unsigned: a relabelled copy of P+1 before the relay's P+1 is a fork no unsigned reader
    can settle: the restore stops. It wrote P events (and the forged P+1) before it stopped, and
    a rerun said "already holds"; now it reads the topic whole first and writes nothing."""
    home = org_ledger.home
    org_ledger.execute_all([JOB] * 3)
    relay = Relay(open_store(home), kafka_bootstrap, topic=kafka_topic,
                  transactional_id=transactional_id, keys=None)  # fmt: skip
    try:
        relay.publish_pending()
        published = org_ledger.position
        org_ledger.execute_all([JOB] * 2)
        nxt = read_raw(open_store(home), published, 1)[0]
        send(kafka_bootstrap, kafka_topic, nxt,
             record_headers(nxt.position, "zz.unknown.v1", nxt.data))  # fmt: skip
        relay.publish_pending()
    finally:
        relay.close()
    dst = tmp_path / "restored"
    out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
              "--to", str(dst), code=1)  # fmt: skip
    assert "forks at position" in out, out
    if (dst / EVENTS_DB).exists():
        with sqlite3.connect(dst / EVENTS_DB) as db:
            assert db.execute("SELECT count(*) FROM stored_events").fetchone() == (0,)


@pytest.mark.parametrize("written", [2, "all"])
def test_a_restore_rerun_after_a_kill_finishes(
    written: int | str, org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str,
    kafka_topic: str, transactional_id: str,
) -> None:  # fmt: skip
    """atk50-25 F7: `store restore` killed -9 while it wrote (pages, one transaction each) or
    after (every event, no progress row) left the start of the log; the rerun refused ("the
    destination already holds N events") and nothing said what to do. The rerun compares what
    is there with the topic's log and writes the rest, and the progress row."""
    from ledger.store.copying import write_log

    home = org_ledger.home
    org_ledger.execute_all([JOB] * 3)
    head = org_ledger.position
    relay_to(home, kafka_bootstrap, kafka_topic, transactional_id, head)
    events = read_raw(open_store(home), 0, 1_000_000)
    dst = tmp_path / "restored"
    dst.mkdir()
    upto = head if written == "all" else int(written)
    write_log([events[:upto]], dst, None)  # what the killed restore left
    args = ("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic)
    out = run(*args, "--to", str(dst))  # was exit 1, "already holds N events"
    assert f"restored {head} events (positions 1-{head})" in out, out
    relays_records(kafka_bootstrap, kafka_topic, dst, set())
    with sqlite3.connect(dst / EVENTS_DB) as db:
        assert db.execute("SELECT count(*) FROM stored_events").fetchone() == (head,)
        assert db.execute("SELECT position FROM gpuledger_relay_progress").fetchall() == [(head,)]
    # a store holding another log's start: refused, saying what to do, nothing written
    other = tmp_path / "other"
    other.mkdir()
    write_log([[events[0]._replace(data=bytes(events[0].data) + b" ")]], other, None)
    out = run(*args, "--to", str(other), code=1)
    assert "already holds 1 events and its event at position 1 is not the log's" in out, out
    assert "restore into an empty store" in out, out


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_a_dropped_progress_table_does_not_make_relay_json_vouch(
    signed: bool, org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str,
    transactional_id: str, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """F9: the relay published to P (its row MAC'd); P+1, P+2 follow; someone with the store and
    the home drops the progress table, raises relay.json to the head P+2 and sends an unsigned
    exact copy of P+2. The store looked like an earlier version's, relay.json vouched: the copy
    was the bookmark and P+1 never reached the topic (signing on too). `audit verify` names the
    dropped table; the relay takes relay.json as no vouch and publishes P+1, P+2."""
    if signed:
        monkeypatch.setenv(KEYS_ENV, KEYS_TEXT)
    home = org_ledger.home
    org_ledger.execute_all([JOB] * 3)
    published = org_ledger.position
    relay_to(home, kafka_bootstrap, kafka_topic, transactional_id, published)
    org_ledger.execute_all([JOB] * 2)
    head = org_ledger.position
    with sqlite3.connect(home / EVENTS_DB) as db:
        db.execute(f"DROP TABLE {relay_progress.TABLE}")
    health = json.loads(health_path(home).read_text())
    health["position"] = health["store_head"] = head
    health_path(home).write_text(json.dumps(health))
    out = run("--home", str(home), "audit", "verify", code=1)
    assert "keeps no relay progress table" in out and "a dropped table" in out, out
    last = read_raw(open_store(home), head - 1, 1)[0]
    forged_at = send(kafka_bootstrap, kafka_topic, last,
                     record_headers(last.position, last.tag, last.data))  # fmt: skip
    service = relay_to(home, kafka_bootstrap, kafka_topic, transactional_id, head)
    assert service.health.skipped == (forged_at,)  # was (): the copy was its bookmark
    relays_records(kafka_bootstrap, kafka_topic, home, {forged_at})
