"""Benchmark: 28 days of the Philly sample on a contended cluster through the full event path.

    python scripts/bench_simulate.py                      # fairshare, 50 nodes x 8 = 400 GPUs
    python scripts/bench_simulate.py --policy slurm --nodes 32
    python scripts/bench_simulate.py --days 7             # shorter
    python scripts/bench_simulate.py --no-fifo            # skip the fifo run

Goal: 28 simulated days in <= 30 s of wall-clock time per policy, every submission, placement,
preemption, checkpoint and exit going through the real ledger (SQLite event store, held in memory
during the run), the real `decide()` and the DuckDB projection for the report. Prints the wall
time, simulated days per second, events per second, and two same-run baselines: the time to
read, decode and fold the run's own event log through the pure domain (the least any simulation
on this ledger does), and
the same workload under `fifo` (the cheapest policy: no ranks, no preemption), so the ratio to it
says what the policy costs whatever the machine's load. The process's CPU time is printed beside
every wall time: on a shared machine it is the figure that does not grow with the load.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.sim.runner import START_AT, Cluster, SimConfig, simulate
from ledger.sim.workload import Assumptions, parse_trace, resolve
from ledger.store.application import Ledger
from ledger.store.clock import SimClock

GOAL_S = 30.0
TRACE = Path(__file__).resolve().parents[1] / "examples/traces/philly-4plusgpu-sample.csv.gz"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--policy", default="fairshare")
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--days", type=float, default=28.0)
    ap.add_argument("--ranks", default="incremental", choices=["incremental", "projection"])
    ap.add_argument("--no-fifo", action="store_true", help="skip the same-run fifo baseline")
    args = ap.parse_args()
    trace = args.trace
    if not trace.exists():
        sys.exit(f"error: no trace at {trace} (pass --trace PATH to a Philly-format .csv.gz)")
    workload = resolve(parse_trace(trace.read_bytes(), str(trace)), Assumptions())
    config = SimConfig(
        policy=args.policy, cluster=Cluster(nodes=args.nodes), days=args.days, ranks=args.ranks
    )
    print(
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "sim"
        t0, c0 = time.perf_counter(), time.process_time()
        result = simulate(workload, config, home)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        m = result.metrics
        # raw baseline: read, decode and fold the run's own log
        t1 = time.perf_counter()
        ledger = Ledger(home, SimClock(START_AT))
        state = State()
        for _, ev in ledger.follow(0):
            evolve(state, ev)
        raw = time.perf_counter() - t1
        ledger.close()
    print(
        f"{args.policy}: {m.days:g} days of {trace.name} on {config.cluster.gpus} GPUs: "
        f"{wall:.1f} s wall, {cpu:.1f} s CPU (goal <= {GOAL_S:.0f} s: {wall / GOAL_S:.2f}x "
        f"the goal in wall time, {cpu / GOAL_S:.2f}x in CPU time)"
    )
    print(
        f"  {m.days / wall:.2f} simulated days/s, {m.events:,} events = {m.events / wall:,.0f} "
        f"events/s, {m.cycles:,} dispatcher cycles = {m.cycles / wall:,.0f} cycles/s"
    )
    print(
        f"  raw baseline (read + decode + fold the same {m.events:,} events): {raw:.2f} s; "
        f"the simulation takes {wall / raw:.0f}x that"
    )
    print(
        f"  owed by period {m.owed_by_period or 0:.1%}, occupancy {m.occupancy:.1%}, "
        f"{m.preemptions} preemptions"
    )
    if args.no_fifo or args.policy == "fifo":
        return
    fifo = SimConfig(
        policy="fifo", cluster=Cluster(nodes=args.nodes), days=args.days, ranks=args.ranks
    )
    with tempfile.TemporaryDirectory() as tmp:
        t2, c2 = time.perf_counter(), time.process_time()
        simulate(workload, fifo, Path(tmp) / "fifo")
        base, base_cpu = time.perf_counter() - t2, time.process_time() - c2
    print(
        f"  same-run baseline: fifo {base:.1f} s wall, {base_cpu:.1f} s CPU "
        f"({base_cpu / GOAL_S:.2f}x the goal); {args.policy} / fifo = {wall / base:.2f} wall, "
        f"{cpu / base_cpu:.2f} CPU"
    )
    print(f"  load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
