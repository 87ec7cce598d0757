"""Benchmark: one whole dispatcher cycle on a real ledger and projection (goal <= 250 ms).

World: 1,024 nodes x 8 GPUs, a busy cluster (the first cycle fills it), then 10,000 pending jobs.
Before each timed cycle some running jobs finish (not timed), so every cycle really places work
and appends its decision. A cycle = `Dispatcher.cycle(now)`: catch up the ledger, catch the DuckDB
projection up to the snapshot position and compute fair-share ranks, build the snapshot, the pure
`decide()` (the default policy), append the decision expecting the snapshot position, launch on
the simulation kernel's executor (`ledger.sim.kernel.KernelExecutor`) and record the starts. The
same run times `decide()` alone on the same snapshot: the raw baseline.

    python scripts/bench_cycle.py                  # 1,024 nodes, 10,000 pending, 15 cycles
    python scripts/bench_cycle.py --nodes 256 --pending 2000 --cycles 5
    python scripts/bench_cycle.py --history /tmp/gpuledger-history/5000000   # on 5M events

With --history DIR the cycles run on a copy of the log in DIR (`scripts/bench_history.py` makes
them: 1,024 x 8 GPUs and N events of history) with a live ledger started from its snapshot and
its projection, instead of an empty ledger: the same 10,000 pending jobs, the same cycles, so the
p99 can be compared across history sizes (goal: within 20% between 10k and 5M events).

With --pg-history DIR the same, on a PostgreSQL store: DIR is a home `scripts/bench_pg_history.py`
made (N-pg beside the SQLite history N: its `pg.json` names the database, loaded by `gpuledger
store copy`); the cycles run on a private copy of that database (`CREATE DATABASE ... TEMPLATE`,
on the server of $GPULEDGER_PG_DSN, dropped at the end), with the home's snapshot key and
projection copied, so every append of a cycle is a PostgreSQL transaction:

    GPULEDGER_PG_DSN=$(scripts/postgres/postgres up) \
        python scripts/bench_cycle.py --pg-history /tmp/gpuledger-history/5000000-pg
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ledger.cycle.dispatcher import Dispatcher, ProjectionRanks
from ledger.cycle.executor import Orders
from ledger.cycle.inputs import snapshot_from_state
from ledger.dispatch import registry
from ledger.dispatch.engine import decide
from ledger.sim.kernel import KernelExecutor
from ledger.store import locate, snapshots
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from projections.projector import Projector
from projections.store import PROJECTIONS_DIR, Store
from schemas import commands as c
from schemas.events import CycleDecided, tag_of

GOAL_MS = 250.0
RECORD_GOAL = 64 * 1024
DECIDED = tag_of(CycleDecided)


def record_bytes(ledger: Ledger, based_on: int) -> int:
    """Stored size of the decision record appended after `based_on` (0: none)."""
    for _position, raw in ledger.follow_raw(based_on, tags=[DECIDED], page=1):
        return len(raw)
    return 0


def build(
    home: Path, nodes: int, clock: SimClock, rng: random.Random, history: Path | None = None
) -> Ledger:
    if history is not None:
        for f in history.glob("events.sqlite*"):
            shutil.copy(f, home / f.name)
        if (history / snapshots.STATE_KEY).exists():  # the snapshot's signing key
            shutil.copy2(history / snapshots.STATE_KEY, home / snapshots.STATE_KEY)
        if (history / PROJECTIONS_DIR).is_dir():
            shutil.copytree(history / PROJECTIONS_DIR, home / PROJECTIONS_DIR)
    ledger = Ledger(home, clock, seeded_ids(1), live=history is not None)
    if history is None:
        ledger.execute(c.InitLedger(actor="root", admin="root"))
    else:
        clock.advance_to(max(clock.now(), last_event_at(ledger) + 60))
    cmds: list[c.AnyCommand] = [c.OpenAccount(actor="root", path="org", kind="program")]
    for p in range(12):
        cmds.append(c.OpenAccount(actor="root", path=f"org/p{p}", kind="project", shares=1 + p % 4))
        cmds += [c.AddMember(actor="root", user=f"u{p}x{u}", project=f"org/p{p}") for u in range(5)]
    if history is None:  # a history brings its own 1,024 nodes
        cmds += [
            c.RegisterNode(actor="root", node=f"n{i:04d}", gpu_type="h100", gpus=8)
            for i in range(nodes)
        ]
    ledger.execute_all(cmds)
    return ledger


@contextmanager
def pg_copy(history: Path, home: Path) -> Iterator[None]:
    """`home` names a private copy of the PostgreSQL database of the history home `history`
    (a file copy on the server: `CREATE DATABASE ... TEMPLATE`), dropped at the end."""
    import psycopg

    admin = os.environ.get("GPULEDGER_PG_DSN", "")
    if not admin:
        sys.exit("error: --pg-history needs GPULEDGER_PG_DSN (the server the history is on)")
    source = json.loads((history / "pg.json").read_text())["dsn"]
    template = source.rsplit("/", 1)[1].partition("?")[0]
    name = f"bench_cycle_{os.getpid()}"
    with psycopg.connect(admin, autocommit=True) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        con.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    base, _, rest = source.partition("?")
    locate.remember(home, base.rsplit("/", 1)[0] + "/" + name + (f"?{rest}" if rest else ""))
    try:
        yield
    finally:
        with psycopg.connect(admin, autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def last_event_at(ledger: Ledger) -> float:
    ((_, last),) = ledger.read(ledger.position - 1, 1)
    return last.at


def submissions(n: int, rng: random.Random) -> list[c.AnyCommand]:
    out: list[c.AnyCommand] = []
    for _ in range(n):
        p = rng.randrange(12)
        gpus = rng.choice([1, 1, 2, 4, 8, 8, 16, 32])
        out.append(
            c.SubmitJob(
                actor=f"u{p}x{rng.randrange(5)}",
                account=f"org/p{p}",
                gpus=gpus,
                min_runtime_s=rng.choice([0, 600, 3600, 8 * 3600]),
                resumable=rng.random() < 0.6,
                priority=rng.randrange(3),
            )
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--cycles", type=int, default=15)
    ap.add_argument(
        "--finish", type=int, default=40, help="running jobs that end before each cycle"
    )
    ap.add_argument("--history", type=Path, default=None, help="run on a copy of this log")
    ap.add_argument(
        "--pg-history",
        type=Path,
        default=None,
        help="run on a copy of this PostgreSQL history home (bench_pg_history.py's N-pg)",
    )
    ap.add_argument("--profile", type=Path, default=None, help="cProfile the timed cycles here")
    args = ap.parse_args()
    profiler = cProfile.Profile() if args.profile else None
    rng = random.Random(7)
    clock = SimClock(1_000_000.0)
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-cycle-")))
        if args.pg_history is not None:
            stack.enter_context(pg_copy(args.pg_history, home))
        store_kind = "postgresql" if args.pg_history is not None else "sqlite"
        ledger = build(home, args.nodes, clock, rng, args.history or args.pg_history)
        stack.callback(ledger.close)
        source = stack.enter_context(locate.open_source(home))
        with Store.open(home) as store:
            executor = KernelExecutor()
            d = Dispatcher(
                ledger,
                ProjectionRanks(Projector(store, source)),
                registry.build(),
                executor,
            )
            # fill the cluster, then queue the pending work (not timed)
            ledger.execute_all(submissions(args.nodes * 3, rng))
            clock.advance_to(clock.now() + 60)
            d.cycle(clock.now())
            queued = submissions(args.pending, rng)
            for at in range(0, len(queued), 5_000):  # a request writes at most 16 MiB
                ledger.execute_all(queued[at : at + 5_000])
            clock.advance_to(clock.now() + 60)
            d.cycle(clock.now())
            times, cpus, decides, placed, sizes = [], [], [], [], []
            for _ in range(args.cycles):
                running = sorted(
                    j.job_id for j in ledger.state.jobs.values() if j.status == "running"
                )
                ending = rng.sample(running, min(args.finish, len(running)))
                ledger.execute_all(
                    [c.FinishJob(actor="@executor", job_id=j, exit_code=0) for j in ending]
                )
                executor.carry_out(Orders(stops=tuple(ending)), clock.now())
                clock.advance_to(clock.now() + 60)
                t0, c0 = time.perf_counter(), time.process_time()
                if profiler is not None:
                    profiler.enable()
                result = d.cycle(clock.now())
                if profiler is not None:
                    profiler.disable()
                times.append((time.perf_counter() - t0) * 1000)
                cpus.append((time.process_time() - c0) * 1000)
                placed.append(len(result.decision.placements))
                sizes.append(record_bytes(ledger, result.position))
                # raw baseline: decide() alone on the snapshot the cycle saw
                ranks, level_fs = d.rank_source.ranks(clock.now(), ledger.position)
                snap = snapshot_from_state(
                    ledger.state, ranks, clock.now(), level_fs=level_fs, position=ledger.position
                )
                t1 = time.perf_counter()
                decide(snap, d.policy, clock.now())
                decides.append((time.perf_counter() - t1) * 1000)
            history = ledger.position
            pending = sum(1 for j in ledger.state.jobs.values() if j.status == "pending")
            running_n = sum(1 for j in ledger.state.jobs.values() if j.status == "running")
    if profiler is not None:
        profiler.dump_stats(args.profile)
    p50 = statistics.median(times)
    p99 = max(times) if len(times) < 100 else statistics.quantiles(times, n=100)[98]
    cpu_p99 = max(cpus) if len(cpus) < 100 else statistics.quantiles(cpus, n=100)[98]
    print(
        f"bench_cycle: {args.nodes} nodes x 8 GPUs, ~{pending:,} pending, {running_n:,} running, "
        f"{args.cycles} cycles, history {history:,} events, store {store_kind}, "
        f"load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print(
        f"whole cycle: p50 {p50:.1f} ms, max {p99:.1f} ms; "
        f"goal <= {GOAL_MS:.0f} ms: ratio {p99 / GOAL_MS:.2f}"
    )
    print(
        f"whole cycle CPU time (all threads of the process): p50 {statistics.median(cpus):.1f} "
        f"ms, max {cpu_p99:.1f} ms; goal <= {GOAL_MS:.0f} ms: ratio {cpu_p99 / GOAL_MS:.2f}"
    )
    print(
        f"decide() alone (raw baseline, same snapshots): p50 {statistics.median(decides):.1f} ms; "
        f"cycle / decide = {p50 / statistics.median(decides):.1f}x; "
        f"placed per cycle p50 {statistics.median(placed):.0f}"
    )
    print(
        f"decision record: max {max(sizes):,} bytes stored; goal <= {RECORD_GOAL:,}: "
        f"ratio {max(sizes) / RECORD_GOAL:.3f}"
    )


if __name__ == "__main__":
    main()
