"""Benchmark: what a `gpuledger` process costs to start, as the test suite starts thousands of them.

On a fresh data directory (the organisation of tests/integration/serverkit.py, a server on it):

  client      `queue`, `jobs` and a `submit` over the server's Unix socket
  embedded    `account tree` and `node list` with no server (the CLI opens the store)
  serve       `gpuledger serve --executor record` from its launch until it prints that it listens,
              then SIGTERM until it exits

Each is run --runs times; printed: the wall time (min, median) and the CPU time (user + sys, mean)
of the process. CPU is the measure on a shared machine: wall time grows with the load.
`--no-bytecode` runs every process with PYTHONDONTWRITEBYTECODE on a copy of our packages without
their bytecode (first on PYTHONPATH): what every process paid before scripts/setup wrote it.

    python scripts/bench_start.py
    python scripts/bench_start.py --runs 20 --no-bytecode
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.integration.serverkit import BUDGET  # noqa: E402

GPULEDGER = str(Path(sys.executable).parent / "gpuledger")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _line(what: str, walls: list[float], cpu: float) -> str:
    return (
        f"{what:<34} wall min {min(walls) * 1000:6.0f} ms  median "
        f"{statistics.median(walls) * 1000:6.0f} ms  CPU {cpu / len(walls) * 1000:6.0f} ms"
    )


def timed(env: dict[str, str], runs: int, *args: str) -> str:
    walls, cpu0 = [], _cpu()
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([GPULEDGER, *args], env=env, capture_output=True, check=True)
        walls.append(time.perf_counter() - t)
    return _line(" ".join(args)[:34], walls, _cpu() - cpu0)


def serve(env: dict[str, str], runs: int, tmp: Path) -> str:
    walls, cpu0 = [], _cpu()
    log = tmp / "serve.log"
    for _ in range(runs):
        log.write_text("")
        with log.open("w") as out:
            t = time.perf_counter()
            proc = subprocess.Popen(
                [GPULEDGER, "serve", "--listen", "127.0.0.1:0", "--executor", "record"],
                env=env, stdout=out, stderr=out,
            )  # fmt: skip
            while "listening on" not in log.read_text():
                assert proc.poll() is None, log.read_text()
                time.sleep(0.01)
            walls.append(time.perf_counter() - t)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    return _line("serve (to listening, then stop)", walls, _cpu() - cpu0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--no-bytecode", action="store_true")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpuledger-bench-start-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env.update(GPULEDGER_HOME=str(tmp / "home"), GPULEDGER_USER="root")
    if a.no_bytecode:
        for pkg in ("schemas", "ledger", "projections"):
            shutil.copytree(
                REPO / pkg, tmp / "src" / pkg, ignore=shutil.ignore_patterns("__pycache__")
            )
        env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(tmp / "src"))
    try:
        (tmp / "budget.toml").write_text(BUDGET)
        for args in (("init", "--admin", "root"), ("budget", "apply", str(tmp / "budget.toml"))):
            subprocess.run([GPULEDGER, *args], env=env, capture_output=True, check=True)
        subprocess.run(
            [GPULEDGER, "node", "add", "n1", "--gpus", "8", "--gpu-type", "h100"],
            env=env, capture_output=True, check=True,
        )  # fmt: skip
        print(f"{a.runs} runs each, load {os.getloadavg()[0]:.1f}, bytecode "
              f"{'none' if a.no_bytecode else 'as installed'}")  # fmt: skip
        for args in (("account", "tree"), ("node", "list")):
            print("embedded", timed(env, a.runs, *args))
        print("        ", serve(env, max(1, a.runs // 2), tmp))
        log = (tmp / "bg.log").open("w")
        server = subprocess.Popen(
            [GPULEDGER, "serve", "--listen", "127.0.0.1:0", "--executor", "none"],
            env=env, stdout=log, stderr=log,
        )  # fmt: skip
        try:
            while not (tmp / "home" / "gpuledger.sock").exists():
                time.sleep(0.05)
            cwd = os.getcwd()
            os.chdir(tmp)  # a submission's working directory
            sub = ("--as", "alice", "submit", "-A", "ai2/olmo", "-G", "1", "--", "true")
            for args in (("queue",), ("jobs",), sub):
                print("client  ", timed(env, a.runs, *args))
            os.chdir(cwd)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
        print(f"load after {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
