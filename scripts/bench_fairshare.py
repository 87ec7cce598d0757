"""Benchmark: fair-share recompute for 10,000 accounts and 1,000,000 job intervals in the window.

Builds a projection file directly (not from a log: the account history and job intervals are
inserted as Arrow tables, seeded): P programs x Q projects x U users (default 20 x 25 x 20 =
10,000 user leaves, 10,520 accounts) and N funded or unfunded intervals spread over the 7-day
window ending at `at` (some still running). Then, in the same run:

  fair share   `queries.fair_share(store, at)`: window usage per leaf in SQL, rolled up to every
               account, level fair share per sibling group, then the pure Fair Tree ranking in
               Python (goal <= 100 ms); the account tree is kept between calls while the
               account history is unchanged
  tree rebuilt the same, with the account tree read and built again on every call
  half-life    the same with a 1-day half-life instead of the window
  levels only  the SQL part alone (`queries.levels`)
  raw          a bare `SELECT leaf, sum(gpus * (end - start)) ... GROUP BY leaf` over the same
               intervals: the floor for touching every interval once

    python scripts/bench_fairshare.py
    python scripts/bench_fairshare.py --intervals 3000000 --repeat 9
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb  # noqa: F401  (the full package: it sets up the scans of Arrow tables `register` needs)
import pyarrow as pa

from projections import fairshare as fs
from projections import queries
from projections.store import Store
from schemas import events as e
from schemas.events import tag_of

GOAL_MS = 100.0
AT = 1_800_000_000.0
WEEK = 7 * 86400.0


def build(path: Path, programs: int, projects: int, users: int, intervals: int, seed: int) -> int:
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    leaves: list[str] = []
    pos = 0

    def add(path: str, parent: str | None, kind: str) -> None:
        nonlocal pos
        pos += 1
        base = {"account": path, "changed_at": AT - 30 * 86400.0, "reason": ""}
        rows.append(
            {
                **base,
                "position": pos,
                "tag": tag_of(e.AccountOpened),
                "parent": parent,
                "kind": kind,
                "shares": None,
                "open": True,
            }
        )
        pos += 1
        rows.append(
            {
                **base,
                "position": pos,
                "tag": tag_of(e.SharesSet),
                "parent": None,
                "kind": None,
                "shares": rng.randint(0, 10),
                "open": None,
            }
        )

    for p in range(programs):
        prog = f"prog{p}"
        add(prog, None, "program")
        for q in range(projects):
            proj = f"{prog}/proj{q}"
            add(proj, prog, "project")
            for u in range(users):
                leaf = f"{proj}/user{u}"
                add(leaf, proj, "user")
                leaves.append(leaf)
    starts = [AT - rng.uniform(0, WEEK) for _ in range(intervals)]
    ends = [s + rng.uniform(60, 12 * 3600) for s in starts]
    chosen = [rng.choice(leaves) for _ in range(intervals)]
    table = pa.table(
        {
            "job_id": pa.array(range(1, intervals + 1), pa.int64()),
            "start_position": pa.array(range(pos + 1, pos + intervals + 1), pa.int64()),
            "start_at": starts,
            "end_position": pa.array([None] * intervals, pa.int64()),
            "end_at": [e if e < AT else None for e in ends],
            "end_reason": pa.array([None] * intervals, pa.string()),
            "account": [leaf.rsplit("/", 1)[0] for leaf in chosen],
            "user_name": [leaf.rsplit("/", 1)[1] for leaf in chosen],
            "leaf": chosen,
            "gpus": pa.array([rng.choice((1, 2, 4, 8)) for _ in range(intervals)], pa.int32()),
            "gpu_type": [("h100", "a100")[i % 2] for i in range(intervals)],
            "funded": [rng.random() < 0.8 for _ in range(intervals)],
            "cycle_id": pa.array([None] * intervals, pa.string()),
            "slots": pa.array(
                [[]] * intervals,
                pa.list_(pa.struct([("node", pa.string()), ("gpu_indices", pa.list_(pa.int32()))])),
            ),
        }
    )
    with Store(path) as store:
        store.con.register("hist", pa.Table.from_pylist(rows))
        store.con.execute("INSERT INTO account_history BY NAME SELECT * FROM hist")
        store.con.register("ivs", table)
        store.con.execute("INSERT INTO job_intervals BY NAME SELECT * FROM ivs")
        store.con.execute("CHECKPOINT")
    return len(leaves)


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median wall ms and median process CPU ms (all threads) of `repeat` calls."""
    fn()  # warm
    walls, cpus = [], []
    for _ in range(repeat):
        c0, t0 = cpu_s(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(cpu_s() - c0)
    return statistics.median(walls) * 1000, statistics.median(cpus) * 1000


def rebuilt(store: Store) -> fs.FairTree:
    """`queries.fair_share` with the account tree read and built again (no cache)."""
    queries._SHAPES.clear()
    return queries.fair_share(store, AT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--programs", type=int, default=20)
    ap.add_argument("--projects", type=int, default=25)
    ap.add_argument("--users", type=int, default=20)
    ap.add_argument("--intervals", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fairshare.duckdb"
        t0 = time.perf_counter()
        leaves = build(path, args.programs, args.projects, args.users, args.intervals, args.seed)
        print(
            f"built {leaves:,} user leaves and {args.intervals:,} intervals in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        date = subprocess.run(["date"], capture_output=True, text=True, check=False).stdout.strip()
        print(f"{os.cpu_count()} cores; {date}")
        with Store(path, read_only=True) as store:
            tree = queries.fair_share(store, AT)
            window = store.con.execute(
                "SELECT count(*) FROM job_intervals WHERE start_at < ? AND "
                "(end_at IS NULL OR end_at > ?)",
                [AT, AT - WEEK],
            ).fetchall()[0][0]
            print(
                f"{len(tree.rows):,} accounts, {tree.users:,} ranked users, "
                f"{window:,} intervals in the window"
            )
            half = fs.UsagePolicy(half_life_s=86400.0)
            results = {
                "fair share (window)": timed(lambda: queries.fair_share(store, AT), args.repeat),
                "fair share (tree rebuilt)": timed(lambda: rebuilt(store), args.repeat),
                "fair share (half-life)": timed(
                    lambda: queries.fair_share(store, AT, half), args.repeat
                ),
                "levels only (SQL)": timed(lambda: queries.levels(store, AT), args.repeat),
                "raw scan + group by": timed(
                    lambda: store.con.execute(
                        "SELECT leaf, sum(gpus * (coalesce(end_at, ?) - start_at)) "
                        "FROM job_intervals GROUP BY leaf",
                        [AT],
                    ).fetchall(),
                    args.repeat,
                ),
            }
        raw = results["raw scan + group by"][0]
        print(f"{'':26s} {'wall':>8s}    {'cpu':>8s}   (cpu: all threads of this process)")
        for name, (ms, cpu) in results.items():
            print(f"{name:26s} {ms:8.1f} ms {cpu:8.1f} ms   {ms / raw:5.1f}x raw (wall)")
        load = os.getloadavg()[0]
        print(f"goal: fair share <= {GOAL_MS:.0f} ms; load average during the run {load:.1f}")


if __name__ == "__main__":
    main()
