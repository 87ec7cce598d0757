"""Placement to Slurm job running: gpu-ledger's SlurmExecutor against bare `sbatch`.

    python scripts/bench_slurm.py [--placements 200] [--gpus 4]

Uses the cluster at $SLURM_CONF, or starts a private one (scripts/slurm/slurm up, private data
directory and free ports) and stops it at the end. Each round places one 1-GPU job on every GPU
of the node; the two arms alternate round by round, so both see the same machine:

- ledger: `SlurmExecutor.carry_out` of the placement, as the service does right after the decision
  is appended (its `sbatch` with the exact node, GPUs, name, comment and log), then the service's
  polling until the exits are seen;
- bare: `sbatch --gres=gpu:1` of the same script, waiting with `squeue`.

The latency of a placement is from the moment it is handed over to the moment the job's own
script runs (it prints its start time first). Prints p50/p99 of each arm and the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchkit import machine, private_service  # noqa: E402

from ledger.cycle.executor import Launch, Orders  # noqa: E402
from ledger.engines.slurm import SlurmExecutor, parse_nodes  # noqa: E402
from schemas.events import GpuSlot  # noqa: E402

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


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--placements", type=int, default=200)
    ap.add_argument("--partition", default=os.environ.get("GPULEDGER_SLURM_PARTITION", "gpuledger"))
    args = ap.parse_args()
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
    ms = 1000.0
    lp50, lp99 = pct(ledger, 50) * ms, pct(ledger, 99) * ms
    bp50, bp99 = pct(bare, 50) * ms, pct(bare, 99) * ms
    print(f"machine: {machine()}; load {os.getloadavg()[0]:.1f}")
    print(f"{len(ledger)} placements per arm on {node.name} ({node.gpus} GPUs), 1 GPU each")
    print(f"ledger (SlurmExecutor): p50 {lp50:.0f} ms, p99 {lp99:.0f} ms, mean "
          f"{statistics.mean(ledger) * ms:.0f} ms")  # fmt: skip
    print(f"bare sbatch:            p50 {bp50:.0f} ms, p99 {bp99:.0f} ms, mean "
          f"{statistics.mean(bare) * ms:.0f} ms")  # fmt: skip
    print(f"ratio ledger/bare:      p50 {lp50 / bp50:.2f}, p99 {lp99 / bp99:.2f}")


if __name__ == "__main__":
    main()
