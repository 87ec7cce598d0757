#!/usr/bin/env python3
"""One person's connections against another's submits (docs/security.md, row T23; issue 25).

A real `gpuledger serve` whose soft limit of open files is `--files` at start (systemd's
default is 1,024); alice opens `--connections` connections from `--threads` threads, each
asking for `--pipeline` 10,000-row pages and reading none of them; meanwhile carol submits 40
jobs every `--every` seconds and bob reads 5 rows. Prints, per round: carol's submits that
succeeded and their p50/max, bob's read, the server's open files and RSS.

    .venv/bin/python scripts/attack_connections.py --connections 3000 --files 1024

Before the connections' limits: a round with 0/40 of carol's submits (connection reset); with
them, 40/40 in every round (the numbers of the commit that added this script: docs/security.md
row T23)."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import resource
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchkit import GPULEDGER

from ledger.store.application import Ledger
from schemas import commands as c

BUDGET = """
[accounts."ai2"]
kind = "program"

[accounts."ai2/olmo"]
kind = "project"
members = ["alice", "bob"]

[accounts."ai2/tulu"]
kind = "project"
members = ["carol"]
"""


def cli(home: Path, *args: str, user: str = "root") -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env |= {"GPULEDGER_HOME": str(home), "GPULEDGER_USER": user}
    out = subprocess.run([GPULEDGER, *args], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def ledger(tmp: Path) -> Path:
    """3,000 pending jobs with a 400-byte label: a 10,000-row page is ~2.4 MB."""
    home = tmp / "ledger"
    cli(home, "init", "--admin", "root")
    (tmp / "budget.toml").write_text(BUDGET)
    cli(home, "budget", "apply", str(tmp / "budget.toml"))
    cli(home, "node", "add", "n1", "--gpus", "8", "--gpu-type", "h100")
    led = Ledger(home)
    try:
        job = c.SubmitJob(actor="bob", account="ai2/olmo", gpus=8, min_runtime_s=3600,
                          labels={"note": "x" * 400})  # fmt: skip
        for _ in range(30):
            led.execute_all([job] * 100)
    finally:
        led.close()
    return home


def serve(home: Path, files: int, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    env = {k: v for k, v in os.environ.items() if k != "GPULEDGER_HOME"}
    env["GPULEDGER_HOME"] = str(home)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(files, hard), hard))
    try:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [GPULEDGER, "serve", "--listen", "127.0.0.1:0", "--executor", "record"],
                env=env, stdout=out, stderr=out,
            )  # fmt: skip
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    while not (m := re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text())):
        if proc.poll() is not None:
            raise SystemExit(f"error: serve did not start:\n{log.read_text()}")
        time.sleep(0.1)
    return proc, int(m.group(1))


def request(port: int, token: str, method: str, path: str, body: Any = None) -> tuple[Any, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    began = time.monotonic()
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.monotonic() - began
    except OSError as err:
        return type(err).__name__, time.monotonic() - began
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=3000)
    ap.add_argument("--pipeline", type=int, default=2, help="pages asked on each connection")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--files", type=int, default=1024, help="the server's open files at start")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--every", type=float, default=5.0)
    a = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, (a.connections + 1024,) * 2)
    tmp = Path(tempfile.mkdtemp(prefix="gpuledger-attack-"))
    home = ledger(tmp)
    tok = {who: cli(home, "token", "create", "--user", who) for who in ("alice", "bob", "carol")}
    proc, port = serve(home, a.files, tmp / "serve.log")

    def look() -> str:
        rss = next(x for x in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                   if x.startswith("VmRSS"))  # fmt: skip
        files = len(os.listdir(f"/proc/{proc.pid}/fd"))
        return f"server: {files} open files, {' '.join(rss.split()[1:])} RSS"

    def round_(label: str) -> None:
        took, failed = [], []
        for _ in range(40):
            status, t = request(port, tok["carol"], "POST", "/v1/commands/submit",
                                {"actor": "", "account": "ai2/tulu", "gpus": 1})  # fmt: skip
            (took if status == 200 else failed).append(t if status == 200 else status)
        took.sort()
        p50 = f"p50 {took[len(took) // 2]:.3f} s, max {took[-1]:.3f} s" if took else ""
        bob = request(port, tok["bob"], "GET", "/v1/jobs?limit=5")
        print(f"{label}: carol {len(took)}/40 submits {p50} {sorted(set(failed))}; "
              f"bob's read {bob[0]} in {bob[1]:.2f} s; {look()}", flush=True)  # fmt: skip

    try:
        round_("idle")
        heads = (
            "GET /v1/jobs?limit=10000 HTTP/1.1\r\nHost: a\r\n"
            f"Authorization: Bearer {tok['alice']}\r\n\r\n"
        )
        opened: list[socket.socket] = []

        def flood() -> None:
            while len(opened) < a.connections:
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                try:
                    s.connect(("127.0.0.1", port))
                    s.sendall(heads.encode() * a.pipeline)
                except OSError:
                    s.close()
                    time.sleep(0.05)
                    continue
                opened.append(s)

        for _ in range(a.threads):
            threading.Thread(target=flood, daemon=True).start()
        for n in range(a.rounds):
            time.sleep(a.every)
            round_(f"t+{(n + 1) * a.every:g} s, alice opened {len(opened)}")
        for s in opened:
            s.close()
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
