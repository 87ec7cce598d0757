"""Benchmark: what grows with history, on a PostgreSQL store against the same log on SQLite, in
the same run: the measures of scripts/bench_history.py (start, RSS, `queue`/`jobs`/`shares`
through the CLI, `serve` start) on each store, side by side, for each log size N.

The SQLite side is bench_history's own history (made once in --dir/N and cached: the synthetic
log, its cold fold, a snapshot, the DuckDB projection). The PostgreSQL side is a home whose
`store` names a fresh database of the PostgreSQL at $GPULEDGER_PG_DSN (else a private one,
`scripts/postgres/postgres up`), loaded by the product's own `gpuledger store copy` (the events
in pages of 10,000, one multi-row INSERT each, then the snapshots; the chain checked on the way
and the copy compared with the source, byte for byte), with the SQLite home's snapshot key and
DuckDB projection copied beside it (the same log gives the same projection: folding 5M events
from PostgreSQL again would only measure the fold). Both homes then answer from the same state.

    python scripts/bench_pg_history.py                        # 10k, 100k, 1M, 5M in /tmp
    python scripts/bench_pg_history.py --sizes 10000,100000 --dir /tmp/gpuledger-history
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from bench_history import (
    _START,
    CLI_GOAL_MS,
    START_GOAL_S,
    cli_ms,
    ensure_log,
    prepare,
    serve_start,
)
from bench_pg import database
from benchkit import machine, postgres

from ledger.store import locate, snapshots
from ledger.store.pgread import PgSource
from projections.errors import SourceUnavailable
from projections.store import PROJECTIONS_DIR


def start(home: Path) -> dict[str, float]:
    """The service's start in a fresh process (either store: `locate` reads the home's)."""
    out = subprocess.run(
        [sys.executable, "-c", _START, str(home)], check=True, capture_output=True, text=True
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def pg_home(sqlite_home: Path, admin: str, n: int) -> tuple[Path, dict[str, float]]:
    """The PostgreSQL home beside `sqlite_home`, loaded once (cached by its marker file)."""
    home = sqlite_home.parent / f"{n}-pg"
    marker = home / "pg.json"
    if marker.exists():
        info: dict[str, float] = json.loads(marker.read_text())
        if _head(str(info["dsn"])) == info["events"]:
            return home, info
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    dsn = database(admin, f"bench_history_{n}")
    exe = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"
    t0 = time.perf_counter()
    out = subprocess.run([exe, "store", "copy", str(sqlite_home), dsn, "--json"], check=True,
                         capture_output=True, text=True)  # fmt: skip
    copy_s = time.perf_counter() - t0
    locate.remember(home, dsn)
    shutil.copy2(sqlite_home / snapshots.STATE_KEY, home / snapshots.STATE_KEY)
    shutil.copytree(sqlite_home / PROJECTIONS_DIR, home / PROJECTIONS_DIR)
    copied = json.loads(out.stdout)
    info = {"dsn": dsn, "events": _head(dsn), "copy_s": copy_s, "copied": copied}  # type: ignore[dict-item]
    marker.write_text(json.dumps(info))
    return home, info


def _head(dsn: str) -> int:
    """The head of the store `dsn` (-1: it cannot be read)."""
    try:
        with PgSource(dsn) as source:
            return source.head()
    except SourceUnavailable:
        return -1


def db_bytes(dsn: str) -> int:
    """The store's database on disk (its events, snapshots and indexes, and PostgreSQL's own
    catalog, ~7 MB)."""
    with psycopg.connect(dsn) as con:
        row = con.execute("SELECT pg_database_size(current_database())").fetchone()
    return int(row[0]) if row else 0


def run(admin: str, args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"machine: {machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'events':>10} {'store':>10} {'B/ev':>5} {'load s':>7} {'start s':>7} {'RSS MB':>7} "
          f"{'queue ms':>8} {'jobs ms':>8} {'shares ms':>9} {'(CPU ms: queue':>14} {'jobs':>5} "
          f"{'shares)':>7} {'serve s':>7} {'(CPU s)':>7} {'load':>5}")  # fmt: skip
    worst: dict[str, list[float]] = {"sqlite": [], "postgresql": []}
    worst_cpu: dict[str, list[float]] = {"sqlite": [], "postgresql": []}
    serves: dict[str, dict[int, float]] = {"sqlite": {}, "postgresql": {}}
    starts: dict[str, dict[int, float]] = {"sqlite": {}, "postgresql": {}}
    for n in sizes:
        lite = args.dir / str(n)
        info = prepare(lite, ensure_log(lite, n))
        pg, pinfo = pg_home(lite, admin, n)
        sides = [("sqlite", lite, (lite / "events.sqlite").stat().st_size, info["write_s"]),
                 ("postgresql", pg, db_bytes(str(pinfo["dsn"])), pinfo["copy_s"])]  # fmt: skip
        for kind, home, size, loaded in sides:
            s = start(home)
            measured = [cli_ms(home, "queue"), cli_ms(home, "jobs"), cli_ms(home, "shares")]
            times, cpus = [m[0] for m in measured], [m[1] for m in measured]
            serve = serve_start(home)
            worst[kind] += times
            worst_cpu[kind] += cpus
            serves[kind][n], starts[kind][n] = serve[0], s["start_s"]
            print(
                f"{n:>10,} {kind:>10} {size / n:>5.0f} {loaded:>7.1f} {s['start_s']:>7.2f} "
                f"{s['rss_mb']:>7.0f} {times[0]:>8.0f} {times[1]:>8.0f} {times[2]:>9.0f} "
                f"{cpus[0]:>14.0f} {cpus[1]:>5.0f} {cpus[2]:>7.0f} {serve[0]:>7.2f} "
                f"{serve[1]:>7.2f} {os.getloadavg()[0]:>5.1f}",
                flush=True,
            )
    top = max(sizes)
    for kind in ("sqlite", "postgresql"):
        print(f"{kind}: at {top:,} start {starts[kind][top]:.2f} s, serve start "
              f"{serves[kind][top]:.2f} s (goal <= {START_GOAL_S:g} s: ratio "
              f"{serves[kind][top] / START_GOAL_S:.2f}); CLI worst {max(worst[kind]):.0f} ms, "
              f"CPU {max(worst_cpu[kind]):.0f} ms (goal <= {CLI_GOAL_MS:.0f} ms: ratio "
              f"{max(worst_cpu[kind]) / CLI_GOAL_MS:.2f} on CPU)")  # fmt: skip
    print(f"PostgreSQL / SQLite at {top:,}: CLI worst wall "
          f"{max(worst['postgresql']) / max(worst['sqlite']):.2f}x, CPU "
          f"{max(worst_cpu['postgresql']) / max(worst_cpu['sqlite']):.2f}x; serve start "
          f"{serves['postgresql'][top] / serves['sqlite'][top]:.2f}x")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="10000,100000,1000000,5000000")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/gpuledger-history"))
    args = ap.parse_args()
    with postgres() as dsn:
        run(dsn, args)


if __name__ == "__main__":
    main()
