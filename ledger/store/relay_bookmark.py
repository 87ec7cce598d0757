"""The relay's bookmark: where its last committed record on the topic is, read back from the
topic and checked against the store and the relay's progress (docs/kafka.md, step 3).

Split from `ledger.store.relay` (the connect, which calls it, and the publishing stay there):
which records on the topic are the relay's own, from the store's progress row, relay.json's
word and the relay's own last commit, and the refusal of a topic that holds another log. The
tail is read by `relay_tail`. An edge (the network, the store).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ledger.store.relay_progress import Anchor, Word, anchor, beyond, words
from ledger.store.relay_raw import RawSource
from ledger.store.relay_tail import (
    Found,
    bookmark,
    first_position,
    not_taken,
    store_digests,
    tail_windows,
)
from ledger.store.relay_topic import RelayError
from projections.source import follow

if TYPE_CHECKING:
    from ledger.store.relay import Relay

log = logging.getLogger("gpuledger.relay")


def read_bookmark(relay: Relay, topic_id: str = "", fresh: bool = False) -> tuple[Found, list[int]]:
    """The position of our last committed record on the topic, and the offsets of the
    foreign records after it (written by another producer: skipped, the store being the
    source of truth).

    Reads back from the end in growing windows, keeping a digest of each record, never its value
    (`relay_tail`). Our last record is the one with the highest readable position whose key, tag
    header and bytes equal the store's at that position (its headers the relay's, each once) and
    that is the record our progress names (`relay_progress.anchor`: the store's row, shared by
    every server, when its MAC verifies under our state key and it names this topic id
    `topic_id` and the record's offset; or the relay's own last commit on this topic, after a
    reconnect), or comes right after the best taken so far (`Scan.follows`), from that record or
    from the start of the log: no gap either way. Neither our signature nor a position within
    our progress makes a record ours: a saved record of the relay's put back onto the topic made
    again was the bookmark, and the events before it never reached the topic (atk52-25 F1). With
    none known (no row, one of an earlier version or that does not verify, another topic id;
    `fresh`: the topic made again) the whole topic is read from its start. An older record
    copied to the tail is foreign, and so is anything after ours the store does not hold (a
    forged event, however well it links). With signing keys, a record right after ours that
    continues the chain from it *and* carries our signature is no forgery: the topic holds
    events this store lacks (a store replaced by an older copy, or another relay with our
    keys), and the relay refuses the topic. So it does when the whole topic holds none of our
    records but records that chain (another ledger's topic).
    """
    source = RawSource(relay.recorder)

    def digests(positions: set[int]) -> Mapping[int, bytes]:
        return store_digests(
            lambda after, until, page: follow(source, after, until, page=page),
            source.head(),
            positions,
        )

    head = relay.store_head()
    word = relay.kept.word(head)
    if word.position is None and (relay.kept.key is not None or relay.keys is not None):
        # no table, yet a relay that signs (its rows, or its records): a store of this
        # version whose table was dropped (`gpuledger init` makes it), and relay.json, with
        # no MAC, vouched again (atk49-25 F9): it is a floor, never a vouch
        log.warning(
            "relay: the store keeps no progress table for topic %s, yet this relay signs "
            "(a dropped table?): relay.json is not taken as a vouch; only records following "
            "the start of the log (or signed) are its own, read on up to it",
            relay.topic,
        )
        word = Word(0, True)
    kept = word.position
    for text in beyond(head, **{"the store's progress row": kept, "relay.json": relay.progress}):
        log.warning(
            "relay: %s on topic %s: not taken (a progress is written only after a commit "
            "of the store's events; someone edited it)",
            text,
            relay.topic,
        )
    if kept and kept <= head and not word.verified:
        log.warning(
            "relay: the store's progress row on topic %s (position %d) does not verify under "
            "the state key: not taken as a vouch (edited, or written by an earlier version "
            "or under another server's key); only records following the start of the log "
            "are its own, read on up to it; the row is rewritten at the next write",
            relay.topic,
            kept,
        )
    _vouch, floor = words(word, relay.progress, head)
    floor = max(floor, relay.position)
    start = None if fresh else anchor(word, topic_id, head)
    mine = None if fresh else relay._committed()  # a reconnect on its last commit's topic
    if (
        mine is not None
        and mine.topic_id == topic_id
        and relay.position <= head
        and (start is None or start.position < relay.position)
    ):
        start = Anchor(mine.offset, relay.position, mine.stamp)
    why = None if start is None else not_taken(
        relay.bootstrap, start.offset, relay.topic, relay.config, relay.timeout_s,
        relay.connect_timeout_s, start.stamp,
    )  # fmt: skip
    if start is not None and why is not None:
        log.warning(
            "relay: the record its progress names on %s (position %d, offset %d) %s: not "
            "taken as its own; the topic is read from its start",
            relay.topic,
            start.position,
            start.offset,
            why,
        )
        start = None
    windows = tail_windows(relay.bootstrap, relay.topic, relay.config,
                           relay._bounded(relay.timeout_s), relay.connect_timeout_s,
                           from_start=start is None, check=relay._connecting)  # fmt: skip

    def starts() -> bool:  # no copies of later events at its start (`bookmark`)
        return (
            first_position(
                relay.bootstrap, relay.topic, relay.config, relay.timeout_s, relay.connect_timeout_s
            )
            == 1
        )

    return bookmark(
        windows,
        digests,
        relay.keys,
        lambda position, ours: refusal(relay, position, ours),
        start,
        floor,
        starts,
    )


def refusal(relay: Relay, position: int, ours: int) -> RelayError:
    """The topic holds another log: say where it disagrees with the store (`position`: the
    last one the window names; `ours`: the position of our last record on it, kept in the
    error's `published` field)."""
    head = relay.store_head()
    if position > head:
        signed = relay.keys is not None  # (unsigned records say nothing of a key: atk61-ha F6)
        return RelayError(
            f"topic {relay.topic} is ahead of the store: it has position {position}"
            + (" signed with our key" if signed else "")
            + f", the store ends at {head}",
            hint="the store was replaced by an older copy, or another relay "
            + ("signs with our key" if signed else "publishes there")
            + "; publish to a new topic",
            published=ours,
        )
    return RelayError(
        f"topic {relay.topic} differs from the store at position {position}",
        hint="the topic belongs to another ledger; publish to a new topic",
        published=ours,
    )
