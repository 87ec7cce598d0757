"""The HTTP API under /v1 (Litestar: msgspec Structs in and out, OpenAPI generated).

- `POST /v1/commands/<op>`: one route per command Struct of `schemas.commands` (body = the
  Struct; `actor` may be "" for "the caller"). Answers `CommandResult`.
- `POST /v1/batch`: commands applied atomically (budgets as code).
- `GET /v1/health` (no identity needed), `GET /v1/whoami`, `GET /v1/tokens`, and the reads.
- Errors: application/problem+json (`schemas.api.Problem`) with the LedgerError code.

Identity comes first on every route but health and the OpenAPI document: the Unix socket's peer
uid, or a bearer token (`ledger.server.identity`). What the identity may do is decided by the
domain alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable, Mapping
from importlib.metadata import version
from typing import Any, ClassVar

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.exceptions import HTTPException, ValidationException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme
from litestar.params import JSONBody

from ledger.reads import layer as reads
from ledger.reads.table import READS
from ledger.server import connections, copied, pages, pooled, query, tables
from ledger.server import identity as ident
from ledger.server import metrics as m
from ledger.server.agent_api import agent_routes
from ledger.server.cache import ReadCache
from ledger.server.commands import CommandPath
from ledger.server.front import Front
from ledger.server.ha_front import POSITION_HEADER, STORE_HEADER
from ledger.server.readpool import ReadPool, limits_from_env, sent_from_env
from ledger.server.store_seen import stale_s
from ledger.server.worker import Worker
from ledger.store.relay_health import RELAY_STALE, RELAY_UNREPORTED, unreported_words
from ledger.store.requests import valid_key
from ledger.wire import OUTCOME_HEADER
from schemas import api
from schemas import commands as c
from schemas.commands import AnyCommand
from schemas.errors import (
    Conflict,
    ContractViolation,
    InvalidCommand,
    InvalidTransition,
    LedgerError,
    NotAuthenticated,
    NotAuthorised,
    TooBusy,
    TooLarge,
    Unavailable,
    UnknownEntity,
)

PEER_UID = ident.PEER_UID

STATUS: dict[type[LedgerError], int] = {
    TooLarge: 413,
    InvalidCommand: 400,
    NotAuthenticated: 401,
    NotAuthorised: 403,
    UnknownEntity: 404,
    InvalidTransition: 409,
    ContractViolation: 409,
    Conflict: 409,
    TooBusy: 429,
    Unavailable: 503,
}

# InitLedger creates a ledger: that is `gpuledger init` on the data directory, before a server.
SERVED_COMMANDS: tuple[type[c.Command], ...] = tuple(
    t for t in AnyCommand.__args__ if t is not c.InitLedger
)


def status_of(err: LedgerError) -> int:
    for cls in type(err).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 400


def status_of_any(err: BaseException) -> int:
    """The HTTP status an exception escaping a handler is answered with."""
    if isinstance(err, LedgerError):
        return status_of(err)
    return err.status_code if isinstance(err, HTTPException) else 500


def problem(err: LedgerError) -> Response[api.Problem]:
    status = status_of(err)
    body = api.Problem(
        title=err.code,
        status=status,
        detail=err.line(),
        code=err.code,
        message=err.message,
        hint=err.hint,
        param=str(err.fields.get("param", "")),
    )
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if status == 429:
        headers = {"Retry-After": str(err.fields.get("retry_after", 1))}
    if err.fields.get("outcome") == "unknown":  # a write that may be stored all the same
        headers = {OUTCOME_HEADER: "unknown"}
    if err.fields.get("store") == "away":  # the store does not answer: the CLI says it once
        headers = {**(headers or {}), STORE_HEADER: "away"}
    return Response(
        body, status_code=status, media_type="application/problem+json", headers=headers
    )


def _ledger_error(_: Request[Any, Any, Any], err: LedgerError) -> Response[api.Problem]:
    return problem(err)


def _http_error(_: Request[Any, Any, Any], err: HTTPException) -> Response[api.Problem]:
    code = "invalid" if isinstance(err, ValidationException) else "http"
    detail = str(err.detail)
    extra = getattr(err, "extra", None)
    param = ""
    if isinstance(extra, list) and extra:
        detail += ": " + "; ".join(
            f"{x.get('key', '')} {x.get('message', '')}".strip()
            for x in extra
            if isinstance(x, dict)
        )
        # the parameter refused (`state=bogus`): named, as a LedgerError's `param`
        param = next((str(x["key"]) for x in extra if isinstance(x, dict) and x.get("key")), "")
    body = api.Problem(title=code, status=err.status_code, detail=detail, code=code, param=param)
    return Response(body, status_code=err.status_code, media_type="application/problem+json")


def _internal(request: Request[Any, Any, Any], err: Exception) -> Response[api.Problem]:
    if _store_away(err):  # a PostgreSQL store that does not answer: 503 in one line, not 500
        return _ledger_error(
            request,
            Unavailable(
                f"the store does not answer ({type(err).__name__})",
                hint="retry; /v1/jobs, /v1/log, /v1/shares and /v1/usage answer from what is "
                "folded",
            ),
        )
    body = api.Problem(
        title="internal",
        status=500,
        detail=f"internal error: {type(err).__name__}",
        code="internal",
    )
    return Response(body, status_code=500, media_type="application/problem+json")


def _store_away(err: BaseException) -> bool:
    """Whether `err` says the store does not answer (psycopg's connection errors and its pool's
    timeout, as eventsourcing passes them on; a projection whose source went away), itself or as
    the cause of another. (atk34-28 F2: the pool's timeout, wrapped by eventsourcing, answered a
    committed submit "internal error", which the CLI does not retry with its key.)"""
    from projections.errors import SourceUnavailable

    while err is not None:
        if isinstance(err, SourceUnavailable) or (
            type(err).__module__.split(".")[0] in _STORE_MODULES
            and type(err).__name__ in ("OperationalError", "InterfaceError", "PoolTimeout")
        ):
            return True
        err = err.__cause__  # type: ignore[assignment]
    return False


_STORE_MODULES = ("psycopg", "psycopg_pool", "eventsourcing")
"""The packages whose connection errors mean the store does not answer (named, not imported:
the server imports neither)."""


def error_response(err: Exception) -> Response[api.Problem]:
    """An exception escaping a command route, as the app's exception handlers answer it."""
    if isinstance(err, LedgerError):
        return problem(err)
    return _internal(None, err)  # type: ignore[arg-type]


def create_asgi(
    worker: Worker,
    *,
    clock: Callable[[], float],
    limits: connections.Limits | None = None,
    os_accounts: Mapping[str, str] | None = None,
) -> Front:
    """What `serve` serves: the Litestar app behind the command routes' hot path, its writes
    under way counted (the reads give way to them: `pooled.paged`), behind the connections'
    limits (`ledger.server.connections`: each caller's connections capped, a read's admission
    held until its answer is sent; `limits`: the environment's when None). `os_accounts`:
    serve.toml's, which the Unix socket's callers are named by (`identity.from_peer`)."""
    return _build(worker, clock, limits, os_accounts or {})[1]


def create_app(worker: Worker, *, clock: Callable[[], float]) -> Litestar:
    """The Litestar application serving `worker`'s ledger."""
    return _build(worker, clock)[0]


def _build(
    worker: Worker,
    clock: Callable[[], float],
    limits: connections.Limits | None = None,
    os_accounts: Mapping[str, str] | None = None,
) -> tuple[Litestar, Front]:
    ledger = worker.service.ledger
    writes = pooled.Writes()
    conns = connections.Connections(limits or connections.limits_from_env())

    def whose_uid(uid: int | None) -> tuple[str, bool]:
        """A socket peer's account, and whether it is the host's admin: root or a ledger
        admin's OS account (the socket's admin reserve, `connections.Tally`)."""
        name, root = connections.os_account(uid)
        actor = ident.socket_user(name, os_accounts or {})
        return name, root or (isinstance(actor, str) and ledger.state.is_admin(actor))

    conns.whose_uid = whose_uid

    def identify(uid: Any, bearer: str | None) -> ident.Identity:
        if isinstance(uid, int) and not bearer:  # a token sent on the socket is the caller
            return ident.from_peer(uid, os_accounts)
        return ident.from_bearer(ledger.state, bearer, clock())

    def who(request: Request[Any, Any, Any]) -> ident.Identity:
        return identify(request.scope.get(PEER_UID), request.headers.get("authorization"))

    def person(request: Request[Any, Any, Any]) -> ident.Identity:
        """Reads are for people (users, managers, admins), not node or job tokens."""
        caller = who(request)
        if caller.actor.startswith("@"):
            raise NotAuthorised(f"{caller.actor!r} may not read the ledger", actor=caller.actor)
        return caller

    def command_route(cls: type[c.Command]) -> HTTPRouteHandler:
        tag = cls.__struct_config__.tag

        async def handler(request: Request[Any, Any, Any], data: Any) -> api.CommandResult:
            cmd = ident.act(who(request), data)
            key = request.headers.get("idempotency-key")
            if key is not None and not valid_key(key.strip()):
                raise InvalidCommand("invalid Idempotency-Key", hint="1-128 printable characters")
            appended = await worker.execute(cmd, key.strip() if key else None)
            return api.CommandResult(position=appended.position, events=appended.events)

        handler.__annotations__ = {
            "request": Request,
            "data": JSONBody[cls],  # type: ignore[misc,valid-type]
            "return": api.CommandResult,
        }
        handler.__doc__ = (cls.__doc__ or f"The `{tag}` command.").strip().splitlines()[0]
        return post(
            f"/v1/commands/{tag}",
            operation_id=f"command_{str(tag).replace('.', '_')}",
            status_code=200,
            tags=["commands"],
            security=[{"bearer": []}],
            name=f"command-{tag}",
        )(handler)

    @post("/v1/batch", status_code=200, tags=["commands"], security=[{"bearer": []}])
    async def batch(
        request: Request[Any, Any, Any], data: JSONBody[api.Batch]
    ) -> api.CommandResult:
        """Apply commands atomically (at most `MAX_BATCH` of them): all are appended, or none."""
        caller = who(request)
        cmds = [ident.act(caller, cmd) for cmd in data.commands]
        if any(isinstance(cmd, c.InitLedger) for cmd in cmds):
            raise InvalidCommand("init is not served", hint="run `gpuledger init` before serve")
        if caller.actor in batching:
            raise TooBusy("a batch of yours is under way", hint="retry when it ends", retry_after=1)
        batching.add(caller.actor)
        try:  # decided first on the view, beside the worker, in the caller's turn: a batch
            # refused there costs the worker nothing (a refused 19,000-submit batch held it
            # 2.5 s, four at once stopped the cycle 9 s: atk44-25 F7)
            await copied.on_view(
                worker, pool, caller.actor, "the batch's dry run",
                lambda view: tables.dry_run(worker, view.ledger, view.moment, cmds),
            )  # fmt: skip
            appended = await worker.call(lambda: ledger.execute_all(cmds), write=True)
        finally:
            batching.discard(caller.actor)
        return api.CommandResult(position=appended.position, events=appended.events)

    batching: set[str] = set()
    """Callers with a batch under way (one each: another meanwhile gets 429)."""

    @get("/v1/health", tags=["service"])
    async def health() -> api.Health:
        """Up or not, version, last cycle, projection and relay lag, event count (no identity
        needed)."""
        svc = worker.service
        head = ledger.position
        relay, relay_state, relay_error, last_error = relay_health(worker)
        checked = svc.relay_checked_s_ago()  # this server's relay's (`relay status` tells it)
        st = svc.stats
        return api.Health(
            status="up" if worker.accepting else "stopping",
            version=version("gpu-ledger"),
            started_at=st.started_at,
            head=head,
            cycles=st.cycles,
            last_cycle_at=st.last_cycle_at,
            last_cycle_s=st.last_cycle_s,
            projection_position=st.projection_position,
            projection_lag=max(0, head - st.projection_position),
            relay_position=relay,
            relay_lag=None if relay is None else max(0, head - relay),
            last_error=last_error,
            relay_state=relay_state,
            relay_error=relay_error,
            relay_checked_s_ago=None if checked is None else round(checked, 3),
            executor=svc.about.get("executor", ""),
            placing=svc.placing,
            jobs_run_as=svc.about.get("jobs_run_as", ""),
            engine_note=svc.dispatcher.engine_note if svc.dispatcher else "",
            **_roles(worker, head),
            unobserved=tuple(sorted(svc.dispatcher.unobserved)) if svc.dispatcher else (),
            unobserved_since=svc.dispatcher.unobserved_since if svc.dispatcher else None,
            unobserved_why=svc.dispatcher.unobserved_why if svc.dispatcher else "",
            engine_away=st.engine_away,
            engine_away_since=st.engine_away_since,
        )

    @get("/v1/whoami", tags=["identity"], security=[{"bearer": []}])
    async def whoami(request: Request[Any, Any, Any]) -> api.WhoAmI:
        """Who the server takes the caller to be."""
        caller = who(request)
        return api.WhoAmI(
            actor=caller.actor, via=caller.via, admin=ledger.state.is_admin(caller.actor)
        )

    @get("/v1/tokens", tags=["identity"], security=[{"bearer": []}])
    async def tokens(request: Request[Any, Any, Any]) -> list[api.TokenRow]:
        """The caller's tokens (an admin's: everyone's); never secrets or their hashes."""
        return reads.tokens(ledger.state, person(request).actor)

    handles = ServiceHandles(worker.service)

    def read_route(name: str) -> HTTPRouteHandler:
        spec = READS[name]

        async def handler(request: Request[Any, Any, Any], **query: Any) -> Any:
            caller = person(request)  # reads are for people
            given = {k.removesuffix("_"): x for k, x in query.items() if x is not None}
            args = spec.parse(given)
            # the projection's reads: in the read pool, beside the worker (on either store; on
            # PostgreSQL from what is folded while the store is away, saying where that is)
            if spec.pooled:
                data, at, cut = await pooled.answer(
                    worker, pool, name, spec, args, caller.actor, writes
                )
                headers = {POSITION_HEADER: str(at)}
                if cut is not None:  # a page cut at its bytes: says how many rows it holds
                    headers[pooled.TRUNCATED_HEADER] = str(cut)
                return Response(
                    data, media_type="application/json", status_code=200, headers=headers
                )
            # the live state's (previews with `policy=` or `at=` too): on a copy (T5)
            data = await handles.copied(worker, pool, name, spec, args, caller.actor)
            return Response(data, media_type="application/json", status_code=200)

        params = [
            inspect.Parameter(
                "request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request
            ),
            *spec.signature(),
        ]
        handler.__signature__ = inspect.Signature(params, return_annotation=spec.returns)  # type: ignore[attr-defined]
        handler.__annotations__ = {p.name: p.annotation for p in params} | {"return": spec.returns}
        handler.__doc__ = spec.doc or f"The `{name}` read."
        handler.__name__ = f"read_{name}"
        return get(
            f"/v1/{spec.path}",
            operation_id=f"read_{name}",
            tags=["reads"],
            security=[{"bearer": []}],
            name=f"read-{name}",
        )(handler)

    document: list[bytes] = []
    rendering = asyncio.Lock()

    @get("/v1/openapi.json", include_in_schema=False, media_type="application/json")
    async def openapi(request: Request[Any, Any, Any]) -> Response[bytes]:
        """This API's OpenAPI document (committed as schemas/openapi.json), rendered once: it
        needs no identity, and rendering it held the event loop 0.25 s each time, so anyone
        looping it delayed every submit (issue 25)."""
        async with rendering:
            if not document:
                document.append(render_openapi(request.app))
        return Response(document[0], media_type="application/json")

    pool = ReadPool(
        tables.connect(worker), lambda fn: worker.call(fn), limits=limits_from_env()
    ).start()
    pool.sent = sent_from_env()
    if isinstance(worker, Worker):  # a serving app (not `offline_app`'s, for the document)
        assert not worker.started, "the app is made before the worker thread starts"
        pool.connect_now()
        service = worker.service
        if service.projector is not None:  # the reads' catch-ups: beside the worker (T5)
            from projections.errors import SourceUnavailable

            with contextlib.suppress(SourceUnavailable):  # else on the worker, as before
                pool.projector = service.projector.beside(service.ledger.source())
    routes: list[Any] = [command_route(cls) for cls in SERVED_COMMANDS]
    routes += [batch, health, whoami, tokens, openapi]
    routes += [read_route(name) for name in READS]
    routes += tables.routes(worker, person, pool)
    routes += agent_routes(worker, who, clock)
    metrics = m.Metrics(status_of_any)
    worker.service.on_cycle.append(metrics.observe_cycle)
    metrics.registry.register(m.PoolCounts(pool, worker))
    metrics.registry.register(m.ConnectionCounts(conns))
    routes += [m.route(metrics, worker, handles, person, pool)]
    # what the next reads ask first, computed ahead in the read pool (the worker only hands it)
    worker.idle.append(lambda: handles.warm(worker, pool))
    worker.idle.append(lambda: metrics.warm(handles, worker, pool))
    routes += pages.routes(worker, handles, person, pool)
    app = Litestar(
        route_handlers=routes,
        before_request=query.QueryGate(who, lambda h: bool(set(h.paths) & PAGE_SHELLS)),
        middleware=[metrics.middleware],
        exception_handlers={
            LedgerError: _ledger_error,
            HTTPException: _http_error,
            Exception: _internal,
        },
        openapi_config=OpenAPIConfig(
            title="gpu-ledger",
            version="1",
            path="/v1/openapi",
            render_plugins=[SwaggerRenderPlugin()],
            description="Budgets, fair share and scheduling contracts for shared GPU clusters.",
            components=Components(
                security_schemes={
                    "bearer": SecurityScheme(type="http", scheme="bearer", bearer_format="glt_…")
                }
            ),
        ),
        debug=False,
        logging_config=None,
    )
    writes.app = CommandPath(
        app, worker, identify, SERVED_COMMANDS, metrics.observe_api, error_response, writes
    )

    def unmetered(caller: ident.Identity) -> bool:
        """The ledger's admins and the nodes' agents are never metered (`front.Front`)."""
        return caller.actor.startswith("@node:") or ledger.state.is_admin(caller.actor)

    writes.app.unmetered = unmetered  # nor are their writes' bytes
    writes.app.batching = lambda caller: caller.actor in batching  # asked before the body
    front = Front(writes, identify, conns, unmetered)
    front.stop_reads = pool.stop
    return app, front


PAGE_SHELLS = frozenset({"/", "/ui/{page:str}"})
"""Routes whose query string is the browser script's (the dashboard's page shells)."""


def relay_health(worker: Any) -> tuple[int | None, str | None, str | None, str | None]:
    """Health's relay position, state and error, and its `last_error`: this server's relay,
    or, on a server that runs none or does not act as leader, the leader's as it reported it
    (`_leaders_relay`: a leader resumed past its lease, before its worker stepped down, said its
    own "publishing" while standby); its own relay stopped is its last error too (it said
    None: atk61-ha F6)."""
    svc = worker.service
    relay = svc.relay_position()  # None: no relay, or a position not known (atk58 F4)
    state, error = svc.relay_state()
    last_error = svc.stats.last_error
    if last_error is None and state == "stopped" and error:
        last_error = f"the relay stopped: {error}"
    if worker.ha is not None and (state is None or not worker.ha.acting()):
        relay, state, error = _leaders_relay(worker.ha, svc.kafka)
    return relay, state, error, last_error


def _leaders_relay(ha: Any, kafka: str | None = None) -> tuple[int | None, str | None, str | None]:
    """(position, state, error) of the leader's relay as it last reported it to the store, for
    a server that runs none (a standby): it said "no Kafka" while the leader's relay published
    or had stopped (atk52-ha F4). The error names whose relay it is and how old the word is.
    `kafka`: this server's bootstrap (None: it relays to none when it leads); with one, a
    leader of an earlier version, which reports nothing of its relay, is `unreported` (it said
    "no relay has run" in a rolling upgrade), with no position."""
    got = ha.leader_relay()
    if got is None and kafka and ha.leader_of_earlier_version():
        return None, RELAY_UNREPORTED, unreported_words(ha.leader_address(), kafka)
    if got is None:
        return None, None, None
    word, ago = got
    if ago > ha.relay_word_s:  # dead, paused or cut off: no newer word (atk54-25 F1)
        said = (
            f"the leader's relay ({ha.leader_address()}) said {word.state} {ago:.0f} s ago, "
            "no report since: its server is down, paused or cut off from the store"
        )
        return word.position, RELAY_STALE, f"{said}: {word.error}" if word.error else said
    said = f"the leader's relay ({ha.leader_address()}), as it reported {ago:.0f} s ago"
    return word.position, word.state, f"{said}: {word.error}" if word.error else said


def _roles(worker: Worker, head: int) -> dict[str, Any]:
    """Health's word on leadership: this server's role, the leader, the epoch, every server's
    lag (on a store several servers share), and a store that does not answer."""
    ha = worker.ha
    store = "sqlite" if worker.service.ledger.dsn is None else "postgresql"
    if ha is None:
        return {"store": store, "store_error": worker.follow_error}
    expires_in, renewed_ago = ha.lease_times()
    stale = stale_s(time.monotonic(), worker.read_at, ha.acting(), ha.lease.lease_s)
    stale = None if stale is None else round(stale, 1)
    return {
        "role": ha.role,
        "leader": ha.leader_address(),
        "epoch": ha.epoch,
        "lease_s": ha.lease.lease_s,
        "lease_expires_in_s": None if expires_in is None else round(expires_in, 3),
        "lease_renewed_s_ago": None if renewed_ago is None else round(renewed_ago, 3),
        "store": store,
        "store_error": ha.store_error() or worker.follow_error,
        "lease_read_s_ago": None if (read := ha.lease_read_s_ago()) is None else round(read, 3),
        "stale_s": stale,
        "settings_error": ha.refused,
        "address_error": ha.same_address,
        "no_taker": ha.no_taker(),
        "older_servers": ha.older,
        "servers": ha.servers(head),
    }


class ServiceHandles:
    """What the server's reads share: the service loop (its ledger's position and clock, read
    on the event loop), the answers kept per log position (`cache`), and when each shared value
    was last asked for. Every read runs in the read pool, on the published view of the live
    state or the projection alone (`ledger.server.copied`), never on the worker thread.

    The dispatcher's preview "now" (what `queue`, `priority`, `explain`, the pages and /metrics
    build on) is computed once per log position and kept for `ReadCache.fresh_s`; `warm` has it
    computed ahead in the read pool, when the worker is idle, so the first read after an append
    finds it ready (while someone asked for one in the last `WARM_FOR_S`: a ledger nobody reads
    costs nothing)."""

    WARM_FOR_S = 600.0

    def __init__(self, service: Any) -> None:
        self.service = service
        self.cache = ReadCache(clock=self.now)
        self.asked: dict[str, float] = {}
        """When each shared value was last asked for by a read."""

    def warm(self, worker: Worker, pool: ReadPool) -> None:
        """Have the shared preview computed ahead, in the read pool on the published view (the
        worker calls it when idle and only hands it on: `copied.ahead`), while someone asked
        for one in the last `WARM_FOR_S`."""
        from ledger.server import copied

        asked = self.asked.get("live-preview")
        if asked is None or time.monotonic() - asked > self.WARM_FOR_S:
            return
        view = worker.view
        if view is None or self.cache.holds("live-preview", view.ledger.position):
            return
        copied.ahead(worker, pool, self.cache, lambda h: h.live_preview())

    async def copied(
        self, worker: Worker, pool: ReadPool, name: str, spec: Any, args: Any, viewer: str
    ) -> bytes:
        """The encoded answer of a read of the live state for `viewer`, from the cache when
        kept (once per log position, per viewer too for the reads whose answer depends on who
        asks), else computed in `pool` on a copy of the live state (`ledger.server.copied`),
        admitted as one of `viewer`'s reads, and kept."""
        from ledger.server import copied

        key = viewer if spec.personal else ""
        with pool.admitted(viewer, read=True):  # a kept answer is a read too (T5)
            got = self.cache.get(name, args, self.ledger.position, self.now(), key)
        if got is not None:
            return got
        self.asked["live-preview"] = time.monotonic()  # the worker computes it ahead when idle

        def run(h: copied.CopiedHandles) -> tuple[int, float, bytes, bool, Any]:
            data = msgspec.json.encode(spec.run(h, args))
            return h.ledger.position, h.now(), data, h.current(), h.basis()

        position, now, data, current, basis = await copied.read(
            worker, pool, viewer, f"the {name} read", run, cache=self.cache,
            extra=self._heard if name == "nodes" else None,
        )  # fmt: skip
        if current:  # one read from the shared preview lives as long as it (`ReadCache`)
            self.cache.put(name, args, position, now, data, key, basis=basis)
        return data

    def _heard(self, _view: Any) -> dict[str, Any]:
        """What `node list` asks of the service beside its state (on the event loop): when its
        engine last heard from each node (`CopiedHandles.heard_from`)."""
        executor = getattr(self.service, "executor", None)
        return {"heard_from": dict(executor.heard_from()) if executor is not None else {}}

    @property
    def ledger(self) -> Any:
        return self.service.ledger

    def now(self) -> float:
        now: float = self.service.clock.now()
        return now


def openapi_document(app: Litestar) -> dict[str, Any]:
    """The OpenAPI document as the server serves it at /v1/openapi.json."""
    doc: dict[str, Any] = _any_of(msgspec.to_builtins(app.openapi_schema.to_schema()))
    return _problems(doc)


WRITES = pooled.WRITES
"""Routes that change the ledger: they may also answer 409 (a transition or contract refused)."""


def _problems(doc: dict[str, Any]) -> dict[str, Any]:
    """Every error an operation may answer, as it answers it: application/problem+json
    (`api.Problem`), in place of the framework's generic 400. 400 a bad query or body, 401 no
    or a bad identity, 403 not allowed, 404 no such entity, 409 (writes) refused as a
    transition, 413 (with a body) over the size limit, 429 too busy (Retry-After), 503
    stopping (docs/server.md, "The API")."""
    from http import HTTPStatus

    _, components = msgspec.json.schema_components(
        [api.Problem], ref_template="#/components/schemas/{name}"
    )
    doc.setdefault("components", {}).setdefault("schemas", {}).update(components)
    ref = {"schema": {"$ref": "#/components/schemas/Problem"}}
    for path, ops in doc.get("paths", {}).items():
        for op in ops.values():
            if not isinstance(op, dict) or "responses" not in op or not op.get("security"):
                continue  # health and the document itself need nobody and fail no input
            codes = [400, 401, 403, 404, 429, 503]
            if path.startswith(WRITES):
                codes.append(409)
            if "requestBody" in op:
                codes.append(413)
            for code in sorted(codes):
                op["responses"][str(code)] = {
                    "description": HTTPStatus(code).phrase,
                    "content": {"application/problem+json": ref},
                }
    return doc


def _any_of(node: Any) -> Any:
    """Unions as `anyOf`: a value of `float | int` is both a number and an integer, which
    `oneOf` (exactly one) would reject. Tagged unions stay exact through their `type` consts."""
    if isinstance(node, dict):
        return {("anyOf" if k == "oneOf" else k): _any_of(x) for k, x in node.items()}
    if isinstance(node, list):
        return [_any_of(x) for x in node]
    return node


OPENAPI_FILE = "openapi.json"
"""Committed beside the event schemas: schemas/openapi.json."""


def offline_app() -> Litestar:
    """The app without a running server (its routes, its OpenAPI document)."""

    class _Offline:
        idle: ClassVar[list[Any]] = []

        class service:
            ledger = None
            on_cycle: ClassVar[list[Any]] = []

    return create_app(_Offline(), clock=lambda: 0.0)  # type: ignore[arg-type]


def offline_document() -> bytes:
    """The OpenAPI document without a running server (for export and the drift test)."""
    return render_openapi(offline_app())


def render_openapi(app: Litestar) -> bytes:
    """Pure: the canonical bytes of the OpenAPI document (sorted keys, 2-space indent)."""
    import json

    text = json.dumps(openapi_document(app), indent=2, sort_keys=True, ensure_ascii=False)
    return (text + "\n").encode()
