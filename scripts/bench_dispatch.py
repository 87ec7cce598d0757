"""Benchmark: one dispatcher `decide()` on a mostly busy cluster.

    python scripts/bench_dispatch.py                # headline + growth table (~1 min, 2 cores)
    python scripts/bench_dispatch.py --quick        # headline only
    python scripts/bench_dispatch.py --clock cpu    # process time: steadier on a busy machine
    python scripts/bench_dispatch.py --quick --pending 50000 --nodes 4096 --goal-ms 250
                                                    # issue 26's figure
    python scripts/bench_dispatch.py --quick --record  # + the decision record's waiting summary

Headline: 10,000 pending jobs on 1,024 nodes x 8 GPUs with ~90% of the GPUs held by running jobs
(a mix of sizes, gang jobs, contracts in and past their term, unfunded work, squatters, draining
nodes). Goal: p99 of decide() <= 100 ms. Printed with the ratio to the goal and, as a same-run
raw baseline, the time to build and sort the 10,000 sort keys alone (the least any ordering
dispatcher does).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from collections.abc import Callable

from ledger.dispatch import (
    Decision,
    NodeView,
    PendingJob,
    Policy,
    RunningJob,
    Snapshot,
    decide,
    registry,
)
from ledger.dispatch.ordering import fairshare_key
from ledger.dispatch.snapshot import NodeState
from schemas.digest import summarise
from schemas.events import GpuSlot

GOAL_S = 0.100
NOW = 1_800_000_000.0
HOUR = 3600


def world(pending: int, nodes: int, seed: int = 7, busy: float = 0.9) -> Snapshot:
    """A seeded synthetic cluster: 12 projects x 5 users, 7/8 h100 and 1/8 a100 nodes."""
    rng = random.Random(seed)
    projects = [f"lab/p{i:02d}" for i in range(12)]
    rng.shuffle(projects)
    ranks: dict[str, int] = {}
    level_fs: dict[str, float] = {}
    leaves: list[tuple[str, str]] = []
    fs = sorted((rng.lognormvariate(0, 1) for _ in projects), reverse=True)
    for p, f in zip(projects, fs, strict=True):
        level_fs[p] = f
        ufs = sorted((rng.lognormvariate(0, 1) for _ in range(5)), reverse=True)
        for u, g in enumerate(ufs):
            user = f"u{u}"
            ranks[f"{p}/{user}"] = len(ranks)
            level_fs[f"{p}/{user}"] = g
            leaves.append((p, user))
    ranks["lab"] = 0
    for p in projects:
        ranks[p] = min(v for k, v in ranks.items() if k.startswith(p + "/"))
    # the numbers behind the ranks (`Snapshot.usage`, `shares`; only fairshare-10 reads them):
    # equal shares, usage a week of 90% of the GPUs split as the level fair shares say
    week = 7 * 86400 * nodes * 8 * busy
    weights = {p: 1.0 / f for p, f in zip(projects, fs, strict=True)}
    usage = {"lab": week, **{p: week * w / sum(weights.values()) for p, w in weights.items()}}
    shares = {"lab": 1.0, **dict.fromkeys(projects, 1.0 / len(projects))}

    views: list[NodeView] = []
    running: list[RunningJob] = []
    job_id = 1
    free: dict[str, list[int]] = {}
    types: dict[str, str] = {}
    for i in range(nodes):
        name = f"n{i:05d}"
        types[name] = "a100" if i % 8 == 7 else "h100"
        free[name] = list(range(8))
    names = list(free)
    rng.shuffle(names)

    def new_running(gpus: int, slots: tuple[GpuSlot, ...]) -> RunningJob:
        nonlocal job_id
        project, user = rng.choice(leaves)
        placed = NOW - rng.uniform(0, 12 * HOUR)
        contract = rng.choice((0, HOUR, 4 * HOUR, 8 * HOUR, 8 * HOUR))
        resumable = rng.random() < 0.6
        job = RunningJob(
            job_id=job_id,
            account=project,
            user=user,
            gpus=gpus,
            slots=slots,
            placed_at=placed,
            min_runtime_s=contract,
            resumable=resumable,
            checkpoint_at=rng.uniform(placed, NOW) if resumable else placed,
            low_util_since=NOW - rng.uniform(0, 3 * HOUR) if rng.random() < 0.05 else None,
        )
        job_id += 1
        return job

    if busy <= 0:
        names = []  # an idle cluster: nobody runs anything
    # gang jobs over whole nodes first (about 20% of the GPUs), then one-node jobs; leave
    # 1-3 GPUs free on some nodes and a few nodes whole, for about (1 - busy) free overall
    held = 0
    k = 0
    while held < 0.2 * nodes * 8 and k + 4 <= len(names):
        width = rng.choice((2, 4))
        group = names[k : k + width]
        k += width
        slots = tuple(GpuSlot(node=n, gpu_indices=tuple(range(8))) for n in group)
        for n in group:
            free[n] = []
        running.append(new_running(8 * width, slots))
        held += 8 * width
    spare = (1 - busy) * 8
    for n in names[k:]:
        r = rng.random()
        leave = 8 if r < spare / 16 else (rng.choice((1, 2, 3)) if r < spare / 2.5 else 0)
        while len(free[n]) > leave:
            size = min(rng.choice((1, 1, 2, 2, 4, 4, 8)), len(free[n]) - leave)
            idx, free[n] = tuple(free[n][:size]), free[n][size:]
            running.append(new_running(size, (GpuSlot(node=n, gpu_indices=idx),)))
    for i, name in enumerate(sorted(free)):
        state: NodeState = "draining" if i % 50 == 25 else "active"
        views.append(
            NodeView(
                name=name,
                cluster="c1",
                gpu_type=types[name],
                gpus=8,
                state=state,
                free=tuple(free[name]),
            )
        )

    sizes = (1, 1, 1, 2, 2, 4, 4, 8, 8, 8, 16, 32, 64)
    jobs: list[PendingJob] = []
    for _ in range(pending):
        project, user = rng.choice(leaves)
        size = rng.choice(sizes)
        debug = size <= 8 and rng.random() < 0.03
        r = rng.random()
        gpu_type = "h100" if r < 0.3 else ("a100" if r < 0.35 else None)
        jobs.append(
            PendingJob(
                job_id=job_id,
                account=project,
                user=user,
                gpus=size,
                gpu_type=gpu_type,
                min_runtime_s=0 if rng.random() < 0.2 else (600 if debug else 4 * HOUR),
                resumable=rng.random() < 0.6,
                priority=rng.randrange(4),
                submitted_at=NOW - rng.uniform(0, 2 * 86400),
                debug=debug,
                time_limit_s=600 if debug else None,
            )
        )
        job_id += 1
    return Snapshot(
        position=123_456,
        taken_at=NOW,
        nodes=tuple(views),
        running=tuple(running),
        pending=tuple(jobs),
        ranks=ranks,
        level_fs=level_fs,
        usage=usage,
        shares=shares,
    )


def timed(fn: Callable[[], object], runs: int, clock: Callable[[], float]) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def ms(x: float) -> str:
    return f"{x * 1000:7.1f} ms"


def row(
    pending: int,
    nodes: int,
    runs: int,
    policy: Policy,
    clock: Callable[[], float],
    busy: float = 0.9,
) -> tuple[list[float], Snapshot]:
    snap = world(pending, nodes, busy=busy)
    decide(snap, policy, NOW)  # warm up
    return timed(lambda: decide(snap, policy, NOW), runs, clock), snap


def record(fresh: Callable[[], Decision], runs: int, clock: Callable[[], float]) -> None:
    """What writing the decision down costs beside `decide()`: the waiting summary its record
    keeps, as `cycle.decided.v4` builds it (from the runs) and as v3 did (a `Considered` per job,
    then the per-job digest), interleaved in the same run; and the whole command. Each is timed
    on a fresh decision (`fresh()`, not timed): a decision builds its sort keys when first asked
    (`ordering.Ordered`), and the record is what asks."""
    v4: list[float] = []
    v3: list[float] = []
    cmd: list[float] = []
    for _ in range(runs):
        d = fresh()
        v4 += timed(d.summary, 1, clock)
        d = fresh()
        v3 += timed(lambda d=d: summarise(d.considered()), 1, clock)  # type: ignore[misc]
        d = fresh()
        cmd += timed(lambda d=d: d.to_command("@dispatcher", "cycle-1"), 1, clock)  # type: ignore[misc]
    s = d.summary()
    print(
        f"record: waiting summary v4 (runs) p50 {ms(pct(v4, 0.5))} p99 {ms(pct(v4, 0.99))}; "
        f"v3 (per job) p50 {ms(pct(v3, 0.5))} p99 {ms(pct(v3, 0.99))}; "
        f"v3 / v4 = {pct(v3, 0.5) / pct(v4, 0.5):.1f}x; {s.runs} runs of {s.waiting()} waiting"
    )
    print(f"record: to_command (v4) p50 {ms(pct(cmd, 0.5))} p99 {ms(pct(cmd, 0.99))}")
    both = timed(lambda: fresh().to_command("@dispatcher", "cycle-1"), runs, clock)
    print(f"decide() + to_command (a cycle that records): p50 {ms(pct(both, 0.5))} "
          f"p99 {ms(pct(both, 0.99))}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument(
        "--policy",
        default=registry.DEFAULT,
        help="a registered policy name or version (default: the current fair share)",
    )
    ap.add_argument(
        "--budget",
        type=int,
        default=None,
        help="victim searches per cycle (the policy's search_budget; default its own)",
    )
    ap.add_argument("--quick", action="store_true", help="headline only")
    ap.add_argument(
        "--record",
        action="store_true",
        help="also time the decision record's waiting summary (v4 from runs, v3 per job)",
    )
    ap.add_argument("--pending", type=int, default=10_000, help="headline: pending jobs")
    ap.add_argument("--nodes", type=int, default=1024, help="headline: nodes of 8 GPUs")
    ap.add_argument("--goal-ms", type=float, default=GOAL_S * 1000, help="headline: p99 goal")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: perf_counter (the goal); cpu: process_time, steadier on a shared machine",
    )
    args = ap.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    knobs = {} if args.budget is None else {"search_budget": args.budget}
    policy = registry.build(args.policy, knobs)
    budget = getattr(policy, "search_budget", 0)
    today = time.strftime("%Y-%m-%d")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"python {platform.python_version()}, {os.cpu_count()} cpus, load {load}, {today}")

    goal = args.goal_ms / 1000
    snap = world(args.pending, args.nodes)
    d = decide(snap, policy, NOW)
    ranks = snap.ranks
    times: list[float] = []
    base: list[float] = []
    for _ in range(args.runs):  # interleaved, so the ratio compares like with like
        times += timed(lambda: decide(snap, policy, NOW), 1, clock)
        base += timed(lambda: sorted(fairshare_key(j, ranks) for j in snap.pending), 1, clock)
    total = sum(n.gpus for n in snap.nodes)
    free = sum(len(n.free) for n in snap.nodes)
    p50, p99, b50 = pct(times, 0.5), pct(times, 0.99), statistics.median(base)
    print(
        f"world: {len(snap.pending)} pending, {len(snap.nodes)} nodes, "
        f"{len(snap.running)} running, {free}/{total} GPUs free"
    )
    print(
        f"decision: {len(d.placements)} placed, {len(d.preemptions)} preempted, "
        f"{len(d.waiting)} waiting, fragmentation {d.fragmentation_gpus} GPUs "
        f"({policy.version}, search budget {budget})"
    )
    print(
        f"decide() {args.pending:,} pending x {args.nodes:,} nodes ({args.clock} clock): "
        f"p50 {ms(p50)}  "
        f"p99 {ms(p99)}  ({args.runs} runs)"
    )
    print(f"ratio p99 / goal {goal * 1000:.0f} ms: {p99 / goal:.2f}")
    print(
        f"raw baseline (build + sort the sort keys): p50 {ms(b50)}; decide p50 / baseline: "
        f"{p50 / b50:.1f}x"
    )
    if args.record:
        record(lambda: decide(snap, policy, NOW), args.runs, clock)
    if args.quick:
        return
    runs = max(5, args.runs // 3)
    print(f"\ngrowth ({runs} runs each, {args.clock} clock)")
    print(
        f"{'pending':>8} {'nodes':>6} {'busy':>5} {'p50':>10} {'p99':>10} "
        f"{'placed':>7} {'preempted':>9}"
    )
    for pending, nodes, busy in (
        (1_000, 1024, 0.9),
        (10_000, 1024, 0.9),
        (30_000, 1024, 0.9),
        (10_000, 256, 0.9),
        (10_000, 4096, 0.9),
        (10_000, 1024, 0.0),
    ):
        t, snap = row(pending, nodes, runs, policy, clock, busy)
        d = decide(snap, policy, NOW)
        print(
            f"{pending:>8} {nodes:>6} {busy:>5.1f} {ms(pct(t, 0.5)):>10} {ms(pct(t, 0.99)):>10} "
            f"{len(d.placements):>7} {len(d.preemptions):>9}"
        )


if __name__ == "__main__":
    main()
