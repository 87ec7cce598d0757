"""Red team, one signed-in person tying up the server's connections (threat model row T23,
docs/security.md; issue 25): many connections asking for big answers (10,000-row pages) that
they read slowly or never (a slowloris on the response side). Against a real `gpuledger
serve` over raw sockets: a send that stalls is dropped after `GPULEDGER_SEND_STALL_S`, an
answer counts against its reader's admission until it is sent, a person's 17th connection is
refused in one line (429, closed) while another person is served, and another person's
submits all succeed throughout."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.engines.supervised import live_processes
from tests.integration.serverkit import ServerWorld as World
from tests.integration.serverkit import (
    cli,
    make_token,
    set_up_ledger,
    set_up_long_queue,
    start_server,
)

STALL_S = 2.0
PAGE = "/v1/jobs?limit=10000"
"""About 2.4 MB: a few pipelined are more than the kernel's buffers hold for a client that
reads nothing, so the rest waits in the server's."""


FILES = 512
FLOOD = 700
"""Connections alice opens: more than the server's files at start (`FILES`)."""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("connections")
    home = tmp / "ledger"
    set_up_long_queue(home, tmp)
    tokens = {who: make_token(home, "--user", who) for who in ("root", "alice", "bob", "carol")}
    # a server whose soft limit of open files is a common default's (systemd's is 1,024):
    # before the caps, one person's connections used them all and everyone's accept failed
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(FILES, hard), hard))
    try:
        server = start_server(home, env={"GPULEDGER_SEND_STALL_S": str(STALL_S)})
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield World(server, tokens)
    finally:
        assert server.stop() == 0


def connect(w: World) -> socket.socket:
    """A connection that reads (almost) nothing: its receive buffer as small as the kernel
    allows."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", w.server.port))
    return s


def ask(w: World, s: socket.socket, who: str, path: str, times: int = 1) -> None:
    head = f"GET {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {w.tokens[who]}\r\n\r\n"
    s.sendall(head.encode() * times)


def answer(s: socket.socket, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """One whole answer read from `s` (its status, headers and body)."""
    s.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        got = s.recv(65536)
        assert got, f"closed before an answer: {data!r}"
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        got = s.recv(65536)
        assert got, "closed inside an answer"
        body += got
    return int(lines[0].split()[1]), headers, body


def read_all(s: socket.socket, timeout: float = 30) -> tuple[int, str]:
    """Every byte `s` still delivers, and how it ended ("eof" or "reset")."""
    s.settimeout(timeout)
    n = 0
    try:
        while True:
            got = s.recv(1 << 20)
            if not got:
                return n, "eof"
            n += len(got)
    except ConnectionResetError:
        return n, "reset"


def get(w: World, who: str, path: str) -> tuple[int, dict[str, str], bytes]:
    s = socket.create_connection(("127.0.0.1", w.server.port))
    try:
        ask(w, s, who, path)
        return answer(s)
    finally:
        s.close()


def counter(w: World, name: str, reason: str, before: bool = False) -> float:
    """A count from /metrics (`before`: 0 when the server has none yet)."""
    status, _headers, body = get(w, "root", "/metrics")
    assert status == 200, body
    for line in body.decode().splitlines():
        if line.startswith(f'{name}{{reason="{reason}"}} '):
            return float(line.split()[-1])
    assert before, f"{name} {reason} not in /metrics"
    return 0.0


def test_a_send_that_stalls_is_dropped_and_its_answer_counts_until_then(world: World) -> None:
    """Each step waits for what the server records, never for a time: under CI's load the
    pages took longer than the 1 s once slept, the test began reading before the drop, and its
    reads were progress (stop 56's CI: no `send_stalled` drop counted)."""
    w = world
    # 1 alice asks for three big pages on each of two connections and reads none of them
    dropped = counter(w, "gpuledger_connections_dropped_total", "send_stalled", before=True)
    stalled = [connect(w) for _ in range(2)]
    for s in stalled:
        ask(w, s, "alice", PAGE, times=3)
    try:
        # 2 her answers computed and not sent are hers still: two at once, a third read is 429
        #   (once the server has taken both: a read before that is simply answered)
        deadline = time.monotonic() + 60
        while (got := get(w, "alice", "/v1/jobs?limit=1"))[0] != 429:
            assert got[0] == 200 and time.monotonic() < deadline, got
            time.sleep(0.5)
        _status, headers, body = got
        assert "retry-after" in headers and b"2 queries running already" in body
        # another person reads meanwhile
        assert get(w, "bob", "/v1/jobs?limit=1")[0] == 200
        # 3 no byte leaves for STALL_S: both connections are dropped, their answers
        #   unsent, and her admission is hers again (the counter read as root, whose
        #   connection is its own: nothing of alice's is read until both are dropped)
        deadline = time.monotonic() + STALL_S * 30
        while counter(w, "gpuledger_connections_dropped_total", "send_stalled") < dropped + 2:
            assert time.monotonic() < deadline, "a stalled send was never dropped"
            time.sleep(0.5)
        for s in stalled:
            n, how = read_all(s, timeout=STALL_S * 10)
            assert n < 3 * 2_000_000, (n, how)  # never all three pages
        deadline = time.monotonic() + STALL_S * 5
        while get(w, "alice", "/v1/jobs?limit=1")[0] != 200:
            assert time.monotonic() < deadline, "her reads stayed refused after the drop"
            time.sleep(0.5)
    finally:
        for s in stalled:
            s.close()


def test_a_persons_17th_connection_is_refused_in_one_line_while_another_is_served(
    world: World,
) -> None:
    w = world
    # 1 sixteen connections of alice's, each with a request under way (a submit whose body
    #   she never sends: her connection is claimed once its headers are in)
    held = []
    body = b'{"actor": "", "account": "ai2/olmo", "gpus": 1}'
    head = (
        f"POST /v1/commands/submit HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
        f"{w.tokens['alice']}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    try:
        for _ in range(16):
            s = socket.create_connection(("127.0.0.1", w.server.port))
            s.sendall(head)
            held.append(s)
        time.sleep(0.5)
        refused = counter(w, "gpuledger_connections_refused_total", "per_person", before=True)
        # 2 the 17th: 429 in one line, Retry-After, and closed (not a hang)
        extra = socket.create_connection(("127.0.0.1", w.server.port))
        try:
            ask(w, extra, "alice", "/v1/whoami")
            status, headers, text = answer(extra, timeout=10)
            assert status == 429 and headers.get("connection") == "close", text
            assert headers.get("retry-after") == "1"
            problem = json.loads(text)
            assert problem["code"] == "busy" and "16 connections open" in problem["detail"]
            assert read_all(extra, timeout=10)[0] == 0  # closed after it
        finally:
            extra.close()
        assert counter(w, "gpuledger_connections_refused_total", "per_person") == refused + 1
        # 3 another person is served meanwhile, reads and a submit
        assert get(w, "carol", "/v1/whoami")[0] == 200
        status, _ = w.server.request("POST", "/v1/commands/submit",
                                     {"actor": "", "account": "ai2/tulu", "gpus": 1},
                                     w.tokens["carol"])  # fmt: skip
        assert status == 200
        # 4 the held submits go through once their bodies come; then alice connects again
        for s in held:
            s.sendall(body)
        for s in held:
            assert answer(s)[0] == 200
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 10
    while get(w, "alice", "/v1/whoami")[0] != 200:
        assert time.monotonic() < deadline, "alice's connections stayed counted after closing"
        time.sleep(0.1)


def test_another_persons_submits_all_succeed_while_one_person_floods_connections(
    world: World,
) -> None:
    w = world
    # 1 alice floods: `FLOOD` connections, each asking for three big pages, reading none
    stop = threading.Event()
    opened: list[socket.socket] = []

    def flood() -> None:
        while not stop.is_set() and len(opened) < FLOOD:
            try:
                s = connect(w)
                ask(w, s, "alice", PAGE, times=3)
            except OSError:
                time.sleep(0.05)
                continue
            opened.append(s)

    attackers = [threading.Thread(target=flood, daemon=True) for _ in range(4)]
    for t in attackers:
        t.start()
    # 2 carol submits, bob reads, throughout: every one succeeds
    failed: list[object] = []
    done = 0
    try:
        began = time.monotonic()
        while time.monotonic() - began < STALL_S * 4 or done < 50:
            status, got = w.server.request("POST", "/v1/commands/submit",
                                           {"actor": "", "account": "ai2/tulu", "gpus": 1},
                                           w.tokens["carol"])  # fmt: skip
            if status != 200:
                failed.append((status, got))
            done += 1
            if done % 10 == 0:
                status, _h, text = get(w, "bob", "/v1/jobs?limit=5")
                if status != 200:
                    failed.append((status, text[:200]))
    finally:
        stop.set()
        for t in attackers:
            t.join(timeout=30)
        for s in opened:
            s.close()
    assert failed == [], failed[:5]
    assert len(opened) >= FLOOD  # the flood happened
    # her connections past 16 were refused, the stalled ones dropped
    assert counter(w, "gpuledger_connections_refused_total", "per_person") > 0


def test_past_the_servers_cap_a_connection_is_answered_503_and_one_that_asks_nothing_is_dropped(
    tmp_path: Path,
) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    token = make_token(home, "--user", "carol")
    server = start_server(home, env={"GPULEDGER_MAX_CONNECTIONS": "8",
                                     "GPULEDGER_SEND_STALL_S": "5"})  # fmt: skip
    w = World(server, {"carol": token})
    quiet: list[socket.socket] = []
    try:
        # 1 eight connections that ask nothing fill the server's cap
        quiet = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(8)]
        time.sleep(0.3)
        # 2 the ninth: 503 in one line at once, and closed (not a hang)
        extra = socket.create_connection(("127.0.0.1", server.port))
        try:
            status, headers, text = answer(extra, timeout=10)
            assert status == 503 and headers.get("connection") == "close", text
            assert "8 connections open" in json.loads(text)["detail"]
            assert read_all(extra, timeout=10)[0] == 0
        finally:
            extra.close()
        # 3 a connection that asks nothing for the stall limit is dropped: room again
        for s in quiet:
            assert read_all(s, timeout=30)[1] in ("eof", "reset")
        assert get(w, "carol", "/v1/whoami")[0] == 200
    finally:
        for s in quiet:
            s.close()
        assert server.stop() == 0


def test_a_body_announced_and_never_sent_is_dropped_and_huge_headers_are_refused(
    world: World,
) -> None:
    """atk36-25 F1: a request without a token announcing a 4 MB body and sending none held its
    connection for good (1,100 of them filled the server's cap; everyone, the Unix socket's
    admin too, heard 503 for as long as the outsider liked); now a body that stops coming is
    dropped after the stall limit. F5: 32 MiB of tiny header lines grew the server by 1.3 GB;
    now a request's line and headers are at most 64 KiB: one 431 line, closed."""
    before = counter(world, "gpuledger_connections_dropped_total", "no_body", before=True)
    held = [socket.create_connection(("127.0.0.1", world.server.port)) for _ in range(3)]
    try:
        announced = (
            b"POST /v1/commands/submit HTTP/1.1\r\nHost: t\r\n"
            b"Content-Type: application/json\r\nContent-Length: 4000000\r\n\r\n{"
        )
        for s in held:
            s.sendall(announced)
        t0 = time.monotonic()
        for s in held:
            assert read_all(s, timeout=30)[1] in ("eof", "reset")
        assert time.monotonic() - t0 < STALL_S + 5.0
    finally:
        for s in held:
            s.close()
    after = counter(world, "gpuledger_connections_dropped_total", "no_body")
    assert after >= before + 3, (before, after)
    # a body that keeps coming, slower than all at once, is whole and answered
    s = socket.create_connection(("127.0.0.1", world.server.port))
    try:
        body = json.dumps({"actor": "", "account": "ai2/olmo", "gpus": 1, "command": ["true"],
                           "min_runtime_s": 0}).encode()  # fmt: skip
        s.sendall(b"POST /v1/commands/submit HTTP/1.1\r\nHost: t\r\nContent-Type: "
                  b"application/json\r\nAuthorization: Bearer " + world.tokens["carol"].encode()
                  + b"\r\nContent-Length: %d\r\n\r\n" % len(body))  # fmt: skip
        for i in range(0, len(body), 20):
            s.sendall(body[i : i + 20])
            time.sleep(STALL_S / 4)
        status, _h, text = answer(s)
        assert status != 408 and status < 500, text
    finally:
        s.close()
    # huge headers: one 431 line and closed, nothing kept
    s = socket.create_connection(("127.0.0.1", world.server.port))
    try:
        s.sendall(b"GET /v1/whoami HTTP/1.1\r\nHost: t\r\n")
        with contextlib.suppress(OSError):  # the server may close while we still send
            for _ in range(200):  # long lines: 100 lines at most is its own 431
                s.sendall(b"X-a: " + b"b" * 2000 + b"\r\n")
        status, headers, text = answer(s)
        assert status == 431 and headers.get("connection") == "close", text
        assert "64 KiB" in json.loads(text)["detail"]
    finally:
        s.close()
    assert get(world, "carol", "/v1/whoami")[0] == 200


def test_tokenless_squatters_at_a_nodes_address_never_cut_its_agent_off(
    tmp_path: Path,
) -> None:
    """atk38-25 F5: 64 tokenless connections from a GPU node's address (another tenant's job
    on it, any local account), each asking `/v1/health` every 3.5 s, filled that address's 64
    unclaimed connections; the agent's every poll and report was refused 429 at accept, before
    its node token was read, its lease ran out and it killed its jobs, and one 429 at
    registration made it exit. Now a connection past its address's cap waits for its first
    request and is admitted when that carries a valid token: the agent keeps its job and its
    node, and a restarted agent registers while the squatters hold on; a 65th tokenless
    connection of theirs is still refused 429."""
    from tests.integration.agentkit import SERVE, Agent, Cluster, wait_for

    home = tmp_path / "home"
    cli(home, "init", "--admin", "root")
    budget = tmp_path / "budget.toml"
    budget.write_text('[accounts."ai2"]\nkind = "program"\n\n[accounts."ai2/olmo"]\n'
                      'kind = "project"\nmembers = ["root"]\n')  # fmt: skip
    cli(home, "budget", "apply", str(budget), GPULEDGER_USER="root")
    cli(home, "node", "add", "n1", "--gpus", "2", "--gpu-type", "sim", GPULEDGER_USER="root")
    token = make_token(home, "--node", "n1", "--name", "n1")
    c = Cluster(home, start_server(home, *SERVE))
    agent = Agent("n1", tmp_path / "n1", token, c.server.url, tmp_path / "n1.log")
    c.agents["n1"] = agent
    stop = threading.Event()
    squat: list[socket.socket] = []
    try:
        agent.start()
        job = c.submit(1, "sleep 600")
        c.wait_status(job, "running")
        squat = [socket.create_connection(("127.0.0.1", c.server.port), timeout=30)
                 for _ in range(64)]  # fmt: skip
        kept: list[int] = []

        def hold() -> None:  # one /v1/health on each every ~3.5 s: under the 20 a second
            while not stop.is_set():
                for s in squat:
                    with contextlib.suppress(OSError, AssertionError):
                        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n")
                        kept.append(answer(s, timeout=10)[0])
                    if stop.wait(0.055):
                        return

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        wait_for("the squatters' first answers", lambda: len(kept) >= 64)
        # the address's unclaimed connections are full: a 65th without a token is refused
        with socket.create_connection(("127.0.0.1", c.server.port), timeout=30) as s:
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n")
            status, _h, body = answer(s, timeout=10)
        assert status == 429 and b"no request with a token has claimed" in body, body
        # three times the node-lost limit: the agent keeps in touch, its job runs on
        before = len(agent.text())
        time.sleep(15)
        assert c.nodes()["n1"] == "active", c.why()
        assert c.job(job)["status"] == "running", c.why()
        assert agent.proc is not None and agent.proc.poll() is None, c.why()
        assert "joining again" not in agent.text()[before:], c.why()
        # a restarted agent registers meanwhile (one 429 there took it down)
        agent.kill(signal.SIGTERM)
        agent.start()
        assert c.job(job)["status"] == "running", c.why()
        assert set(kept) == {200}, sorted(set(kept))  # the squatters held on throughout
    finally:
        stop.set()
        for s in squat:
            s.close()
        if agent.proc is not None and agent.proc.poll() is None:
            agent.kill(signal.SIGKILL)
        c.server.stop(signal.SIGKILL)
        for p in live_processes(agent.state):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
