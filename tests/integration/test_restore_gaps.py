"""`gpuledger store restore --from-kafka` of a topic that is not one whole log, with signing on
(docs/kafka.md, docs/ha.md; real broker, real store):

- atk52-25 F6: a topic with a gap (saved records 1..k put back onto a topic made again, then the
  relay's records from P on: the relay took its replayed record P as its bookmark, atk52-25 F1)
  restored 1..k and said "chain verified", exit 0. The relay's signed records past the log read
  say the relay published positions the topic lacks: the restore refuses, writing nothing.
- atk52-ha F2: a topic forked by a deposed leader's relay (its record of position N, which the
  promoted store lacks, then the new leader's relay's different event N and the log after it).
  Such a topic was refused (a fork) but named as an unsigned reader's ("one of them was not
  written by the relay ... turn on signing"), both records carrying the relay's signature, and
  without "nothing was written"; now the restore says what it is and what to do. A topic that
  holds the lost event alone (the new signed relay stopped before publishing its own: the
  attack's case) restores a log ending in it, and no restore from the topic alone can tell:
  open, docs/ha.md.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ledger.store import EVENTS_DB
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.relay import RawRecord, open_store, read_raw
from projections.kafka_wire import KEYS_ENV, record_headers, signing_keys
from schemas import commands as c
from tests.integration.test_relay_forgeries import KEYS_TEXT, run, send
from tests.integration.test_relay_progress import JOB

pytestmark = pytest.mark.kafka

ENV = {KEYS_ENV: KEYS_TEXT}


def publish(bootstrap: str, topic: str, events: list[RawRecord]) -> None:
    """`events` on the topic as the relay writes them (its key, headers and signature)."""
    keys = signing_keys()
    for event in events:
        send(bootstrap, topic, event, record_headers(event.position, event.tag, event.data, keys))


def nothing_written(dst: Path) -> None:
    if (dst / EVENTS_DB).exists():
        import sqlite3

        with sqlite3.connect(dst / EVENTS_DB) as db:
            assert db.execute("SELECT count(*) FROM stored_events").fetchone() == (0,)


def test_a_topic_whose_relay_records_lie_past_a_gap_is_not_restored(
    org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """atk52-25 F6: 1..k, then the relay's signed records from P on (k+1..P-1 never on the
    topic): was "restored k events, chain verified", exit 0."""
    monkeypatch.setenv(KEYS_ENV, KEYS_TEXT)
    org_ledger.execute_all([JOB] * 4)
    events = read_raw(open_store(org_ledger.home), 0, 1_000)
    head = len(events)
    k, p = 10, head - 3
    publish(kafka_bootstrap, kafka_topic, [*events[:k], *events[p - 1 :]])
    dst = tmp_path / "restored"
    out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
              "--to", str(dst), code=1, env=ENV)  # fmt: skip
    assert f"lacks positions {k + 1} to {p - 1}" in out, out
    assert f"claims position {p}" in out and "nothing was written" in out, out
    nothing_written(dst)


def test_a_topic_forked_by_a_deposed_leaders_relay_is_not_restored(
    org_ledger: Ledger, tmp_path: Path, clock: SimClock, kafka_bootstrap: str, kafka_topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """atk52-ha F2: the old leader's relay published position N (lost by the failover: the
    promoted store's N is another event), then the new leader's relay published its N and the
    log after it: refused, but as an unsigned reader's fork ("turn on signing", "one of them was
    not written by the relay"); now named as two relays' logs, nothing written."""
    monkeypatch.setenv(KEYS_ENV, KEYS_TEXT)
    org_ledger.execute_all([JOB] * 3)
    shared = org_ledger.position
    promoted = tmp_path / "promoted"
    shutil.copytree(org_ledger.home, promoted)
    org_ledger.execute_all([JOB])  # the old leader's last commit, which the failover lost
    lost = read_raw(open_store(org_ledger.home), 0, 1_000)
    other = Ledger(promoted, clock, seeded_ids(99))
    try:
        other.execute_all([c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2,
                                       min_runtime_s=0, duration_s=90)] * 3)  # fmt: skip
    finally:
        other.close()
    kept = read_raw(open_store(promoted), 0, 1_000)
    n = shared + 1
    assert lost[n - 1].data != kept[n - 1].data and lost[: n - 1] == kept[: n - 1]
    publish(kafka_bootstrap, kafka_topic, [*lost[:n], *kept[n - 1 :]])
    dst = tmp_path / "restored"
    out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
              "--to", str(dst), code=1, env=ENV)  # fmt: skip
    assert f"forks at position {n}" in out, out
    assert "both carry the relay's signature" in out, out  # was "turn on signing"
    assert "nothing was written" in out and "publish to a new topic" in out, out
    nothing_written(dst)


def test_a_restore_names_the_topic_and_the_record_it_restored_last_in_its_progress_row(
    org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str,
    transactional_id: str,
) -> None:  # fmt: skip
    """s53 open item (issue 25): a restore wrote its progress row without the topic's id and the
    offset of its last record, so the next relay, finding no record it may take as its bookmark,
    read the whole topic from its start. The row names both now, when the record passes the
    relay's own checks (followed by a commit marker: the relay's transactions); records sent
    outside a transaction get a row without them, as before."""
    from ledger.store.relay import Relay
    from ledger.store.relay_progress import read, read_anchor
    from tests.integration.conftest import delete_topics, read_all
    from tests.integration.test_relay_remade import topic_id

    org_ledger.execute_all([JOB] * 2)
    head = org_ledger.position
    relay = Relay(open_store(org_ledger.home), kafka_bootstrap, topic=kafka_topic,
                  transactional_id=transactional_id)  # fmt: skip
    try:
        assert relay.publish_pending() == head
    finally:
        relay.close()
    record = read_all(kafka_bootstrap, kafka_topic)[-1]
    last, stamp = record.offset, record.timestamp
    assert record.timestamp_type == 1  # LogAppendTime: the broker's clock
    dst = tmp_path / "restored"
    out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
              "--to", str(dst))  # fmt: skip
    assert f"restored {head} events" in out, out
    assert "appended by the broker at " in out and f"({stamp} ms)" in out, out
    store = open_store(dst)
    assert read(store, kafka_topic) == head
    # the append time too (None before: the next relay checked the commit marker alone)
    assert read_anchor(store, kafka_topic) == (topic_id(kafka_bootstrap, kafka_topic), last, stamp)
    # the next relay takes that record as its bookmark: nothing published again
    relay = Relay(store, kafka_bootstrap, topic=kafka_topic, transactional_id=transactional_id)
    try:
        assert relay.publish_pending() == 0 and relay.position == head
    finally:
        relay.close()
    assert len(read_all(kafka_bootstrap, kafka_topic)) == head
    # a topic whose records were sent outside a transaction: no commit marker follows them
    loose = f"{kafka_topic}-loose"
    try:
        publish(kafka_bootstrap, loose, read_raw(open_store(org_ledger.home), 0, 1_000))
        run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", loose,
            "--to", str(tmp_path / "loose"))  # fmt: skip
    finally:
        delete_topics(kafka_bootstrap, [loose])
    kept = open_store(tmp_path / "loose")
    assert read(kept, loose) == head and read_anchor(kept, loose) == (None, None, None)


def test_a_keyless_restore_of_a_signed_topic_refuses_unless_told(
    org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """atk54-25 F5 (a): the relay's signed records, then a topic writer's unsigned record that
    links to the last (here the store's own last event, unsigned: the same shape). A restore
    without keys took it as the log's next event, "chain verified", exit 0, and wrote the row
    naming it. Now it refuses in one line, nothing written; --accept-unsigned restores."""
    monkeypatch.setenv(KEYS_ENV, KEYS_TEXT)
    org_ledger.execute_all([JOB] * 2)
    events = read_raw(open_store(org_ledger.home), 0, 1_000)
    head = len(events)
    publish(kafka_bootstrap, kafka_topic, events[:-1])
    last = events[-1]
    send(
        kafka_bootstrap, kafka_topic, last, record_headers(last.position, last.tag, last.data, None)
    )
    monkeypatch.delenv(KEYS_ENV)
    dst = tmp_path / "restored"
    out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
              "--to", str(dst), code=1)  # fmt: skip
    assert "carry the relay's signature" in out and "nothing was written" in out, out
    assert "GPULEDGER_KAFKA_SIGNING_KEYS" in out, out
    nothing_written(dst)
    out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
              "--to", str(dst), "--accept-unsigned")  # fmt: skip
    assert f"restored {head} events" in out, out
    # with the keys the unsigned record is set aside, as before
    keyed = tmp_path / "keyed"
    out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
              "--to", str(keyed), env=ENV)  # fmt: skip
    assert f"restored {head - 1} events" in out, out


def test_a_keyed_restore_names_the_replayed_copies_it_passes_over(
    org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """atk54-25 F7: the relay's signed records, copies of three of them replayed at the tail
    (someone replaying saved records), then the relay's next ones. A keyed restore passed over
    the copies, as readers do (nothing in them is new), and said nothing of them, while `audit
    verify --kafka` named them: it names them now, with their offsets."""
    from tests.integration.conftest import read_all

    monkeypatch.setenv(KEYS_ENV, KEYS_TEXT)
    org_ledger.execute_all([JOB] * 3)
    events = read_raw(open_store(org_ledger.home), 0, 1_000)
    head = len(events)
    publish(kafka_bootstrap, kafka_topic, events[:-2])
    publish(kafka_bootstrap, kafka_topic, events[-5:-2])  # the same records, signed, again
    offsets = [r.offset for r in read_all(kafka_bootstrap, kafka_topic)][-3:]
    publish(kafka_bootstrap, kafka_topic, events[-2:])
    dst = tmp_path / "restored"
    out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
              "--to", str(dst), env=ENV)  # fmt: skip
    assert f"restored {head} events" in out, out
    said = f"passed over 3 record(s) of {kafka_topic} that are exact copies of records restored"
    assert said in out and "and a good signature" in out, out  # was nothing
    assert f"offsets {', '.join(map(str, offsets))}" in out, out


def test_a_restore_names_its_last_record_with_a_replayed_copy_after_it(
    org_ledger: Ledger, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str,
    transactional_id: str,
) -> None:  # fmt: skip
    """atk55-25 F4: one exact copy of an earlier record appended to the relay's topic (outside
    a transaction, as someone replaying a saved record does): the restore named no record in its
    progress row, saying its last record "is not followed by a commit marker" (false): it looked
    the position up in the last page read alone, which held only the copy."""
    from ledger.store.relay import Relay
    from ledger.store.relay_progress import read_anchor
    from tests.integration.conftest import read_all
    from tests.integration.test_relay_remade import topic_id

    org_ledger.execute_all([JOB] * 2)
    head = org_ledger.position
    relay = Relay(open_store(org_ledger.home), kafka_bootstrap, topic=kafka_topic,
                  transactional_id=transactional_id)  # fmt: skip
    try:
        assert relay.publish_pending() == head
    finally:
        relay.close()
    last = read_all(kafka_bootstrap, kafka_topic)[-1].offset
    publish(kafka_bootstrap, kafka_topic, read_raw(open_store(org_ledger.home), 3, 1))  # a copy
    dst = tmp_path / "restored"
    out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
              "--to", str(dst))  # fmt: skip
    assert f"restored {head} events" in out, out
    assert f"position {head}, the record at offset {last:,}" in out, out  # was "no record"
    assert "not followed by a commit marker" not in out, out
    anchor = read_anchor(open_store(dst), kafka_topic)
    assert anchor[:2] == (topic_id(kafka_bootstrap, kafka_topic), last), anchor
