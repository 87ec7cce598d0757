"""Benchmark: how long from a command accepted to its event in a Kafka-fed projection.

    python scripts/bench_kafka_latency.py                    # starts (and stops) its own broker
    python scripts/bench_kafka_latency.py --bootstrap 127.0.0.1:19092 --rate 1000 --seconds 20
    python scripts/bench_kafka_latency.py --follower process # the projector in another process

One process plays the ledger the way `gpuledger up --kafka` runs it: the main thread appends
`SubmitJob` commands through `Ledger.execute` at `--rate` commands per second (paced against the
clock, one command per call), a relay thread publishes the store to a fresh topic (`Relay.run`,
as `up --kafka` starts it) and the projector follows the topic into a DuckDB file
(`projections.kafka_follow.follow`, the loop of `gpuledger project follow`):

- `--follower thread` (default): in a thread of the same process, as in `up --kafka`;
- `--follower process`: `gpuledger project follow --kafka ...` in a child process with its own
  data directory (another reader, e.g. on another machine); its commits are seen through its
  DEBUG log lines, read as they are written.

Latency of a command = the moment the projection's tracking position (committed in DuckDB with
the rows) first reaches the command's log position, minus the moment `Ledger.execute` returned
(both `time.monotonic()`, one clock for all processes). The first `--warmup` seconds are not
counted. Prints p50/p90/p99/max, the achieved rate and the ratio of p99 to the goal (500 ms),
with the machine and its load average (the machine may be shared).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

from benchkit import broker, machine

from ledger.store.application import Ledger
from ledger.store.clock import SystemClock
from ledger.store.relay import Relay, open_store
from projections.kafka_follow import follow
from projections.kafka_source import KafkaSource
from projections.projector import Projector
from projections.store import Store
from schemas import commands as c

GOAL_P99_S = 0.5
GPULEDGER = Path(sys.executable).parent / "gpuledger"
APPLIED = re.compile(r"applied through position (\d+)")


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def organisation(ledger: Ledger) -> None:
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=3),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )


class Visible:
    """(monotonic time, tracking position) each time the projection committed, in order."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.positions: list[int] = []
        self.lock = threading.Lock()

    def saw(self, position: int) -> None:
        now = time.monotonic()
        with self.lock:
            self.times.append(now)
            self.positions.append(position)

    def last(self) -> int:
        with self.lock:
            return self.positions[-1] if self.positions else 0

    def when(self, position: int) -> float | None:
        """When the projection first reached `position`."""
        i = bisect.bisect_left(self.positions, position)
        return self.times[i] if i < len(self.positions) else None


class TimedRelay(Relay):
    """The relay, noting when each transaction's last position is committed (its `position`
    moves only after a successful commit): splits the latency into relay and projector."""

    def __init__(self, *args: Any, committed: Visible, **kwargs: Any) -> None:
        self.committed = committed
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def position(self) -> int:
        return self._position

    @position.setter
    def position(self, value: int) -> None:
        self._position = value
        if value > self.committed.last():
            self.committed.saw(value)


@contextlib.contextmanager
def thread_follower(
    bootstrap: str, topic: str, workdir: Path, visible: Visible
) -> Iterator[threading.Thread]:
    stop = threading.Event()

    def run() -> None:
        with Store(workdir / "follower.duckdb") as store, KafkaSource(bootstrap, topic) as src:
            follow(Projector(store, src), stop, progress=lambda p, _h: visible.saw(p))

    thread = threading.Thread(target=run, name="projector", daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(timeout=30)


@contextlib.contextmanager
def process_follower(
    bootstrap: str, topic: str, workdir: Path, visible: Visible
) -> Iterator[subprocess.Popen[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    proc = subprocess.Popen(
        [
            str(GPULEDGER),
            "--home",
            str(workdir / "follower"),
            "project",
            "follow",
            "--kafka",
            bootstrap,
            "--topic",
            topic,
            "--log-level",
            "DEBUG",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            m = APPLIED.search(line)
            if m:
                visible.saw(int(m.group(1)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        reader.join(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()


def percentile(sorted_values: list[float], q: float) -> float:
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def run(args: argparse.Namespace, bootstrap: str) -> None:
    with tempfile.TemporaryDirectory(prefix="gpuledger-bench-latency-") as tmp:
        workdir = Path(tmp)
        home = workdir / "home"
        ledger = Ledger(home, SystemClock())
        organisation(ledger)
        topic = f"bench-latency-{uuid.uuid4().hex[:12]}"
        committed = Visible()
        relay = TimedRelay(
            open_store(home),
            bootstrap,
            topic=topic,
            transactional_id=f"bench-{topic}",
            committed=committed,
        )
        stop = threading.Event()
        relay_thread = threading.Thread(
            target=relay.run, args=(stop,), kwargs={"on_error": print}, name="relay", daemon=True
        )
        visible = Visible()
        follower = thread_follower if args.follower == "thread" else process_follower
        relay_thread.start()
        with follower(bootstrap, topic, workdir, visible):
            deadline = time.monotonic() + 60
            while visible.last() < ledger.position:  # the follower is up and caught up
                if time.monotonic() > deadline:
                    sys.exit("error: the follower did not catch up within 60 s")
                time.sleep(0.01)
            load_before = load()
            accepted: list[tuple[int, float]] = []
            job = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, duration_s=60.0)
            n = int(args.rate * (args.seconds + args.warmup))
            t0 = time.monotonic()
            for i in range(n):
                wait = t0 + i / args.rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                position = ledger.execute(job).position
                accepted.append((position, time.monotonic()))
            took = time.monotonic() - t0
            deadline = time.monotonic() + 60
            while visible.last() < accepted[-1][0] and time.monotonic() < deadline:
                time.sleep(0.01)
            load_after = load()
        stop.set()
        relay_thread.join(timeout=30)
        relay.close()
        ledger.close()
    counted = accepted[int(args.rate * args.warmup) :]
    latencies, relayed = [], []
    for position, at in counted:
        seen, on_topic = visible.when(position), committed.when(position)
        if seen is None or on_topic is None:
            sys.exit(f"error: position {position} never became visible in the projection")
        latencies.append(seen - at)
        relayed.append(on_topic - at)
    latencies.sort()
    relayed.sort()
    p50, p90, p99 = (percentile(latencies, q) for q in (0.5, 0.9, 0.99))
    commits = sum(1 for t in visible.times if t >= counted[0][1])
    print(f"machine: {machine()}")
    print(f"kafka-python {version('kafka-python')}, duckdb {version('duckdb')}, broker {bootstrap}")
    print(f"load average (1/5/15 min): before {load_before}, after {load_after}")
    print(
        f"rate: {n / took:,.0f} commands/s achieved (target {args.rate:,.0f}), "
        f"{len(counted):,} commands counted after {args.warmup:g} s of warm-up; "
        f"projector ({args.follower}): {commits:,} commits, "
        f"{len(counted) / max(1, commits):.0f} events per commit"
    )
    print(
        f"latency accepted -> visible in the Kafka-fed projection: p50 {p50 * 1000:.0f} ms, "
        f"p90 {p90 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms"
    )
    r50, r99 = (percentile(relayed, q) * 1000 for q in (0.5, 0.99))
    print(
        f"  of which accepted -> committed on the topic (relay): p50 {r50:.0f} ms, p99 {r99:.0f} ms"
    )
    verdict = "meets" if p99 <= GOAL_P99_S else "misses"
    print(f"goal p99 <= {GOAL_P99_S * 1000:.0f} ms: p99/goal = {p99 / GOAL_P99_S:.2f} ({verdict})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=float, default=1_000.0, help="commands per second")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds")
    ap.add_argument(
        "--warmup", type=float, default=5.0, help="seconds not counted, first (broker JIT, caches)"
    )
    ap.add_argument("--follower", choices=["thread", "process"], default="thread")
    ap.add_argument("--bootstrap", default=os.environ.get("GPULEDGER_KAFKA", "").strip() or None)
    args = ap.parse_args()
    with broker(args.bootstrap) as bootstrap:
        run(args, bootstrap)


if __name__ == "__main__":
    main()
