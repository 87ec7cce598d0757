"""The front's answers on their way out (`ledger.server.encoding`): HEAD as GET without a body,
gzip for whole text answers a client accepts it for, streamed answers passed on part by part."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import pytest

from ledger.server import encoding

BIG = json.dumps([{"job_id": i, "account": "prog1/team01"} for i in range(2_000)]).encode()


def served(
    parts: list[bytes], *, kind: bytes = b"application/json", head: bool = False, gz: bool = True
) -> list[dict[str, Any]]:
    """What the client is sent when the app answers `parts` (more than one: a stream)."""
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def app() -> None:
        out = encoding.wrap(send, head=head, gzip_ok=gz)
        length = [(b"content-length", b"%d" % len(parts[0]))] if len(parts) == 1 else []
        headers = [(b"content-type", kind), *length]
        await out({"type": "http.response.start", "status": 200, "headers": headers})
        for i, part in enumerate(parts):
            more = i < len(parts) - 1
            await out({"type": "http.response.body", "body": part, "more_body": more})

    asyncio.run(app())
    return sent


def headers(sent: list[dict[str, Any]]) -> dict[bytes, bytes]:
    return {bytes(k).lower(): bytes(v) for k, v in sent[0]["headers"]}


def test_a_whole_json_answer_is_gzipped_for_a_client_that_accepts_it() -> None:
    sent = served([BIG])
    h = headers(sent)
    assert h[b"content-encoding"] == b"gzip" and h[b"vary"] == b"Accept-Encoding"
    body = sent[1]["body"]
    assert int(h[b"content-length"]) == len(body) < len(BIG) / 5
    assert gzip.decompress(body) == BIG
    assert served([BIG])[1]["body"] == body  # the same bytes each time (no time in them)


def test_no_gzip_unless_asked_small_answers_and_other_types_as_they_are() -> None:
    plain = served([BIG], gz=False)
    assert b"content-encoding" not in headers(plain) and plain[1]["body"] == BIG
    assert headers(plain)[b"vary"] == b"Accept-Encoding"
    small = served([b'{"ok": true}'])
    assert b"content-encoding" not in headers(small) and small[1]["body"] == b'{"ok": true}'
    png = served([BIG], kind=b"image/png")
    assert b"content-encoding" not in headers(png) and png[1]["body"] == BIG


def test_a_streamed_answer_is_passed_on_part_by_part_uncompressed() -> None:
    lines = [b'{"read": %d}\n' % i * 200 for i in range(3)]
    sent = served(lines)
    assert b"content-encoding" not in headers(sent)
    assert [m["body"] for m in sent[1:]] == lines
    assert [m["more_body"] for m in sent[1:]] == [True, True, False]


def test_a_head_is_the_gets_headers_with_no_body() -> None:
    get = served([BIG], gz=False)
    head = served([BIG], gz=False, head=True)
    assert headers(head) == headers(get) and int(headers(head)[b"content-length"]) == len(BIG)
    assert [m["body"] for m in head[1:]] == [b""]


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (b"gzip, deflate, br", True),
        (b"br;q=1.0, gzip;q=0.8", True),
        (b"*", True),
        (b"gzip;q=0", False),
        (b"gzip;q=0, *", False),  # atk49-29 F4: the explicit entry decides, not `*`
        (b"*, gzip;q=0", False),
        (b"*;q=0, gzip", True),
        (b"GZIP;Q=0.5, *;q=0", True),
        (b"identity", False),
        (None, False),
    ],
)
def test_accept_encoding_is_read_as_http_says(value: bytes | None, ok: bool) -> None:
    hdrs = [] if value is None else [(b"accept-encoding", value)]
    assert encoding.accepts_gzip({"type": "http", "headers": hdrs}) is ok


def test_a_head_request_reaches_the_app_as_a_get() -> None:
    scope, head = encoding.head_as_get({"type": "http", "method": "HEAD", "path": "/metrics"})
    assert head and scope["method"] == "GET"
    scope, head = encoding.head_as_get({"type": "http", "method": "POST", "path": "/v1/x"})
    assert not head and scope["method"] == "POST"


def test_a_head_is_marked_for_the_metrics() -> None:
    """atk49-29 F7: the metrics counted a HEAD as a GET; the scope the app sees says it."""
    scope, _ = encoding.head_as_get({"type": "http", "method": "HEAD", "path": "/metrics"})
    assert scope[encoding.HEAD] is True
    scope, _ = encoding.head_as_get({"type": "http", "method": "GET", "path": "/metrics"})
    assert encoding.HEAD not in scope


def test_a_gzipped_answer_has_an_etag_of_its_own() -> None:
    """atk49-29 F9: the gzip'd and the identity answer carried one strong ETag."""
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def app(gz: bool) -> None:
        out = encoding.wrap(send, head=False, gzip_ok=gz)
        hdrs = [(b"content-type", b"application/javascript"), (b"etag", b'"abc"')]
        await out({"type": "http.response.start", "status": 200, "headers": hdrs})
        await out({"type": "http.response.body", "body": BIG, "more_body": False})

    asyncio.run(app(True))
    assert headers(sent)[b"etag"] == b'"abc-gzip"' and gzip.decompress(sent[1]["body"]) == BIG
    sent.clear()
    asyncio.run(app(False))
    assert headers(sent)[b"etag"] == b'"abc"' and sent[1]["body"] == BIG


def test_a_large_answer_that_does_not_change_is_compressed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """atk49-29 F10: the OpenAPI document (437 KB, no token needed) was gzip'd again for
    every request. The front keeps the last few large answers' gzip'd bytes, by their bytes."""
    calls: list[int] = []
    real = encoding._squeeze

    def counted(body: bytes) -> bytes:
        calls.append(len(body))
        return real(body)

    monkeypatch.setattr(encoding, "_squeeze", counted)
    kept = encoding.Squeezed()
    big = BIG * 40  # past THREAD_MIN
    assert len(big) >= encoding.THREAD_MIN

    async def twice() -> list[bytes]:
        return [await kept.squeeze(big), await kept.squeeze(bytes(big))]

    first, second = asyncio.run(twice())
    assert first == second and gzip.decompress(first) == big and calls == [len(big)]
    others = [big + b" " * i for i in range(1, encoding.Squeezed.MOST + 1)]

    async def more() -> None:
        for body in others:
            await kept.squeeze(body)

    asyncio.run(more())
    assert big not in kept.kept and len(kept.kept) == encoding.Squeezed.MOST
