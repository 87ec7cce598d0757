"""What the benchmarks share: the machine line, free ports, private services (Kafka, Slurm) and a
`gpuledger serve` to time over HTTP (`Serve`)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

KAFKA_SCRIPT = Path(__file__).resolve().parent / "kafka" / "kafka"
PG_SCRIPT = Path(__file__).resolve().parent / "postgres" / "postgres"
GPULEDGER = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"


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


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """`GPULEDGER_PG_DSN` when it names a PostgreSQL, or one of our own (private data dir, a
    free port: `scripts/postgres/postgres up`), stopped at the end."""
    given = os.environ.get("GPULEDGER_PG_DSN", "")
    if given:
        yield given
        return
    with private_service(
        "a private PostgreSQL", PG_SCRIPT, "GPULEDGER_PG_DATA", ("GPULEDGER_PG_PORT",)
    ) as dsn:
        if not dsn:
            sys.exit("error: PostgreSQL did not start")
        yield dsn


class Serve:
    """`gpuledger serve` on 127.0.0.1 (a free port) over `home` with `args`, its output in
    `log` (no GPULEDGER_* variable of the caller's but the home)."""

    def __init__(
        self,
        home: Path,
        log: Path,
        *args: str,
        nice: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """`nice`: the server's nice level (absolute; below the caller's needs root); `env`:
        variables added to its environment."""
        environ = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
        environ["GPULEDGER_HOME"] = str(home)
        environ.update(env or {})
        self.log = log

        def lowered() -> None:
            if nice is not None:
                os.setpriority(os.PRIO_PROCESS, 0, nice)

        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [GPULEDGER, "serve", "--listen", "127.0.0.1:0", *args],
                env=environ, stdout=out, stderr=out, preexec_fn=lowered,
            )  # fmt: skip
        deadline = time.monotonic() + 600
        while True:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"error: serve did not start:\n{log.read_text()}")
            time.sleep(0.2)

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        token: str | None = None,
        timeout: float = 600,
    ) -> tuple[int, bytes, float]:
        """One request: its status, body and wall milliseconds."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        t0 = time.perf_counter()
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        return resp.status, raw, (time.perf_counter() - t0) * 1000

    def request(self, method: str, path: str, body: Any = None, token: str = "") -> tuple[int, Any]:
        """One request with a JSON body (None: none): its status and decoded answer."""
        data = None if body is None else json.dumps(body).encode()
        status, raw, _ = self.call(method, path, data, token)
        return status, json.loads(raw) if raw else None

    def cpu(self) -> float:
        """CPU seconds (user + system) the server process has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)
