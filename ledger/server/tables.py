"""Budgets as code and the audit through the server: `POST /v1/budget/plan`,
`POST /v1/audit/table`, `GET /v1/audit/verify` and `GET /v1/audit/check`, so `budget apply`,
every audit export (table, CSV, JSON, Parquet), `audit verify` and `audit check` work beside a
running server without opening the data directory.

The plan is made from the server's state as the caller (the CLI prints it, then applies it
through `/v1/batch`, atomically); an audit table is the exact Arrow table embedded mode builds,
sent as an Arrow IPC stream, so every format prints the same bytes in both modes. An audit
table is computed in the read pool (`ledger.server.readpool`: its own cursor and thread, a time,
row and byte limit, per-caller limits), never on the worker thread; a SELECT of the caller's
own (`sql`) only for admins (`reads.may_query_all`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgspec
from litestar import Request, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody

from ledger.history.tamper import ChainReport
from ledger.reads import layer as reads
from ledger.server import audits, copied
from ledger.server import identity as ident
from ledger.server.readpool import ReadPool
from ledger.server.worker import Worker
from schemas import api
from schemas import views as v
from schemas.errors import TooBusy

T = TypeVar("T")

if TYPE_CHECKING:
    import duckdb

    from ledger.core.budget import BudgetFile
    from ledger.core.state import State
    from ledger.history.tables import Limits


def streamed(result: type) -> ResponseSpec:
    """A whole-log audit's 200 in the OpenAPI document: `result`, or streamed."""
    return ResponseSpec(
        result, generate_examples=False,
        description="The result, or with `Accept: application/x-ndjson` one `AuditFrame` a "
        "line: a step at least every second while it runs, then its result or its error",
    )  # fmt: skip


def routes(
    worker: Worker, person: Callable[[Request[Any, Any, Any]], ident.Identity], pool: ReadPool
) -> list[HTTPRouteHandler]:
    """The routes, for people only (like every read); audit tables run in `pool`."""
    lanes = {admin: audits.AuditLane(admin) for admin in (True, False)}
    """`audit verify` and `audit check` walk the whole log: one of each at a time for admins and
    one for everyone else (so no plain user keeps an admin from verifying), on a thread at nice
    10 (the worker and the submits go first); another caller meanwhile gets 429."""

    def lane(caller: ident.Identity) -> audits.AuditLane:
        return lanes[worker.service.ledger.state.is_admin(caller.actor)]

    planning: set[str] = set()
    """Callers with a budget plan under way (one each: another meanwhile gets 429)."""

    @post("/v1/budget/plan", status_code=200, tags=["commands"], security=[{"bearer": []}])
    async def budget_plan(
        request: Request[Any, Any, Any], data: JSONBody[api.BudgetPlanRequest]
    ) -> api.BudgetPlan:
        """The changes that make the ledger match a budget file, as the caller (checked as they
        would be applied with `check`; nothing is appended: apply them with /v1/batch)."""
        from ledger.core import budget as b

        caller = person(request)
        if data.check:  # every change would be refused: said before any work (T5)
            b.require_may_change(worker.service.ledger.state, data.actor or caller.actor)
        if caller.actor in planning:
            raise TooBusy("a plan of yours is under way", hint="retry when it ends", retry_after=2)
        planning.add(caller.actor)
        try:  # the file parsed beside the worker (pure), planned beside it on the live state's
            # view, admitted like a read: a 70,000-member plan checked on the worker held the
            # cycle and everyone's submits ~35 s (atk44-25 F6)
            parsed = await lanes[False].run(lambda: b.parse(data.toml.encode(), data.name))
            with pool.admitted(caller.actor, read=True):
                return await copied.on_view(
                    worker, pool, caller.actor, "the budget plan",
                    lambda view: plan(worker, view.ledger.state, view.moment, caller, data, parsed),
                )  # fmt: skip
        finally:
            planning.discard(caller.actor)

    @post("/v1/audit/table", status_code=200, tags=["reads"], security=[{"bearer": []}])
    async def audit_table(
        request: Request[Any, Any, Any], data: JSONBody[api.AuditQuery]
    ) -> api.AuditTable:
        """An audit table (one read-only SELECT, admins only; a job's history, the preemptions
        or the budget changes) as an Arrow IPC stream. Computed beside the worker (never
        delaying a command or a cycle), stopped at its time, row and byte limits; 429 with
        Retry-After past a caller's share of queries."""
        caller = person(request)
        if data.kind == "sql":
            reads.require_query_all(worker.service.ledger.state, caller.actor)
        with pool.admitted(caller.actor):  # before the worker is asked anything (T5)
            # the log so far, caught up beside the worker (shared with every read waiting)
            await copied.caught_up(worker, pool, int(worker.service.ledger.position))
            return await pool.compute(lambda con, limits: table(con, data, limits))

    @get("/v1/audit/verify", tags=["reads"], security=[{"bearer": []}],
         responses={200: streamed(ChainReport)})  # fmt: skip
    async def audit_verify(request: Request[Any, Any, Any]) -> Any:
        """The hash chain recomputed over the store: the first broken link and what broke it,
        each row checked against its snapshots and the projection's link. Read from the store
        through its own connection, beside the worker (no write waits). Streamed as NDJSON
        (`api.AuditFrame` lines) when asked with `Accept: application/x-ndjson`."""
        from ledger.history import tamper

        caller = person(request)
        service = worker.service
        mine = lane(caller)

        def anchor() -> tuple[tamper.Anchor | None, duckdb.DuckDBPyConnection]:
            assert service.store is not None and service.projector is not None
            service.projector.catch_up()
            return tamper.projection_anchor(service.store), service.store.con.cursor()

        async def work(walk: audits.Walk) -> ChainReport:
            # caught up beside the worker first: the worker's part is the last few events
            await copied.caught_up(worker, pool, int(service.ledger.position))
            held, rows = await worker.call(anchor)
            try:  # the projection's rows through a cursor of their own (a snapshot of them)
                report = await mine.run(
                    lambda: tamper.verify_store(service.home, held, rows, progress=walk.told),
                    walk,
                )
            finally:
                rows.close()
            if mine.admin:
                return report
            # the head's link hashes the head event whole: shown to someone who may not see
            # that event, it confirms a guess of its private fields offline (T1); anchors are
            # admins'
            return msgspec.structs.replace(report, head_hash="")

        return await audits.start(request, mine, "verify", caller.actor, admitted(caller),
                                  stopping, work)  # fmt: skip

    @get("/v1/audit/check", tags=["reads"], security=[{"bearer": []}],
         responses={200: streamed(v.CheckView)})  # fmt: skip
    async def audit_check(request: Request[Any, Any, Any]) -> Any:
        """The ledger's invariants over the whole log, usage charged to unfunded jobs, and GPUs
        held twice by processes alive on the server's host. The history is scanned beside the
        worker, the projection caught up beside it and read in the read pool with the view of
        the live state: the worker runs none of it. Streamed as NDJSON like `audit/verify`."""
        from ledger.engines.supervised import live_processes
        from ledger.history import tables
        from ledger.history.tamper import store_head

        caller = person(request)
        mine = lane(caller)
        service = worker.service

        async def work(walk: audits.Walk) -> v.CheckView:
            def scan() -> Any:
                total = store_head(service.home)
                walk.told("check", 0, total)
                return tables.scan_history(
                    service.home, progress=lambda n: walk.told("check", n, total)
                )

            report = await mine.run(scan, walk)
            await copied.caught_up(worker, pool, int(service.ledger.position))  # beside it
            now = await copied.view(worker, pool)

            def rest(con: duckdb.DuckDBPyConnection, _limits: Any) -> v.CheckView:
                # the projection's charges through the pool's cursor, the live processes
                # against the view: the worker runs none of it (it caught the projection up
                # and queried it there, ~0.45 s a check on a busy ledger: atk44w F6)
                live = tables.live_violations(service.home, lambda: now.ledger, live_processes)
                return tables.check_view(report, cast("Any", copied.CursorStore(con)), live)

            return await pool.compute(rest)

        return await audits.start(request, mine, "check", caller.actor, admitted(caller),
                                  stopping, work)  # fmt: skip

    def stopping() -> bool:
        return not worker.accepting

    def admitted(caller: ident.Identity) -> contextlib.AbstractContextManager[None]:
        """A whole-log audit admitted as one of the caller's reads (2 at once, 429 past it)."""
        return pool.admitted(caller.actor, read=True)

    @get("/v1/audit/progress", tags=["reads"], security=[{"bearer": []}])
    async def audit_progress(request: Request[Any, Any, Any]) -> api.AuditProgress:
        """How far the `audit verify` and `audit check` under way in the caller's lane are
        (events read of the store's head; null: none runs): what the CLI shows while it waits
        for one through the server."""
        mine = lane(person(request))
        return api.AuditProgress(verify=mine.steps.get("verify"), check=mine.steps.get("check"))

    return [budget_plan, audit_table, audit_verify, audit_check, audit_progress]


def plan(
    worker: Worker,
    state: State,
    now: float,
    caller: ident.Identity,
    req: api.BudgetPlanRequest,
    parsed: BudgetFile,
) -> api.BudgetPlan:
    """In the read pool, on a view of the live state (`state` at `now`), never on the worker
    thread: plan the parsed file as the caller (or `req.actor`), and with `check` try every
    change on a copy of it, as the ledger's edge admits commands (`admit`), with ids of its own
    (the ledger's are not drawn for a dry run)."""
    from ledger.core import budget as b
    from ledger.store.clock import random_ids

    actor = req.actor or caller.actor
    changes = b.plan(state, parsed, actor, prune=req.prune)
    if req.check:
        cmds = [ident.act(caller, ch.command) for ch in changes]
        b.check(state, cmds, now, random_ids(), worker.service.ledger.admit, until(LIMIT_S))
    return api.BudgetPlan(
        changes=[
            api.BudgetChange(symbol=ch.symbol, text=ch.text, command=ch.command) for ch in changes
        ]
    )


LIMIT_S = 10.0
"""The longest a dry run (a budget plan's check, a batch's) runs in the read pool."""


def until(limit_s: float) -> Callable[[], bool]:
    """True once `limit_s` seconds from now have passed."""
    deadline = time.monotonic() + limit_s
    return lambda: time.monotonic() > deadline


def dry_run(worker: Worker, view: copied.Frozen, now: float, cmds: list[Any]) -> None:
    """In the read pool, on a view of the live state (`view`, at `now`): each command's
    `expected_position` checked against the events after it up to the view's position (from
    those the ledger kept decoded: a clash refused 409 here cost the worker a 2,000 x 1,000 key
    scan before, atk44w), then `cmds` decided one after another on a copy of the state as the
    ledger's edge admits them, raising the first rejection (what the apply on the worker would
    raise, had nothing moved meanwhile)."""
    from ledger.core import budget as b
    from ledger.core import conflicts
    from ledger.store.clock import random_ids

    ledger = worker.service.ledger
    oldest = conflicts.oldest(cmds, view.position)
    if oldest is not None:
        after = ledger.kept(oldest, view.position)
        if after is not None:  # else not kept (rare: 1,000 back at most): the worker checks
            conflicts.check(view.state, cmds, after)
    b.check(view.state, cmds, now, random_ids(), ledger.admit, until(LIMIT_S))


def connect(worker: Worker) -> Callable[[], duckdb.DuckDBPyConnection]:
    """The read pool's connection to the service's projection (made on the worker thread, the
    service connection's own), locked down: no file or network access; every query of the
    database on its caller's thread alone (`threads = 1`, see `ledger.server.readpool`)."""

    def run() -> duckdb.DuckDBPyConnection:
        from ledger.history import tables

        store = worker.service.store
        assert store is not None
        con = store.con.cursor()
        tables.lock_down(con)
        con.execute("SET threads = 1")
        return con

    return run


def table(con: duckdb.DuckDBPyConnection, q: api.AuditQuery, limits: Limits) -> api.AuditTable:
    """In the read pool: the table from a cursor of the service's projection, as an Arrow IPC
    stream. Only single SELECT statements pass `check_select`; external access is off."""
    import pyarrow as pa

    from ledger.history import tables

    result = tables.audit_table(con, q, limits)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, result.schema) as writer:
        writer.write_table(result)
    return api.AuditTable(rows=result.num_rows, arrow=sink.getvalue().to_pybytes())
