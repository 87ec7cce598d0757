"""What the front does to every answer on its way out (`ledger.server.front`), the app unaware:

- **HEAD is GET without a body**: a HEAD request is served as the GET of the same path (the
  same status and headers, its `Content-Length` the GET's), and no body is sent. Litestar
  answered `HEAD /metrics` 405 (atk48-29 F10); Prometheus tooling and `curl -I` ask it.
- **gzip**: a whole answer (one body part) of a text type (JSON, HTML, JavaScript, CSS, the
  metrics' text) of at least `GZIP_MIN` bytes is sent gzip-compressed to a client that accepts
  gzip (`Accept-Encoding`), with `Vary: Accept-Encoding`; a streamed answer (more than one
  part: the NDJSON progress of `audit verify`, the log's stream) is passed on part by part as
  before, never held back to be compressed. Compressing a large answer runs on a thread
  (zlib leaves the interpreter lock), not on the event loop that commits the submits.

The bytes a read's answer is charged to its reader (`front._counting`, `ReadPool.sent`) are the
answer's own, before compression: compression makes an answer cheaper to send, not its reader's
allowance larger (the allowance bounds the work of answering, compression is more of it).
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Awaitable, Callable
from typing import Any

GZIP_MIN = 1_024
"""Answers shorter than this are sent as they are (gzip's header costs more than it saves)."""
THREAD_MIN = 64 * 1024
"""Answers at least this long are compressed on a thread, not on the event loop."""
LEVEL = 5
TYPES = (
    b"application/json",
    b"application/problem+json",
    b"application/javascript",
    b"text/",
)

Send = Callable[[Any], Awaitable[None]]


HEAD = "gpuledger.head"
"""Set in the scope of a HEAD request served as its GET: the metrics label it HEAD (they
counted HEAD probes as GETs: atk49-29 F7)."""


def head_as_get(scope: Any) -> tuple[Any, bool]:
    """The scope the app sees (a HEAD request's as its GET's, marked `HEAD`) and whether it
    was a HEAD."""
    if scope.get("type") == "http" and scope.get("method") == "HEAD":
        return {**scope, "method": "GET", HEAD: True}, True
    return scope, False


def accepts_gzip(scope: Any) -> bool:
    """Whether the request's `Accept-Encoding` accepts gzip: an explicit `gzip` entry's q
    decides (`gzip;q=0, *` refuses gzip: RFC 9110 12.5.3, atk49-29 F4), else `*`'s; a `q=0`
    refuses."""
    explicit: float | None = None
    star: float | None = None
    for name, value in scope.get("headers", ()):
        if bytes(name).lower() != b"accept-encoding":
            continue
        for item in bytes(value).decode("latin-1").split(","):
            coding, _, params = item.strip().partition(";")
            coding = coding.strip().lower()
            if coding not in ("gzip", "*"):
                continue
            q = 1.0 if not params.strip() else _q(params.strip().lower().removeprefix("q="))
            if coding == "gzip":
                explicit = q if explicit is None else min(explicit, q)
            else:
                star = q if star is None else min(star, q)
    chosen = explicit if explicit is not None else star
    return chosen is not None and chosen > 0


def gzip_tag(tag: str) -> str:
    """The ETag of the gzip'd representation of the answer whose ETag is `tag`: a strong
    validator names one representation (RFC 9110 8.8.3), so the two codings' differ."""
    return tag[:-1] + '-gzip"' if tag.endswith('"') else tag + "-gzip"


def _q(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def _compressible(headers: list[Any]) -> bool:
    kind = b""
    for name, value in headers:
        low = bytes(name).lower()
        if low == b"content-encoding":
            return False  # encoded already
        if low == b"content-type":
            kind = bytes(value).lower()
    return kind.startswith(TYPES)


def _squeeze(body: bytes) -> bytes:
    return gzip.compress(body, compresslevel=LEVEL, mtime=0)  # mtime 0: the same bytes each time


class Squeezed:
    """The gzip'd bytes of the last few large answers, by their bytes: an answer that never
    changes (the OpenAPI document, 437 KB, asked without a token; the page's assets) is
    compressed once, not per request (3.1 ms of zlib each: a tokenless client looping it cost
    the server 3x the CPU, atk49-29 F10). A hit needs the very same bytes, so no answer is
    ever given to another than the one it was made for; `MOST` entries, the oldest dropped."""

    MOST = 8
    LARGEST = 4 * 1024 * 1024
    """A larger answer is compressed and not kept (8 of them stay within ~32 MiB)."""

    def __init__(self) -> None:
        self.kept: dict[bytes, bytes] = {}

    async def squeeze(self, body: bytes) -> bytes:
        if len(body) > self.LARGEST:
            return await asyncio.to_thread(_squeeze, body)
        packed = self.kept.pop(body, None)
        if packed is None:
            if len(body) >= THREAD_MIN:  # zlib leaves the lock: the loop goes on
                packed = await asyncio.to_thread(_squeeze, body)
            else:
                packed = _squeeze(body)
        self.kept[body] = packed  # the newest last
        while len(self.kept) > self.MOST:
            del self.kept[next(iter(self.kept))]
        return packed


def wrap(send: Send, *, head: bool, gzip_ok: bool, kept: Squeezed | None = None) -> Send:
    """`send` as the app's: its answer's start held until its first body part, which decides
    whether the answer is whole and compressible; a HEAD's body parts sent empty; `kept`: the
    large answers' gzip'd bytes kept (`Squeezed`)."""
    start: dict[str, Any] | None = None

    async def out(message: Any) -> None:
        nonlocal start
        kind = message["type"]
        if kind == "http.response.start":
            start = message
            return
        if kind != "http.response.body":
            await send(message)
            return
        body = bytes(message.get("body", b""))
        more = bool(message.get("more_body", False))
        if start is not None:
            first, start = start, None
            headers = list(first.get("headers", ()))
            whole = not more and len(body) >= GZIP_MIN and _compressible(headers)
            if whole:
                headers.append((b"vary", b"Accept-Encoding"))
            if whole and gzip_ok:
                if kept is not None and len(body) >= THREAD_MIN:
                    body = await kept.squeeze(body)
                elif len(body) >= THREAD_MIN:  # zlib leaves the lock: the loop goes on
                    body = await asyncio.to_thread(_squeeze, body)
                else:
                    body = _squeeze(body)
                headers = [
                    (k, gzip_tag(bytes(v).decode("latin-1")).encode("latin-1"))
                    if bytes(k).lower() == b"etag" else (k, v)
                    for k, v in headers
                    if bytes(k).lower() != b"content-length"
                ]  # fmt: skip
                headers += [(b"content-encoding", b"gzip"), (b"content-length", b"%d" % len(body))]
            await send({**first, "headers": headers})
        await send({**message, "body": b"" if head else body, "more_body": more})

    return out
