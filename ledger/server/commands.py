"""The API's bodies, strictly, and the command routes' hot path, in front of the framework.

Every POST route with a JSON body (the commands, `/v1/batch`, `/v1/budget/plan`,
`/v1/audit/table`, the agents' `/v1/agent/*`; found in the app's handlers, so a new route cannot
be forgotten) has its body decoded here, strictly, before anything else reads it
(docs/security.md, row T14; docs/server.md, "Request bodies"):

- at most `MAX_BODY` bytes (4 MiB), else 413 `too_large` (the rest is not read);
- the route's Struct exactly, with msgspec's strict decoding: no coercion (`"2"` is no integer,
  `0` no boolean), a field the Struct does not know is refused, every bound of `schemas.bounds`
  holds (strings, lists); a NUL character in any string is refused; nesting deeper than the
  Struct allows is refused at its first level;
- a body that fails is one problem+json line, 400 `invalid`, naming where (`$.gpus`), and
  nothing is appended; an unidentified caller gets 401 first.

A submit is the request a cluster sends most, and Litestar's per-request machinery (routing,
the middleware stack, the signature model, kwargs extraction, the response object) cost about as
much CPU as deciding and appending the command itself. So a command this layer decoded is also
answered here, with exactly what the Litestar route does:

  1 read the body; decode it strictly into the command's Struct (above)
  2 identify the caller per request (`who`: the Unix socket's peer uid, or the bearer token,
    looked up in the ledger's state at that moment: revocation and expiry bite at once)
  3 set the actor (`identity.act`), hand the command to the group commit (`Worker.execute`),
    answer only once its transaction has committed
  4 answer `CommandResult` as JSON, or the LedgerError as problem+json rendered by the app's
    own exception handler; time the request in the same API histogram as every route.

The other body routes get their checked body replayed to the framework (whose lenient
conversion of a strictly valid body changes nothing); everything else goes to the framework
untouched. The Litestar routes stay what the OpenAPI document describes.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
import typing
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from litestar import Litestar, Request, Response

from ledger.server import connections, meters
from ledger.server import identity as ident
from ledger.server.pooled import is_write
from ledger.server.worker import Worker
from ledger.store.requests import valid_key
from schemas import api, bounds
from schemas import commands as c
from schemas.errors import InvalidCommand, LedgerError, TooBusy, TooLarge

Scope = Any
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
"""ASGI's shapes, loosely (the framework's own are typed for its side)."""

MAX_BODY = 4 * 1024 * 1024
"""The largest request body (413 beyond): a budget file (1 MiB, `api.BUDGET_FILE_MAX`) fits
escaped as a JSON string, and an agent's report of a full node's parts."""

_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
"""A JSON escape of NUL (`\\u0000` after an even number of backslashes): the only way a NUL can be
in a valid JSON text's strings."""

_JSON = [(b"content-type", b"application/json")]
_encoder = msgspec.json.Encoder()


class CommandPath:
    """ASGI app: every body of `bodies` (path -> Struct) checked strictly, the command routes of
    `served` answered directly, everything else by `app`."""

    def __init__(
        self,
        app: Litestar,
        worker: Worker,
        who: Callable[[Any, str | None], ident.Identity],
        served: tuple[type[c.Command], ...],
        observe: Callable[[str, str, int, float], None],
        error_response: Callable[[Exception], Response[Any]],
        writes: Any = None,
    ) -> None:
        self.app = app
        self.writes = writes
        """`pooled.Writes`: a write counted once its body has arrived and its caller is known
        (the reads give way to it meanwhile); None: not counted."""
        self.worker = worker
        self.who = who
        self.written = meters.Written(**connections.positive_settings(dict(os.environ), (
            (meters.WRITE_RATE_ENV, "per_s", float), (meters.WRITE_BURST_ENV, "burst", float),
        )))  # fmt: skip
        """Each person's bytes written to the log (429 past them: `_turn`)."""
        self.unmetered: Callable[[ident.Identity], bool] = lambda _who: False
        """Whose writes are never metered (the ledger's admins and nodes: set by the app)."""
        self.observe = observe
        self.error_response = error_response
        self.commands = {f"/v1/commands/{cls.__struct_config__.tag}" for cls in served}
        self.bodies: dict[str, tuple[str, msgspec.json.Decoder[Any]]] = {
            path: (_name(kind), msgspec.json.Decoder(kind)) for path, kind in body_types(app)
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        route = self.bodies.get(path)
        if route is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500  # what the API histogram says of a request that ends in an exception
        try:
            status = await self._serve(scope, receive, send, path, route)
        finally:
            if path in self.commands or status >= 400:
                self.observe(path, "POST", status, time.perf_counter() - t0)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        path: str,
        route: tuple[str, msgspec.json.Decoder[Any]],
    ) -> int:
        # 1 the body, at most MAX_BODY bytes, decoded strictly
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return 499  # the client went away
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_BODY:
                break
        problem: LedgerError | None = None
        value: Any = None
        if len(body) > MAX_BODY:
            problem = TooLarge(
                f"the body of POST {path} is over {MAX_BODY // (1024 * 1024)} MiB",
                hint="send less at once (docs/server.md, request bodies)",
            )
        else:
            try:
                value = route[1].decode(body)
                if b"u0000" in body and _NUL.search(body):
                    raise msgspec.ValidationError("a NUL character is refused in any string")
            except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as err:
                why = "nested too deep" if isinstance(err, RecursionError) else str(err)
                problem = InvalidCommand(
                    f"the body of POST {path} is not a valid {route[0]}: {why}",
                    hint="see /v1/openapi.json",
                )
        # 2 who calls: an unidentified caller is told so before anything about its body
        try:
            caller = self.who(scope.get(ident.PEER_UID), _authorization(scope))
        except LedgerError as err:
            return await self._error(scope, receive, send, err)
        if problem is not None:
            return await self._error(scope, receive, send, problem)
        metered = is_write(path) and not self.unmetered(caller)
        # what it may write, taken before it is written (atk44z F2); a write that only frees
        # what earlier writes made (a cancel) is never refused, only charged (atk44z F5)
        reserved = reserve(value, body) if metered and not frees(value) else 0
        if reserved and (wait := self.written.reserve(caller.whose, reserved, _now())) > 0:
            return await self._error(scope, receive, send, _written_past(self.written, wait))
        status, written = 500, reserved  # kept whole when the write ends in an exception
        try:
            status, written = await self._write(scope, receive, send, path, body, caller, value)
        finally:
            if metered:
                self.written.settle(caller.whose, reserved, written, _now())
        return status

    async def _write(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        path: str,
        body: bytes,
        caller: ident.Identity,
        value: Any,
    ) -> tuple[int, int]:
        """Answer the write: its status and the bytes it is charged (about what it wrote: its
        answer; a command refused 413 for its size its body, read and decoded all the same,
        atk44w F5; another refusal nothing)."""
        with self._counted(path):  # a write from here on, not before (issue 25)
            if path not in self.commands:  # checked: the framework's route answers it
                sent = [0]  # a batch answers with the events it appended: charged those

                async def counting(message: Any) -> None:
                    sent[0] += (
                        len(message.get("body", b"")) if message["type"].endswith("body") else 0
                    )
                    await send(message)

                await self.app(scope, _replay(body, False, receive), counting)
                return 200, max(len(body), sent[0])  # a 60 KB batch wrote 16 MiB (atk44z F1)
            # 3 decided and appended in the group commit; answered once committed
            size = await self._command(scope, receive, send, ident.act(caller, value))
            if size >= 0:
                return 200, size
            return -size, len(body) if size == -413 else 0

    def _counted(self, path: str) -> contextlib.AbstractContextManager[None]:
        if self.writes is None or not is_write(path):
            return contextlib.nullcontext()
        return self.writes.counting()  # type: ignore[no-any-return]

    async def _command(self, scope: Scope, receive: Receive, send: Send, cmd: Any) -> int:
        """The bytes of the answer once sent (200), or minus the error's status."""
        try:
            appended = await self.worker.execute(cmd, _key(scope))
            data = _encoder.encode(
                api.CommandResult(position=appended.position, events=appended.events)
            )
        except Exception as err:
            return -await self._error(scope, receive, send, err)
        await send({"type": "http.response.start", "status": 200, "headers": _sized(data)})
        await send({"type": "http.response.body", "body": data})
        return len(data)

    async def _error(self, scope: Scope, receive: Receive, send: Send, err: Exception) -> int:
        """4 the error as the app's exception handlers answer it (problem+json)."""
        request: Request[Any, Any, Any] = Request(scope, receive)
        response = self.error_response(err)
        await response.to_asgi_response(self.app, request)(scope, receive, send)
        return response.status_code or 500


FREEING = (c.CancelJob, c.HoldJob, c.RevokeToken)
"""Writes that only end or stop what an earlier, metered write made (a job, a token): never
refused by the write meter, only charged what they wrote. A person past it could not cancel
the array she had just submitted by mistake while it was placed and charged (atk44z F5); each
applies once per thing made (a hold again after a release, which is metered), so they cannot
grow the log by themselves."""
EVENT_EXTRA = 1024
"""What an event adds to its command's bytes, at most (its ids, times, hash link: ~450)."""


def frees(value: Any) -> bool:
    """Whether the write `value` (a command, a batch) is made only of `FREEING` commands."""
    commands = value.commands if isinstance(value, api.Batch) else (value,)
    return bool(commands) and all(isinstance(cmd, FREEING) for cmd in commands)


def reserve(value: Any, body: bytes) -> int:
    """What a write may add to the log, known before it is decided (`meters.Written.reserve`;
    settled at what it wrote): each command's bytes and `EVENT_EXTRA` for each event it makes,
    an array's per task (the command without its list of tasks), at most the most a request
    may write (`bounds.MAX_REQUEST_WRITTEN`) with its answer's framing."""
    if isinstance(value, api.Batch):
        size = sum(_reserve(cmd, len(_encoder.encode(cmd))) for cmd in value.commands)
    else:
        size = _reserve(value, len(body))
    return min(size, bounds.MAX_REQUEST_WRITTEN + EVENT_EXTRA)


def _reserve(cmd: Any, size: int) -> int:
    tasks = getattr(cmd, "array", ())
    if not tasks:
        return size + EVENT_EXTRA
    return len(tasks) * (max(0, size - len(_encoder.encode(tasks))) + EVENT_EXTRA)


def _now() -> float:
    return time.monotonic()


def _written_past(meter: meters.Written, wait: float) -> TooBusy:
    return TooBusy(
        f"you wrote more than {meter.burst / 2**20:g} MiB to the log lately (at most "
        f"{meter.per_s * 60 / 2**20:g} MiB a minute once past it)",
        hint=f"retry in {math.ceil(wait)} s; send smaller commands or fewer array tasks",
        retry_after=math.ceil(wait),
    )


def body_types(app: Litestar) -> list[tuple[str, type[Any]]]:
    """Every POST route of `app` with a JSON body, and the Struct its body must be."""
    out = []
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            if "POST" not in handler.http_methods:
                continue
            hints = typing.get_type_hints(handler.fn)
            if "data" in hints:
                out.append((route.path, hints["data"]))
    return out


def _name(kind: Any) -> str:
    """The name of a body's type as an error line says it."""
    if typing.get_origin(kind) is not None:  # a union: the command's own name is the route
        return "body"
    tag = getattr(getattr(kind, "__struct_config__", None), "tag", None)
    return f"`{tag}` command" if isinstance(tag, str) else f"`{kind.__name__}`"


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
