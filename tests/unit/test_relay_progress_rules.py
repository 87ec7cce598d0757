"""The relay's progress kept in the store every server shares (`ledger.store.relay_progress`):
the rules (the highest word, written only forward and at most once a second), the SQLite
store's row, and the bookmark taking the store's word when the home has no relay.json (a
standby's first lead, a leader on another host, a lost file: atk46-25 F3's residual, T8). The
real broker and both stores: tests/integration/test_relay_progress.py."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from ledger.store import relay_progress
from ledger.store.application import Ledger
from ledger.store.relay import open_store
from ledger.store.relay_progress import Kept, beyond, due, keep, read, rows, trusted
from tests.unit.test_relay_tail import KEYS, bookmark, chain, ours


@pytest.mark.parametrize(
    ("words", "want"),
    [
        ((None, None), None),
        ((None, 7), 7),
        ((12, None), 12),
        ((12, 7), 12),
        ((0, None), 0),
    ],
    ids=["no word", "the store's alone", "relay.json alone", "the higher", "nothing published"],
)
def test_the_progress_is_the_highest_word_or_none(
    words: tuple[int | None, int | None], want: int | None
) -> None:
    assert trusted(*words) == want


def test_a_word_beyond_the_store_head_is_no_word() -> None:
    """atk47-25 F1, F4: a progress is written only after a commit of the store's events."""
    assert trusted(1_000, 24, head=27) == 24
    assert trusted(1_000, None, head=27) == 0  # an edit: records following the start only
    assert trusted(None, None, head=27) is None
    assert trusted(27, 24, head=27) == 27
    assert beyond(27, row=1_000, file=24, none=None) == [
        "row says position 1,000, beyond the store's head 27"
    ]


@pytest.mark.parametrize(
    ("position", "kept", "since_s", "every_s", "want"),
    [
        (10, 0, 5.0, 1.0, True),
        (10, 10, 5.0, 1.0, False),
        (9, 10, 5.0, 1.0, False),
        (11, 10, 0.5, 1.0, False),
        (11, 10, 0.0, 0.0, True),
        (5_010, 10, 0.1, 1.0, True),
        (5_009, 10, 0.1, 1.0, False),
    ],
    ids=[
        "forward, due",
        "no further",
        "never back",
        "within the second",
        "a stopping relay",
        "a batch past it",
        "short of a batch",
    ],
)
def test_the_progress_is_written_forward_once_a_second_or_a_batch(
    position: int, kept: int, since_s: float, every_s: float, want: bool
) -> None:
    assert due(position, kept, since_s, every_s) is want


@pytest.mark.parametrize("keys", [None, KEYS], ids=["unsigned", "signed"])
def test_with_no_relay_json_the_stores_progress_keeps_a_rebuilt_copy_from_being_the_bookmark(
    monkeypatch: pytest.MonkeyPatch, keys: Any
) -> None:
    """atk46-25 F3 with no relay.json: a topic writer sends the exact bytes of event 13 (the
    relay published up to 10), unsigned. The store's progress (10) is the relay's word: 13 is
    foreign, and 11, 12 are published. With no word anywhere an unsigned topic is trusted (the
    residual, T8) as far as its tail is read; a signed one never is."""
    store = chain(20)
    topic = ours(store[:10], keys) + ours([store[12]], None)
    monkeypatch.setattr(relay_progress, "read", lambda _recorder, _topic: 10)
    assert bookmark(monkeypatch, store, topic, keys, progress=None) == (10, [10])
    # relay.json older than the store's word (a host that led long ago): the store's counts
    assert bookmark(monkeypatch, store, topic, keys, progress=4) == (10, [10])
    monkeypatch.setattr(relay_progress, "read", lambda _recorder, _topic: None)
    # with no word anywhere an unsigned 13 is trusted, but a topic read whole (its first
    # offset reached) gives where a reader stands, 10 (s51): 11, 12 are published after it
    # (13 took it before; a longer topic, read from its end only, still does: T8)
    assert bookmark(monkeypatch, store, topic, keys, progress=None) == (10, [10])


def test_with_nothing_published_only_records_that_follow_the_start_are_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store that says nothing was published on the topic (0: its table made by `gpuledger
    init`, no row). A rebuilt copy of event 12 sent before the ledger's first relay: foreign,
    everything published. This ledger's records from position 1, unsigned (a relay that kept
    no progress: an earlier version's): each follows the one before from the start, so they
    are taken, not published again. Its records without the start (the broker's retention
    deleted it): foreign, published again (duplicates readers pass over); they chain, but they
    are this ledger's log, not another's (was: refused as another ledger's topic)."""
    store = chain(12)
    monkeypatch.setattr(relay_progress, "read", lambda _recorder, _topic: 0)
    assert bookmark(monkeypatch, store, ours([store[11]], None), None) == (0, [0])
    assert bookmark(monkeypatch, store, ours(store[:10], None), None) == (10, [])
    assert bookmark(monkeypatch, store, ours(store[3:10], None), None) == (0, list(range(7)))


def test_the_sqlite_store_keeps_the_highest_progress_per_topic(ledger: Ledger) -> None:
    recorder = open_store(ledger.home)
    assert read(recorder, "t") is None  # no table yet: a store from before it was kept
    assert rows(recorder) == []
    keep(recorder, "t", 5)
    keep(recorder, "t", 3)  # a deposed relay's older word never lowers it
    keep(recorder, "other", 2)
    # a topic with no row, the table made: no relay of this ledger committed there
    assert (read(recorder, "t"), read(recorder, "other"), read(recorder, "none")) == (5, 2, 0)
    keep(recorder, "t", 9)
    assert read(open_store(ledger.home), "t") == 9  # another connection: committed
    assert rows(recorder) == [("other", 2), ("t", 9)]  # what `store copy` carries over


def test_a_new_store_starts_with_the_table_so_no_row_means_nothing_published(
    ledger: Ledger,
) -> None:
    from ledger.store.relay_progress import begin

    recorder = open_store(ledger.home)
    assert read(recorder, "t") is None  # a store of an earlier version: no word
    begin(recorder)  # `gpuledger init`
    assert (read(recorder, "t"), rows(recorder)) == (0, [])


def test_the_relay_writes_its_progress_at_most_every_interval_and_when_it_stops(
    org_ledger: Ledger,
) -> None:
    recorder = open_store(org_ledger.home)  # it holds the positions written (no row past them)
    kept = Kept(recorder, "t", every_s=3600)
    assert kept.read() is None  # no table yet
    kept.advance(5)  # the first is due
    kept.advance(6)  # within the interval: not yet
    assert read(recorder, "t") == 5
    kept.flush(6)
    kept.flush(4)
    assert read(recorder, "t") == 6
    assert Kept(recorder, "t").read() == 6


def test_a_progress_the_store_refuses_is_logged_and_publishing_goes_on(
    org_ledger: Ledger, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Behind costs duplicates, never a gap: a failed write never stops the relay."""
    kept = Kept(open_store(org_ledger.home), "t", every_s=0)

    def refuse(*_args: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(relay_progress, "keep", refuse)
    with caplog.at_level(logging.DEBUG, logger="gpuledger.relay"):
        kept.advance(5)
        kept.advance(6)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "cannot keep its progress (position 5)" in warned[0].message
    assert kept.kept == 0
    monkeypatch.undo()
    kept.advance(7)
    assert read(kept.recorder, "t") == 7 and kept.kept == 7


def test_the_health_file_is_synced_before_it_replaces_the_old_one_and_its_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """relay.json is a home's word on the relay's progress: written through a temporary file,
    synced, renamed, the directory synced (it was not synced at all)."""
    from ledger.store.relay_health import health_path, read_health
    from ledger.store.relay_service import RelayService

    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    service = RelayService(tmp_path, "127.0.0.1:9", topic="t")
    service._write()
    assert synced[0].startswith(str(health_path(tmp_path)) + ".")  # the temporary file
    assert synced[1] == str(tmp_path)
    health = read_health(tmp_path)
    assert health is not None and health.topic == "t"


def test_audit_verify_names_a_progress_beyond_the_store_head(ledger: Ledger) -> None:
    """atk47-25 F1: `update gpuledger_relay_progress set position=1000` with the head at 27 was
    invisible to `audit verify` ("chain intact", exit 0)."""
    from ledger.history import tamper

    assert tamper.verify_store(ledger.home).ok
    keep(open_store(ledger.home), "gpuledger.events", ledger.position)
    assert tamper.verify_store(ledger.home).ok  # a true word
    keep(open_store(ledger.home), "gpuledger.events", 1_000)
    report = tamper.verify_store(ledger.home)
    assert [p.text() for p in report.problems] == [
        f"position {ledger.position}: edited: the relay's progress on topic gpuledger.events "
        f"(store) says position 1,000, beyond the store's head {ledger.position}: an edited "
        "progress"
    ]
