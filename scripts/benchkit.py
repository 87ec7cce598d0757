"""What the Kafka benchmarks share: the machine line, free ports, and a private broker."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

KAFKA_SCRIPT = Path(__file__).resolve().parent / "kafka" / "kafka"


def machine() -> str:
    mem = ""
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        kb = int(f.readline().split()[1])
        mem = f", {kb / 1024**2:.0f} GB RAM"
    return f"{os.cpu_count()} cores{mem}, {platform.platform()}, Python {platform.python_version()}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    """The given broker, or one of our own (private data dir, free ports), stopped at the end."""
    if bootstrap:
        yield bootstrap
        return
    with tempfile.TemporaryDirectory(prefix="gpuledger-bench-kafka-") as data:
        env = dict(
            os.environ,
            GPULEDGER_KAFKA_DATA=data,
            GPULEDGER_KAFKA_PORT=str(free_port()),
            GPULEDGER_KAFKA_CONTROLLER_PORT=str(free_port()),
        )
        print("starting a private broker (scripts/kafka/kafka up) ...", flush=True)
        up = subprocess.run([str(KAFKA_SCRIPT), "up"], env=env, stdout=subprocess.PIPE, text=True)
        try:
            if up.returncode != 0:
                sys.exit("error: the Kafka broker did not start (see above)")
            yield up.stdout.strip()
        finally:
            subprocess.run([str(KAFKA_SCRIPT), "down"], env=env, stderr=subprocess.DEVNULL)
