"""`projections.source.follow`: the one way to walk a log, in pages, by position and by tag."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from projections.source import ListSource, LogRecord, follow

LOG = [LogRecord(i, "a" if i % 3 else "b", b"{}") for i in range(1, 11)]


class Untagged:
    """A source that can only read everything (as the Kafka source): tags are filtered."""

    def __init__(self) -> None:
        self.inner = ListSource(LOG)

    def read(self, after: int, limit: int) -> list[LogRecord]:
        return self.inner.read(after, limit)

    def head(self) -> int:
        return self.inner.head()

    def close(self) -> None:
        pass


@pytest.mark.parametrize("source", [ListSource(LOG), Untagged()], ids=["by tag", "filtered"])
@pytest.mark.parametrize(
    ("after", "until", "tags", "page", "want"),
    [
        (0, None, None, 4, [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]),
        (2, 7, None, 4, [[3, 4, 5, 6], [7]]),
        (0, None, ["b"], 2, [[3, 6], [9]]),
        (3, 8, ["b"], 10, [[6]]),
        (10, None, None, 4, []),
    ],
    ids=["everything", "a range", "one tag", "one tag in a range", "nothing after the head"],
)
def test_follow_walks_the_range_in_pages(
    source: ListSource | Untagged,
    after: int,
    until: int | None,
    tags: list[str] | None,
    page: int,
    want: list[list[int]],
) -> None:
    got = [[r.position for r in p] for p in follow(source, after, until, tags=tags, page=page)]
    flat = [p for pg in got for p in pg]
    assert flat == [p for pg in want for p in pg]
    if tags is None:
        assert got == want


READERS = {
    "ledger/store/application.py",
    "ledger/store/confirmed.py",
    "ledger/store/copying.py",
    "ledger/store/embedded.py",
    "ledger/store/mapping.py",
    "ledger/store/pgread.py",
    "ledger/store/postgres.py",
    "ledger/store/relay.py",
    "ledger/store/relay_raw.py",
}
"""The store adapters: the only modules that know eventsourcing's tables (they read them)."""
WRITERS = {"projections/testing/synthetic.py", "scripts/bench_append.py", "scripts/bench_replay.py"}
"""Bulk writers of generated logs and raw baselines (they insert; they never walk the log)."""
TABLES = re.compile(
    r"select_notifications|notification_id|stored_events|stored_snapshots|originator_version"
    r"|EVENTS_TABLE|SNAPSHOTS_TABLE|gpuledger_events|gpuledger_snapshots"
)
"""What knowing eventsourcing's tables looks like: their names, their columns, the recorder's
readers."""


def test_only_the_store_knows_the_event_store_tables_every_walk_uses_follow() -> None:
    root = Path(__file__).resolve().parents[2]
    found = set()
    for folder in ("ledger", "projections", "scripts"):
        for path in (root / folder).rglob("*.py"):
            if TABLES.search(path.read_text()):
                found.add(str(path.relative_to(root)))
    assert found <= READERS | WRITERS, found - READERS - WRITERS
    assert all(p.startswith("ledger/store/") for p in found - WRITERS)
