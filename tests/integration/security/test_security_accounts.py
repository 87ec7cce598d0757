"""Red team, one cap per account (threat model row T23, docs/security.md; atk37-25 F1, F2, F4, F5):
against a real `gpuledger serve` over raw sockets, each TCP client on an address of its own on
the loopback, each local account a real OS account connecting to the Unix socket:

- one user's job tokens (one per running job of hers) hold at most 16 connections together,
  from one address (each job token was an account of its own: one user with 64 running jobs
  held TCP's whole 1,024, F1), the 17th 429, held 0.25 s like every 429 (answered at once, a
  person looping them made ~2,600 a second: F5); her own token is served beside them;
- an OS account holds 16 connections on the socket, claimed by its name or not (16 of each:
  two accounts took the socket's reserve, F2), and with TCP and the socket's room full of
  others', the host's admin (root, a ledger admin's account) is still answered on the socket;
- under the open-files limit systemd gives (1,024), the socket filled first and TCP then: every
  connection counts against one total, the admin is answered, and the refusal is in the log
  (TCP admitted its whole cap beside a full socket: more connections than files, F4).

Each assertion counts what the server answers, never a latency ratio."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ledger.core import tokens
from ledger.store.application import Ledger
from ledger.store.clock import new_token_secret
from ledger.wire import SOCKET_NAME
from schemas import commands as c
from tests.integration.security.test_security_connections import answer
from tests.integration.serverkit import Server, make_token, set_up_ledger, start_server
from tests.integration.userkit import User, os_user, shared_dir

PER_PERSON = 16
JOBS = 20
TCP_CAP = 48
LOCAL = 24
STALL_S = 30.0
"""Long enough that the connections a test holds are not dropped while it looks."""


@dataclass
class World:
    server: Server
    tokens: dict[str, str]
    job_tokens: list[str]

    @property
    def socket_path(self) -> Path:
        return self.server.home / SOCKET_NAME


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with shared_dir("gpuledger-accounts-") as top:  # other accounts reach the socket
        home = top / "ledger"
        set_up_ledger(home, top)
        ledger = Ledger(home)
        secrets = [new_token_secret() for _ in range(JOBS)]
        try:
            ledger.execute_all([
                c.RegisterNode(actor="root", node=f"n{i}", gpu_type="h100", gpus=8)
                for i in (2, 3, 4)
            ])  # fmt: skip
            submit = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=3600)
            ledger.execute_all([submit] * JOBS)
            mine = sorted(j for j, job in ledger.state.jobs.items() if job.spec.user == "alice")
            ledger.execute_all([
                tokens.issue("alice", "alice", s, scope="job", scope_job=j)
                for s, j in zip(secrets, mine[-JOBS:], strict=True)
            ])  # fmt: skip
        finally:
            ledger.close()
        home.chmod(0o755)
        people = {who: make_token(home, "--user", who) for who in ("alice", "carol")}
        server = start_server(home, "--interval", "0.5s", env={
            "GPULEDGER_SEND_STALL_S": str(STALL_S), "GPULEDGER_MAX_CONNECTIONS": str(TCP_CAP),
            "GPULEDGER_LOCAL_CONNECTIONS": str(LOCAL)})  # fmt: skip
        try:
            w = World(server, people, secrets)
            _until_placed(w)
            yield w
        finally:
            assert server.stop() == 0


def _until_placed(w: World) -> None:
    """Every one of alice's jobs holds its GPUs (a job token is valid only then)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, _h, body = ask(tcp(w, "127.0.40.1"), w, "/v1/whoami", w.job_tokens[-1])
        if status == 200:
            return
        time.sleep(0.3)
    raise AssertionError(f"alice's jobs were not placed: {status} {body!r}")


def tcp(w: World, source: str) -> socket.socket:
    """A TCP connection to the server from `source` (an address of the loopback)."""
    s = socket.socket()
    s.bind((source, 0))
    s.connect(("127.0.0.1", w.server.port))
    return s


def unix(w: World) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(w.socket_path))
    return s


def head(path: str, token: str | None = None, method: str = "GET", length: int = 0) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    body = f"Content-Type: application/json\r\nContent-Length: {length}\r\n" if length else ""
    return f"{method} {path} HTTP/1.1\r\nHost: t\r\n{auth}{body}\r\n".encode()


def ask(
    s: socket.socket, w: World, path: str, token: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    with s:
        s.sendall(head(path, token))
        return answer(s, timeout=15)


def slow_body(s: socket.socket, token: str | None = None) -> socket.socket:
    """A write whose body never comes: its connection is its caller's until the body stalls."""
    s.sendall(head("/v1/commands/submit", token, "POST", 1000))
    return s


def answered_within(s: socket.socket, seconds: float) -> int | None:
    """The status a connection was answered with within `seconds` (None: still held)."""
    s.settimeout(seconds)
    try:
        data = s.recv(65536)
    except TimeoutError:
        return None
    except OSError:
        return -1
    if not data:
        return -1
    return int(data.split(b" ", 2)[1])


def test_a_users_job_tokens_together_hold_16_connections_beside_her_own(world: World) -> None:
    """F1: each job token was a caller of its own: 20 job tokens x 2 connections from one
    address were all held; now her jobs' tokens together hold 16 (each job at most 4), the
    rest 429, held 0.25 s (F5); her own token is still served (counted as hers, a manager's
    job tokens for her job locked her out: atk38-25 F6), and so is carol at the same
    address."""
    w = world
    me = "127.0.41.1"
    conns = [slow_body(tcp(w, me), t) for t in w.job_tokens for _ in range(2)]
    try:
        got = [answered_within(s, 0.05) for s in conns]
        time.sleep(1.0)
        got = [g if g is not None else answered_within(s, 0.05)
               for s, g in zip(conns, got, strict=True)]  # fmt: skip
        held = got.count(None)
        assert held == PER_PERSON and got.count(429) == len(conns) - PER_PERSON, got
        started = time.monotonic()
        status, _h, body = ask(tcp(w, me), w, "/v1/whoami", w.job_tokens[0])
        assert status == 429 and b"'jobs of alice' has 16 connections open" in body, body
        assert time.monotonic() - started >= 0.25  # held like every 429 (F5)
        status, _h, body = ask(tcp(w, me), w, "/v1/whoami", w.tokens["alice"])
        assert status == 200, body
        status, _h, body = ask(tcp(w, me), w, "/v1/whoami", w.tokens["carol"])
        assert status == 200, body
    finally:
        for s in conns:
            s.close()


HOLDER = r"""
import json, socket, sys, time
path, claimed, idle = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conns = []
for i in range(claimed + idle):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        conns.append(s)
        continue
    if i < claimed:  # a write whose body never comes: claimed by the account's own name
        try:
            s.sendall(b"POST /v1/commands/submit HTTP/1.1\r\nHost: t\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        except OSError:
            pass  # refused at once: its answer is read below
    conns.append(s)
    time.sleep(0.01 if claimed + idle < 100 else 0.001)
time.sleep(1.5)
got = []
for s in conns:
    s.setblocking(False)
    try:
        data = s.recv(65536)
        got.append(int(data.split(b" ", 2)[1]) if data else -1)
        if data and not data.startswith(b"HTTP/1.1 429"):
            print(data, file=sys.stderr)
    except BlockingIOError:
        got.append(None)
    except OSError:
        got.append(-1)
print(json.dumps(got), flush=True)
sys.stdin.read()  # hold the rest until the test is done
"""


def hold(
    w: World, user: User, claimed: int, idle: int
) -> tuple[subprocess.Popen[str], list[int | None]]:
    """`user`'s process holding `claimed` + `idle` connections on the socket: what each was
    answered (None: held)."""
    proc = subprocess.Popen(
        ["runuser", "-u", user.name, "--", "/usr/bin/python3", "-c", HOLDER, str(w.socket_path),
         str(claimed), str(idle)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the holder said nothing"
    return proc, json.loads(line)


def test_local_accounts_hold_16_each_and_never_lock_the_host_admin_out(world: World) -> None:
    """F2: an OS account held 16 claimed and 16 unclaimed connections on the socket, and two
    such accounts with TCP full took the socket's reserve: root heard 503. Now an account's
    connections are one 16 whether a request claimed them or not, and with TCP full and the
    socket's room taken by local accounts, root (and a ledger admin's account) are answered."""
    w = world
    holders: list[subprocess.Popen[str]] = []
    tcp_conns: list[socket.socket] = []
    try:
        with os_user("glacc") as one, os_user("glacc") as two:
            proc, got = hold(w, one, PER_PERSON, PER_PERSON)
            holders.append(proc)
            assert got.count(None) == PER_PERSON and got.count(429) == PER_PERSON, got
            # TCP full: tokenless connections from one address (its 64 > TCP's cap)
            for _ in range(TCP_CAP):
                tcp_conns.append(tcp(w, "127.0.42.1"))
            time.sleep(0.5)
            status, _h, body = ask(tcp(w, "127.0.42.2"), w, "/v1/health")
            assert status == 503, body
            # the socket's reserve (24) beyond TCP's: the first account's 16, 8 of another's
            proc, got = hold(w, two, PER_PERSON, 0)
            holders.append(proc)
            assert got.count(None) == LOCAL - PER_PERSON and got.count(503) == 8, got
            for _ in range(3):
                status, _h, body = ask(unix(w), w, "/v1/health")
                assert status == 200, body  # root: the admins' reserve
    finally:
        for s in tcp_conns:
            s.close()
        for proc in holders:
            proc.communicate("", timeout=30)


SMALL_TCP = 600
SMALL_LOCAL = 64


def test_the_socket_filled_then_tcp_never_passes_the_files_serve_sized() -> None:
    """F4: TCP was refused only at its own cap, so with the socket full first the caps let
    2,112 connections open against 1,344 files; the server ran out of descriptors (every new
    connection reset, root's requests on an open one 500). Here TCP 600 and the socket 64 more
    under a soft limit of 1,024 files: one local account holds the socket's 664, TCP's 600 are
    all 503 in one line, root is answered on the socket, and the server says it refused."""
    with shared_dir("gpuledger-files-") as top, os_user("glfd") as user:
        home = top / "ledger"
        set_up_ledger(home, top)
        home.chmod(0o755)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
        try:
            server = start_server(home, env={
                "GPULEDGER_SEND_STALL_S": "60", "GPULEDGER_MAX_CONNECTIONS": str(SMALL_TCP),
                "GPULEDGER_LOCAL_CONNECTIONS": str(SMALL_LOCAL),
                "GPULEDGER_CONNECTIONS_PER_PERSON": "5000",
                "GPULEDGER_CONNECTIONS_PER_ADDRESS": "5000"})  # fmt: skip
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(4096, hard)), hard))
        w = World(server, {}, [])
        holders: list[subprocess.Popen[str]] = []
        held: list[socket.socket] = []
        try:
            # 1 one local account takes the socket's room: TCP's and the socket's reserve
            proc, got = hold(w, user, 0, SMALL_TCP + SMALL_LOCAL)
            holders.append(proc)
            assert got.count(None) == SMALL_TCP + SMALL_LOCAL, sorted(map(str, set(got)))
            # 2 then TCP: all refused in one line (TCP counts the socket's too)
            refused = 0
            for _ in range(SMALL_TCP):
                try:
                    held.append(tcp(w, "127.0.44.1"))
                except OSError:
                    continue
            for s in held:
                refused += answered_within(s, 0.5) == 503
            assert refused == SMALL_TCP, refused
            # 3 the host's admin is answered on the socket, new connections and all
            for _ in range(3):
                try:
                    status, _h, body = ask(unix(w), w, "/v1/health")
                except OSError as err:
                    status, body = -1, str(err).encode()
                assert status == 200, body
            text = server.log_path.read_text(errors="replace")
            assert "refusing TCP connections (503)" in text, text[-3000:]
        finally:
            for s in held:
                s.close()
            for proc in holders:
                proc.communicate("", timeout=60)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            assert server.stop() == 0
