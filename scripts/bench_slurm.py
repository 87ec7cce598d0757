"""Placement to Slurm job running: gpu-ledger's SlurmExecutor against bare `sbatch`.

    python scripts/bench_slurm.py [--placements 200] [--submits 40] [--interval 1s]

Uses the cluster at $SLURM_CONF, or starts a private one (scripts/slurm/slurm up, private data
directory and free ports) and stops it at the end. Each round places one 1-GPU job on every GPU
of the node; the two arms alternate round by round, so both see the same machine:

- ledger: `SlurmExecutor.carry_out` of the placement, as the service does right after the decision
  is appended (its `sbatch` with the exact node, GPUs, name, comment and log), then the service's
  polling until the exits are seen;
- bare: `sbatch --gres=gpu:1` of the same script, waiting with `squeue`.

The latency of a placement is from the moment it is handed over to the moment the job's own
script runs (it prints its start time first). Prints p50/p99 of each arm and the ratio.

With --submits N (default 40; 0 skips it), a third arm: `gpuledger up --executor slurm
--interval I` on a fresh ledger, and N `gpuledger submit`s of the same 1-GPU script one after
another, each from the moment the CLI is started to the moment the job's script runs (what a
user waits: the CLI, the next cycle, the placement, sbatch, Slurm). Its goal is at most one cycle
interval plus the bare sbatch p99 (issue 24).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchkit import machine, private_service  # noqa: E402

from ledger.cycle.executor import Launch, Orders  # noqa: E402
from ledger.engines.slurm import SlurmExecutor, parse_nodes  # noqa: E402
from schemas.events import GpuSlot  # noqa: E402
from schemas.units import parse_interval  # noqa: E402

SLURM_SCRIPT = ROOT / "scripts" / "slurm" / "slurm"
JOB = ("bash", "-c", "date +%s.%N")


@contextlib.contextmanager
def cluster() -> Iterator[str]:
    """The cluster at $SLURM_CONF, or a private one stopped at the end; yields its config path."""
    conf = os.environ.get("SLURM_CONF")
    if conf:
        yield conf
        return
    with private_service(
        "a private Slurm cluster",
        SLURM_SCRIPT,
        "GPULEDGER_SLURM_DATA",
        ("GPULEDGER_SLURMCTLD_PORT", "GPULEDGER_SLURMD_PORT"),
    ) as private_conf:
        yield private_conf


def started_at(log: Path, timeout_s: float = 120) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return float(log.read_text().split()[0])
        time.sleep(0.02)
    raise SystemExit(f"error: no start time in {log}")


def ledger_round(ex: SlurmExecutor, node: str, gpus: int, first_id: int) -> list[float]:
    handed: dict[int, float] = {}
    for i in range(gpus):
        job_id = first_id + i
        slot = GpuSlot(node=node, gpu_indices=(i,))
        handed[job_id] = time.time()
        launch = Launch(job_id, (slot,), JOB, None, "root", "bench")
        ex.carry_out(Orders(launches=(launch,)), handed[job_id])
    left = set(handed)
    while left:  # the service's observing, until it has seen every exit
        for x in ex.observe(time.time(), {}).exits:
            left.discard(x.job_id)
        time.sleep(0.05)
    return [started_at(ex.log_dir / f"job-{j}.log") - t for j, t in handed.items()]


def bare_round(
    env: dict[str, str], partition: str, out: Path, gpus: int, first: int
) -> list[float]:
    handed: dict[str, tuple[float, Path]] = {}
    for i in range(gpus):
        log = out / f"bare-{first + i}.log"
        t0 = time.time()
        done = subprocess.run(
            ["sbatch", "--parsable", f"--partition={partition}", "--gres=gpu:1", f"--output={log}"],
            input="#!/bin/bash\nexec date +%s.%N\n",
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        handed[done.stdout.strip().split(";")[0]] = (t0, log)
    while True:
        q = subprocess.run(
            ["squeue", "-h", "-j", ",".join(handed), "-o", "%T"],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if not any(s in q.stdout for s in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")):
            break
        time.sleep(0.05)
    return [started_at(log) - t0 for t0, log in handed.values()]


BUDGET = (
    '[accounts."ai2"]\nkind = "program"\n'
    '[accounts."ai2/olmo"]\nkind = "project"\nmembers = ["root"]\n'
)


def service_arm(
    env: dict[str, str], partition: str, node: str, tmp: Path, n: int, interval: str
) -> list[float]:
    """N submissions through `gpuledger up --executor slurm`, one after another: CLI start to
    the job's script running."""
    gl = str(Path(sys.executable).parent / "gpuledger")
    home = tmp / "home"
    env = {k: v for k, v in env.items() if not k.startswith("GPULEDGER_")}
    env |= {"GPULEDGER_HOME": str(home), "GPULEDGER_USER": "root"}

    def cli(*args: str) -> str:
        done = subprocess.run([gl, *args], env=env, capture_output=True, text=True, cwd=tmp)
        if done.returncode != 0:
            raise SystemExit(f"error: gpuledger {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    cli("init", "--admin", "root")
    (tmp / "budget.toml").write_text(BUDGET)
    cli("budget", "apply", str(tmp / "budget.toml"))
    with (tmp / "up.log").open("wb") as log:
        up = subprocess.Popen(
            [gl, "up", "--executor", "slurm", "--partition", partition, "--interval", interval,
             "--run-as", "service"],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while node not in cli("node", "list") and time.monotonic() < deadline:
                time.sleep(0.2)
            out, handed = [], {}
            for i in range(1, n + 1):
                handed[i] = t0 = time.time()
                cli("submit", "-A", "ai2/olmo", "-G", "1", "--", "bash", "-c", "date +%s.%N")
                out.append(started_at(tmp / f"gpuledger-{i}.out") - t0)  # where it was submitted
                print(f"\r{i} submissions", end="", flush=True)
            print()
            breakdown(json.loads(cli("log", "--json", "--limit", "10000")), handed, tmp)
            return out
        finally:
            up.terminate()
            up.wait(timeout=60)


def breakdown(rows: list[dict[str, Any]], handed: dict[int, float], work: Path) -> None:
    """Where a submission's time goes (medians): the CLI until its event is appended, the wait
    for the cycle that places it, and the placement until the job's script runs."""
    at: dict[tuple[str, int], float] = {}
    for r in rows:
        ev = r["event"]
        kind = ev["type"].rsplit(".", 1)[0]
        if kind in ("job.submitted", "job.placed") and ev.get("job_id") in handed:
            at.setdefault((kind, ev["job_id"]), float(ev["at"]))
    cli_s, cycle_s, engine_s = [], [], []
    for j, t0 in handed.items():
        sub, placed = at.get(("job.submitted", j)), at.get(("job.placed", j))
        if sub is None or placed is None:
            continue
        cli_s.append(sub - t0)
        cycle_s.append(placed - sub)
        engine_s.append(started_at(work / f"gpuledger-{j}.out") - placed)
    a, b, c = (statistics.median(xs) * 1000 for xs in (cli_s, cycle_s, engine_s))
    print(f"submit to running, medians: CLI to appended {a:.0f} ms, appended to placed "
          f"{b:.0f} ms, placed to running {c:.0f} ms")  # fmt: skip


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--placements", type=int, default=200)
    ap.add_argument("--partition", default=os.environ.get("GPULEDGER_SLURM_PARTITION", "gpuledger"))
    ap.add_argument("--submits", type=int, default=40)
    ap.add_argument("--interval", default="1s", help="the service arm's cycle interval")
    args = ap.parse_args()
    load0, cpu0, wall0 = os.getloadavg()[0], time.process_time(), time.time()
    served: list[float] = []
    with cluster() as conf, tempfile.TemporaryDirectory(prefix="gpuledger-bench-") as tmp:
        env = dict(os.environ, SLURM_CONF=conf)
        ex = SlurmExecutor(args.partition, "bench" + str(os.getpid()), Path(tmp), env=env)
        ex.check()
        nodes = parse_nodes(
            subprocess.run(["scontrol", "-o", "show", "node"], env=env, capture_output=True,
                           text=True, check=True).stdout,
            args.partition,
        )  # fmt: skip
        node = nodes[0]
        ex.observe(time.time(), {})
        ledger: list[float] = []
        bare: list[float] = []
        n = 0
        while len(ledger) < args.placements:
            ledger += ledger_round(ex, node.name, node.gpus, n + 1)
            bare += bare_round(env, args.partition, Path(tmp), node.gpus, n + 1)
            n += node.gpus
            print(f"\r{len(ledger)} placements per arm", end="", flush=True)
        print()
        if args.submits:
            served = service_arm(
                env, args.partition, node.name, Path(tmp), args.submits, args.interval
            )
    ms = 1000.0
    lp50, lp99 = pct(ledger, 50) * ms, pct(ledger, 99) * ms
    bp50, bp99 = pct(bare, 50) * ms, pct(bare, 99) * ms
    cpu = time.process_time() - cpu0
    print(f"machine: {machine()}; load {load0:.1f} -> {os.getloadavg()[0]:.1f}; wall "
          f"{time.time() - wall0:.0f} s, this process's CPU {cpu:.1f} s")  # fmt: skip
    print(f"{len(ledger)} placements per arm on {node.name} ({node.gpus} GPUs), 1 GPU each")
    print(f"ledger (SlurmExecutor): p50 {lp50:.0f} ms, p99 {lp99:.0f} ms, mean "
          f"{statistics.mean(ledger) * ms:.0f} ms")  # fmt: skip
    print(f"bare sbatch:            p50 {bp50:.0f} ms, p99 {bp99:.0f} ms, mean "
          f"{statistics.mean(bare) * ms:.0f} ms")  # fmt: skip
    print(f"ratio ledger/bare:      p50 {lp50 / bp50:.2f}, p99 {lp99 / bp99:.2f} (goal p99 <= 1.3)")
    if served:
        sp50, sp99 = pct(served, 50) * ms, pct(served, 99) * ms
        goal = parse_interval(args.interval) * ms + bp99
        print(f"submit to running ({len(served)} through `up --interval {args.interval}`): p50 "
              f"{sp50:.0f} ms, p99 {sp99:.0f} ms; goal interval + bare p99 = {goal:.0f} ms: "
              f"{'met' if sp99 <= goal else 'missed'}")  # fmt: skip


if __name__ == "__main__":
    main()
