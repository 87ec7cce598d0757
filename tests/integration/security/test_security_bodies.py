"""Red team, a POST body's cost before its caller is known (atk44w F4): every body was read and
decoded on the event loop before the token, the write meter or the one-batch rule was checked;
4 MB batches refused 401 (no token) or 429 (past the meter) slowed another person's submits
5-100x. A real server, raw sockets: a request's head alone is answered when it should be
refused, so its body was never needed (on the old code each of these waited for the body)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from tests.integration.serverkit import Server, make_token, set_up_ledger, start_server

FOUR_MB = 4_000_000


def _head(server: Server, path: str, length: int, token: str | None) -> socket.socket:
    """A connection that sent a POST's head announcing `length` bytes, and none of them."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {length}\r\n\r\n".encode()
    )
    return sock


def _answer(sock: socket.socket, within_s: float = 5) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of the next answer on `sock`, which must come within
    `within_s` (before the body announced is sent)."""
    sock.settimeout(within_s)
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        assert got, f"closed without an answer: {data!r}"
        data += got
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(head.split()[1]), json.loads(rest[:length])


def test_a_refused_requests_body_is_never_read(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    alice, bob = (make_token(home, "--user", who) for who in ("alice", "bob"))
    server = start_server(home, env={"GPULEDGER_WRITE_BURST": str(2 << 20)})
    submit = {"actor": "", "account": "ai2/olmo", "gpus": 1, "command": ["/bin/true"]}
    try:
        # no token: 401 from the head; the body then sent is dropped and the connection serves on
        sock = _head(server, "/v1/batch", FOUR_MB, None)
        status, body = _answer(sock)
        assert status == 401, body
        sock.sendall(b"x" * FOUR_MB + b"GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n")
        status, body = _answer(sock, 30)
        assert status == 200 and body["status"] == "up", body
        sock.close()

        # a Content-Length over 4 MiB: 413 from the head
        sock = _head(server, "/v1/batch", 5 << 20, alice)
        status, body = _answer(sock)
        assert status == 413 and "over 4 MiB" in body["message"], body
        sock.close()

        # one body over 1 MiB of a person's at a time: a second one 429 from its head
        first = _head(server, "/v1/commands/submit", 2 << 20, alice)
        second = _head(server, "/v1/batch", 2 << 20, alice)
        status, body = _answer(second)
        assert status == 429 and "over 1 MiB is under way" in body["message"], body
        second.close()
        assert server.request("POST", "/v1/commands/submit", submit, bob)[0] == 200
        first.close()

        # bodies refused 400 are charged to their sender: past her meter, 429 from the head
        bad = {"commands": [{"op": "submit", "account": "ai2/olmo", "gpus": "1",
                             "command": ["x" * 4000] * 200}]}  # fmt: skip
        statuses = [server.request("POST", "/v1/batch", bad, alice)[0] for _ in range(5)]
        assert statuses[0] == 400 and statuses[-1] == 429, statuses  # 800 KB each, 2 MiB
        sock = _head(server, "/v1/batch", FOUR_MB, alice)
        status, body = _answer(sock)
        assert status == 429, body
        assert body["message"].startswith("you wrote more than 2 MiB to the log lately")
        sock.close()
        assert server.request("POST", "/v1/commands/submit", submit, bob)[0] == 200
    finally:
        assert server.stop() == 0
