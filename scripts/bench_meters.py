#!/usr/bin/env python3
"""Another person's submits while requests flood the server (docs/security.md, row T23;
issue 25, atk38-25 F2, F3; docs/benchmarks.md "Request meters").

A real `gpuledger serve` (at `--nice`, 10 by default, like a service beside jobs); bob submits
one job at a time, 0.05 s apart, from 127.0.0.2, for `--seconds` in each of three rounds:
idle; while 64 loopback addresses (127.0.1.1-127.0.4.16) loop `GET /v1/whoami` without a
token on two kept-alive connections each (F2); while alice loops `GET /v1/nope` with her
token, 8 pipelined on each of 16 connections (F3); while alice sends submits with 200 KB
bodies of 1-byte chunks on 16 connections (`chunked`, atk39-25 F4); while 16 tokenless
connections of one /24 each send 20,000 pipelined `GET /v1/health` at once (`pipe20k`, F6).
`--rounds` picks them. The floods run in processes of their own
(at the same nice as the server). Prints, per round: bob's submits (all 200?) and their
p50/p99, and the flood's answers by status.

    .venv/bin/python scripts/bench_meters.py --seconds 15
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import os
import re
import socket
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchkit import GPULEDGER, machine

BUDGET = """
[accounts."ai2"]
kind = "program"

[accounts."ai2/olmo"]
kind = "project"
members = ["alice", "bob"]
"""


def cli(home: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env |= {"GPULEDGER_HOME": str(home), "GPULEDGER_USER": "root"}
    out = subprocess.run([GPULEDGER, *args], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def serve(home: Path, nice: int, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env["GPULEDGER_HOME"] = str(home)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            ["nice", "-n", str(nice), GPULEDGER, "serve", "--listen", "127.0.0.1:0",
             "--executor", "record", "--interval", "0.5s"],
            env=env, stdout=out, stderr=out,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text())
        if m:
            return proc, int(m.group(1))
        time.sleep(0.05)
    raise SystemExit(f"serve did not start:\n{log.read_text()}")


def head(path: str, token: str | None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n{auth}\r\n".encode()


def tokenless(port: int, source: str, until: float, out: multiprocessing.Queue) -> None:
    seen: Counter[int] = Counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    while time.time() < until:
        try:
            conn.request("GET", "/v1/whoami", headers={"Authorization": "Bearer glt_junk"})
            resp = conn.getresponse()
            resp.read()
            seen[resp.status] += 1
            if resp.getheader("connection") == "close":
                conn.close()
        except (OSError, http.client.HTTPException):
            conn.close()
    out.put(dict(seen))


def pipelined(port: int, token: str, until: float, out: multiprocessing.Queue) -> None:
    seen: Counter[int] = Counter()
    while time.time() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                f = s.makefile("rb")
                while time.time() < until:
                    s.sendall(head("/v1/nope", token) * 8)
                    closed = False
                    for _ in range(8):
                        status = int(f.readline().split()[1])
                        length, closed = 0, False
                        while (line := f.readline()) not in (b"\r\n", b""):
                            name, _, value = line.decode().partition(":")
                            if name.lower() == "content-length":
                                length = int(value)
                            if name.lower() == "connection" and "close" in value:
                                closed = True
                        f.read(length)
                        seen[status] += 1
                        if closed:
                            break
                    if closed:
                        break
        except (OSError, ValueError, IndexError):
            time.sleep(0.01)
    out.put(dict(seen))


def chunky(port: int, token: str, until: float, out: multiprocessing.Queue) -> None:
    """Alice's submits with 200 KB bodies of 1-byte chunks, one after another (atk39-25 F4)."""
    seen: Counter[int] = Counter()
    body = b'{"actor": "", "account": "ai2/olmo", "gpus": 1}' + b" " * 200_000
    wire = (
        (
            f"POST /v1/commands/submit HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        ).encode()
        + b"".join(b"1\r\n%c\r\n" % b for b in body)
        + b"0\r\n\r\n"
    )
    while time.time() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                with contextlib.suppress(OSError):
                    s.sendall(wire)  # refused at the head: the server closes while we send
                seen[int(s.makefile("rb").readline().split()[1])] += 1
        except (OSError, ValueError, IndexError):
            seen[0] += 1
            time.sleep(0.05)
    out.put(dict(seen))


def pipe20k(port: int, source: str, until: float, out: multiprocessing.Queue) -> None:
    """20,000 tokenless `GET /v1/health` in one send, answers read until the round ends
    (atk39-25 F6)."""
    seen: Counter[int] = Counter()
    wire = head("/v1/health", None) * 20_000
    while time.time() < until:
        try:
            with socket.socket() as s:
                s.bind((source, 0))
                s.settimeout(max(0.1, until - time.time()))
                s.connect(("127.0.0.1", port))
                import threading

                threading.Thread(target=_quiet_send, args=(s, wire), daemon=True).start()
                f = s.makefile("rb")
                while time.time() < until:
                    status = int(f.readline().split()[1])
                    length = 0
                    while (line := f.readline()) not in (b"\r\n", b""):
                        name, _, value = line.decode().partition(":")
                        if name.lower() == "content-length":
                            length = int(value)
                    f.read(length)
                    seen[status] += 1
        except (OSError, ValueError, IndexError):
            time.sleep(0.01)
    out.put(dict(seen))


def _quiet_send(s: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        s.sendall(data)


def flood_procs(kind: str, port: int, token: str, until: float, out: multiprocessing.Queue):
    if kind == "chunked":
        args, target = [(port, token, until, out) for _ in range(16)], chunky
    elif kind == "pipe20k":
        args, target = [(port, f"127.0.5.{a}", until, out) for a in range(1, 17)], pipe20k
    elif kind == "tokenless":
        sources = [f"127.0.{p}.{a}" for p in range(1, 5) for a in range(1, 17)]
        args = [(port, s, until, out) for s in sources for _ in range(2)]
        target = tokenless
    else:  # account
        args = [(port, token, until, out) for _ in range(16)]
        target = pipelined
    # one process per 16 loops: the loops share a process's interpreter, not the probe's
    procs = []
    for i in range(0, len(args), 16):
        p = multiprocessing.Process(target=_many, args=(target, args[i : i + 16]))
        p.start()
        procs.append(p)
    return procs


def _many(target, args) -> None:
    import threading

    threads = [threading.Thread(target=target, args=a) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def probe(port: int, token: str, seconds: float) -> list[tuple[int, float]]:
    body = json.dumps({"actor": "", "account": "ai2/olmo", "gpus": 1}).encode()
    got = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60,
                                          source_address=("127.0.0.2", 0))  # fmt: skip
        try:
            auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            conn.request("POST", "/v1/commands/submit", body=body, headers=auth)
            resp = conn.getresponse()
            resp.read()
            got.append((resp.status, time.monotonic() - began))
        except OSError:
            got.append((0, time.monotonic() - began))
        finally:
            conn.close()
        time.sleep(0.05)
    return got


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--nice", type=int, default=10)
    ap.add_argument("--rounds", default="idle,tokenless,account,chunked,pipe20k")
    a = ap.parse_args()
    print(f"# {machine()}; server and floods at nice {a.nice}, bob's probe at nice 0")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "ledger"
        cli(home, "init", "--admin", "root")
        (Path(tmp) / "budget.toml").write_text(BUDGET)
        cli(home, "budget", "apply", str(Path(tmp) / "budget.toml"))
        cli(home, "node", "add", "n1", "--gpus", "8", "--gpu-type", "h100")
        tokens = {who: cli(home, "token", "create", "--user", who) for who in ("alice", "bob")}
        proc, port = serve(home, a.nice, Path(tmp) / "serve.log")
        try:
            for kind in a.rounds.split(","):
                out: multiprocessing.Queue = multiprocessing.Queue()
                until = time.time() + a.seconds + 1
                procs = [] if kind == "idle" else flood_procs(kind, port, tokens["alice"],
                                                              until, out)  # fmt: skip
                if procs:
                    for p in procs:
                        os.setpriority(os.PRIO_PROCESS, p.pid, a.nice)
                    time.sleep(1.0)
                got = probe(port, tokens["bob"], a.seconds)
                seen: Counter[int] = Counter()
                for p in procs:
                    p.join(timeout=60)
                while not out.empty():
                    seen.update(out.get())
                lat = [t for status, t in got if status == 200]
                print(f"{kind:>9}: bob {len(lat)}/{len(got)} submits 200, p50 "
                      f"{pct(lat, 0.5):.3f} s, p99 {pct(lat, 0.99):.3f} s; flood answers "
                      f"{dict(sorted(seen.items()))} "
                      f"({sum(n for s, n in seen.items() if s != 429) / a.seconds:.0f}/s "
                      "not refused)", flush=True)  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
