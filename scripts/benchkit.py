"""What the benchmarks share: the machine line, free ports, and private services (Kafka, Slurm)."""

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
def private_service(
    what: str, script: Path, data_var: str, port_vars: tuple[str, ...]
) -> Iterator[str]:
    """Start one of the repository's service scripts (`script up`) on a private data directory
    and free ports, yield what `up` prints, and stop it (`script down`) at the end."""
    with tempfile.TemporaryDirectory(prefix=f"gpuledger-bench-{script.name}-") as data:
        env = dict(os.environ, **{data_var: data}, **{v: str(free_port()) for v in port_vars})
        print(f"starting {what} ({script.relative_to(script.parents[2])} up) ...", flush=True)
        up = subprocess.run([str(script), "up"], env=env, stdout=subprocess.PIPE, text=True)
        try:
            if up.returncode != 0:
                sys.exit(f"error: {what} did not start (see above)")
            yield up.stdout.strip()
        finally:
            subprocess.run([str(script), "down"], env=env, stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    """The given broker, or one of our own (private data dir, free ports), stopped at the end."""
    if bootstrap:
        yield bootstrap
        return
    with private_service(
        "a private Kafka broker",
        KAFKA_SCRIPT,
        "GPULEDGER_KAFKA_DATA",
        ("GPULEDGER_KAFKA_PORT", "GPULEDGER_KAFKA_CONTROLLER_PORT"),
    ) as bootstrap_servers:
        yield bootstrap_servers
