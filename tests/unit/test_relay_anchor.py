"""The relay's progress names the topic id and the offset of its last commit, and the relay takes
a bookmark only from that record (or what follows it, or the start of the log): atk52-25 F1
(a), (b), (d), a saved record of the relay's put back onto a topic made again (signed, or
unsigned within the progress) was the bookmark, and the events before it never reached the
topic, "publishing, 0 behind". The fake consumer of test_relay_tail; a real SQLite store for the
row. The real broker's cases: tests/integration/test_relay_remade.py."""

from __future__ import annotations

import sqlite3

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
    elsewhere,
    keep,
    read_anchor,
)
from projections.kafka_wire import SigningKeys
from tests.unit.test_relay_progress_mac import KEY, grown
from tests.unit.test_relay_tail import KEYS, TOPIC, bookmark, chain, ours


@pytest.mark.parametrize("keys", [KEYS, None], ids=["signed-b", "unsigned-a"])
def test_a_saved_record_of_the_progress_put_back_after_a_gap_is_not_the_bookmark(
    monkeypatch: pytest.MonkeyPatch, keys: SigningKeys | None
) -> None:
    """1..20 and the relay's record of its progress 30 on a topic made again: was 30 (signed:
    by its signature; unsigned: a position within the progress), 21..29 never published. The
    row names another topic's record (or none): the bookmark is where the log from the topic's
    start ends, 20, and the record of 30 is foreign."""
    store = chain(30)
    topic = ours(store[:20], keys) + ours([store[29]], keys)
    assert bookmark(monkeypatch, store, topic, keys, progress=30) == (20, [20])
    assert bookmark(monkeypatch, store, topic, keys, progress=30, offset=29) == (20, [20])


@pytest.mark.parametrize("keys", [KEYS, None], ids=["signed", "unsigned"])
def test_the_record_the_progress_names_and_those_that_follow_it_are_the_relays(
    monkeypatch: pytest.MonkeyPatch, keys: SigningKeys | None
) -> None:
    """The progress names 280 at offset 279; the relay's records 281..290 after it (committed
    before it wrote its progress again) follow it: 290, read from the tail (not the whole
    topic), and a copy of 300 at the tail is foreign."""
    store = chain(300)
    topic = ours(store[:290], keys) + ours([store[299]], keys)
    assert bookmark(monkeypatch, store, topic, keys, progress=280, offset=279) == (290, [290])


@pytest.mark.parametrize(
    ("word", "want"),
    [
        (Word(20, True, "A", 19), Anchor(19, 20)),
        (Word(20, True, "B", 19), None),
        (Word(20, True, None, None), None),
        (Word(20, False, "A", 19), None),
        (Word(40, True, "A", 39), None),
        (Word(0, True, "A", None), None),
    ],
    ids=[
        "this topic",
        "another topic id",
        "an earlier version's row",
        "unverified",
        "beyond the head",
        "nothing published",
    ],
)
def test_the_progress_anchors_only_on_the_topic_id_it_names(word: Word, want: Anchor) -> None:
    assert anchor(word, "A", head=30) == want


def test_a_progress_of_another_topic_id_says_the_topic_was_made_again() -> None:
    said = elsewhere("t", Word(20, True, "B", 19), "A")
    assert said is not None and "deleted and made again" in said and "topic id B" in said
    for word in (Word(20, True, "A", 19), Word(20, True, None, None), Word(20, False, "B", 19)):
        assert elsewhere("t", word, "A") is None  # the same, unknown, or no word


def test_the_progress_names_the_topic_id_and_offset_and_another_topic_replaces_it(
    org_ledger: Ledger,
) -> None:
    """A relay publishing the log again to a topic made again writes its progress there, below
    the old topic's (it was only ever raised: the row named the old topic until the relay passed
    its position); the MAC covers the topic id and the offset (an edit of either: `edited`)."""
    records = grown(org_ledger)
    head = records[-1].position
    recorder = open_store(org_ledger.home)
    keep(recorder, TOPIC, head, KEY, topic_id="old", offset=head - 1)
    assert read_anchor(recorder, TOPIC) == ("old", head - 1)
    kept = Kept(recorder, TOPIC, key=KEY)
    assert kept.word(head) == Word(head, True, "old", head - 1)
    kept.flush(3, Committed("new", 2))
    assert kept.word(head) == Word(3, True, "new", 2)
    kept.flush(2, Committed("new", 1))  # never back on one topic
    assert kept.word(head) == Word(3, True, "new", 2)
    with sqlite3.connect(org_ledger.home / EVENTS_DB) as db:
        db.execute(f"UPDATE {TABLE} SET record_offset = 7")
    assert Kept(recorder, TOPIC, key=KEY).word(head) == Word(3, False, "new", 7)
