"""Benchmark: catch-up from the embedded log into DuckDB against a raw Arrow insert of the rows.

A synthetic log (`projections.testing.synthetic`: a simulated cluster's events, written straight
into the
eventsourcing SQLite table, ~50x faster than through the ledger) of the largest size asked for is
made once (kept with --dir). For each size N, on the first N events, in the same run:

  catch-up    a fresh projection file, `Projector.catch_up()` over the log: read, decode and
              validate every event, all read models, tracking; one transaction per batch
              (goal >= 200,000 events/s)
  raw         the `events` rows of the same N events, built beforehand (not timed) as the Arrow
              tables the projector hands DuckDB, inserted with one INSERT per batch into an empty
              table of the same file layout: the floor for moving those rows into DuckDB
              (goal: catch-up >= 40% of raw)
  fair share  `queries.fair_share` at the last event's time on the projection of N events
              (window usage of every account, level fair share, Fair Tree ranks); median of 5
  follow      what the service's follower pays per catch-up of a short tail: the projection is
              first built to N - 1,101 events, then caught up by 1, 100 and 1,000 events (ms
              each); the catch-up rate is over the first part

The rate goals are for catch-ups long enough to be a rate (1M events and more: seconds); a
catch-up of 10k or 100k events is one transaction, whose fixed cost (the `follow` columns) and
lack of overlap between reading and applying dominate it. The summary prints both.

With --kills K it instead SIGKILLs a projector process K times at random points of a catch-up and
checks after each restart that the projection equals a clean build up to the same position.

    python scripts/bench_projections.py                                 # 10k, 100k, 1M, 5M
    python scripts/bench_projections.py --sizes 10000,100000,1000000,3000000,10000000
    python scripts/bench_projections.py --kills 100
    python scripts/bench_projections.py --dir /tmp/bench-log --sizes 1000000  # keep the log
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import resource
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb

from ledger.store.embedded import EmbeddedSource, project
from projections import quarantine, queries  # noqa: F401 (loaded before timing)
from projections.batch import build_batch
from projections.projector import Projector
from projections.source import follow
from projections.store import DEFAULT_BATCH, Store, projection_path
from projections.testing import compare as audit
from projections.testing.synthetic import Shape, append_to_store, synthetic_events

GOAL_EVENTS_PER_S = 200_000
GOAL_RATIO = 0.40
LONG = 1_000_000
"""The rate goals are for catch-ups of this many events and more."""
SEED = 1


def ensure_log(home: Path, events: int) -> int:
    """Make (or reuse) a synthetic log of at least `events` events in `home`."""
    marker = home / "synthetic.json"
    if marker.exists():
        info = json.loads(marker.read_text())
        if info["seed"] == SEED and info["events"] >= events:
            return int(info["events"])
        raise SystemExit(f"{home} holds another log; use another --dir")
    t0 = time.perf_counter()
    head = append_to_store(home, synthetic_events(events, seed=SEED, shape=Shape(nodes=256)))
    secs = time.perf_counter() - t0
    marker.write_text(json.dumps({"seed": SEED, "events": head}))
    print(f"log: {head:,} synthetic events written in {secs:.1f} s ({head / secs:,.0f}/s)")
    return head


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


FOLLOW = (1, 100, 1_000)
"""The short tails the follower catches up at the end of each size (events)."""


def catch_up(home: Path, out: Path, n: int, batch: int) -> tuple[float, float, list[float]]:
    """(wall seconds, process CPU seconds) to project the first n events into a fresh file, and
    the wall ms of each short catch-up (`FOLLOW`) that follows."""
    for f in (out, out.with_name(out.name + ".wal")):
        f.unlink(missing_ok=True)
    with EmbeddedSource(home) as src, Store(out) as store:
        c0, t0 = cpu_s(), time.perf_counter()
        result = Projector(store, src, batch_size=batch).catch_up(until=n)
        secs, cpu = time.perf_counter() - t0, cpu_s() - c0
        assert result.position == n, result
        follow = []
        for k in FOLLOW:
            t0 = time.perf_counter()
            result = Projector(store, src, batch_size=batch).catch_up(until=n + k)
            follow.append((time.perf_counter() - t0) * 1000)
            n += k
            assert result.position == n, result
    return secs, cpu, follow


def raw_insert(home: Path, out: Path, n: int, batch: int) -> tuple[float, float]:
    """(wall, process CPU) seconds spent in INSERTs of the same events rows, prebuilt as Arrow
    (build not timed)."""
    for f in (out, out.with_name(out.name + ".wal")):
        f.unlink(missing_ok=True)
    con = duckdb.connect(str(out))
    con.execute(
        "CREATE TABLE events (position BIGINT, tag VARCHAR, known BOOLEAN, occurred_at DOUBLE, "
        "actor VARCHAR, event_id VARCHAR, job_id BIGINT, account VARCHAR, user_name VARCHAR, "
        "node VARCHAR, raw JSON)"
    )
    spent = spent_cpu = 0.0
    with EmbeddedSource(home) as src:
        for records in follow(src, 0, n, page=batch):
            rows = build_batch(records).tables["b_events"]
            # the typed columns as the projector writes them, computed before the clock starts
            con.register("b_raw", rows)
            typed = con.sql(
                """SELECT position, tag, known, f."at", f.actor, f.event_id, f.job_id,
                          coalesce(f.path, f.account, f.project), f."user", f.node, raw
                   FROM (SELECT *, json_transform(raw, '{"at": "DOUBLE", "actor": "VARCHAR",
                         "event_id": "VARCHAR", "job_id": "BIGINT", "path": "VARCHAR",
                         "account": "VARCHAR", "project": "VARCHAR", "user": "VARCHAR",
                         "node": "VARCHAR"}') AS f FROM b_raw)"""
            ).to_arrow_table()
            con.unregister("b_raw")
            con.register("b_rows", typed)
            t0, c0 = time.perf_counter(), cpu_s()
            con.execute("BEGIN")
            con.execute("INSERT INTO events SELECT * FROM b_rows")
            con.execute("COMMIT")
            spent += time.perf_counter() - t0
            spent_cpu += cpu_s() - c0
            con.unregister("b_rows")
    con.close()
    return spent, spent_cpu


def fair_share_ms(path: Path) -> tuple[float, int, int, float]:
    """(median ms of `fair_share`, accounts, intervals in the window, at)."""
    with Store(path, read_only=True) as store:
        at = float(store.con.execute("SELECT max(occurred_at) FROM events").fetchall()[0][0])
        window = store.con.execute(
            "SELECT count(*) FROM job_intervals WHERE funded AND start_at < ? "
            "AND (end_at IS NULL OR end_at > ?)",
            [at, at - 7 * 86400],
        ).fetchall()[0][0]
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            tree = queries.fair_share(store, at)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1000, len(tree.rows), int(window), at


def machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    date = subprocess.run(["date"], capture_output=True, text=True, check=False).stdout.strip()
    return (
        f"{os.cpu_count()} cores, {mem:.0f} GiB, Python {platform.python_version()}, "
        f"duckdb {duckdb.__version__}; {date}"
    )


def bench_sizes(work: Path, sizes: list[int], batch: int) -> None:
    home = work / "home"
    ensure_log(home, max(sizes))
    print(machine())
    print(f"batch {batch:,} events per transaction")
    follow = " ".join(f"{f'+{k:,} ms':>9}" for k in FOLLOW)
    print(
        f"{'events':>11} {'catch-up/s':>11} {'cpu us/ev':>9} {'ev/cpu-s':>9} {'raw/s':>11} "
        f"{'ratio':>6} {'raw cpu us':>10} {'cpu ratio':>9} {'fair share':>10} {'accounts':>8} "
        f"{'intervals':>9} {follow} {'load':>5}"
    )
    long: list[tuple[float, float]] = []  # (rate, ratio to raw) of the sizes the goals are for
    for n in sizes:
        out = work / f"p{n}.duckdb"
        first = n - sum(FOLLOW)
        secs, cpu, tail = catch_up(home, out, first, batch)
        raw, raw_cpu = raw_insert(home, work / "raw.duckdb", first, batch)
        ms, accounts, window, _ = fair_share_ms(out)
        rate, raw_rate = first / secs, first / raw
        if n >= LONG:
            long.append((rate, rate / raw_rate))
        print(
            f"{n:>11,} {rate:>11,.0f} {cpu / first * 1e6:>9.1f} {first / cpu:>9,.0f} "
            f"{raw_rate:>11,.0f} {rate / raw_rate:>6.0%} {raw_cpu / first * 1e6:>10.1f} "
            f"{raw_cpu / cpu:>9.0%} {ms:>8.1f} ms {accounts:>8,} {window:>9,} "
            + " ".join(f"{t:>9.1f}" for t in tail)
            + f" {os.getloadavg()[0]:>5.1f}",
            flush=True,
        )
        for f in (out, out.with_name(out.name + ".wal")):
            f.unlink(missing_ok=True)
    print(f"goals: catch-up >= {GOAL_EVENTS_PER_S:,} events/s and >= {GOAL_RATIO:.0%} of raw, "
          f"for catch-ups of {LONG:,} events and more")  # fmt: skip
    if long:
        rate, ratio = min(r for r, _ in long), min(q for _, q in long)
        print(f"slowest of those: {rate:,.0f} events/s, {rate / GOAL_EVENTS_PER_S:.2f}x the goal; "
              f"lowest ratio to raw {ratio:.0%}, {ratio / GOAL_RATIO:.2f}x the goal")  # fmt: skip


# --- reliability ----------------------------------------------------------------------------

_CTX = multiprocessing.get_context("forkserver")


def _child(home: Path, batch: int, position: Any) -> None:
    def progress(pos: int, head: int) -> None:
        position.value = pos

    project(home, batch_size=batch, progress=progress)


def _kill_once(home: Path, rng: random.Random, start: int, batch: int) -> bool:
    position = _CTX.Value("q", start)
    child = _CTX.Process(target=_child, args=(home, batch, position))
    child.start()
    assert child.pid is not None
    wanted = start + batch * rng.randint(0, 2)
    while position.value < wanted and child.exitcode is None:
        time.sleep(0.002)
    child.join(timeout=rng.uniform(0.0, 0.2))
    if child.exitcode is not None:
        return False
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    return True


def bench_kills(work: Path, kills: int, events: int, batch: int) -> None:
    _CTX.set_forkserver_preload(["projections.projector"])
    home = work / "kill-home"
    head = append_to_store(home, synthetic_events(events, seed=SEED + 1, shape=Shape(nodes=64)))
    clean = work / "kill-clean.duckdb"
    rng = random.Random(SEED)
    done, position, bad, seen = 0, 0, 0, set()
    t0 = time.perf_counter()
    while done < kills and position < head:
        killed = _kill_once(home, rng, position, batch)
        with Store.open(home) as store:
            position = store.position()
        with EmbeddedSource(home) as src, Store(clean) as c:
            Projector(c, src, batch_size=DEFAULT_BATCH).catch_up(until=position)
        diff = audit.compare_files(projection_path(home), clean)
        if diff != dict.fromkeys(audit.TABLES, (0, 0)):
            bad += 1
            print(f"MISMATCH after kill {done} at position {position}: {diff}")
        done += killed
        seen.add(position)
    project(home)
    with EmbeddedSource(home) as src, Store(clean) as c:
        Projector(c, src).catch_up()
    final = audit.compare_files(projection_path(home), clean)
    bad += final != dict.fromkeys(audit.TABLES, (0, 0))
    print(machine())
    print(
        f"{done} SIGKILLs during catch-up of {head:,} events (batch {batch}), "
        f"{len(seen)} distinct positions, {bad} mismatches against a clean build, "
        f"{time.perf_counter() - t0:.0f} s"
    )
    if done < kills:
        print(f"the log ran out after {done} kills: raise --kill-events")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000,5000000")
    ap.add_argument("--batch", type=int, default=DEFAULT_BATCH)
    ap.add_argument("--dir", type=Path, help="keep the log and projections here")
    ap.add_argument("--kills", type=int, help="reliability mode: this many SIGKILLs")
    ap.add_argument("--kill-events", type=int, default=300_000)
    ap.add_argument("--kill-batch", type=int, default=1_000)
    args = ap.parse_args()
    if args.dir:
        args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(args.dir) if args.dir else Path(tmp)
        if args.kills:
            bench_kills(Path(tmp), args.kills, args.kill_events, args.kill_batch)
        else:
            sizes = sorted(int(s) for s in args.sizes.split(","))
            if sizes[0] <= sum(FOLLOW):
                ap.error(f"--sizes: each size must exceed {sum(FOLLOW):,} (the short tails)")
            bench_sizes(work, sizes, args.batch)


if __name__ == "__main__":
    main()
