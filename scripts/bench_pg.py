"""Benchmark: job submissions over HTTP to a `gpuledger serve` whose log is in PostgreSQL, against
raw psycopg inserts of the same rows, in the same run (docs/ha.md).

--rounds times in turn, each on a fresh database of one private PostgreSQL 15
(`scripts/postgres/postgres up`, or $GPULEDGER_PG_DSN's server):
  raw   8 threads, each with its own psycopg connection, each inserting one row per transaction
        (autocommit) into a table shaped like the store's (stream uuid, version, topic,
        state bytea) with rows of a submit's size: the database's own limit for committed
        single-row writes at this concurrency (fsync and synchronous_commit on)
  HTTP  `POST /v1/commands/submit` from 8 client processes (scripts/bench_api.py's closed-loop
        raw-socket clients), the server group-committing into PostgreSQL (goal >= 2,000
        submits/s, p99 <= 50 ms, ratio to raw >= 30%)
The server's CPU per submit is printed beside the wall-clock rates, and the load.

    python scripts/bench_pg.py                      # 8 clients x 1,000 submits, 3 rounds
    python scripts/bench_pg.py --per-client 500 --rounds 2
    python scripts/bench_pg.py --synchronous-commit off   # both sides: what the disk's fsync costs

`--synchronous-commit` is PostgreSQL's setting, given to both sides' connections (the DSN's
`options`); the default `on` never loses an acknowledged command (docs/ha.md), `off` may lose
the last ~0.6 s of them when PostgreSQL crashes: an operator's choice, measured here only to show
how much of a submit's time is the disk's flush.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
from bench_api import Http, submits_over_http
from benchkit import machine, postgres

from ledger.store import locate
from ledger.store.creating import NewLedger
from ledger.store.pgread import PgSource

GOAL_PER_S = 2_000
GOAL_P99_MS = 50.0
GOAL_RATIO = 0.30


def database(admin: str, name: str, synchronous_commit: str = "") -> str:
    """A fresh database `name` on `admin`'s server; its DSN (with the session's
    synchronous_commit when given)."""
    with psycopg.connect(admin, autocommit=True) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        con.execute(f'CREATE DATABASE "{name}"')
    base, _, rest = admin.partition("?")
    if synchronous_commit:
        option = f"options=-c%20synchronous_commit%3D{synchronous_commit}"
        rest = f"{rest}&{option}" if rest else option
    return base.rsplit("/", 1)[0] + "/" + name + (f"?{rest}" if rest else "")


def raw(dsn: str, clients: int, per_client: int, size: int) -> tuple[float, float]:
    """Rows per second and p99 (ms) of single-row autocommit inserts from `clients` threads."""
    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute(
            "CREATE TABLE raw_events (stream uuid NOT NULL, version bigint "
            "NOT NULL, topic text NOT NULL, state bytea, PRIMARY KEY (stream, "
            "version))"
        )
    state = b"x" * size
    stream = uuid.uuid4()
    lat: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    def run(k: int) -> None:
        mine = []
        with psycopg.connect(dsn, autocommit=True) as con:
            start.wait()
            for i in range(per_client):
                t0 = time.perf_counter()
                con.execute(
                    "INSERT INTO raw_events VALUES (%s, %s, %s, %s)",
                    (stream, k * per_client + i + 1, "job.submitted.v1", state),
                    prepare=True,
                )
                mine.append(time.perf_counter() - t0)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    lat.sort()
    return len(lat) / elapsed, lat[int(len(lat) * 0.99) - 1] * 1000


def over_http(dsn: str, clients: int, per_client: int) -> tuple[Http, int]:
    """The HTTP side on the store `dsn`, and the size of a submit's stored event (bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "ledger"
        locate.remember(home, dsn)
        NewLedger(home, store=dsn).close()  # its tables, as `init --store` makes them
        http = submits_over_http(home, clients, per_client)
        with PgSource(dsn) as source:  # the store's own reader: the size of a stored submit
            rows = source.read_tagged(0, 100, ["job.submitted.v1"])
        size = sum(len(r[2]) for r in rows) // max(1, len(rows)) or 400
    return http, size


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def run(admin: str, args: argparse.Namespace) -> None:
    rates, raws, p99s = [], [], []
    for r in range(args.rounds):
        sync = args.synchronous_commit
        h, size = over_http(database(admin, f"bench_http_{r}", sync), args.clients,
                            args.per_client)  # fmt: skip
        rate, raw_p99 = raw(database(admin, f"bench_raw_{r}", sync), args.clients,
                            args.per_client, size)  # fmt: skip
        rates.append(h.rate)
        raws.append(rate)
        p99s.append(h.p99_ms)
        print(
            f"round {r + 1}: raw psycopg inserts {rate:,.0f} rows/s (p99 {raw_p99:.1f} ms, "
            f"{size} B rows); HTTP {h.rate:,.0f} submits/s, p50 {h.p50_ms:.1f} ms, p99 "
            f"{h.p99_ms:.1f} ms, {h.errors} errors, server {h.server_cpu * 1e6:.0f} us CPU per "
            f"submit; ratio {h.rate / rate:.0%}; synchronous_commit {args.synchronous_commit}; "
            f"{load()}",
            flush=True,
        )
    rate, p99 = statistics.median(rates), statistics.median(p99s)
    ratio = statistics.median(h / r for h, r in zip(rates, raws, strict=True))
    print(
        f"HTTP on PostgreSQL, {args.clients} clients x {args.per_client:,}, median of "
        f"{args.rounds}: {rate:,.0f} submits/s ({rate / GOAL_PER_S:.2f}x the {GOAL_PER_S:,}/s "
        f"goal), p99 {p99:.1f} ms ({p99 / GOAL_P99_MS:.2f}x the {GOAL_P99_MS:.0f} ms limit); "
        f"ratio to raw inserts {ratio:.0%} (goal >= {GOAL_RATIO:.0%}: "
        f"{'met' if ratio >= GOAL_RATIO else 'not met'})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--synchronous-commit", default="on", choices=["on", "off", "local"])
    args = ap.parse_args()
    print(f"machine: {machine()}; {load()}", flush=True)
    with postgres() as dsn:
        run(dsn, args)


if __name__ == "__main__":
    main()
