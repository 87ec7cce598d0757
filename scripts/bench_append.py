"""Benchmark: job submissions appended through the Ledger, against raw SQLite inserts.

Two ways of appending, each on a fresh ledger home in a temp directory:
  one by one  `Ledger.execute(SubmitJob)`, one transaction per submission (goal >= 2,000/s)
  batched     `Ledger.execute_all([SubmitJob] * size)`, one transaction per batch
              (goal >= 20,000 events/s)
and, in the same run, the raw baseline: Python's sqlite3 inserting the very bytes the ledger
stored, in WAL mode like eventsourcing, into a table of the same shape: one row per transaction,
then one transaction per batch. The ratio to raw is what the ledger's own code costs.

    python scripts/bench_append.py                      # 5,000 one by one; 50 batches of 5,000
    python scripts/bench_append.py --one 1000 --batches 5 --profile
    python scripts/bench_append.py --dir /dev/shm         # no fsync cost: the CPU side alone
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ledger.store import EVENTS_DB
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from schemas import commands as c

GOAL_ONE_PER_S = 2_000
GOAL_BATCHED_EVENTS_PER_S = 20_000


def fresh_ledger(home: Path) -> Ledger:
    led = Ledger(home, SimClock(1_000.0), seeded_ids(1))
    led.execute(c.InitLedger(actor="root", admin="root"))
    led.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project"),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            *[
                c.RegisterNode(actor="root", node=f"n{i}", gpu_type="h100", gpus=8)
                for i in range(16)
            ],
        ]
    )
    return led


def submission(i: int) -> c.SubmitJob:
    return c.SubmitJob(
        actor="alice", account="ai2/olmo", gpus=1 + i % 8, min_runtime_s=3600, duration_s=7200.0
    )


def stored_rows(home: Path, after: int) -> list[tuple[str, int, str, bytes]]:
    con = sqlite3.connect(home / EVENTS_DB)
    try:
        return con.execute(
            "SELECT originator_id, originator_version, topic, state FROM stored_events "
            "WHERE rowid > ? ORDER BY rowid",
            (after,),
        ).fetchall()
    finally:
        con.close()


def raw_store(path: Path, synchronous: str = "FULL") -> sqlite3.Connection:
    """A table shaped like eventsourcing's, in WAL mode, autocommit with explicit BEGIN, with
    the same `synchronous` setting the ledger runs with (GPULEDGER_DURABILITY)."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute(f"PRAGMA synchronous={synchronous}")
    con.execute(
        "CREATE TABLE events (originator_id TEXT, originator_version INTEGER, topic TEXT, "
        "state BLOB, PRIMARY KEY (originator_id, originator_version))"
    )
    return con


INSERT = "INSERT INTO events VALUES (?, ?, ?, ?)"
SYNC = os.environ.get("GPULEDGER_DURABILITY", "normal").upper()
OTHER = "FULL" if SYNC == "NORMAL" else "NORMAL"


def raw_one_by_one(
    path: Path, rows: list[tuple[str, int, str, bytes]], synchronous: str = "FULL"
) -> float:
    con = raw_store(path, synchronous)
    t = time.perf_counter()
    for row in rows:
        con.execute("BEGIN")
        con.execute(INSERT, row)
        con.execute("COMMIT")
    elapsed = time.perf_counter() - t
    con.close()
    return elapsed


def raw_batched(
    path: Path, rows: list[tuple[str, int, str, bytes]], size: int, synchronous: str
) -> float:
    con = raw_store(path, synchronous)
    t = time.perf_counter()
    for i in range(0, len(rows), size):
        con.execute("BEGIN")
        con.executemany(INSERT, rows[i : i + size])
        con.execute("COMMIT")
    elapsed = time.perf_counter() - t
    con.close()
    return elapsed


def timed(fn: Callable[[], None], profile: bool, label: str) -> float:
    prof = cProfile.Profile() if profile else None
    t = time.perf_counter()
    if prof is not None:
        prof.enable()
    fn()
    if prof is not None:
        prof.disable()
    elapsed = time.perf_counter() - t
    if prof is not None:
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out).strip_dirs()
        stats.sort_stats("tottime").print_stats(18)
        stats.sort_stats("cumulative").print_stats(25)
        print(f"--- profile: {label} (times inflated by the profiler) ---")
        print(out.getvalue())
    return elapsed


def report(label: str, n: int, events: int, seconds: float, raw_seconds: float, goal: str) -> None:
    rate, raw_rate = events / seconds, events / raw_seconds
    print(
        f"{label:<11} {n:>8,} submissions in {seconds:6.2f} s = "
        f"{n / seconds:>9,.0f} submissions/s, "
        f"{rate:>9,.0f} events/s | raw sqlite {raw_rate:>9,.0f} rows/s | "
        f"ledger/raw = {rate / raw_rate:.3f} | {goal}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--one", type=int, default=5_000, help="submissions appended one by one")
    ap.add_argument("--batches", type=int, default=50, help="number of batches")
    ap.add_argument("--batch-size", type=int, default=5_000, help="submissions per batch")
    ap.add_argument("--profile", action="store_true", help="cProfile the ledger phases")
    ap.add_argument(
        "--dir", type=Path, default=None,
        help="where the temp homes go (default: the system temp dir); /dev/shm takes fsync out",
    )  # fmt: skip
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-append-", dir=args.dir) as tmp:
        root = Path(tmp)

        # 1. one submission per transaction
        led = fresh_ledger(root / "one")
        start = led.position

        def one_by_one() -> None:
            for i in range(args.one):
                led.execute(submission(i))

        one_s = timed(one_by_one, args.profile, "one by one")
        one_events = led.position - start
        led.close()
        rows = stored_rows(root / "one", start)
        raw_one_s = raw_one_by_one(root / "raw-one.sqlite", rows, SYNC)
        raw_other_s = raw_one_by_one(root / "raw-other.sqlite", rows, OTHER)

        # 2. one transaction per batch
        led = fresh_ledger(root / "batched")
        start = led.position
        batches = [[submission(i) for i in range(args.batch_size)] for _ in range(args.batches)]

        def batched() -> None:
            for batch in batches:
                led.execute_all(batch)

        batch_s = timed(batched, args.profile, "batched")
        batch_events = led.position - start
        led.close()
        rows = stored_rows(root / "batched", start)
        raw_batch_s = raw_batched(root / "raw-batched.sqlite", rows, args.batch_size, SYNC)

    n_batched = args.batches * args.batch_size
    where = args.dir or Path(tempfile.gettempdir())
    print(
        f"bench_append: SQLite {sqlite3.sqlite_version}, WAL, synchronous={SYNC} "
        f"(GPULEDGER_DURABILITY={SYNC.lower()}), "
        f"homes under {where}; raw = the same bytes through sqlite3"
    )
    one_rate = args.one / one_s
    report(
        "one by one", args.one, one_events, one_s, raw_one_s,
        f"goal >= {GOAL_ONE_PER_S:,} submissions/s: "
        + ("met" if one_rate >= GOAL_ONE_PER_S else f"MISSED ({one_rate / GOAL_ONE_PER_S:.2f}x)"),
    )  # fmt: skip
    print(
        f"{'':<11} (raw sqlite one by one with synchronous={OTHER}: "
        f"{one_events / raw_other_s:,.0f} rows/s)"
    )
    batch_rate = batch_events / batch_s
    report(
        f"batched x{args.batch_size:,}", n_batched, batch_events, batch_s, raw_batch_s,
        f"goal >= {GOAL_BATCHED_EVENTS_PER_S:,} events/s: "
        + ("met" if batch_rate >= GOAL_BATCHED_EVENTS_PER_S
           else f"MISSED ({batch_rate / GOAL_BATCHED_EVENTS_PER_S:.2f}x)"),
    )  # fmt: skip


if __name__ == "__main__":
    main()
