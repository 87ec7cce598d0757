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

import asyncio
import contextlib
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgspec
from litestar import Request, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.params import JSONBody

from ledger.history.tamper import ChainReport
from ledger.reads import layer as reads
from ledger.server import copied
from ledger.server import identity as ident
from ledger.server.fairlane import FairSlot
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


def routes(
    worker: Worker, person: Callable[[Request[Any, Any, Any]], ident.Identity], pool: ReadPool
) -> list[HTTPRouteHandler]:
    """The routes, for people only (like every read); audit tables run in `pool`."""
    lanes = {admin: _AuditLane(admin) for admin in (True, False)}
    """`audit verify` and `audit check` walk the whole log: one of each at a time for admins and
    one for everyone else (so no plain user keeps an admin from verifying), on a thread at nice
    10 (the worker and the submits go first); another caller meanwhile gets 429."""

    def lane(caller: ident.Identity) -> _AuditLane:
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

    @get("/v1/audit/verify", tags=["reads"], security=[{"bearer": []}])
    async def audit_verify(request: Request[Any, Any, Any]) -> ChainReport:
        """The hash chain recomputed over the store: the first broken link and what broke it,
        each row checked against its snapshots and the projection's link. Read from the store
        through its own connection, beside the worker (no write waits)."""
        from ledger.history import tamper

        caller = person(request)
        service = worker.service
        mine = lane(caller)

        def anchor() -> tuple[tamper.Anchor | None, duckdb.DuckDBPyConnection]:
            assert service.store is not None and service.projector is not None
            service.projector.catch_up()
            return tamper.projection_anchor(service.store), service.store.con.cursor()

        async with mine.hold("verify", caller.actor), admitted(caller):
            # caught up beside the worker first: the worker's part is the last few events
            await copied.caught_up(worker, pool, int(service.ledger.position))
            held, rows = await worker.call(anchor)
            try:  # the projection's rows through a cursor of their own (a snapshot of them)
                report = await mine.run(
                    lambda: tamper.verify_store(
                        service.home, held, rows, progress=mine.counting("verify", service.home)
                    )
                )
            finally:
                rows.close()
        if mine.admin:
            return report
        # the head's link hashes the head event whole: shown to someone who may not see that
        # event, it confirms a guess of its private fields offline (T1); anchors are admins'
        return msgspec.structs.replace(report, head_hash="")

    @get("/v1/audit/check", tags=["reads"], security=[{"bearer": []}])
    async def audit_check(request: Request[Any, Any, Any]) -> v.CheckView:
        """The ledger's invariants over the whole log, usage charged to unfunded jobs, and GPUs
        held twice by processes alive on the server's host. The history is scanned beside the
        worker, the projection caught up beside it and read in the read pool with the view of
        the live state: the worker runs none of it."""
        from ledger.engines.supervised import live_processes
        from ledger.history import tables

        caller = person(request)
        mine = lane(caller)
        service = worker.service
        async with mine.hold("check", caller.actor), admitted(caller):
            report = await mine.run(
                lambda: tables.scan_history(
                    service.home, progress=mine.counting("check", service.home)
                )
            )
            await copied.caught_up(worker, pool, int(service.ledger.position))  # beside it
            now = await copied.view(worker, pool)

            def rest(con: duckdb.DuckDBPyConnection, _limits: Any) -> v.CheckView:
                # the projection's charges through the pool's cursor, the live processes
                # against the view: the worker runs none of it (it caught the projection up
                # and queried it there, ~0.45 s a check on a busy ledger: atk44w F6)
                live = tables.live_violations(service.home, lambda: now.ledger, live_processes)
                return tables.check_view(report, cast("Any", copied.CursorStore(con)), live)

            return await pool.compute(rest)

    @contextlib.asynccontextmanager
    async def admitted(caller: ident.Identity) -> AsyncIterator[None]:
        """A whole-log audit admitted as one of the caller's reads (2 at once, 429 past it)."""
        with pool.admitted(caller.actor, read=True):
            yield

    @get("/v1/audit/progress", tags=["reads"], security=[{"bearer": []}])
    async def audit_progress(request: Request[Any, Any, Any]) -> api.AuditProgress:
        """How far the `audit verify` and `audit check` under way in the caller's lane are
        (events read of the store's head; null: none runs): what the CLI shows while it waits
        for one through the server."""
        mine = lane(person(request))
        return api.AuditProgress(verify=mine.steps.get("verify"), check=mine.steps.get("check"))

    return [budget_plan, audit_table, audit_verify, audit_check, audit_progress]


class _AuditLane:
    """One whole-log audit of each kind at a time, the people waiting served in turn (one of a
    person's under way or waiting, 16 waiting: past either 429), on one thread at nice 10 (see
    `routes`); after
    a person's audit of a kind that took t (`FREE_S` or more), none of theirs of that kind
    starts before `REST` x t later: one person looping them keeps each walk busy a quarter of
    the time at most (their
    threads share the interpreter with the worker and the event loop: looped, they slowed
    another's submits 2-2.5x, atk44-25 F5)."""

    NICE = 10
    REST = 3.0
    FREE_S = 0.5
    """An audit shorter than this (a small ledger's) leaves no rest."""

    def __init__(self, admin: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.admin = admin
        self.clock = clock
        self.slots = {kind: FairSlot(f"an audit {kind}") for kind in ("verify", "check")}
        """One of each kind at a time, the people waiting served in turn (`FairSlot`): with a
        429 to whoever came while one ran, four plain users rotating them kept a fifth
        person's verify refused for good (atk44w F2)."""
        self.steps: dict[str, api.AuditStep] = {}
        """How far each audit under way is (`/v1/audit/progress`)."""
        self.rested: dict[str, float] = {}
        """When each person's rest after their last audit of a kind ends ("kind\0person")."""
        self._threads: ThreadPoolExecutor | None = None

    @contextlib.asynccontextmanager
    async def hold(self, kind: str, person: str = "") -> AsyncIterator[None]:
        now, whose = self.clock(), f"{kind}\0{person}"
        self.rested = {p: t for p, t in self.rested.items() if t > now}
        if whose in self.rested:
            wait = math.ceil(self.rested[whose] - now)
            raise TooBusy(f"{person!r} ran an audit {kind} a moment ago: the next starts "
                          f"{self.REST:g} times its time later", hint=f"retry in {wait} s",
                          retry_after=wait)  # fmt: skip
        async with self.slots[kind].hold(person):
            began = self.clock()
            try:
                yield
            finally:
                self.steps.pop(kind, None)
                ended = self.clock()
                if person and ended - began >= self.FREE_S:  # (unnamed: no rest)
                    self.rested[whose] = max(
                        self.rested.get(whose, 0.0), ended + self.REST * (ended - began)
                    )

    def counting(self, kind: str, home: Any) -> Callable[[int], None]:
        """On the audit's thread: a progress callback keeping `steps[kind]` (the store's head
        its total, read once as it starts)."""
        from ledger.history.tamper import store_head

        total = store_head(home)
        self.steps[kind] = api.AuditStep(done=0, total=total)

        def update(done: int) -> None:
            # a whole Struct replaced at once: a reader on the loop sees one or the other
            self.steps[kind] = api.AuditStep(done=done, total=max(total, done))

        return update

    async def run(self, fn: Callable[[], T]) -> T:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(2, "audit", initializer=self._lower_priority)
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn)

    def _lower_priority(self) -> None:
        with contextlib.suppress(OSError):  # Linux: a thread's nice value is its own
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.NICE)


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
