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
    due,
    elsewhere,
    keep,
    read_anchor,
)
from projections.kafka_wire import SigningKeys
from tests.unit.test_relay_progress_mac import KEY, grown
from tests.unit.test_relay_tail import (
    KEYS,
    MARKER,
    TOPIC,
    Spec,
    Topic,
    bookmark,
    chain,
    ours,
)


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
    topic = [*ours(store[:280], keys), MARKER, *ours(store[280:290], keys), MARKER,
             *ours([store[299]], keys)]  # fmt: skip
    Topic.polled = 0
    assert bookmark(monkeypatch, store, topic, keys, progress=280, offset=279) == (290, [292])
    assert Topic.polled < 40  # its marker's look, then 16 from the end: not the whole topic


JUNK = Spec([], lambda: b"{}")


@pytest.mark.parametrize("keys", [KEYS, None], ids=["signed", "unsigned"])
@pytest.mark.parametrize("after", [[], [JUNK]], ids=["at-the-end", "before-junk"])
def test_a_saved_record_put_at_the_offset_the_progress_names_is_not_the_bookmark(
    monkeypatch: pytest.MonkeyPatch, keys: SigningKeys | None, after: list[Spec]
) -> None:
    """atk53-25 F1: the broker lost the end of the topic (its data restored from an older
    copy: the same topic id, its end at 20), and a topic writer filled the offsets up to the
    one the row names (29) with junk and put the relay's saved record of its progress 30
    there, outside a transaction. It was the bookmark (the row names it): 21..29 never reached
    the topic, "publishing, 0 behind". The relay's record of its progress ends a batch, a
    commit marker after it; that one has none (the topic's end, or the next record): the topic
    is read from its start, and the bookmark is where the log taken from it ends, 20."""
    store = chain(30)
    topic = [*ours(store[:20], keys), MARKER, *[JUNK] * 8, *ours([store[29]], keys), *after]
    assert len(topic) - len(after) == 30  # the record of 30 at offset 29, as the row names
    got = bookmark(monkeypatch, store, topic, keys, progress=30, offset=29)
    assert got == (20, list(range(21, 30 + len(after))))  # was (30, [...]): a gap 21..29


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
    assert read_anchor(recorder, TOPIC) == ("old", head - 1, None)
    kept = Kept(recorder, TOPIC, key=KEY)
    assert kept.word(head) == Word(head, True, "old", head - 1)
    kept.flush(3, Committed("new", 2))
    assert kept.word(head) == Word(3, True, "new", 2)
    kept.flush(2, Committed("new", 1))  # never back on one topic
    assert kept.word(head) == Word(3, True, "new", 2)
    with sqlite3.connect(org_ledger.home / EVENTS_DB) as db:
        db.execute(f"UPDATE {TABLE} SET record_offset = 7")
    assert Kept(recorder, TOPIC, key=KEY).word(head) == Word(3, False, "new", 7)


def test_positions_published_again_on_one_topic_id_rewrite_the_row(org_ledger: Ledger) -> None:
    """atk53-25 F2: the broker lost the end of the topic (its data restored from an older copy:
    the same topic id, a lower end), and the relay published positions at or below its row's
    again, at later offsets. The row was written only when the position rose, so it kept
    naming an offset that no longer held its record (every restart read the whole topic). A
    later commit (a higher offset) on that topic id rewrites it, lower or not; an earlier one
    (a deposed leader's late flush) never does."""
    records = grown(org_ledger)
    head = records[-1].position
    recorder = open_store(org_ledger.home)
    keep(recorder, TOPIC, head, KEY, topic_id="X", offset=head)
    kept = Kept(recorder, TOPIC, key=KEY)
    assert kept.word(head) == Word(head, True, "X", head)
    kept.flush(head - 10, Committed("X", head + 20))  # published again after the loss
    assert kept.word(head) == Word(head - 10, True, "X", head + 20)  # was (head, X, head)
    kept.flush(head, Committed("X", head + 30))
    assert kept.word(head) == Word(head, True, "X", head + 30)  # was never rewritten
    late = Kept(recorder, TOPIC, key=KEY)
    late.flush(head - 1, Committed("X", head + 29))  # an earlier commit: never back
    assert Kept(recorder, TOPIC, key=KEY).word(head) == Word(head, True, "X", head + 30)


@pytest.mark.parametrize(
    ("position", "kept", "offset", "kept_offset", "want"),
    [
        (30, 61, 70, 61, True),
        (61, 61, 92, 61, True),
        (61, 61, 61, 61, False),
        (62, 61, 60, 61, True),
        (50, 61, 50, 61, False),
        (50, 61, None, 61, False),
        (50, 61, 70, None, True),
    ],
    ids=["lower, later", "same, later", "same record", "higher", "earlier", "unknown", "no offset"],
)
def test_a_later_commit_is_due_whatever_its_position(
    position: int, kept: int, offset: int | None, kept_offset: int | None, want: bool
) -> None:
    assert due(position, kept, 5.0, offset=offset, kept_offset=kept_offset) is want


def test_with_keys_an_unsigned_record_the_progress_names_is_not_the_bookmark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """atk54-25 F5 (b): a topic writer appended an unsigned event 21 linked to the relay's
    signed 20; a keyless restore took it and its row named it (21 at offset 21). A relay with
    keys took it as its bookmark and signed 22 linked to the forgery. The row's record must
    carry our signature when the relay signs: the bookmark is 20, the forgery foreign."""
    store = chain(21)
    topic = [*ours(store[:20], KEYS), MARKER, *ours(store[20:], None), MARKER]
    assert bookmark(monkeypatch, store, topic, KEYS, progress=21, offset=21) == (20, [21])
    # unsigned throughout (no keys): the row's record stays the bookmark
    plain = [*ours(store[:20], None), MARKER, *ours(store[20:], None), MARKER]
    assert bookmark(monkeypatch, store, plain, None, progress=21, offset=21) == (21, [])
