"""Benchmark: what the supervised executor costs per running job (the node agent's process side).

    python scripts/bench_agent.py                     # 8, 16, 32, 64 jobs; 30 s windows
    python scripts/bench_agent.py --jobs 64 --window 60

For each size N, a fresh agent process (a bare Python process running `SupervisedExecutor` the
way a node agent does: `observe` every second, utilisation sampled every
second from the test file source, every job with a checkpoint file watched) launches N one-GPU jobs
(`sleep`), waits until all have started, and then for `--window` seconds measures:

- agent CPU: user+system time of the agent process over the window, per running job, in % of
  one core (the same agent with 0 jobs is the baseline, subtracted);
- agent memory: its RSS with N jobs;
- supervisors: the proportional set size (Pss, /proc/PID/smaps_rollup) of one supervisor and of
  all N (one per job part; they share the interpreter's pages).

Limits (no figure is given by the issue; these are the budgets this project sets): agent CPU
<= 0.1% of a core per running job, agent RSS <= 100 MB with 64 jobs, supervisor Pss <= 16 MB.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import machine

CPU_LIMIT_PCT = 0.1
RSS_LIMIT_MB = 100.0
PSS_LIMIT_MB = 16.0
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    fields = raw[raw.rfind(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def pss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def agent_loop(state: Path, jobs: int, ready: Path) -> None:
    """The measured process: an agent's executor with `jobs` running jobs."""
    from ledger.cycle.executor import Launch, Orders
    from ledger.engines.gpu_util import FileSource
    from ledger.engines.supervised import SupervisedExecutor
    from schemas.events import GpuSlot

    util = state / "util"
    util.mkdir(parents=True, exist_ok=True)
    ex = SupervisedExecutor(
        state / "agent", state / "jobs", run_as="service", util=FileSource(util),
        sample_every_s=1.0,
    )  # fmt: skip
    launches = []
    for j in range(1, jobs + 1):
        (util / str(j)).write_text("50")
        slot = GpuSlot(node=f"n{(j - 1) // 8}", gpu_indices=((j - 1) % 8,))
        launches.append(Launch(j, (slot,), ("sleep", "3600"), None, "bench", "b/x"))
    started = len(ex.carry_out(Orders(launches=tuple(launches)), time.time()))
    while True:
        started += len(ex.observe(time.time(), {}).starts)
        if started == jobs and not ready.exists():
            ready.write_text(json.dumps([p.pid for h in ex.jobs.values() for p in h.parts]))
        time.sleep(1.0)


def measure(jobs: int, window: float) -> dict[str, float]:
    supervisors: list[int] = []
    with tempfile.TemporaryDirectory(prefix="gpuledger-bench-agent-") as tmp:
        state = Path(tmp)
        ready = state / "ready"
        proc = subprocess.Popen([sys.executable, __file__, "--agent-loop", tmp, str(jobs)])
        try:
            deadline = time.monotonic() + 120
            while not ready.exists():
                assert proc.poll() is None, "the agent process died"
                assert time.monotonic() < deadline, "jobs did not start"
                time.sleep(0.2)
            supervisors = json.loads(ready.read_text())
            time.sleep(2)  # past the launch burst
            c0, t0 = cpu_s(proc.pid), time.monotonic()
            time.sleep(window)
            c1, t1 = cpu_s(proc.pid), time.monotonic()
            pss = [pss_kb(p) for p in supervisors if Path(f"/proc/{p}").exists()]
            return {
                "jobs": jobs,
                "cpu_pct": 100 * (c1 - c0) / (t1 - t0),
                "rss_mb": status_kb(proc.pid, "VmRSS") / 1024,
                "sup_pss_mb": (sum(pss) / len(pss) / 1024) if pss else 0.0,
                "sup_pss_total_mb": sum(pss) / 1024,
            }
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
            for p in Path(tmp).glob("agent/runs/*/*/job"):  # stop the jobs of this round
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.killpg(int(p.read_text().split()[0]), signal.SIGKILL)
            deadline = time.monotonic() + 30  # their supervisors write exit files, then leave
            while any(Path(f"/proc/{s}").exists() for s in supervisors):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--agent-loop":
        agent_loop(Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[2]) / "ready")
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="8,16,32,64", help="Comma-separated sizes.")
    ap.add_argument("--window", type=float, default=30.0, help="Seconds measured per size.")
    args = ap.parse_args()
    sizes = [int(s) for s in args.jobs.split(",")]
    print(f"bench_agent: {machine()}; load {os.getloadavg()[0]:.1f}; window {args.window:g} s")
    base = measure(0, args.window)
    print(f"   0 jobs: agent CPU {base['cpu_pct']:.3f}% of a core, RSS {base['rss_mb']:.1f} MB")
    print(" jobs | agent CPU % | per job % | ratio | agent RSS MB | supervisor Pss MB (all)")
    for n in sizes:
        r = measure(n, args.window)
        per_job = max(0.0, r["cpu_pct"] - base["cpu_pct"]) / n
        print(
            f" {n:4d} | {r['cpu_pct']:11.3f} | {per_job:9.4f} | {per_job / CPU_LIMIT_PCT:5.2f} |"
            f" {r['rss_mb']:12.1f} | {r['sup_pss_mb']:5.1f} ({r['sup_pss_total_mb']:.0f})"
        )
    verdict = (
        "met"
        if per_job <= CPU_LIMIT_PCT
        and r["rss_mb"] <= RSS_LIMIT_MB
        and r["sup_pss_mb"] <= PSS_LIMIT_MB
        else "missed"
    )
    print(
        f"limits at {sizes[-1]} jobs: CPU per job <= {CPU_LIMIT_PCT}% of a core, agent RSS <= "
        f"{RSS_LIMIT_MB:g} MB, supervisor Pss <= {PSS_LIMIT_MB:g} MB: {verdict}"
    )


if __name__ == "__main__":
    main()
