"""Benchmark: the Teams page's whole period on a first read, before its ended hours are kept
(issue #29: 18-20 s under load). Two ways over the same projection, in this process:

- hours: every hour of the period read into the server and summed there
  (`hours.delivered_series` with nothing kept: what a first read did before);
- engine: summed in DuckDB per team and bucket over every span (`hours.bucketed_series`:
  what a first read did before the projection kept the ended hours);
- kept: the ended hours the projection keeps (`projections.kept`) summed per team and bucket,
  and the hours since the latest event (`bucketed_series(kept=True)`: what the page reads now,
  first read or not).

For each log size N (the synthetic mix of `projections.testing.synthetic` on 1,024 x 8 GPUs,
made once and cached in --dir by `bench_history`'s builder; never commit it), the period runs
from the first event's hour to now (the synthetic history is dated in the past: months of
quiet hours after it, each hour a row per team). Prints wall and CPU ms (median of --repeat),
and the ratio to the 300 ms page goal, on one DuckDB thread as the server's read pool runs
its reads; checks the ways agree to 1e-9. The projection is caught up first (a projection of
an older schema is made again from the log).

    python scripts/bench_teams.py --sizes 20000,1000000 --dir /tmp/gpuledger-teams --repeat 3
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from pathlib import Path

from bench_history import ensure_log, prepare
from benchkit import machine

GOAL_MS = 300.0


def timed(fn: object, repeat: int) -> tuple[float, float, object]:
    """(median wall ms, median CPU ms, the last result) of `fn()` run `repeat` times."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()  # type: ignore[operator]
        walls.append((time.perf_counter() - w0) * 1000)
        cpus.append((time.process_time() - c0) * 1000)
    return statistics.median(walls), statistics.median(cpus), out


def agree(a: object, b: object) -> bool:
    """Whether two results are equal but for the last bits of their floats."""
    import msgspec

    def same(x: object, y: object) -> bool:
        if isinstance(x, dict) and isinstance(y, dict):
            return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            return len(x) == len(y) and all(same(i, j) for i, j in zip(x, y, strict=True))
        if isinstance(x, float) and isinstance(y, float):
            return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)
        return x == y

    return same(msgspec.to_builtins(a), msgspec.to_builtins(b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="20000,1000000")
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--ways",
        default="hours,engine,kept",
        help="hours,engine runs on code before the kept way",
    )
    args = ap.parse_args()

    from ledger.reads import hours
    from ledger.server.pages import bucket_for
    from ledger.store import locate
    from projections.projector import Projector
    from projections.store import Store

    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{machine()}; load {os.getloadavg()[0]:.1f}; {now}")
    print(f"{'events':>9} {'hours':>7} {'way':>7} {'wall ms':>9} {'CPU ms':>8} {'/300 ms':>8}")
    for n in [int(x) for x in args.sizes.split(",")]:
        home = args.dir / f"{n}"
        home.mkdir(parents=True, exist_ok=True)
        prepare(home, ensure_log(home, n))
        with Store.open(home) as store:
            with locate.open_source(home) as source:
                Projector(store, source).catch_up()
            store.con.execute("SET threads = 1")  # as the server's read pool runs its reads
            (first,) = store.con.execute("SELECT min(occurred_at) FROM events").fetchone() or (0,)
            start = math.floor(first / 3600) * 3600
            end = float(math.floor(time.time()))
            bucket = bucket_for(end - start)
            span_h = (end - start) / 3600
            window = (store, start, end, 2, bucket)
            ways = {
                "hours": lambda w=window: hours.delivered_series(*w),  # type: ignore[misc]
                "engine": lambda w=window: hours.bucketed_series(*w),  # type: ignore[misc,attr-defined,unused-ignore]
                "kept": lambda w=window: hours.bucketed_series(*w, kept=True),  # type: ignore[misc,call-arg,unused-ignore]
            }
            got = {}
            for way, fn in ways.items():
                if way not in args.ways.split(","):
                    continue
                wall, cpu, got[way] = timed(fn, args.repeat)
                ratio = wall / GOAL_MS
                print(f"{n:>9,} {span_h:>7,.0f} {way:>7} {wall:>9.0f} {cpu:>8.0f} {ratio:>8.2f}")
            for way in list(got)[1:]:
                assert agree(got[next(iter(got))], got[way]), f"{way} disagrees"
    print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
