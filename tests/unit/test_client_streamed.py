"""`Client.streamed` (the whole-log audits through a server, atk47-29 F2): the timeout is the
longest silence between two lines, not the answer's length; each step is handed over as it
comes; an error line raises as a plain error answer does; a server that answers in one piece
(an older one) is read as before. A real HTTP server on a loopback port (the standard
library's), not a mock of ours."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import ClassVar

import pytest

from ledger.history.tamper import ChainReport
from ledger.wire.client import Client
from schemas import api
from schemas.errors import Unavailable

REPORT = b'{"events":3,"head":3,"head_hash":"","problems":[]}'


class _Handler(http.server.BaseHTTPRequestHandler):
    lines: ClassVar[list[bytes]] = []
    pause_s = 0.0

    def do_GET(self) -> None:
        streamed = "application/x-ndjson" in self.headers.get("Accept", "")
        self.send_response(200)
        kind = "application/x-ndjson" if streamed and self.lines else "application/json"
        self.send_header("Content-Type", kind)
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        for line in self.lines if streamed and self.lines else [REPORT]:
            self.wfile.write(line + b"\n")
            self.wfile.flush()
            time.sleep(self.pause_s)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[type[_Handler]]:
    handler = type("H", (_Handler,), {"lines": [], "pause_s": 0.0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


def _step(done: int, stage: str = "chain") -> bytes:
    return b'{"step":{"done":%d,"total":3,"stage":"%s"}}' % (done, stage.encode())


def test_a_stream_longer_than_the_timeout_is_read_to_its_result(serve: type[_Handler]) -> None:
    serve.lines = [_step(0, "waiting"), _step(1), _step(2), _step(3), b'{"result":' + REPORT + b"}"]
    serve.pause_s = 0.4  # 2 s in all, 0.4 s between lines: a 1 s timeout never passes
    seen: list[api.AuditStep] = []
    began = time.monotonic()
    got = Client(serve.url, timeout=1.0).streamed(  # type: ignore[attr-defined]
        "audit/verify", ChainReport, on_step=seen.append
    )
    assert time.monotonic() - began > 1.5
    assert got == ChainReport(events=3, head=3, head_hash="", problems=())
    assert [(s.stage, s.done) for s in seen] == [("waiting", 0), ("chain", 1), ("chain", 2),
                                                 ("chain", 3)]  # fmt: skip


def test_an_error_line_raises_as_an_error_answer_does(serve: type[_Handler]) -> None:
    serve.lines = [_step(1), b'{"error":{"title":"unavailable","status":503,"detail":"the server'
                   b' stopped before the audit ended","code":"unavailable","message":"the '
                   b'server stopped before the audit ended"}}']  # fmt: skip
    with pytest.raises(Unavailable, match="the server stopped before the audit ended"):
        Client(serve.url).streamed("audit/verify", ChainReport)  # type: ignore[attr-defined]


def test_a_server_that_answers_in_one_piece_is_read_as_before(serve: type[_Handler]) -> None:
    got = Client(serve.url).streamed("audit/verify", ChainReport)  # type: ignore[attr-defined]
    assert got.events == 3 and got.problems == ()
