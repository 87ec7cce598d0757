"""The API's bodies, strictly, and the command routes' hot path, in front of the framework.

Every POST route with a JSON body (the commands, `/v1/batch`, `/v1/budget/plan`,
`/v1/audit/table`, the agents' `/v1/agent/*`; found in the app's handlers, so a new route cannot
be forgotten) has its body decoded here, strictly, before anything else reads it
(docs/security.md, row T14; docs/server.md, "Request bodies"):

- the caller is identified from the headers first: an unidentified caller gets 401 before its
  body is read (the rest is never buffered nor decoded: a tokenless 4 MB batch was read and
  decoded first, atk44w F4); so are, before the body is read, a Content-Length over `MAX_BODY`
  (413), a metered caller past the write meter (429), a second batch of a person's (429), and a
  second body over `LARGE_BODY` of a person's (429);
- at most `MAX_BODY` bytes (4 MiB), else 413 `too_large` (the rest is not read), read in the
  chunks it comes in;
- the route's Struct exactly, with msgspec's strict decoding: no coercion (`"2"` is no integer,
  `0` no boolean), a field the Struct does not know is refused, every bound of `schemas.bounds`
  holds (strings, lists); a NUL character in any string is refused; nesting deeper than the
  Struct allows is refused at its first level;
- a body that fails is one problem+json line, 400 `invalid`, naming where (`$.gpus`), and
  nothing is appended; a metered caller's body read is charged to her write meter whatever
  the answer (its decoding cost the event loop ~5 ms a MiB: bounded by the meter's rate).

A submit is the request a cluster sends most, and Litestar's per-request machinery (routing,
the middleware stack, the signature model, kwargs extraction, the response object) cost about as
much CPU as deciding and appending the command itself. So a command this layer decoded is also
answered here, with exactly what the Litestar route does:

  1 identify the caller per request (`who`: the Unix socket's peer uid, or the bearer token,
    looked up in the ledger's state at that moment: revocation and expiry bite at once)
  2 refuse by the Content-Length, the meter and the caller's requests under way (above)
  3 read the body; decode it strictly into the command's Struct (above)
  4 set the actor (`identity.act`), hand the command to the group commit (`Worker.execute`),
    answer only once its transaction has committed
  5 answer `CommandResult` as JSON, or the LedgerError as problem+json rendered by the app's
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

LARGE_BODY = 1 << 20
"""A metered caller's body over this many bytes is read one at a time per person (another
meanwhile: 429 before it is read): only a batch or a mistaken submit is this large, and each
costs the event loop ~5 ms a MiB to decode (msgspec holds the interpreter: a thread would not
free the loop)."""

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
        self.batching: Callable[[ident.Identity], bool] = lambda _who: False
        """Whether a caller has a batch under way (set by the app: its `/v1/batch` route's
        rule, asked here too so that a second batch is refused before its body is read)."""
        self.reading: set[str] = set()
        """The people (`Identity.whose`) with a body over `LARGE_BODY` being read or served."""
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
        # 1 who calls, from the headers: an unidentified caller is told so before its body is
        # read (a tokenless 4 MB batch was read and decoded first: atk44w F4)
        try:
            caller = self.who(scope.get(ident.PEER_UID), _authorization(scope))
        except LedgerError as err:
            return await self._error(scope, receive, send, err)
        # 2 refused by its Content-Length, the write meter or a large body of the caller's
        # under way, before the body is read (the rest is never buffered nor decoded)
        length = _content_length(scope)
        if length is not None and length > MAX_BODY:
            return await self._error(scope, receive, send, _too_large(path))
        metered = is_write(path) and not self.unmetered(caller)
        freeing = path in FREEING_PATHS  # never refused by the meter, only charged (atk44z F5)
        wait = self.written.retry_in(caller.writes_as, _now()) if metered and not freeing else 0
        if wait > 0:
            return await self._error(scope, receive, send, _written_past(self.written, wait))
        if path == "/v1/batch" and self.batching(caller):
            return await self._error(scope, receive, send, _batch_under_way())
        large = metered and (length or 0) > LARGE_BODY
        if large and caller.writes_as in self.reading:
            return await self._error(scope, receive, send, _large_under_way())
        if large:
            self.reading.add(caller.writes_as)
        try:
            return await self._read_and_answer(scope, receive, send, path, route, caller, metered)
        finally:
            if large:
                self.reading.discard(caller.writes_as)

    async def _read_and_answer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        path: str,
        route: tuple[str, msgspec.json.Decoder[Any]],
        caller: ident.Identity,
        metered: bool,
    ) -> int:
        # 3 the body, in the chunks it comes in, at most MAX_BODY bytes; decoded strictly
        body = await _read_body(receive)
        if body is None:
            return 499  # the client went away
        if len(body) > MAX_BODY:
            return await self._error(scope, receive, send, _too_large(path))
        try:
            value = route[1].decode(body)
            if b"u0000" in body and _NUL.search(body):
                raise msgspec.ValidationError("a NUL character is refused in any string")
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as err:
            if metered:  # read and decoded: charged its body like any write (atk44w F4)
                self.written.charge(caller.writes_as, len(body), _now())
            why = "nested too deep" if isinstance(err, RecursionError) else str(err)
            problem = InvalidCommand(
                f"the body of POST {path} is not a valid {route[0]}: {why}",
                hint="see /v1/openapi.json",
            )
            return await self._error(scope, receive, send, problem)
        # what it will write at least, known now: past the most a request may write it is
        # refused before anything is built, and charged what it claimed (atk45-25 F6)
        if (floor := written_floor(value)) > bounds.MAX_REQUEST_WRITTEN:
            if metered:
                self.written.charge(caller.writes_as, max(reserve(value, body), len(body)), _now())
            return await self._error(scope, receive, send, _writes_too_much(floor))
        # what it may write, taken before it is written (atk44z F2); a write that only frees
        # what earlier writes made (a cancel) is never refused, only charged (atk44z F5)
        reserved = reserve(value, body) if metered and not frees(value) else 0
        if reserved and (wait := self.written.reserve(caller.writes_as, reserved, _now())) > 0:
            self.written.charge(caller.writes_as, len(body), _now())  # read and decoded all same
            return await self._error(scope, receive, send, _written_past(self.written, wait))
        status, written = 500, max(reserved, len(body))  # kept when the write ends in an exception
        try:
            status, written = await self._write(
                scope, receive, send, path, body, caller, value, reserved
            )
        finally:
            if metered:
                self.written.settle(caller.writes_as, reserved, written, _now())
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
        reserved: int,
    ) -> tuple[int, int]:
        """Answer the write: its status and the bytes it is charged (about what it wrote: its
        answer, at least its body; a refused one its body, read and decoded all the same:
        atk44w F4, F5; one refused 413 for its size what it reserved, `reserved`: charged its
        60 KB body, a 10,000-task array refused for its 16 MiB was looped, atk45-25 F6)."""
        with self._counted(path):  # a write from here on, not before (issue 25)
            if path not in self.commands:  # checked: the framework's route answers it
                sent = [0, 200]  # a batch answers with the events it appended: charged those

                async def counting(message: Any) -> None:
                    if message["type"].endswith("start"):
                        sent[1] = message.get("status", 200)
                    sent[0] += (
                        len(message.get("body", b"")) if message["type"].endswith("body") else 0
                    )
                    await send(message)

                await self.app(scope, _replay(body, False, receive), counting)
                too_large = reserved if sent[1] == 413 else 0
                return 200, max(len(body), sent[0], too_large)  # a 60 KB batch wrote 16 MiB
            # 4 decided and appended in the group commit; answered once committed
            size = await self._command(scope, receive, send, ident.act(caller, value))
            if size >= 0:
                return 200, max(size, len(body))
            return -size, max(len(body), reserved if size == -413 else 0)

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
        """5 the error as the app's exception handlers answer it (problem+json)."""
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


FREEING_PATHS = frozenset(f"/v1/commands/{cls.__struct_config__.tag}" for cls in FREEING)
"""Their routes: a person past the meter is not refused before such a body is read."""


def frees(value: Any) -> bool:
    """Whether the write `value` (a command, a batch) is made only of `FREEING` commands."""
    if not isinstance(value, api.Batch):
        return isinstance(value, FREEING)
    return bool(value.commands) and all(isinstance(cmd, FREEING) for cmd in value.commands)


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


def written_floor(value: Any) -> int:
    """Pure: the least the write `value` (a command, a batch) will write to the log, known once
    it is decoded: each submission's command line, labels and paths as JSON, once per task
    (every task's event records them as they are, with more). Past `MAX_REQUEST_WRITTEN` the
    write is refused before anything is built (a 10,000-task array of a 1.7 KB command built
    16 MiB of events before its 413, atk45-25 F6)."""
    commands = value.commands if isinstance(value, api.Batch) else (value,)
    return sum(_floor(cmd) for cmd in commands)


def _floor(cmd: Any) -> int:
    if not isinstance(cmd, c.SubmitJob):
        return 0
    kept = (cmd.command, cmd.labels, cmd.workdir, cmd.stdout, cmd.stderr, cmd.job_name)
    return max(1, len(set(cmd.array))) * sum(len(_encoder.encode(x)) for x in kept if x)


def _writes_too_much(floor: int) -> TooLarge:
    return TooLarge(
        f"this request would write more than {bounds.MAX_REQUEST_WRITTEN:,} bytes to the log "
        f"(at least {floor:,}: its command lines, labels and paths, once per array task); "
        "nothing written",
        hint="submit fewer array tasks or a shorter command, or split the batch",
    )


def _reserve(cmd: Any, size: int) -> int:
    tasks = getattr(cmd, "array", ())
    if not tasks:
        return size + EVENT_EXTRA
    return len(tasks) * (max(0, size - len(_encoder.encode(tasks))) + EVENT_EXTRA)


def _now() -> float:
    return time.monotonic()


def _batch_under_way() -> TooBusy:
    return TooBusy("a batch of yours is under way", hint="retry when it ends", retry_after=1)


def _large_under_way() -> TooBusy:
    return TooBusy(
        f"a request of yours over {LARGE_BODY >> 20} MiB is under way",
        hint="retry when it ends; send one large body at a time",
        retry_after=1,
    )


def _too_large(path: str) -> TooLarge:
    return TooLarge(
        f"the body of POST {path} is over {MAX_BODY // (1024 * 1024)} MiB",
        hint="send less at once (docs/server.md, request bodies)",
    )


def _content_length(scope: Scope) -> int | None:
    """The request's Content-Length (the server's protocol lets one of digits through, or
    none: `protocol.body_length`), or None."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            text = bytes(value).strip()
            return int(text) if text.isdigit() else None
    return None


async def _read_body(receive: Receive) -> bytes | None:
    """The body as its chunks come, kept as a list (a body grown by `+=` copied itself once
    per chunk: ~64 MB of copies for 4 MB), at most a chunk past `MAX_BODY` (the rest is not
    read); None: the client went away."""
    parts: list[bytes] = []
    size, more = 0, True
    while more and size <= MAX_BODY:
        message = await receive()
        if message["type"] != "http.request":
            return None
        part = message.get("body", b"")
        parts.append(part)
        size += len(part)
        more = message.get("more_body", False)
    return b"".join(parts)


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
