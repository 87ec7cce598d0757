"""A ledger's own readers read what it just folded from memory, as the store gives it; a store
held in memory (a simulation's) is saved to `home` as the file store would hold it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ledger.store import EVENTS_DB, application
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from schemas import commands as c
from schemas import events as e
from schemas.codec import stored_tags
from schemas.errors import InvalidCommand


def fill(ledger: Ledger, jobs: int) -> None:
    ledger.execute(c.InitLedger(actor="root", admin="root", min_runtime_cap_s=3600))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="lab", kind="program"),
            c.OpenAccount(actor="root", path="lab/a", kind="project", shares=1),
            c.AddMember(actor="root", user="u", project="lab/a"),
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )
    for i in range(jobs):
        ledger.execute(c.SubmitJob(actor="u", account="lab/a", gpus=1 + i % 8, command=("x",)))


def from_store(ledger: Ledger, after: int, **kw: object) -> list[tuple[int, e.AnyEvent]]:
    """`follow` as the store alone answers it (nothing kept in memory)."""
    kept, ledger._recent = ledger._recent, []
    try:
        return list(ledger.follow(after, **kw))  # type: ignore[arg-type]
    finally:
        ledger._recent = kept


@pytest.mark.parametrize("memory", [False, True])
def test_follow_reads_what_was_just_appended_as_the_store_gives_it(
    tmp_path: Path, memory: bool
) -> None:
    ledger = Ledger(tmp_path, SimClock(1_000.0), seeded_ids(1), memory=memory)
    fill(ledger, 20)
    assert ledger._recent and ledger._recent[-1][0] == ledger.position
    for after in (0, 3, ledger.position - 5, ledger.position):
        assert list(ledger.follow(after)) == from_store(ledger, after)
    tags = stored_tags(e.JobSubmitted)
    got = list(ledger.follow(2, tags=tags))
    assert got == from_store(ledger, 2, tags=tags) and len(got) == 20
    assert list(ledger.follow(2, ledger.position - 3)) == from_store(ledger, 2)[:-3]
    ledger.close()


def test_only_the_newest_events_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(application, "RECENT", 64)
    ledger = Ledger(tmp_path, SimClock(1_000.0), seeded_ids(1), memory=True)
    fill(ledger, 100)
    assert 32 <= len(ledger._recent) <= 64
    assert list(ledger.follow(0)) == from_store(ledger, 0)  # older than kept: the store's
    ledger.close()


def test_a_store_in_memory_is_saved_as_the_file_store_holds_it(tmp_path: Path) -> None:
    on_disk = Ledger(tmp_path / "disk", SimClock(1_000.0), seeded_ids(1))
    in_memory = Ledger(tmp_path / "mem", SimClock(1_000.0), seeded_ids(1), memory=True)
    for ledger in (on_disk, in_memory):
        fill(ledger, 30)
    assert not (tmp_path / "mem" / EVENTS_DB).exists()
    in_memory.write_out()
    rows = []
    for home in ("disk", "mem"):
        with sqlite3.connect(tmp_path / home / EVENTS_DB) as con:
            rows.append(con.execute("SELECT * FROM stored_events ORDER BY 1, 2").fetchall())
    assert rows[0] == rows[1] and len(rows[0]) == on_disk.position
    reopened = Ledger(tmp_path / "mem", SimClock(1_000.0))
    assert reopened.position == in_memory.position and reopened.last_hash == in_memory.last_hash
    for ledger in (on_disk, in_memory, reopened):
        ledger.close()
    with pytest.raises(InvalidCommand, match="already holds a ledger"):
        Ledger(tmp_path / "mem", SimClock(1_000.0), memory=True)
