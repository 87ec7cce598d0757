"""The wire of a standby's forwarded writes (`ha_front.HAFront`): the leader's connection, one
exchange on it, a forward's body within the bound, and the answers a standby gives itself in
the leader's words (413, 401)."""

from __future__ import annotations

import contextlib
import http.client
import socket
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import msgspec

from ledger.wire import OUTCOME_HEADER
from schemas import api
from schemas.errors import TooLarge

Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]

ROLE_HEADER = "x-gpuledger-role"


async def body_within(receive: Receive, path: str, send: Send, role: str) -> bytes | None:
    """A forwarded write's body, at most `commands.MAX_BODY` bytes (collected in one buffer),
    or None: the client went away, or it was over the limit and answered 413 in one line, as
    the leader answers it (the rest is not read). Collected by `body +=` with no bound, one
    user's 1 GB body grew a standby by ~1 GB and slowed everyone's writes through it ~40x
    (atk38-25 F1)."""
    from ledger.server.commands import MAX_BODY

    body, more = bytearray(), True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return None
        body += message.get("body", b"")
        more = message.get("more_body", False)
        if len(body) > MAX_BODY:
            err = TooLarge(
                f"the body of POST {path} is over {MAX_BODY // (1024 * 1024)} MiB",
                hint="send less at once (docs/server.md, request bodies)",
            )
            problem = msgspec.json.encode(
                api.Problem(title=err.code, status=413, detail=err.line(), code=err.code,
                            message=err.message, hint=err.hint)
            )  # fmt: skip
            headers = [
                (b"content-type", b"application/problem+json"),
                (b"content-length", str(len(problem)).encode()),
                (ROLE_HEADER.encode(), role.encode()),
                (b"connection", b"close"),
            ]
            await send({"type": "http.response.start", "status": 413, "headers": headers})
            await send({"type": "http.response.body", "body": problem})
            return None
    return bytes(body)


async def not_authenticated(send: Send, role: str) -> None:
    """The 401 the leader would give a write without a valid token (`identity.from_bearer`'s
    words), answered by a standby itself."""
    from ledger.server.identity import denied

    err = denied()
    body = msgspec.json.encode(
        api.Problem(title=err.code, status=401, detail=err.line(), code=err.code,
                    message=err.message, hint=err.hint)
    )  # fmt: skip
    headers = [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b"Bearer"),
        (ROLE_HEADER.encode(), role.encode()),
    ]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})


FORWARD_TIMEOUT_S = 30.0
"""The longest a standby waits for the leader's answer to a forwarded write while it still
names that leader (a leader that slow for so long is stuck, whatever its lease says)."""


def connection(url: str) -> http.client.HTTPConnection:
    """A connection to the leader at `url` (http or https), not yet opened."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        import ssl

        ctx = ssl.create_default_context()
        return http.client.HTTPSConnection(
            parts.hostname or "", parts.port or 443, timeout=FORWARD_TIMEOUT_S, context=ctx
        )
    return http.client.HTTPConnection(
        parts.hostname or "", parts.port or 80, timeout=FORWARD_TIMEOUT_S
    )


def exchange(
    conn: http.client.HTTPConnection, method: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, bytes, str, str | None]:
    """One request on `conn`; (status, body, content type, `OUTCOME_HEADER`'s value: a write
    the leader may have stored, passed on to the client: atk51-ha F3). Blocks: run in a
    thread."""
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        kind = resp.getheader("content-type") or "application/json"
        return resp.status, resp.read(), kind, resp.getheader(OUTCOME_HEADER)
    except http.client.HTTPException as err:
        raise OSError(str(err)) from err
    finally:
        conn.close()


def abandon(conn: http.client.HTTPConnection) -> None:
    """End a forward's wait at once (its thread's read fails): the thread is not held for the
    rest of `FORWARD_TIMEOUT_S` by a leader that will never answer."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
