"""Replay benchmarks: every decision of a 28-day simulation, and one decision behind 1M events.

1. `replay --all` over a 28-day simulation of the Philly trace at 400 GPUs (`gpuledger simulate
   run`, 50 nodes x 8 GPUs, two drains), made once into DIR/sim28: every recorded decision is
   replayed from the log alone (one in-memory projection advancing monotonically, read as of
   each decision's position; one state folded incrementally). Prints decisions verified per
   second, how many were identical (the bar: all), where the time went, and the same-run ratio
   to the raw baseline: running the same `decide()` calls on snapshots already in hand.
   `--exact-sample N` also times the first N decisions with the projection caught up to exactly
   each position (the literal method), for comparison.
2. One decision replayed with 1,000,000 events before it: DIR/pad1m holds 1M synthetic events of
   a busy 128-node cluster (`projections.testing.synthetic`, chained like the ledger's) and then
   one real
   dispatcher decision. A fresh replay rebuilds the projection (in-memory DuckDB, caught up to
   the decision's position) and the write-side state (fold of 1M events) and decides again.
   Prints the time (best and median of --repeat runs), the breakdown, and the ratio to the raw
   baseline: reading the 1M stored records from SQLite, nothing else.
3. `audit verify` over the 1M-event log (the hash chain), for the record.

Run: `.venv/bin/python scripts/bench_replay.py [--dir DIR]` (the logs are kept in DIR and reused;
default /tmp/gpuledger-bench-replay). The machine is shared: check `cat /proc/loadavg`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from ledger.cycle.dispatcher import Dispatcher, ProjectionRanks
from ledger.dispatch import registry
from ledger.dispatch.engine import decide
from ledger.history.compare import compare, decided_at, squat_threshold
from ledger.history.replay import Replayer, find_decisions, folds_of
from ledger.history.tamper import store_records, verify_chain
from ledger.sim.kernel import KernelExecutor
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.embedded import EmbeddedSource
from projections.projector import Projector
from projections.source import follow
from projections.store import Store
from projections.testing.synthetic import STREAM_ID, synthetic_events
from schemas import codec
from schemas import commands as c
from schemas.events import tag_of

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "examples" / "traces" / "philly-4plusgpu-sample.csv.gz"
GPULEDGER = Path(sys.executable).parent / "gpuledger"


def machine() -> str:
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f", {int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    except OSError:
        pass
    return f"{platform.machine()}, {os.cpu_count()} cores{mem}, Python {platform.python_version()}"


def load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ")[0]
    except OSError:
        return "?"


# --- 1. every decision of a 28-day simulation ---------------------------------------------------


def make_sim(home: Path, trace: Path) -> None:
    if (home / "events.sqlite").exists():
        return
    print(f"simulating 28 days of {trace.name} at 400 GPUs into {home} ...", flush=True)
    started = time.perf_counter()
    subprocess.run(
        [
            str(GPULEDGER),
            "--home",
            str(home),
            "simulate",
            "run",
            "--trace",
            str(trace),
            "--nodes",
            "50",
            "--gpus-per-node",
            "8",
            "--days",
            "28",
            "--policy",
            "fairshare",
            "--drain",
            "n001@3d+6h",
            "--drain",
            "n017@10d+12h",
            "--no-plots",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    print(f"  done in {time.perf_counter() - started:.0f} s", flush=True)


def bench_all(home: Path, exact_sample: int) -> None:
    decisions = find_decisions(home)
    thresholds = {squat_threshold(d) for _, d in decisions}
    with EmbeddedSource(home) as source:
        head = source.head()
        started, cpu0 = time.perf_counter(), time.process_time()
        identical = 0
        snapshots = []
        with Replayer(source, thresholds=thresholds, folds=folds_of(decisions)) as rp:
            for position, recorded in decisions:
                snapshot, policy, digest = rp.snapshot(recorded)
                t = time.perf_counter()
                decision = decide(snapshot, policy, decided_at(recorded))
                rp.timings.decide_s += time.perf_counter() - t
                outcome = rp.outcome(position, recorded)
                identical += not compare(recorded, outcome, decision, digest)
                snapshots.append((snapshot, policy, decided_at(recorded)))
            timings = rp.timings
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu0
        # the raw baseline: the same decide() calls on snapshots already in hand
        t = time.perf_counter()
        for snapshot, policy, now in snapshots:
            decide(snapshot, policy, now)
        raw = time.perf_counter() - t
        n = len(decisions)
        print(
            f"replay --all: {n:,} decisions over {head:,} events in {elapsed:.2f} s = "
            f"{n / elapsed:.1f} decisions verified/s; identical {identical:,} of {n:,} "
            f"({100 * identical / n:.1f}%) (load {load()})"
        )
        print(
            f"  CPU time (all threads): {cpu:.2f} s = {n / cpu:.1f} decisions per CPU-second; "
            f"goal >= 100/s: ratio {n / cpu / 100:.2f}"
        )
        print(
            f"  time: fold {timings.fold_s:.2f} s, projection catch-up {timings.project_s:.2f} s"
            f", ranks (SQL + Fair Tree) {timings.ranks_s:.2f} s, decide {timings.decide_s:.2f} s,"
            f" snapshot and compare {elapsed - timings.total():.2f} s"
        )
        print(
            f"  raw baseline (decide() alone on ready snapshots): {n / raw:.1f}/s; "
            f"ratio replay/raw = {elapsed / raw:.1f}x"
        )
        if exact_sample:
            sample = decisions[:exact_sample]
            t = time.perf_counter()
            with Replayer(source, thresholds=thresholds, exact=True, folds=folds_of(sample)) as rp:
                same = sum(rp.replay(p, d).identical for p, d in sample)
            dt = time.perf_counter() - t
            print(
                f"  --exact (catch_up(until=P) per decision), first {len(sample)}: "
                f"{len(sample) / dt:.1f}/s, identical {same} of {len(sample)}"
            )


# --- 2. one decision behind 1,000,000 events ----------------------------------------------------


def make_padded(home: Path, events: int) -> None:
    if (home / "events.sqlite").exists():
        return
    print(f"writing {events:,} chained synthetic events into {home} ...", flush=True)
    started = time.perf_counter()
    home.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(home / "events.sqlite", isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute(
        "CREATE TABLE IF NOT EXISTS stored_events (originator_id TEXT, originator_version "
        "INTEGER, topic TEXT, state BLOB, PRIMARY KEY (originator_id, originator_version))"
    )
    prev, rows, last_at = "", [], 0.0
    for version, ev in enumerate(synthetic_events(events), start=1):
        ev = msgspec.structs.replace(ev, prev_hash=prev)
        data = codec.encode(ev)
        prev = hashlib.sha256(data).hexdigest()
        last_at = ev.at
        rows.append((STREAM_ID.hex, version, tag_of(type(ev)), data))
        if len(rows) >= 100_000:
            con.execute("BEGIN")
            con.executemany("INSERT INTO stored_events VALUES (?, ?, ?, ?)", rows)
            con.execute("COMMIT")
            rows = []
    if rows:
        con.execute("BEGIN")
        con.executemany("INSERT INTO stored_events VALUES (?, ?, ?, ?)", rows)
        con.execute("COMMIT")
    con.close()
    print(
        f"  written in {time.perf_counter() - started:.0f} s; one real decision now ...", flush=True
    )
    clock = SimClock(last_at + 60.0)
    ledger = Ledger(home, clock, seeded_ids(1))
    state = ledger.state
    project = next(p for p, users in sorted(state.members.items()) if users)
    user = sorted(state.members[project])[0]
    ledger.execute_all(
        [
            c.SubmitJob(actor=user, account=project, gpus=g, min_runtime_s=3_600, duration_s=600.0)
            for g in (1, 2, 4, 8)
        ]
    )
    with Store(":memory:") as store, EmbeddedSource(home) as source:
        dispatcher = Dispatcher(
            ledger,
            ProjectionRanks(Projector(store, source)),
            registry.build(),
            KernelExecutor(),
        )
        result = dispatcher.cycle(clock.now())
    ledger.close()
    print(
        f"  decision at position {result.position:,}: {len(result.decision.placements)} placed, "
        f"{len(result.decision.preemptions)} preempted, appended {result.appended} "
        f"({time.perf_counter() - started:.0f} s in all)",
        flush=True,
    )


def bench_single(home: Path, repeat: int) -> None:
    position, recorded = find_decisions(home)[-1]
    with EmbeddedSource(home) as source:
        # raw baseline: read every stored record up to the decision, nothing else
        t = time.perf_counter()
        n = sum(len(page) for page in follow(source, 0, recorded.based_on))
        raw = time.perf_counter() - t
        runs = []
        for _ in range(repeat):
            t = time.perf_counter()
            with Replayer(
                source,
                thresholds={squat_threshold(recorded)},
                exact=True,
                folds=folds_of([(position, recorded)]),
            ) as rp:
                result = rp.replay(position, recorded)
                timings = rp.timings
            runs.append(time.perf_counter() - t)
            assert result.identical, result.differences
        best, median = min(runs), statistics.median(runs)
        print(
            f"one decision behind {recorded.based_on:,} events ({result.considered} considered, "
            f"{result.placements} placed): best {best:.2f} s, median {median:.2f} s of {repeat}; "
            f"identical; goal <= 1 s: {best:.1f}x over (load {load()})"
        )
        print(
            f"  last run: fold {timings.fold_s:.2f} s, projection {timings.project_s:.2f} s, "
            f"ranks {timings.ranks_s:.3f} s, decide {timings.decide_s:.3f} s"
        )
        print(
            f"  raw baseline (read {n:,} records from SQLite): {raw:.2f} s; ratio "
            f"replay/raw = {best / raw:.1f}x"
        )


def bench_verify(home: Path) -> None:
    t = time.perf_counter()
    report = verify_chain(store_records(home))
    dt = time.perf_counter() - t
    print(
        f"audit verify: {report.events:,} events in {dt:.2f} s = {report.events / dt:,.0f} "
        f"events/s, intact {report.ok}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/gpuledger-bench-replay"))
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--exact-sample", type=int, default=200)
    ap.add_argument("--skip-all", action="store_true")
    ap.add_argument("--skip-single", action="store_true")
    args = ap.parse_args()
    print(f"bench_replay {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {machine()}; load {load()}")
    if not args.skip_all:
        make_sim(args.dir / "sim28", args.trace)
        bench_all(args.dir / "sim28", args.exact_sample)
    if not args.skip_single:
        make_padded(args.dir / "pad1m", args.events)
        bench_single(args.dir / "pad1m", args.repeat)
        bench_verify(args.dir / "pad1m")


if __name__ == "__main__":
    main()
