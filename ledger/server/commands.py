"""The command routes' hot path: `POST /v1/commands/<op>` in front of the framework.

A submit is the request a cluster sends most, and Litestar's per-request machinery (routing,
the middleware stack, the signature model, kwargs extraction, the response object) cost about as
much CPU as deciding and appending the command itself. This ASGI layer answers a well-formed
command with an accepted or rejected outcome itself, with exactly what the Litestar route does:

  1 read the body; decode it strictly into the command's Struct with msgspec (on raw bytes)
  2 identify the caller per request (`who`: the Unix socket's peer uid, or the bearer token,
    looked up in the ledger's state at that moment: revocation and expiry bite at once)
  3 set the actor (`identity.act`), hand the command to the group commit (`Worker.execute`),
    answer only once its transaction has committed
  4 answer `CommandResult` as JSON, or the LedgerError as problem+json rendered by the app's
    own exception handler; time the request in the same API histogram as every route.

Anything else goes to the Litestar app untouched, and so does a command whose body is not a
strict match (malformed JSON, a value Litestar's lenient conversion accepts, a body over
`MAX_BODY`) or whose caller is not identified: the framework answers those, body replayed, so
their answers (errors included) are the framework's, byte for byte. The Litestar routes stay
what the OpenAPI document describes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from litestar import Litestar, Request, Response

from ledger.server import identity as ident
from ledger.server.worker import Worker
from ledger.store.requests import valid_key
from schemas import api
from schemas import commands as c
from schemas.errors import InvalidCommand, LedgerError

Scope = Any
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
"""ASGI's shapes, loosely (the framework's own are typed for its side)."""

MAX_BODY = 64 * 1024
"""Larger bodies take the framework's path (and its size limit)."""

_JSON = [(b"content-type", b"application/json")]
_encoder = msgspec.json.Encoder()


class CommandPath:
    """ASGI app: the command routes of `served` answered directly, everything else by `app`."""

    def __init__(
        self,
        app: Litestar,
        worker: Worker,
        who: Callable[[Any, str | None], ident.Identity],
        served: tuple[type[c.Command], ...],
        observe: Callable[[str, str, int, float], None],
        error_response: Callable[[Exception], Response[Any]],
    ) -> None:
        self.app = app
        self.worker = worker
        self.who = who
        self.observe = observe
        self.error_response = error_response
        self.routes: dict[str, msgspec.json.Decoder[Any]] = {
            f"/v1/commands/{cls.__struct_config__.tag}": msgspec.json.Decoder(cls) for cls in served
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        decoder = self.routes.get(scope.get("path", "")) if scope["type"] == "http" else None
        if decoder is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        # 1 the body, decoded strictly (anything else: the framework's answer)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_BODY:
                break
        try:
            if more:
                raise ValueError("too large")
            cmd = decoder.decode(body)
            # 2 who calls (an unidentified caller: the framework's 401)
            caller = self.who(scope.get(ident.PEER_UID), _authorization(scope))
        except (ValueError, LedgerError):
            await self.app(scope, _replay(body, more, receive), send)
            return
        # 3 decided and appended in the group commit; answered once committed
        status = 500  # what the API histogram says of a request that ends in an exception
        try:
            try:
                appended = await self.worker.execute(ident.act(caller, cmd), _key(scope))
                data = _encoder.encode(
                    api.CommandResult(position=appended.position, events=appended.events)
                )
            except Exception as err:
                status = await self._error(scope, receive, send, err)
                return
            await send({"type": "http.response.start", "status": 200, "headers": _sized(data)})
            await send({"type": "http.response.body", "body": data})
            status = 200
        finally:
            self.observe(scope["path"], "POST", status, time.perf_counter() - t0)

    async def _error(self, scope: Scope, receive: Receive, send: Send, err: Exception) -> int:
        """4 the error as the app's exception handlers answer it (problem+json)."""
        request: Request[Any, Any, Any] = Request(scope, receive)
        response = self.error_response(err)
        await response.to_asgi_response(self.app, request)(scope, receive, send)
        return response.status_code or 500


def _key(scope: Scope) -> str | None:
    """The request's `Idempotency-Key` (a retry of a write sends the same one)."""
    for name, value in scope["headers"]:
        if name == b"idempotency-key":
            key = bytes(value).decode("latin-1").strip()
            if not valid_key(key):
                raise InvalidCommand(
                    "invalid Idempotency-Key", hint="1-128 printable ASCII characters"
                )
            return key
    return None


def _authorization(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return bytes(value).decode("latin-1")
    return None


def _sized(data: bytes) -> list[tuple[bytes, bytes]]:
    return [*_JSON, (b"content-length", str(len(data)).encode())]


def _replay(body: bytes, more: bool, receive: Receive) -> Receive:
    """`receive` with the body read so far handed out first."""
    first = True

    async def replayed() -> Any:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replayed
