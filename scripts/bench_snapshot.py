"""Benchmark: the dispatcher's snapshot (`snapshot_from_state`) costs what live work costs.

A full write-side `State` (the one what-if and the simulation fold) keeps every finished job; the
snapshot reads only the live ones (`State.active`). For 10,000 pending jobs beside F finished
ones (F = 0 .. 1M), median of --repeat builds, CPU time:

  snapshot     `snapshot_from_state` of that state
  raw          the same call on a live state holding only the 10,000 pending jobs (F = 0): the
               floor; the goal is that the ratio stays near 1 as F grows
  before       the pass over every job that found the live ones before `State.active` (that
               pass alone, for comparison)

    python scripts/bench_snapshot.py
    python scripts/bench_snapshot.py --finished 0,100000,1000000 --repeat 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import machine

from ledger.core.state import Job, State
from ledger.cycle.inputs import snapshot_from_state
from schemas import events as e

PENDING = 10_000
GOAL_RATIO = 1.2
"""The snapshot beside 1M finished jobs within 20% of the one with none."""


def state_with(finished: int, pending: int = PENDING) -> State:
    """A full state: `finished` finished jobs (the older ids), then `pending` pending ones, as a
    log leaves them (the live jobs are the newest)."""
    s = State()
    for job_id in range(1, finished + pending + 1):
        spec = e.JobSubmitted(
            job_id=job_id, account="ai2/olmo", user=f"u{job_id % 50}", gpus=1 + job_id % 8,
            min_runtime_s=3600, at=1.0, actor="alice", event_id=f"e{job_id}",
        )  # fmt: skip
        live = job_id > finished
        s.jobs[job_id] = Job(spec=spec, status="pending" if live else "finished")
        if live:
            s.active.add(job_id)
    return s


def walk_ms(state: State, repeat: int) -> float:
    """What the snapshot cost before `State.active`: one pass over every job to find the live
    ones (the rest of the snapshot not included)."""
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        live = [j for j in state.jobs.values() if j.status != "finished"]
        live.sort(key=lambda j: j.job_id)
        times.append((time.process_time() - t0) * 1000)
    return statistics.median(times)


def cpu_ms(state: State, repeat: int) -> tuple[float, int]:
    times = []
    n = 0
    for _ in range(repeat):
        t0 = time.process_time()
        n = len(snapshot_from_state(state, {"ai2/olmo": 0}, 2.0).pending)
        times.append((time.process_time() - t0) * 1000)
    return statistics.median(times), n


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--finished", default="0,10000,100000,1000000")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    print(f"{machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    base, _ = cpu_ms(state_with(0), args.repeat)
    print(f"raw (live state, {PENDING:,} pending, no finished job): {base:.1f} ms CPU")
    print(f"{'finished':>10} {'pending':>8} {'snapshot ms':>11} {'ratio':>6} "
          f"{'(before: the walk alone ms)':>27} {'load':>5}")  # fmt: skip
    worst = 0.0
    for f in (int(x) for x in args.finished.split(",")):
        state = state_with(f)
        ms, n = cpu_ms(state, args.repeat)
        worst = max(worst, ms / base)
        print(f"{f:>10,} {n:>8,} {ms:>11.1f} {ms / base:>6.2f} "
              f"{walk_ms(state, args.repeat):>27.1f} {os.getloadavg()[0]:>5.1f}")  # fmt: skip
    print(f"worst ratio to the live state: {worst:.2f}; goal <= {GOAL_RATIO}: "
          f"ratio {worst / GOAL_RATIO:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
