"""The relay's progress keeps the time the broker appended its last committed record, and the
bookmark takes the record its progress names only when it carries that time (atk53-25 F1, the
transactional writer): after the broker lost the end of the topic (its data restored from an
older copy: the same topic id, a lower end), a topic writer with a *transactional* producer put
the relay's saved record of P at the offset the row names and committed it (a marker after it),
and the relay took it as its bookmark: the positions between the topic's new end and P never
reached it. On a `LogAppendTime` topic the broker stamps every batch with its clock at the
append, so the record written again reads with a later time than the row's. The fake consumer
of test_relay_tail; a real SQLite store for the row. The real broker's case:
tests/integration/test_relay_lost_tail.py."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

from ledger.store import EVENTS_DB
from ledger.store.application import Ledger
from ledger.store.relay import open_store
from ledger.store.relay_progress import (
    TABLE,
    Anchor,
    Committed,
    Kept,
    Word,
    anchor,
    keep,
    link_at,
    mac,
    read_anchor,
    signed_rows,
)
from ledger.store.relay_tail import stamped
from projections.kafka_wire import SigningKeys
from tests.unit.test_relay_progress_mac import KEY, grown
from tests.unit.test_relay_tail import KEYS, MARKER, TOPIC, Spec, bookmark, chain, ours

JUNK = Spec([], lambda: b"{}")
THEN, LATER = 1_765_000_000_000, 1_765_000_090_000
"""When the broker appended the relay's record of P; when the topic writer's copy of it."""


def at(specs: list[Spec], stamp: int | None) -> list[Spec]:
    return [s._replace(stamp=stamp) for s in specs]


def test_the_record_must_carry_the_append_time_the_progress_names() -> None:
    def rec(timestamp: int, kind: int = 1) -> SimpleNamespace:
        return SimpleNamespace(timestamp=timestamp, timestamp_type=kind)

    assert stamped(rec(THEN), THEN) is None
    assert stamped(rec(LATER), None) is None  # a row without one (v2, CreateTime): not checked
    later = stamped(rec(LATER), THEN)
    assert later is not None and f"appended at {LATER} ms, not at the {THEN} ms" in later
    created = stamped(rec(THEN, kind=0), THEN)  # the producer's time, however equal
    assert created is not None and "carries no append time" in created
    assert stamped(None, THEN) == "holds no record"


@pytest.mark.parametrize("keys", [KEYS, None], ids=["signed", "unsigned"])
def test_a_saved_record_committed_again_at_the_offset_the_progress_names_is_not_the_bookmark(
    monkeypatch: pytest.MonkeyPatch, keys: SigningKeys | None
) -> None:
    """The topic's end at 20 after the loss; a transactional writer filled 21..28 with junk and
    put the relay's saved record of 30 at 29, the offset the row names, a commit marker after
    it. It was the bookmark (21..29 never published); the row names the time the broker
    appended the relay's record, the copy reads with a later one: the topic is read from its
    start, the bookmark is 20. The relay's own record, with that time, is taken."""
    store = chain(30)
    written = [*at([JUNK] * 8, LATER), *at(ours([store[29]], keys), LATER), MARKER]
    topic = [*at(ours(store[:20], keys), THEN - 60_000), MARKER, *written]
    assert len(topic) == 31  # the copy of 30 at offset 29, a marker at 30
    got = bookmark(monkeypatch, store, topic, keys, progress=30, offset=29, stamp=THEN)
    assert got == (20, list(range(21, 30)))  # was (30, []): a gap 21..29
    ours_then = [*topic[:29], *at(ours([store[29]], keys), THEN), MARKER]
    assert bookmark(monkeypatch, store, ours_then, keys, progress=30, offset=29, stamp=THEN) == (
        30,
        [],
    )
    # the topic set to CreateTime since: the copy carries the producer's time, whatever it is
    created = [*topic[:29], *at(ours([store[29]], keys), None), MARKER]
    got = bookmark(monkeypatch, store, created, keys, progress=30, offset=29, stamp=THEN)
    assert got == (20, list(range(21, 30)))


def test_the_progress_signs_the_append_time(org_ledger: Ledger) -> None:
    """v3 of the row's MAC covers the append time: an edit of it is no vouch; the anchor
    carries it."""
    records = grown(org_ledger)
    head = records[-1].position
    recorder = open_store(org_ledger.home)
    link = link_at(recorder, head)
    assert link is not None
    assert mac(KEY, TOPIC, head, link, "X", 9, THEN) != mac(KEY, TOPIC, head, link, "X", 9)
    keep(recorder, TOPIC, head, KEY, topic_id="X", offset=9, stamp=THEN)
    word = Kept(recorder, TOPIC, key=KEY).word(head)
    assert word == Word(head, True, "X", 9, THEN)
    assert anchor(word, "X", head) == Anchor(9, head, THEN)
    with sqlite3.connect(org_ledger.home / EVENTS_DB) as db:
        db.execute(f"UPDATE {TABLE} SET append_ms = ?", (LATER,))  # the copy's time
    assert Kept(recorder, TOPIC, key=KEY).word(head) == Word(head, False, "X", 9, LATER)


def test_a_row_of_a_table_without_the_column_keeps_its_meaning(org_ledger: Ledger) -> None:
    """A table s53 made (no `append_ms`) and its v2 row: it verifies, names no time (the old
    check: a commit marker after the record), and the relay's next write adds the column and
    signs the time."""
    records = grown(org_ledger)
    head = records[-1].position
    recorder = open_store(org_ledger.home)
    link = link_at(recorder, head)
    assert link is not None
    with sqlite3.connect(org_ledger.home / EVENTS_DB) as db:
        db.execute(f"DROP TABLE IF EXISTS {TABLE}")  # a table of this version
        db.execute(
            f"CREATE TABLE {TABLE} (topic TEXT PRIMARY KEY, position INTEGER NOT NULL, kept_at "
            "TEXT NOT NULL, mac TEXT, topic_id TEXT, record_offset INTEGER)"
        )
        db.execute(
            f"INSERT INTO {TABLE} VALUES (?, ?, datetime('now'), ?, 'X', 9)",
            (TOPIC, head, mac(KEY, TOPIC, head, link, "X", 9)),
        )
    kept = Kept(recorder, TOPIC, key=KEY)
    assert kept.word(head) == Word(head, True, "X", 9, None)
    kept.flush(head, Committed("X", 12, THEN))
    assert Kept(recorder, TOPIC, key=KEY).word(head) == Word(head, True, "X", 12, THEN)


def test_store_copy_carries_the_append_time(org_ledger: Ledger, tmp_path: Path) -> None:
    """`store copy` carries each row as it is, its append time too: without it the copied
    row's v3 MAC did not verify (no vouch: the topic read from its start)."""
    from ledger.cli.store import _copy_progress

    records = grown(org_ledger)
    head = records[-1].position
    keep(open_store(org_ledger.home), TOPIC, head, KEY, topic_id="X", offset=9, stamp=THEN)
    assert signed_rows(open_store(org_ledger.home))[0][3:] == ("X", 9, THEN)
    copy = tmp_path / "copy"
    copy.mkdir()
    with (
        sqlite3.connect(org_ledger.home / EVENTS_DB) as src,
        sqlite3.connect(copy / EVENTS_DB) as db,
    ):
        src.backup(db)  # the same events (WAL and all)
        db.execute(f"DELETE FROM {TABLE}")
    _copy_progress(org_ledger.home, None, copy, None)
    assert read_anchor(open_store(copy), TOPIC) == ("X", 9, THEN)
    assert Kept(open_store(copy), TOPIC, key=KEY).word(head) == Word(head, True, "X", 9, THEN)
