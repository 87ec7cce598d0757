"""Benchmark: job submissions over HTTP to a real `gpuledger serve`, against embedded appends.

In one run, on fresh ledger homes in a temp directory, --rounds times in turn (the machine is
shared: alternating the two sides exposes both to the same load):
  embedded  `Ledger.execute(SubmitJob)` one by one in this process (the baseline)
  HTTP      `POST /v1/commands/submit` from 8 concurrent client processes to a `gpuledger
            serve` on 127.0.0.1; the server group-commits what arrives together (goal >= 1,000
            submits/s, p99 <= 50 ms, ratio to embedded >= 40%)
Both sides submit the same commands: each of 8 users its own jobs, every job labelled with its
own sequence number. Over HTTP each client is one user with its own bearer token and one
HTTP/1.1 keep-alive connection, closed loop (it sends its next request once the answer to the
last has arrived), and checks every answer's status. The clients are raw sockets with the
request line and headers built once (the benchmark measures the server, and a client library
such as http.client spent ~250 us of CPU per request on the same 2 cores the server runs on).
Both wall-clock rates and CPU per submit (this process's for embedded, the server process's for
HTTP; the clients' apart) are printed, and the ratios of both.
  queue     `gpuledger queue --json --limit 50` through the server at --pending jobs (a list:
            the growth), end to end (the CLI process included; goal <= 300 ms): the FIRST read
            after an append (the bench holds or releases a job over HTTP, then starts the CLI at
            once) and a read again at the same position, --queue-runs times each

    python scripts/bench_api.py                    # 8 clients x 1,000 submits, 3 rounds
    python scripts/bench_api.py --clients 8 --per-client 500 --pending 1000,10000
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from benchkit import machine

from ledger.core.tokens import issue
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, new_token_secret, seeded_ids
from schemas import commands as c

GOAL_PER_S = 1_000
GOAL_P99_MS = 50.0
GOAL_RATIO = 0.40
GOAL_QUEUE_MS = 300.0
GPULEDGER = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"


USERS = [f"user{i}" for i in range(8)]


def set_up(home: Path, clock: SimClock | None = None) -> tuple[Ledger, str]:
    """A ledger with an account, its members (`alice` and `USERS`) and 16 nodes; a token of
    alice's (the others': `tokens`)."""
    # events of today, as a server's own appends will be (not of 1970: the dashboard would
    # read ~500k hours of "whole period" ahead)
    led = Ledger(home, clock or SimClock(float(int(time.time()) - 3_600)), seeded_ids(1))
    led.execute(c.InitLedger(actor="root", admin="root"))
    led.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project"),
            *[c.AddMember(actor="root", user=u, project="ai2/olmo") for u in ["alice", *USERS]],
            *[
                c.RegisterNode(actor="root", node=f"n{i}", gpu_type="h100", gpus=8)
                for i in range(16)
            ],
        ]
    )
    return led, tokens(led, ["alice"])[0]


def tokens(led: Ledger, users: list[str]) -> list[str]:
    """One new bearer token for each of `users`."""
    out = []
    for user in users:
        secret = new_token_secret()
        cmd = issue("root", user, secret, name="bench")
        led.execute(cmd)
        out.append(secret)
    return out


def submit_body(client: int, seq: int) -> bytes:
    """The JSON of one submit (the actor is the caller): a job of its own, labelled."""
    return b'{"actor":"","account":"ai2/olmo","gpus":1,"labels":{"seq":"%d-%d"}}' % (client, seq)


def embedded(n: int) -> tuple[float, float]:
    """Submits per second and CPU seconds per submit of `Ledger.execute` one by one (the same
    commands as over HTTP: the users in turn, each job labelled)."""
    with tempfile.TemporaryDirectory() as tmp:
        led, _ = set_up(Path(tmp))
        cmds = [
            c.SubmitJob(
                actor=USERS[i % len(USERS)],
                account="ai2/olmo",
                gpus=1,
                labels={"seq": f"{i % len(USERS)}-{i // len(USERS)}"},
            )
            for i in range(n)
        ]
        t0, c0 = time.perf_counter(), time.process_time()
        for cmd in cmds:
            led.execute(cmd)
        rate, cpu = n / (time.perf_counter() - t0), (time.process_time() - c0) / n
        led.close()
        return rate, cpu


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)


def exchange(sock: socket.socket, request: bytes, buf: bytes) -> tuple[int, bytes]:
    """Send one HTTP/1.1 request and read its whole answer: (status, what arrived after it)."""
    sock.sendall(request)
    while (end := buf.find(b"\r\n\r\n")) < 0:
        buf += _recv(sock)
    m = _LENGTH.search(buf, 0, end + 2)
    if m is None:
        raise SystemExit(f"error: an answer without content-length: {buf[:200]!r}")
    total = end + 4 + int(m.group(1))
    while len(buf) < total:
        buf += _recv(sock)
    return int(buf[9:12]), buf[total:]


def _recv(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    if not data:
        raise SystemExit("error: the server closed the connection")
    return data


def client(
    port: int,
    token: str,
    k: int,
    n: int,
    start: float,
    out: mp.Queue,  # type: ignore[type-arg]
    floor: bool = False,
) -> None:
    """Client `k`: `n` submits, one at a time on one keep-alive connection (`floor`: `GET
    /v1/whoami`, the HTTP path without the ledger's work)."""
    auth = f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n".encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lat: list[float] = []
    errors = 0
    buf = b""
    while time.time() < start:
        time.sleep(0.001)
    c0 = time.process_time()
    for i in range(n):
        if floor:
            request = b"GET /v1/whoami HTTP/1.1\r\n" + auth + b"\r\n"
        else:
            body = submit_body(k, i)
            request = b"POST /v1/commands/submit HTTP/1.1\r\n%s%s%d\r\n\r\n%s" % (
                auth,
                b"Content-Type: application/json\r\nContent-Length: ",
                len(body),
                body,
            )
        t0 = time.perf_counter()
        status, buf = exchange(sock, request, buf)
        lat.append(time.perf_counter() - t0)
        errors += status != 200
    sock.close()
    out.put((lat, errors, time.time(), time.process_time() - c0))


def serve(home: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    log = home.parent / "serve.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [GPULEDGER, "serve", "--listen", "127.0.0.1:0", "--interval", "1h"],
            # the submit path itself, not one account's request meter (50 a second by default,
            # docs/server.md "Connections"): set GPULEDGER_REQUEST_RATE to measure with it
            env={"GPULEDGER_REQUEST_RATE": "1000000", **os.environ, "GPULEDGER_HOME": str(home)},
            stdout=f,
            stderr=f,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text())
        if m:
            return proc, int(m.group(1)), log
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"serve did not start:\n{log.read_text()}")


class Http(NamedTuple):
    rate: float
    p50_ms: float
    p99_ms: float
    errors: int
    server_cpu: float
    """Server CPU seconds per submit."""
    client_cpu: float
    """The client processes' CPU seconds per submit."""


def over_http(clients: int, per_client: int, floor: bool = False) -> Http:
    with tempfile.TemporaryDirectory() as tmp:
        return submits_over_http(Path(tmp) / "ledger", clients, per_client, floor)


def submits_over_http(home: Path, clients: int, per_client: int, floor: bool = False) -> Http:
    """A ledger set up in `home` (`set_up`), served, and `clients` processes submitting
    `per_client` jobs each, all starting at once: the rate, latencies and CPU per submit."""
    led, _ = set_up(home)
    secrets = tokens(led, [USERS[k % len(USERS)] for k in range(clients)])
    led.close()
    proc, port, _ = serve(home)
    try:
        out: mp.Queue = mp.Queue()  # type: ignore[type-arg]
        start = time.time() + 1.0
        procs = [
            mp.Process(target=client, args=(port, secrets[k], k, per_client, start, out, floor))
            for k in range(clients)
        ]
        for p in procs:
            p.start()
        while time.time() < start:
            time.sleep(0.001)
        cpu0 = process_cpu(proc.pid)
        results = [out.get(timeout=600) for _ in procs]
        cpu = process_cpu(proc.pid) - cpu0
        for p in procs:
            p.join()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    lat = sorted(x for r in results for x in r[0])
    errors = sum(r[1] for r in results)
    elapsed = max(r[2] for r in results) - start
    p50 = statistics.median(lat) * 1000
    p99 = lat[int(len(lat) * 0.99) - 1] * 1000
    n = len(lat)
    return Http(n / elapsed, p50, p99, errors, cpu / n, sum(r[3] for r in results) / n)


def post(port: int, token: str, path: str, body: bytes) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(
            "POST",
            path,
            body=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise SystemExit(f"error: {path} answered {resp.status}: {data[:300]!r}")
    finally:
        conn.close()


class QueueTimes(NamedTuple):
    first_ms: list[float]
    """End to end, right after an append."""
    again_ms: list[float]
    """End to end, again at the same position."""
    cli_cpu_ms: float
    """The CLI process's CPU (median)."""
    server_cpu_first_ms: float
    """The server's CPU from the append to the first read's answer (median)."""
    server_cpu_again_ms: float


def queue_through_server(pending: int, runs: int) -> QueueTimes | None:
    """`gpuledger queue --json --limit 50` through the server at `pending` jobs, end to end (the
    CLI process included), `runs` times: right after an append (a hold or a release of the last
    job over HTTP, then the CLI started at once), and again at the same position."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "ledger"
        led, token = set_up(home)
        big = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=100)  # one at a time fits
        for at in range(0, pending, 5_000):
            led.execute_all([big] * min(5_000, pending - at))
        led.close()
        proc, port, _ = serve(home)
        env = dict(os.environ, GPULEDGER_HOME=str(home))

        def run() -> tuple[float, float]:
            t0 = time.perf_counter()
            r0 = os.times()
            done = subprocess.run(
                [GPULEDGER, "queue", "--json", "--limit", "50"], env=env, capture_output=True
            )
            r1 = os.times()
            if done.returncode != 0:
                raise SystemExit(f"queue through the server failed: {done.stderr.decode()}")
            cpu = (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)
            return (time.perf_counter() - t0) * 1000, cpu * 1000

        try:
            run()  # the server's first read after its start
            first, again, cpu, server_first, server_again = [], [], [], [], []
            for i in range(runs):
                tag = "release" if i % 2 else "hold"
                body = b'{"actor": "", "job_id": %d}' % pending  # the last: pending
                c0 = process_cpu(proc.pid)
                post(port, token, f"/v1/commands/{tag}", body)
                ms, cpu_ms = run()
                c1 = process_cpu(proc.pid)
                first.append(ms)
                cpu.append(cpu_ms)
                again.append(run()[0])
                server_first.append((c1 - c0) * 1000)
                server_again.append((process_cpu(proc.pid) - c1) * 1000)
            return QueueTimes(
                first,
                again,
                statistics.median(cpu),
                statistics.median(server_first),
                statistics.median(server_again),
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=1000)
    ap.add_argument("--embedded", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pending", default="1000,10000", help="pending jobs for the queue reads")
    ap.add_argument("--queue-runs", type=int, default=6)
    args = ap.parse_args()
    print(f"machine: {machine()}; {load()}", flush=True)
    bases, https = [], []
    for r in range(args.rounds):
        base, base_cpu = embedded(args.embedded)
        h = over_http(args.clients, args.per_client)
        bases.append((base, base_cpu))
        https.append(h)
        print(
            f"round {r + 1}: embedded {base:,.0f}/s ({base_cpu * 1e6:.0f} us CPU per submit); "
            f"HTTP {h.rate:,.0f}/s, p50 {h.p50_ms:.1f} ms, p99 {h.p99_ms:.1f} ms, "
            f"{h.errors} errors, server {h.server_cpu * 1e6:.0f} us CPU per submit "
            f"(clients {h.client_cpu * 1e6:.0f} us); ratio wall {h.rate / base:.0%}, "
            f"CPU {base_cpu / h.server_cpu:.0%}; {load()}",
            flush=True,
        )
    rate = statistics.median(h.rate for h in https)
    base = statistics.median(b[0] for b in bases)
    p99 = statistics.median(h.p99_ms for h in https)
    server_cpu = statistics.median(h.server_cpu for h in https)
    base_cpu = statistics.median(b[1] for b in bases)
    print(
        f"HTTP, {args.clients} clients x {args.per_client:,}, median of {args.rounds}: "
        f"{rate:,.0f} submits/s ({rate / GOAL_PER_S:.2f}x the {GOAL_PER_S:,}/s goal), "
        f"p99 {p99:.1f} ms ({p99 / GOAL_P99_MS:.2f}x the {GOAL_P99_MS:.0f} ms limit)"
    )
    ratios = sorted(h.rate / b[0] for h, b in zip(https, bases, strict=True))
    cpu_ratio = base_cpu / server_cpu
    print(
        f"ratio HTTP / embedded (goal >= {GOAL_RATIO:.0%}): wall clock, round by round "
        f"{', '.join(f'{x:.0%}' for x in ratios)} (median {statistics.median(ratios):.0%}; "
        f"{'met' if statistics.median(ratios) >= GOAL_RATIO else 'not met'}); CPU per submit "
        f"{base_cpu * 1e6:.0f} us embedded / {server_cpu * 1e6:.0f} us server = "
        f"{cpu_ratio:.0%} ({'met' if cpu_ratio >= GOAL_RATIO else 'not met'})"
    )
    floor = over_http(args.clients, args.per_client, floor=True)
    print(
        f"a request through the framework without the ledger's work (GET /v1/whoami, same "
        f"clients; submits take the command routes' hot path in front of it): "
        f"{floor.rate:,.0f} requests/s, server {floor.server_cpu * 1e6:.0f} us CPU per request; "
        f"{load()}",
        flush=True,
    )
    for pending in (int(x) for x in args.pending.split(",")):
        q = queue_through_server(pending, args.queue_runs)
        if q is None:
            continue
        first, again = statistics.median(q.first_ms), statistics.median(q.again_ms)
        print(
            f"gpuledger queue through the server at {pending:,} pending, end to end: first "
            f"read after an append median {first:.0f} ms, max {max(q.first_ms):.0f} ms "
            f"({first / GOAL_QUEUE_MS:.2f}x / {max(q.first_ms) / GOAL_QUEUE_MS:.2f}x the "
            f"{GOAL_QUEUE_MS:.0f} ms limit); again at the same position median {again:.0f} ms "
            f"({again / GOAL_QUEUE_MS:.2f}x); CPU: CLI {q.cli_cpu_ms:.0f} ms, server "
            f"{q.server_cpu_first_ms:.0f} ms (append and first read) and "
            f"{q.server_cpu_again_ms:.0f} ms (again); {load()}",
            flush=True,
        )


if __name__ == "__main__":
    main()
