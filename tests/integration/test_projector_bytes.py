"""A catch-up reads batches bounded in bytes, not only in events (atk44z F8: `project follow`
held ~10x the topic's bytes, 3.5 GB for a 330 MB topic of 880 KB job submissions: the default
batch is 122,880 events, whatever their size). A real store and projection; the source's reads
are counted as they pass."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.embedded import EmbeddedSource
from projections.projector import Projector, next_count
from projections.store import Store
from schemas import commands as c

BIG = ("/bin/true", *["x" * 4000] * 200)  # an 800 KB command line


class Counted:
    """`source` with the bytes each read returned counted."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.reads: list[int] = []

    def head(self) -> int:
        return int(self.source.head())

    def read(self, after: int, limit: int) -> Any:
        records = self.source.read(after, limit)
        self.reads.append(sum(len(r[2]) for r in records))
        return records


def _ledger(home: Path, jobs: int) -> Ledger:
    led = Ledger(home, SimClock(1_000.0), seeded_ids(7))
    led.execute(c.InitLedger(actor="root", admin="root"))
    led.execute_all([
        c.OpenAccount(actor="root", path="ai2", kind="program"),
        c.OpenAccount(actor="root", path="ai2/olmo", kind="project"),
        c.AddMember(actor="root", user="alice", project="ai2/olmo"),
        c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
    ])  # fmt: skip
    for _ in range(jobs):
        led.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, command=BIG))
    return led


def test_a_catch_up_of_large_events_reads_them_a_few_mib_at_a_time(tmp_path: Path) -> None:
    home = tmp_path / "home"
    led = _ledger(home, 40)  # ~32 MB of events
    head = led.position
    with EmbeddedSource(home) as src, Store(tmp_path / "p.duckdb") as store:
        counted = Counted(src)
        tracemalloc.start()
        try:
            done = Projector(store, counted, batch_bytes=4 << 20).catch_up()  # type: ignore[arg-type]
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert done.position == head and store.position() == head
        rows = store.con.execute("SELECT count(*) FROM jobs").fetchone()
        assert rows is not None and rows[0] == 40
    assert max(counted.reads) <= 3 * (4 << 20), counted.reads  # was one read of 32 MB
    assert sum(counted.reads) > 30 << 20
    print(f"reads {len(counted.reads)}, largest {max(counted.reads):,} B, peak {peak:,} B")
    assert peak < 64 << 20, peak  # Python's share; was ~10x the bytes read


def test_a_quarantine_readers_batches_are_bounded_in_bytes_too(tmp_path: Path) -> None:
    home = tmp_path / "home"
    head = _ledger(home, 20).position  # ~16 MB of events
    with EmbeddedSource(home) as src, Store(tmp_path / "q.duckdb") as store:
        counted = Counted(src)
        done = Projector(store, counted, batch_bytes=2 << 20, quarantine=True).catch_up()  # type: ignore[arg-type]
        assert done.position == head
    assert max(counted.reads) <= 3 * (2 << 20), counted.reads  # was one read of 16 MB


def test_small_events_still_go_in_whole_row_groups() -> None:
    assert next_count(122_880, 16 << 20, 0, None) == 16  # sizes unknown: a few first
    assert next_count(122_880, 16 << 20, 16, 400) == 122_880 - 16  # completes the row group
    assert next_count(122_880, 16 << 20, 122_880, 1_000) == 122_880
    assert next_count(122_880, 16 << 20, 16, 880_000) == 19  # 16 MiB of 880 KB events
    assert next_count(122_880, 1 << 20, 0, 4 << 20) == 1  # one at least
