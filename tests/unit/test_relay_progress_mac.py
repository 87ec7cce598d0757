"""The relay's progress row is signed under the service's state key (`relay_progress.mac`): an
edit at or below the store's head is no vouch, and `audit verify` names it (atk47-25 F1's
residual: only a row *beyond* the head was found out; one raised to a position not yet
published, at or below the head, with a rebuilt copy of that event on the topic, made the copy
the relay's bookmark and the events before it never reached the topic). A real SQLite store; the
topic is the fake consumer of test_relay_tail."""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

import pytest

from ledger.history import tamper
from ledger.store import EVENTS_DB
from ledger.store.application import Ledger
from ledger.store.relay import Relay, open_store, read_raw
from ledger.store.relay_progress import TABLE, Kept, Word, keep, read, words
from ledger.store.relay_tail import tail_windows
from projections.kafka_wire import SigningKeys, record_headers
from schemas import commands as c
from tests.unit.test_relay_tail import KEYS, TOPIC, Spec, Topic

KEY = b"k" * 32


def grown(ledger: Ledger, n: int = 40) -> list[Any]:
    """`ledger` with `n` more events; its stored records."""
    ledger.execute_all(
        [c.AddMember(actor="root", user=f"u{i}", project="ai2/olmo") for i in range(n)]
    )
    return read_raw(open_store(ledger.home), 0, 10_000)


def specs(records: list[Any], keys: SigningKeys | None) -> list[Spec]:
    return [
        Spec(record_headers(r.position, r.tag, r.data, keys), lambda d=r.data: d, r.key)
        for r in records
    ]


def relay_bookmark(
    monkeypatch: pytest.MonkeyPatch,
    ledger: Ledger,
    topic: list[Spec],
    keys: SigningKeys | None,
    key: bytes | None = KEY,
) -> tuple[int, list[int]]:
    monkeypatch.setattr(sys.modules[tail_windows.__module__], "KafkaConsumer", Topic)
    monkeypatch.setattr(Topic, "specs", topic)
    relay = object.__new__(Relay)
    relay.recorder = open_store(ledger.home)
    relay.bootstrap, relay.topic, relay.config = "127.0.0.1:9", TOPIC, {}
    relay.timeout_s, relay.connect_timeout_s, relay.keys = 30.0, 3.0, keys
    relay.progress, relay.position, relay.mark, relay._offset = None, 0, None, None
    relay._going_on, relay._deadline = None, lambda: None  # no round's end (a connect's)
    relay.kept = Kept(relay.recorder, TOPIC, key=key)
    last, foreign = relay._bookmark()
    return last.position, foreign


def edit(ledger: Ledger, position: int) -> None:
    """What atk47-25 did: `update gpuledger_relay_progress set position=...`."""
    with sqlite3.connect(ledger.home / EVENTS_DB) as db:
        db.execute(f"UPDATE {TABLE} SET position = ?", (position,))


@pytest.mark.parametrize("keys", [None, KEYS], ids=["unsigned", "signed"])
def test_a_progress_raised_within_the_head_does_not_vouch_for_a_rebuilt_copy(
    org_ledger: Ledger, monkeypatch: pytest.MonkeyPatch, keys: SigningKeys | None
) -> None:
    """Published up to head-3 (its progress signed); the row raised to the head and an unsigned
    rebuilt copy of the head's event on the topic: was the bookmark (head-2, head-1 never
    published, signing on or off); now the row does not verify, the relay's last record is
    head-3 and the copy foreign."""
    records = grown(org_ledger)
    head, last = records[-1].position, records[-4].position
    keep(open_store(org_ledger.home), TOPIC, last, KEY)
    topic = specs(records[:-3], keys) + specs(records[-1:], None)
    assert relay_bookmark(monkeypatch, org_ledger, topic, keys) == (last, [last])
    edit(org_ledger, head)
    assert read(open_store(org_ledger.home), TOPIC) == head
    assert relay_bookmark(monkeypatch, org_ledger, topic, keys) == (last, [last])
    # the next write replaces the edited row with a true, signed one (it was only ever raised)
    kept = Kept(open_store(org_ledger.home), TOPIC, key=KEY)
    assert kept.word(head) == Word(head, False)
    kept.flush(last)
    assert kept.word(head) == Word(last, True)


def test_a_progress_lowered_and_an_old_record_copied_to_the_tail_republish_nothing(
    org_ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row lowered to 3 (a MAC copied from an old row, or none) and a copy of event 3 at the
    tail: the relay resumed after 3 and published everything after it again; now the row is a
    floor only when it verifies, and the whole topic is read: the last record is the head."""
    records = grown(org_ledger)
    head = records[-1].position
    keep(open_store(org_ledger.home), TOPIC, head, KEY)
    topic = specs(records, None) + specs(records[2:3], None)
    assert relay_bookmark(monkeypatch, org_ledger, topic, None) == (head, [head])
    edit(org_ledger, 3)
    assert relay_bookmark(monkeypatch, org_ledger, topic, None) == (head, [head])


def test_the_words_a_relay_vouches_with_and_reads_on_to() -> None:
    assert words(Word(20, True), None, head=30) == (20, 20)
    assert words(Word(20, False), None, head=30) == (0, 20)  # no vouch, a floor
    assert words(Word(40, True), None, head=30) == (0, 0)  # beyond the head: no word
    assert words(Word(20, True), 25, head=30) == (20, 25)  # relay.json beside a row: a floor
    assert words(Word(None, True), 25, head=30) == (25, 25)  # a store of an earlier version
    assert words(Word(None, True), None, head=30) == (None, 0)
    assert words(Word(0, True), 99, head=30) == (0, 0)


def test_audit_verify_names_a_progress_row_edited_within_the_head(org_ledger: Ledger) -> None:
    """`update gpuledger_relay_progress set position=<a position within the head>` was invisible
    to `audit verify` ("chain intact", exit 0). Signed under the home's state key now."""
    from ledger.store.snapshots import state_key

    records = grown(org_ledger, 5)
    head = records[-1].position
    keep(open_store(org_ledger.home), "gpuledger.events", head - 2, state_key(org_ledger.home))
    assert tamper.verify_store(org_ledger.home).ok
    edit(org_ledger, head - 1)
    report = tamper.verify_store(org_ledger.home)
    assert [(p.position, p.kind) for p in report.problems] == [(head, "edited")]
    assert "gpuledger.events (store, position " + f"{head - 1:,}) does not verify" in (
        report.problems[0].detail
    )
    # a row signed under another home's key (a PostgreSQL ledger's other server, a restore run
    # from another home) or with none is not checked here: the relay takes it as no vouch
    keep(open_store(org_ledger.home), "gpuledger.events", head - 2, b"another" * 4, repair=True)
    assert tamper.verify_store(org_ledger.home).ok
    edit(org_ledger, head - 1)
    assert tamper.verify_store(org_ledger.home).ok
    kept = Kept(open_store(org_ledger.home), "gpuledger.events", key=state_key(org_ledger.home))
    assert kept.word(head) == Word(head - 1, False)


def test_a_table_of_an_earlier_version_gets_its_mac_column_at_the_first_write(
    org_ledger: Ledger,
) -> None:
    records = grown(org_ledger, 2)
    with sqlite3.connect(org_ledger.home / EVENTS_DB) as db:
        db.execute(
            f"CREATE TABLE {TABLE} (topic TEXT PRIMARY KEY, position INTEGER NOT NULL, "
            "kept_at TEXT NOT NULL)"
        )
        db.execute(f"INSERT INTO {TABLE} VALUES ('{TOPIC}', 3, 'then')")
    kept = Kept(open_store(org_ledger.home), TOPIC, key=KEY)
    assert kept.word() == Word(3, False)  # no MAC: no vouch, rewritten at the next write
    kept.flush(records[-1].position)
    assert kept.word() == Word(records[-1].position, True)


def test_keeping_the_progress_beside_a_busy_writer_waits_for_the_lock_never_fails(
    org_ledger: Ledger,
) -> None:
    """CI (test_kafka_failures, under load): `keep` read the schema (`CREATE TABLE IF NOT
    EXISTS`) before its upsert, so a commit by the dispatcher in between made SQLite refuse the
    upgrade to a write at once ("database is locked", no wait) and the relay warned. The upsert
    is the transaction's first statement now: it waits for the writer as any write does."""
    import threading

    stop = threading.Event()

    def busy() -> None:
        i = 0
        while not stop.is_set():
            org_ledger.execute(c.AddMember(actor="root", user=f"w{i}", project="ai2/olmo"))
            i += 1

    recorder = open_store(org_ledger.home)
    keep(recorder, TOPIC, 1, KEY)
    writer = threading.Thread(target=busy, daemon=True)
    writer.start()
    try:
        for n in range(2, 300):
            keep(recorder, TOPIC, n, KEY)
    finally:
        stop.set()
        writer.join(30)
    assert read(recorder, TOPIC) == 299


def test_a_progress_past_the_store_s_head_is_never_written(org_ledger: Ledger) -> None:
    """atk52-ha F3: a deposed leader's relay flushed its progress at stop into the promoted
    store, which had lost the tail it had read: a row past the head, unsigned (no event to sign),
    that the next relay called edited. Now nothing is written for a position the store does
    not hold; a true one still is."""
    head = grown(org_ledger, 3)[-1].position
    kept = Kept(open_store(org_ledger.home), TOPIC, key=KEY)
    kept.flush(head + 2)
    assert read(open_store(org_ledger.home), TOPIC) in (None, 0)
    kept.flush(head)
    assert kept.word(head) == Word(head, True)
