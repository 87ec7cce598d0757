"""Benchmark: what grows with history. For each log size N (10k, 100k, 1M, 5M events of a realistic
mix, `projections.testing.synthetic` on 1,024 x 8 GPUs, with real `cycle.decided.v2` records), made
once and cached in --dir (never commit it):

  bytes/event   the store (`events.sqlite`) and the DuckDB projection, on disk, per event
  cold start    a live `Ledger` with no snapshot: the whole log folded once (then snapshotted)
  start         the service's start in a fresh process: the live ledger from its newest
                snapshot plus the tail, the projection opened and caught up, one preview of the
                cycle (snapshot, ranks, decide) (goal <= 5 s at 5M)
  RSS           that process's peak resident memory (goal: at 5M <= 1.5x at 100k)
  pend          the jobs pending at the end of the log (what `queue` shows and its preview orders;
                the synthetic logs end with none: `--pending N` submits jobs until N wait, in
                place, so give it a --dir of its own; the CLI is timed before `serve`, whose
                first cycle places what fits)
  serve start   `gpuledger serve` itself, from its launch until it prints that it listens:
                wall and CPU seconds (goal <= 5 s at 5M); stopped with SIGTERM
  CLI           `gpuledger queue`, `jobs`, `shares` wall and CPU time, best of 3 after a run not
                timed, bytecode cached as an install has it (goal <= 300 ms)

    python scripts/bench_history.py                         # 10k, 100k, 1M, 5M in /tmp
    python scripts/bench_history.py --sizes 10000,100000 --dir /tmp/gpuledger-history
    python scripts/bench_history.py --pending 2000 --dir /tmp/gpuledger-history-pending
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ledger.store import EVENTS_DB, locate
from ledger.store.application import Ledger
from projections.projector import Projector
from projections.store import Store, projection_path
from projections.testing.synthetic import Shape, append_to_store, synthetic_events

SEED = 1
START_GOAL_S = 5.0
CLI_GOAL_MS = 300.0
RSS_GOAL = 1.5
CLI_TIMEOUT_S = 120.0

_START = """
import json, resource, sys, time
t0 = time.perf_counter()
from pathlib import Path
from ledger.store.application import Ledger
from ledger.dispatch.policy import FairShare
from ledger.cycle.dispatcher import StoreRanks, preview
from projections.projector import Projector
from ledger.store import locate
from projections.store import Store
home = Path(sys.argv[1])
t1 = time.perf_counter()
ledger = Ledger(home, live=True)
tail = ledger.position - ledger.snapshot_position
with Store.open(home) as store, locate.open_source(home) as source:
    Projector(store, source).catch_up()
    snap, decision = preview(ledger, StoreRanks(store), FairShare(), ledger.clock.now())
t2 = time.perf_counter()
print(json.dumps({"start_s": t2 - t1, "imports_s": t1 - t0, "tail": tail,
                  "live_jobs": len(ledger.state.jobs), "pending": len(snap.pending),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def ensure_log(home: Path, events: int) -> dict[str, float]:
    """Make (or reuse) the synthetic log of `events` events; return the cached facts."""
    marker = home / "history.json"
    if marker.exists():
        info: dict[str, float] = json.loads(marker.read_text())
        return info
    t0 = time.perf_counter()
    head = append_to_store(home, synthetic_events(events, seed=SEED, shape=Shape(nodes=1024)))
    info = {"events": head, "write_s": time.perf_counter() - t0}
    marker.write_text(json.dumps(info))
    return info


def prepare(home: Path, info: dict[str, float]) -> dict[str, float]:
    """Cold start (whole fold, then a snapshot) and the projection, once per log."""
    if "cold_start_s" not in info:
        t0 = time.perf_counter()
        ledger = Ledger(home, live=True)
        info["cold_start_s"] = time.perf_counter() - t0
        ledger.snapshot_state()
        ledger.close()
    if "catch_up_s" not in info:
        t0 = time.perf_counter()
        with Store.open(home) as store, locate.open_source(home) as source:
            Projector(store, source).catch_up()
        info["catch_up_s"] = time.perf_counter() - t0
    (home / "history.json").write_text(json.dumps(info))
    return info


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cli_ms(home: Path, *args: str) -> tuple[float, float]:
    """(wall ms, CPU ms of the process: user + system), each the best of 3 after one run not
    timed. The CLI runs with its bytecode cached, as an installed package has it (pip compiles
    it at install): with PYTHONDONTWRITEBYTECODE set, every run would compile our modules again
    (~100 ms)."""
    exe = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    best = best_cpu = float("inf")
    for attempt in range(4):
        t0, c0 = time.perf_counter(), _children_cpu()
        try:
            subprocess.run(
                [exe, "--home", str(home), *args],
                check=True,
                capture_output=True,
                timeout=CLI_TIMEOUT_S,
                env=env,
            )
        except subprocess.TimeoutExpired:
            return float("inf"), float("inf")
        if attempt == 0:
            continue  # writes the bytecode cache, and warms the page cache
        best = min(best, (time.perf_counter() - t0) * 1000)
        best_cpu = min(best_cpu, (_children_cpu() - c0) * 1000)
    return best, best_cpu


def start(home: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _START, str(home)], check=True, capture_output=True, text=True
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def serve_start(home: Path) -> tuple[float, float]:
    """(wall s, CPU s) of `gpuledger serve` from its launch until it prints that it listens."""
    exe = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPULEDGER_") and k != "PYTHONDONTWRITEBYTECODE"
    }
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [exe, "--home", str(home), "serve", "--listen", "127.0.0.1:0", "--interval", "1h"],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if "listening on" in line:
                wall = time.perf_counter() - t0
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
                return wall, cpu
        raise SystemExit(f"serve exited with {proc.wait()} before it listened")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=CLI_TIMEOUT_S)


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def add_pending(home: Path, want: int) -> None:
    """Submit 1-GPU jobs of one hour, round robin over the tree's members, until `want` jobs
    wait (each member submits to its own project), so `queue` previews a real queue."""
    from schemas.commands import SubmitJob

    ledger = Ledger(home, live=True)
    try:
        have = sum(1 for j in ledger.state.jobs.values() if j.status == "pending")
        members = sorted((user, project) for project, users in ledger.state.members.items()
                         for user in users)  # fmt: skip
        cmds = [
            SubmitJob(actor=user, account=project, gpus=1, duration_s=3600, command=("true",))
            for user, project in (members[i % len(members)] for i in range(max(0, want - have)))
        ]
        for i in range(0, len(cmds), 500):
            ledger.execute_all(cmds[i : i + 500])
    finally:
        ledger.close()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="10000,100000,1000000,5000000")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/gpuledger-history"))
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI timings")
    ap.add_argument(
        "--pending", type=int, default=0, help="submit jobs until this many wait (in place)"
    )
    ap.add_argument(
        "--no-serve", action="store_true", help="skip `serve` (its first cycle places jobs)"
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(f"{os.cpu_count()} cores, {mem:.0f} GiB, Python {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")  # fmt: skip
    print(
        f"{'events':>10} {'store B/ev':>10} {'proj B/ev':>9} {'cold s':>7} {'start s':>7} "
        f"{'tail':>6} {'live':>6} {'pend':>6} {'RSS MB':>7} {'queue ms':>8} {'jobs ms':>8} "
        f"{'shares ms':>9} "
        f"{'(CPU ms: queue':>14} {'jobs':>5} {'shares)':>7} {'serve s':>7} {'(CPU s)':>7} "
        f"{'load':>5}"
    )
    rss: dict[int, float] = {}
    starts: dict[int, float] = {}
    serves: dict[int, tuple[float, float]] = {}
    cli: list[float] = []
    cli_cpu: list[float] = []
    for n in sizes:
        home = args.dir / str(n)
        info = prepare(home, ensure_log(home, n))
        if args.pending:
            add_pending(home, args.pending)
        s = start(home)
        rss[n], starts[n] = s["rss_mb"], s["start_s"]
        times = cpus = [float("nan")] * 3
        if not args.no_cli:  # before serve, whose first cycle places what it can
            measured = [cli_ms(home, "queue"), cli_ms(home, "jobs"), cli_ms(home, "shares")]
            times, cpus = [m[0] for m in measured], [m[1] for m in measured]
            cli += times
            cli_cpu += cpus
        serves[n] = (float("nan"), float("nan")) if args.no_serve else serve_start(home)
        print(
            f"{n:>10,} {size_of(home / EVENTS_DB) / n:>10.0f} "
            f"{size_of(projection_path(home)) / n:>9.0f} {info['cold_start_s']:>7.1f} "
            f"{s['start_s']:>7.2f} {s['tail']:>6,.0f} {s['live_jobs']:>6,.0f} "
            f"{s['pending']:>6,.0f} {s['rss_mb']:>7.0f} "
            f"{times[0]:>8.0f} {times[1]:>8.0f} {times[2]:>9.0f} {cpus[0]:>14.0f} {cpus[1]:>5.0f} "
            f"{cpus[2]:>7.0f} {serves[n][0]:>7.2f} {serves[n][1]:>7.2f} "
            f"{os.getloadavg()[0]:>5.1f}",
            flush=True,
        )
    top = max(sizes)
    print(f"start at {top:,}: {starts[top]:.2f} s; goal <= {START_GOAL_S:g} s: "
          f"ratio {starts[top] / START_GOAL_S:.2f}")  # fmt: skip
    print(f"serve start at {top:,}: {serves[top][0]:.2f} s (CPU {serves[top][1]:.2f} s); goal <= "
          f"{START_GOAL_S:g} s: ratio {serves[top][0] / START_GOAL_S:.2f}; growth "
          f"{serves[top][0] / serves[min(sizes)][0]:.2f}x from {min(sizes):,}")  # fmt: skip
    if 100_000 in rss:
        ratio = rss[top] / rss[100_000]
        print(f"RSS at {top:,} / RSS at 100,000: {ratio:.2f}; goal <= {RSS_GOAL}: "
              f"ratio {ratio / RSS_GOAL:.2f}")  # fmt: skip
    if cli:
        worst = max(cli)
        print(f"CLI worst: {worst:.0f} ms; goal <= {CLI_GOAL_MS:.0f} ms: "
              f"ratio {worst / CLI_GOAL_MS:.2f}")  # fmt: skip
        worst_cpu = max(cli_cpu)
        print(f"CLI worst CPU time: {worst_cpu:.0f} ms; goal <= {CLI_GOAL_MS:.0f} ms: "
              f"ratio {worst_cpu / CLI_GOAL_MS:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
