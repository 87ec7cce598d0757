"""Red team, a standby's forwarded writes (threat model row T23, docs/security.md; docs/ha.md;
atk37-25 F3): two real servers on one PostgreSQL. A standby forwarded every write carrying an
`Authorization` header to the leader, on the event loop's few default threads, and the leader
metered the junk-token ones by the standby's address (20 a second, each waiting up to 1 s): an
outsider's writes with a junk token held the forwarding threads and another person's writes
through the standby went from ~1,500 to 16 in 10 s. Now a standby answers a write whose token
its folded state does not hold 401 itself, never forwarded, and forwards the rest on threads of
its own.

Each assertion counts what the servers answer or count, never a latency ratio."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.wire import SOCKET_NAME
from tests.integration.hakit import Group, Member, make_group
from tests.integration.security.test_security_connections import answer
from tests.integration.serverkit import cli, init_on_store, make_token

JUNK = "glt_0123456789abcdef_" + "A" * 43
"""A token of the right form that no ledger issued."""
SUBMIT = json.dumps({"actor": "", "account": "ai2/olmo", "gpus": 1, "min_runtime_s": 60}).encode()


@pytest.fixture
def pair(tmp_path: Path, pg_store: str) -> Iterator[tuple[Group, dict[str, str]]]:
    home = tmp_path / "server-0"
    init_on_store(home, tmp_path, pg_store)
    tokens = {who: make_token(home, "--user", who) for who in ("alice", "root")}
    g = make_group(tmp_path, pg_store, 2, "--interval", "0.5s", home=home)
    try:
        for m in g.members:
            g.start(m)
        yield g, tokens
    finally:
        g.stop()


def post(m: Member, token: str | None, source: str = "127.0.0.1") -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=60,
                                      source_address=(source, 0))  # fmt: skip
    try:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        conn.request("POST", "/v1/commands/submit", body=SUBMIT, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def ask(path: Path, what: str) -> tuple[int, dict[str, str], bytes]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(path))
        s.sendall(f"GET {what} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        return answer(s, timeout=30)


def refused_there(m: Member) -> float:
    """Requests without a valid token `m` metered: delayed or refused (/metrics)."""
    status, _h, body = ask(m.home / SOCKET_NAME, "/metrics")  # as the host's admin
    assert status == 200, body
    text = body.decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(
            (
                "gpuledger_connections_anonymous_delayed_total ",
                'gpuledger_connections_refused_total{reason="anonymous_rate"} ',
            )
        ):
            total += float(line.split()[-1])  # fmt: skip
    return total


def test_a_standby_answers_a_write_with_a_token_it_does_not_know_401_itself(
    pair: tuple[Group, dict[str, str]],
) -> None:
    g, tokens = pair
    token = tokens["alice"]
    leader = g.leader()
    standby = next(m for m in g.members if m is not leader)
    # a junk token, well formed or not: 401 from the standby, never the leader's answer
    for junk in (JUNK, "junk"):
        status, headers = post(standby, junk)
        assert status == 401, (status, headers)
        assert headers.get("x-gpuledger-role") == "standby" and "x-gpuledger-leader" not in headers
    # a valid token's write is forwarded (the leader's answer names it)
    status, headers = post(standby, token)
    assert status == 200 and headers.get("x-gpuledger-leader") == leader.url, headers
    # a token made on the leader a moment ago: the standby waits for its log to bring it
    fresh = cli(leader.home, "token", "create", "--user", "alice", GPULEDGER_URL=leader.url,
                GPULEDGER_TOKEN=tokens["root"]).stdout.strip()  # fmt: skip
    status, headers = post(standby, fresh)
    assert status == 200 and headers.get("x-gpuledger-leader") == leader.url, headers


FLOODERS = 8
WRITES = 40


def test_junk_token_writes_at_a_standby_never_reach_the_leader_nor_hold_up_a_persons(
    pair: tuple[Group, dict[str, str]],
) -> None:
    """An outsider looping junk-token writes at the standby from 4 addresses, 8 threads: none
    reaches the leader (it answers none 401 and meters none of them by the standby's address:
    it metered hundreds), and alice's writes through the standby meanwhile are all answered
    200 by the leader."""
    g, tokens = pair
    token = tokens["alice"]
    leader = g.leader()
    standby = next(m for m in g.members if m is not leader)
    before = refused_there(leader)
    stop = threading.Event()
    junk: list[int] = []

    def flood(source: str) -> None:
        while not stop.is_set():
            try:
                junk.append(post(standby, JUNK, source)[0])
            except OSError:
                junk.append(-1)

    threads = [threading.Thread(target=flood, args=(f"127.0.43.{i % 4 + 1}",), daemon=True)
               for i in range(FLOODERS)]  # fmt: skip
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        mine = [post(standby, token) for _ in range(WRITES)]
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert [s for s, _h in mine] == [200] * WRITES, mine
    assert all(h.get("x-gpuledger-leader") == leader.url for _s, h in mine)
    assert junk and set(junk) <= {401, 429}, sorted(set(junk))
    assert refused_there(leader) == before, "the leader saw the junk"


def test_a_standby_answers_a_write_over_the_body_limit_413_itself(
    pair: tuple[Group, dict[str, str]],
) -> None:
    """atk38-25 F1: a standby collected a forwarded write's body with `body +=` and no bound
    (one user's 1 GB body grew it by ~1 GB). Now a body past `commands.MAX_BODY` (4 MiB) is
    answered 413 `too_large` in one line by the standby itself, as the leader answers it, never
    forwarded; alice's next write through it is forwarded as before."""
    g, tokens = pair
    token = tokens["alice"]
    leader = g.leader()
    standby = next(m for m in g.members if m is not leader)
    size = 5 * 1024 * 1024
    with socket.create_connection(("127.0.0.1", standby.port), timeout=30) as s:
        s.sendall(
            b"POST /v1/commands/submit HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n" % (token.encode(), size)
        )

        def send_body() -> None:
            chunk = b" " * 65536
            try:
                for _ in range(size // len(chunk)):
                    s.sendall(chunk)
            except OSError:
                pass  # answered and closed before the rest was read

        sender = threading.Thread(target=send_body, daemon=True)
        sender.start()
        status, headers, body = answer(s, timeout=30)
        sender.join(timeout=30)
    assert status == 413, (status, headers, body)
    problem = json.loads(body)
    assert problem["code"] == "too_large" and "over 4 MiB" in problem["detail"], problem
    assert headers.get("x-gpuledger-role") == "standby" and "x-gpuledger-leader" not in headers
    status, headers = post(standby, token)
    assert status == 200 and headers.get("x-gpuledger-leader") == leader.url, headers


def test_tokenless_squatters_at_the_standbys_address_never_stop_its_forwards(
    pair: tuple[Group, dict[str, str]],
) -> None:
    """atk38-25 F4: 64 tokenless connections to the leader from the standby's address, each
    asking `/v1/health` every ~3.5 s, took that address's 64 unclaimed connections; the
    standby's forwards (a fresh connection each) were refused 429 at accept, before their
    token was read, and every person's write through the standby failed. Now a connection past
    its address's cap is admitted when its first request has a valid token: alice's writes
    through the standby, from another address, are all forwarded and answered 200."""
    g, tokens = pair
    leader = g.leader()
    standby = next(m for m in g.members if m is not leader)
    squat = [socket.create_connection(("127.0.0.1", leader.port), timeout=30) for _ in range(64)]
    stop = threading.Event()
    kept: list[int] = []

    def hold() -> None:  # one /v1/health on each every ~3.5 s: under the 20 a second
        while not stop.is_set():
            for s in squat:
                try:
                    s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n")
                    kept.append(answer(s, timeout=10)[0])
                except (OSError, AssertionError):
                    kept.append(-1)
                if stop.wait(0.055):
                    return

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        deadline = time.monotonic() + 30
        while len(kept) < 64:
            assert time.monotonic() < deadline, kept
            time.sleep(0.1)
        mine = [post(standby, tokens["alice"], "127.0.0.2") for _ in range(10)]
        assert [s for s, _h in mine] == [200] * 10, mine
        assert all(h.get("x-gpuledger-leader") == leader.url for _s, h in mine)
        assert set(kept) == {200}, sorted(set(kept))  # the squatters held on throughout
    finally:
        stop.set()
        holder.join(timeout=30)
        for s in squat:
            s.close()
