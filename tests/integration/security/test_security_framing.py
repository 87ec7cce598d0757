"""Red team, the work a request costs before any meter sees it (threat model row T23,
docs/security.md; issue 25, atk39-25 F1, F4, F6). Against a real `gpuledger serve` over raw
sockets, each TCP client bound to an address of its own on the loopback (127.0.x.y):

- a request body sent as `Transfer-Encoding: chunked` (1-byte chunks cost the parser one
  Python call each: one person's 16 requests froze the API ~2.5 minutes and every node was
  counted lost, F4) is refused 411 at its head, before its body is read, and counted; while 16
  such connections push 1.2 MB of 1-byte chunks each, another person's submits are answered;
- a request of more than 100 header lines (10,000 lines of `a:b` under the 64 KiB cost ~8 ms of
  the event loop each, F1) is refused 431 before the parser sees its headers, 100 are served;
  while 64 tokenless connections loop them, another person's submits are answered;
- pipelined requests are given to the parser one at a time, each after the answer of the one
  before (20,000 tokenless `GET /v1/health` in one send were all parsed before any meter, F6):
  a malformed request after three good ones is refused only after their three answers; while
  16 connections send 20,000 each, another person's submits are answered and each flooding
  connection is closed by its address's meter.

Each assertion counts what the server counts or answers, never a latency ratio."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO

import pytest

from ledger.wire import SOCKET_NAME
from tests.integration.security.test_security_connections import answer
from tests.integration.serverkit import ServerWorld as World
from tests.integration.serverkit import make_token, set_up_ledger, start_server

FLOOD_S = 5.0


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("framing")
    home = tmp / "ledger"
    set_up_ledger(home, tmp)
    tokens = {who: make_token(home, "--user", who) for who in ("alice", "bob")}
    server = start_server(home, "--interval", "0.5s", env={"GPULEDGER_SEND_STALL_S": "20"})
    try:
        yield World(server, tokens)
    finally:
        assert server.stop() == 0


def tcp(w: World, source: str) -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.connect(("127.0.0.1", w.server.port))
    return s


def request(path: str, *, token: str | None = None, method: str = "GET", extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return f"{method} {path} HTTP/1.1\r\nHost: t\r\n{auth}{extra}\r\n".encode()


def submit_body(pad: int = 0) -> bytes:
    return json.dumps({"actor": "", "account": "ai2/olmo", "gpus": 1}).encode() + b" " * pad


def chunked(body: bytes) -> bytes:
    """`body` in 1-byte chunks, as the attacker sent it."""
    return b"".join(b"1\r\n%c\r\n" % b for b in body) + b"0\r\n\r\n"


def metric(w: World, line_start: str) -> float:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:  # root, on the socket
        s.connect(str(w.server.home / SOCKET_NAME))
        s.sendall(request("/metrics"))
        status, _h, body = answer(s, timeout=60)
    assert status == 200, body
    for line in body.decode().splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    return 0.0


def closed(s: socket.socket, timeout: float = 30) -> bool:
    """Whether the server closes `s` (EOF or reset) within `timeout`, reading what comes."""
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def submits_during(w: World, flood: Callable[[threading.Event], None], threads: int) -> list[int]:
    """Bob's submits, one after another on fresh connections, while `threads` threads run
    `flood` for `FLOOD_S`: their statuses (each answered before the flood ends)."""
    stop = threading.Event()
    runners = [threading.Thread(target=flood, args=(stop,), daemon=True) for _ in range(threads)]
    for t in runners:
        t.start()
    time.sleep(0.5)  # the flood under way
    got: list[int] = []
    began = time.monotonic()
    try:
        while time.monotonic() - began < FLOOD_S:
            with tcp(w, "127.0.20.1") as s:
                body = submit_body()
                s.sendall(request("/v1/commands/submit", token=w.tokens["bob"], method="POST",
                                  extra=f"Content-Type: application/json\r\n"
                                        f"Content-Length: {len(body)}\r\n") + body)  # fmt: skip
                got.append(answer(s, timeout=FLOOD_S + 10)[0])
            time.sleep(0.05)
        assert all(t.is_alive() for t in runners), "the flood ended before the submits"
    finally:
        stop.set()
        for t in runners:
            t.join(timeout=60)
    return got


def test_a_chunked_body_is_refused_411_at_its_head_before_it_is_read(world: World) -> None:
    """F4: alice's submit with a chunked body was read one Python call per chunk (1,000,000
    chunks: ~20 s of the event loop) and answered 200. Now its head is answered 411 before
    any of the body is sent, the connection closed, and the refusal counted."""
    w = world
    before = metric(w, 'gpuledger_connections_refused_total{reason="length"}')
    for token in (w.tokens["alice"], None):
        with tcp(w, "127.0.21.1") as s:
            s.sendall(request("/v1/commands/submit", token=token, method="POST",
                              extra="Content-Type: application/json\r\n"
                                    "Transfer-Encoding: chunked\r\n"))  # fmt: skip
            status, headers, text = answer(s, timeout=10)  # the body not sent yet
            assert status == 411 and headers.get("connection") == "close", text
            assert "Content-Length" in json.loads(text)["detail"], text
            assert closed(s)
    # the same body with its Content-Length is served, as our clients send it
    with tcp(w, "127.0.21.1") as s:
        body = submit_body(pad=10_000)
        s.sendall(request("/v1/commands/submit", token=w.tokens["alice"], method="POST",
                          extra=f"Content-Type: application/json\r\n"
                                f"Content-Length: {len(body)}\r\n") + body)  # fmt: skip
        status, _h, text = answer(s)
        assert status == 200, text
    # two lengths, or one that is not a number: one 400 line, never a guess at the end
    for extra in ("Content-Length: 2\r\nContent-Length: 3\r\n", "Content-Length: +2\r\n"):
        with tcp(w, "127.0.21.1") as s:
            s.sendall(request("/v1/commands/submit", method="POST", extra=extra) + b"{}")
            status, _h, text = answer(s, timeout=10)
            assert status == 400 and b"one Content-Length" in text, text
    assert metric(w, 'gpuledger_connections_refused_total{reason="length"}') == before + 4


def test_chunked_floods_on_a_persons_16_connections_leave_anothers_submits_answered(
    world: World,
) -> None:
    """F4: 16 of alice's requests with 1 MB bodies of 1-byte chunks froze the API ~2.5
    minutes (not one of dan's submits answered, every node counted lost). Now each is refused
    at its head and its connection closed while it still sends, and bob's submits are all
    answered meanwhile."""
    w = world
    wire = request("/v1/commands/submit", token=w.tokens["alice"], method="POST",
                   extra="Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                   ) + chunked(submit_body(pad=200_000))  # fmt: skip
    refused: list[int] = []
    lock = threading.Lock()

    def flood(stop: threading.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError), tcp(w, "127.0.22.1") as s:
                s.settimeout(30)
                with contextlib.suppress(OSError):
                    s.sendall(wire)  # the server closes while we still send
                with contextlib.suppress(OSError, AssertionError):
                    status = answer(s, timeout=30)[0]
                    with lock:
                        refused.append(status)
            time.sleep(0.05)

    before = metric(w, 'gpuledger_connections_refused_total{reason="length"}')
    his = submits_during(w, flood, 16)
    assert his and set(his) == {200}, his
    assert len(his) >= 3, his
    assert set(refused) <= {411, 429}, refused
    assert metric(w, 'gpuledger_connections_refused_total{reason="length"}') > before


def test_more_than_100_header_lines_are_refused_431_before_they_are_parsed(world: World) -> None:
    """F1: 10,000 header lines of `a:b` (60 KB, under the 64 KiB cap) were parsed, one Python
    call per line, and answered 200. Now past 100 lines: one 431 line, closed, counted; 100
    lines are served."""
    w = world
    before = metric(w, 'gpuledger_connections_refused_total{reason="headers"}')
    for lines, want in ((100, 200), (101, 431), (10_000, 431)):
        with tcp(w, "127.0.23.1") as s:
            extra = "a:b\r\n" * (lines - 1)  # with Host: `lines` (10,000: 50 KB)
            s.sendall(request("/v1/health", extra=extra))
            status, headers, text = answer(s, timeout=10)
        assert status == want, (lines, text)
        if want == 431:
            assert headers.get("connection") == "close" and b"100 lines" in text, text
    assert metric(w, 'gpuledger_connections_refused_total{reason="headers"}') == before + 2


def test_header_line_floods_leave_anothers_submits_answered(world: World) -> None:
    """F1: 128 tokenless connections of one /24 looping 10,000-line requests cut another
    person's submits from ~150 to 2 in 15 s. Now each is refused at its 101st line."""
    w = world
    wire = request("/v1/health", extra="a:b\r\n" * 10_000)
    seen: list[int] = []
    lock = threading.Lock()
    sources = iter(range(10_000))

    def flood(stop: threading.Event) -> None:
        with lock:
            me = f"127.0.24.{next(sources) % 16 + 1}"
        while not stop.is_set():
            with contextlib.suppress(OSError, AssertionError), tcp(w, me) as s:
                with contextlib.suppress(OSError):
                    s.sendall(wire)
                status = answer(s, timeout=30)[0]
                with lock:
                    seen.append(status)

    his = submits_during(w, flood, 64)
    assert his and set(his) == {200}, his
    assert len(his) >= 3, his
    assert seen and set(seen) <= {431, 429}, set(seen)


def test_pipelined_requests_are_parsed_one_at_a_time(world: World) -> None:
    """F6: every request of a send was parsed at once, before any was answered: a malformed
    one after three good ones was answered 400 at once, and the three never. Now the parser
    sees each request after the answer before it: three 200s, then the 400."""
    w = world
    with tcp(w, "127.0.25.1") as s:
        s.sendall(request("/v1/health") * 3 + b"NOT HTTP AT ALL\r\n\r\n")
        s.settimeout(10)
        said = b""  # every answer until the server closes (several may come in one read)
        while got := s.recv(65536):
            said += got
    statuses = [int(x) for x in re.findall(rb"HTTP/1\.1 (\d{3}) ", said)]
    assert statuses == [200, 200, 200, 400], statuses


def test_a_pipelined_flood_is_metered_and_anothers_submits_are_answered(world: World) -> None:
    """F6: 16 connections, each sending 20,000 pipelined tokenless `GET /v1/health` in one
    send (760 KB), stopped every submit for the attack and ~20 s after it. Now each
    connection's requests reach the meters one at a time, each parsed once the one before is
    answered: the 16 (one /24) are answered at its 40 a second, twice that at once, the rest
    not yet parsed; bob's submits are all answered meanwhile."""
    w = world
    wire = request("/v1/health") * 20_000
    answered: list[int] = []
    lock = threading.Lock()
    sources = iter(range(10_000))

    def flood(stop: threading.Event) -> None:
        with lock:
            me = f"127.0.26.{next(sources) % 16 + 1}"
        with tcp(w, me) as s:
            threading.Thread(target=_send_quietly, args=(s, wire), daemon=True).start()
            threading.Thread(target=_shut_when, args=(s, stop), daemon=True).start()
            n = 0
            s.settimeout(30)
            with contextlib.suppress(OSError, ValueError, IndexError), s.makefile("rb") as f:
                while _status(f) == 200:
                    n += 1
            with lock:
                answered.append(n)

    before = metric(w, "gpuledger_connections_anonymous_delayed_total")
    began = time.monotonic()
    his = submits_during(w, flood, 16)
    took = time.monotonic() - began
    assert his and set(his) == {200}, his
    assert len(his) >= 3, his
    # the /24's bucket: 80 at once and 40 a second, of 320,000 sent
    assert len(answered) == 16 and sum(answered) <= 80 + 40 * (took + 1), (answered, took)
    assert metric(w, "gpuledger_connections_anonymous_delayed_total") > before


def _shut_when(s: socket.socket, stop: threading.Event) -> None:
    stop.wait()
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)


def _send_quietly(s: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        s.sendall(data)


def _status(f: BinaryIO) -> int:
    """The status of the next of several pipelined answers on `f`, read whole."""
    status = int(f.readline().split()[1])
    length = 0
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    f.read(length)
    return status


def test_empty_lines_where_a_request_belongs_are_refused_and_leave_anothers_submits_answered(
    world: World,
) -> None:
    """atk40-25 F1: one tokenless connection sending only CRLFs: the parser skips empty lines
    without starting a request, so no meter, hold or bound saw them, and the gate walked its
    buffer four bytes at a time; another person's submits fell from ~170 to 2 in 12 s. Now a
    few are taken (RFC 9112 2.2), more are one 400 line and the connection closed, counted;
    the parser's own refusals (a head that is no request) are the gate's, held and counted
    (F2: answered at once, logged, 90,000 in 12 s)."""
    w = world
    key = 'gpuledger_connections_refused_total{reason="malformed"}'
    before = metric(w, key)
    with tcp(w, "127.0.26.1") as s:  # two empty lines, then a request: served
        s.sendall(b"\r\n\r\n" + request("/v1/health"))
        assert answer(s, timeout=10)[0] == 200
    for wire in (b"\r\n" * 3, b"X\r\n\r\n", b"GET / HTTP/1.1\r\nTransfer_Encoding\r\n\r\n"):
        with tcp(w, "127.0.26.2") as s:
            with contextlib.suppress(OSError):
                s.sendall(wire)
            status, headers, text = answer(s, timeout=10)
            assert status == 400 and headers.get("connection") == "close", (wire[:20], text)
            assert b"not an HTTP/1.1 request" in text, text
    assert metric(w, key) == before + 3
    blank = b"\r\n" * 500_000

    def flood(stop: threading.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError), tcp(w, "127.0.27.1") as s:
                while not stop.is_set():
                    s.sendall(blank)

    his = submits_during(w, flood, 4)
    assert his and set(his) == {200}, his
    assert len(his) >= 3, his
