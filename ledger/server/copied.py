"""Reads of the live state beside the worker thread, on a copy of it (docs/security.md, row T5).

The queue, priority and explain previews (now, or with `policy=` or `at=`), the squatters, the
nodes, the accounts, the dashboard's teams, queue, nodes, budget, job, decisions and
preemptions pages and `/metrics` need the live state, which only the worker thread may touch.
They read a view of it the worker publishes (`Worker.view`, `take`: `State.copy`, its dicts and
sets copied, their values immutable, about 1 ms at 10k live jobs, with what the engine was last
seen holding) whenever the state moved (a group commit, a call that writes, a cycle, a
standby's follow), before those moves are answered, and, after a group commit, only while
someone reads (a read in the last `worker.WANTED_S`) or once the worker rests, or before it
runs a cycle, a call or idle work (`Worker._publish_after_writes`: a copy per group commit was
a fifth of the worker's time under a stream of submits nobody read): a read asked after a
write was acknowledged sees it (`Worker.current_view`: a view behind the writes answered is
waited for, one group commit at most), and asks the worker nothing, so it never waits behind
a dispatcher cycle (the first read after a quiet spell neither), and no cycle waits behind
it. Only a read before the worker's first turn asks the worker thread to publish one (and a
standby's read while its view is behind its follow). The read itself, the dispatcher's
preview decision included, runs in the read pool (a lane of its own,
`ledger.server.fairlane`: one thread at the service's priority serving the people reading in
turn, each resting after their own reads, so another person's small reads of the projection
never wait behind these, and one person's looped previews delay another's dashboard by one
read at most), admitted as one of the caller's reads (`ReadPool.admitted`), at the moment it
was asked. Nothing the dispatcher decides reads a view.

A read sees every write made before it was asked: the view holds it, and the projection holds
at least the view's position. The reads catch it up for everyone (`caught_up`: a read that
finds it behind starts a catch-up at once, or joins the one under way, shared by all the reads
waiting; it waits for no cycle), never on the worker thread: on the read pool's projector
thread, with a projector of its own on a connection of its own (`Projector.beside`, sharing
the service projector's lock, so a cycle reads its ranks at exactly its position), and after a
catch-up that took t not before `REST` times t has passed (its Python holds the interpreter
lock a quarter of the time at most), `CHUNK` events at a time (a cycle waits for one chunk at
most). Their time is counted apart (`ReadPool.catch_up_s`). What these reads show of the live
state (the queue, the jobs' states, the nodes) is the view's, exact; an answer is kept
(`ReadCache`) only when the projection held the view's position (`CopiedHandles.current`).

The shared preview "now" (`live_preview`) is still computed once per log position and kept
for `ReadCache.fresh_s` (ahead, once the log is still, on the read pool's thread for it:
`ahead`).

An edge: the worker thread, the projector thread, a database cursor.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ledger.server import pooled
from ledger.server.cache import Basis

if TYPE_CHECKING:
    import duckdb

    from ledger.core.state import State
    from ledger.server.cache import ReadCache
    from ledger.server.readpool import ReadPool
    from ledger.server.worker import Worker

T = TypeVar("T")

PREVIEW = "live-preview"
"""The shared preview's name in the `ReadCache`."""
REST = 3.0
"""After a catch-up for reads that took t, the next begins `REST` times t later at the earliest
(see above); a read that finds the projection behind otherwise starts one at once."""
CHUNK = 500
"""The most events one catch-up for reads folds (`fold`): a cycle that wants the projector's
lock meanwhile waits for one chunk at most."""
REST_MAX_S = 2.0
"""The longest rest (a catch-up that waited on a slow store is not held against the reads)."""


@dataclass(frozen=True)
class Frozen:
    """A copy of the live state at a log position: what the read layer asks of a ledger
    (`LiveState`: `state`, `catch_up`)."""

    state: State
    position: int

    def catch_up(self) -> int:
        return self.position


@dataclass(frozen=True)
class CursorStore:
    """A read pool's cursor as the read layer's projection `Store` (`con`, `position`)."""

    con: duckdb.DuckDBPyConnection

    def position(self) -> int:
        return pooled.tracked(self.con)


@dataclass(frozen=True)
class Copy:
    """The view the worker thread publishes (`take`) as a read gets it: the live state copied,
    the moment (the read's), the GPUs foreign work holds (as the service last observed its
    engine), and `extra` (what a read asks of the service beside the state, on the event
    loop)."""

    ledger: Frozen
    moment: float
    foreign: Mapping[str, frozenset[int]]
    extra: Any = None
    stopping: Mapping[str, frozenset[int]] = field(default_factory=dict)
    """GPUs of stopped runs still in their grace (`Observed.stopping`)."""
    projected: int = 0
    """The service's own projection's position when published (its last cycle's), and the
    first event past it as (position, `at`) (None: none): how long the projection lags."""
    unprojected: tuple[int, float] | None = None
    rewound: int = 0
    """`Ledger.rewound` when published: a state read back from the log at the same position
    (the log held other events there: atk51-ha F2) is a new view too."""
    longest_s: float | None = None
    """The longest time limit the engine starts, as the service last observed it
    (`Observed.longest_s`, Slurm's partition MaxTime; None: no limit): a job asking for more
    is never placed, and the queue and explain say so (`preview.too_long_waits`)."""


@dataclass
class CopiedHandles:
    """The `Handles` a read runs with in the read pool: a `Copy` and the pool's cursor."""

    copy: Copy
    cursor: duckdb.DuckDBPyConnection
    cache: ReadCache | None = None
    """The server's cache, where the shared preview is kept (None: computed for this read)."""
    viewer: str = ""
    _preview: list[Any] = field(default_factory=list)

    @property
    def ledger(self) -> Frozen:
        return self.copy.ledger

    def store(self) -> Any:
        """The projection through the pool's cursor (what the read layer uses of a `Store`)."""
        return CursorStore(self.cursor)

    def now(self) -> float:
        return self.copy.moment

    def foreign(self) -> Mapping[str, frozenset[int]]:
        return self.copy.foreign

    def stopping(self) -> Mapping[str, frozenset[int]]:
        return self.copy.stopping

    def longest_s(self) -> float | None:
        return self.copy.longest_s

    def heard_from(self) -> Mapping[str, float]:
        """As the service's engine knew it when the read began (`ServiceHandles.copied` asks
        it on the event loop: it moves with every beat, no append publishes it)."""
        extra = self.copy.extra
        got = extra.get("heard_from") if isinstance(extra, dict) else None
        return got if isinstance(got, dict) else {}

    def current(self) -> bool:
        """Whether the projection (as this read sees it) holds the copy's position: an answer
        read from it may be kept for that position."""
        return pooled.tracked(self.cursor) >= self.ledger.position

    def live_preview(self, *, ahead: bool = False) -> Any:
        """The shared preview at the copy's position (`ServiceHandles.live_preview`)."""
        from ledger.dispatch import registry
        from ledger.reads import preview as previews
        from ledger.server.pages import KeptStarts, LivePreview

        def compute() -> LivePreview:
            state = self.ledger.state
            policy = registry.build(state.policy)
            # made from the last preview's views and order (any position; under one policy)
            last = None if self.cache is None else self.cache.last(PREVIEW)
            was = None if last is None else last.carried
            carried = was[1] if was is not None and was[0] == state.policy else None
            longest = self.longest_s()
            snapshot, decision, carried = previews.live_carried(
                self.ledger, self.store(), policy, self.now(), self.foreign(), carried,
                longest_s=longest,
            )  # fmt: skip
            held = previews.held_back(state, snapshot, policy, longest)
            return LivePreview(policy.version, (snapshot, decision), self.now(), held,
                               KeptStarts(), (state.policy, carried))  # fmt: skip

        if not self._preview:
            got = (
                compute()
                if self.cache is None or not self.current()  # kept only once it is the log's
                else self.cache.shared(PREVIEW, self.ledger.position, self.now(), compute)
            )
            self._preview.append(got)
        return self._preview[0]

    def basis(self) -> Basis | None:
        """The shared preview this read used (None: none): what its answer, once kept, is kept
        as long as (`ReadCache.put`)."""
        return Basis(PREVIEW, self._preview[0].now) if self._preview else None


@dataclass(frozen=True)
class At:
    """The log position a read of the projection alone was asked at (`ProjectedHandles.ledger`)."""

    position: int


@dataclass
class ProjectedHandles:
    """The `Handles` of a read of the projection alone (`projected_read`): no copy of the live
    state, the moment it was asked and the pool's cursor."""

    ledger: At
    moment: float
    cursor: duckdb.DuckDBPyConnection

    def store(self) -> Any:
        return CursorStore(self.cursor)

    def now(self) -> float:
        return self.moment

    def current(self) -> bool:
        return pooled.tracked(self.cursor) >= self.ledger.position


async def projected_read(
    worker: Worker,
    pool: ReadPool,
    caller: str,
    what: str,
    fn: Callable[[ProjectedHandles], T],
    *,
    moment: float,
) -> T:
    """`fn(handles)` in the read pool on the projection alone, as it stands once it holds the
    log's position now (`caught_up`, beside the worker): the worker thread is asked nothing, so
    such a read never waits behind a dispatcher cycle or a write (the teams page: shares and
    owed against delivered are the projection's). Admitted as one of `caller`'s reads."""
    with pool.admitted(caller, read=True):
        target = int(worker.service.ledger.position)
        await caught_up(worker, pool, target)

        def run(cursor: duckdb.DuckDBPyConnection, _limits: Any) -> T:
            cursor.execute("BEGIN TRANSACTION")  # one snapshot of the projection for the read
            try:
                return fn(ProjectedHandles(At(target), moment, cursor))
            finally:
                with contextlib.suppress(Exception):
                    cursor.execute("ROLLBACK")

        return await pool.compute(pooled.stopped(what, run), read=True, live=True, person=caller)


async def view(worker: Worker, pool: ReadPool) -> Copy:
    """The published view of the live state at the moment now (the worker thread is asked to
    publish one only when none is yet: a read before its first turn)."""
    got: Copy | None = await worker.current_view()
    if got is None or (not worker.leading() and got.ledger.position < _position(worker)):
        # none yet; or a standby whose follow folded more than its view shows (no write of
        # this server's waits on it, but a read asked at a position it has now folded does)
        got = await pool.worker_call(worker.publish_view)
    assert got is not None
    return dataclasses.replace(got, moment=float(worker.service.clock.now()))


def ahead(
    worker: Worker, pool: ReadPool, cache: ReadCache, fn: Callable[[CopiedHandles], Any]
) -> bool:
    """On the worker thread, when idle: hand `fn(handles)` (what the next reads will ask first,
    kept in `cache`) to the read pool's thread of work done ahead (`ReadPool.beside`), on the
    published view, and return at once: the worker computes nothing. Not when no view is
    published or the projection is behind it (the read that needs it computes it once caught
    up); True when handed on."""
    got = worker.view
    if got is None or projected(worker, pool) < got.ledger.position:
        return False
    copy = dataclasses.replace(got, moment=float(worker.service.clock.now()))

    def run(cursor: duckdb.DuckDBPyConnection, _limits: Any) -> None:
        cursor.execute("BEGIN TRANSACTION")
        try:
            fn(CopiedHandles(copy, cursor, cache))
        finally:
            with contextlib.suppress(Exception):
                cursor.execute("ROLLBACK")

    return pool.beside(run)


async def caught_up(worker: Worker, pool: ReadPool, target: int) -> None:
    """Return once the projection holds `target` (the log's position when the read was asked):
    at once when it does already (the last catch-up for reads, or the last cycle's, reached it),
    else after a catch-up begun after it was asked, which starts at once unless one is under way
    (then it is joined) or the last one's rest is not over (`REST` times its time), shared by
    every read waiting (or once one has ended that brought the projection no further: as far as
    the store lets it go). No read waits for a cycle. The catch-up runs on the read pool's
    projector thread (`ReadPool.projecting`), never the worker's. A read waits `WAIT_MAX_S` at
    most, and no longer once the store is known to be away: it then answers from the
    projection as it stands, saying its position."""
    if pooled.store_away(worker):  # the projection as it stands, not a wait on the store
        return
    asked = pool.catch_ups
    until = time.monotonic() + WAIT_MAX_S
    while projected(worker, pool) < target and not (pool.caught_up_by > asked and pool.stalled):
        if pool.catching is None:
            wait = pool.caught_up_at + pool.catch_up_rest - time.monotonic()
            if wait > 0:
                await asyncio.sleep(min(wait, POLL_S))  # a cycle may get there first
                continue
            pool.catching = asyncio.ensure_future(_catch_up(worker, pool))
        catching = pool.catching
        try:
            await asyncio.wait_for(asyncio.shield(catching), WAIT_STEP_S)
        except TimeoutError:
            if pooled.store_away(worker) or time.monotonic() > until:
                return
        finally:
            if pool.catching is catching and catching.done():
                pool.catching = None


POLL_S = 0.02
"""How often a read waiting out a catch-up's rest looks whether a cycle got the projection
there meanwhile."""
WAIT_STEP_S = 1.0
"""How often a read waiting for a catch-up asks whether the store is known to be away."""
WAIT_MAX_S = 8.0
"""The longest a read waits for the projection (a store that hangs): `worker.READ_WAIT_S`."""


def projected(worker: Worker, pool: ReadPool) -> int:
    """The projection's position as last seen by a catch-up for reads or a cycle (no query)."""
    return max(pool.projected, int(getattr(worker.service.stats, "projection_position", 0)))


async def _catch_up(worker: Worker, pool: ReadPool) -> None:
    pool.caught_up_at = time.monotonic()
    pool.catch_ups += 1
    seq = pool.catch_ups
    began = [0.0]

    def run() -> int:
        began[0] = time.perf_counter()
        return fold(worker, pool.projector)

    before = pool.projected
    try:
        at = await (pool.projecting(run) if pool.projector is not None else worker.call(run))
        pool.projected = max(pool.projected, at)
        pool.stalled = pool.projected <= before and at < int(worker.service.ledger.position)
    finally:
        took = time.perf_counter() - began[0] if began[0] else 0.0
        pool.caught_up_at = time.monotonic()
        pool.catch_up_rest = min(REST * took, REST_MAX_S)
        pool.caught_up_by = max(pool.caught_up_by, seq)
        pool.catch_up_s += took


def fold(worker: Worker, projector: Any = None) -> int:
    """At most `CHUNK` more events of the log into the projection, with `projector` (the read
    pool's, on its own thread; None: the service's, on the worker thread); the position it then
    holds. A PostgreSQL store that does not answer leaves it where it is."""
    from projections.errors import SourceUnavailable

    service = worker.service
    projector = projector or service.projector
    assert projector is not None
    at, head = int(projector.store.position()), int(service.ledger.position)
    if at < head:
        try:
            projector.catch_up(until=min(head, at + CHUNK))
        except SourceUnavailable:
            if service.ledger.dsn is None:
                raise
    return int(projector.store.position())


def take(worker: Worker, before: Copy | None = None) -> Copy:
    """On the worker thread (the lock held): the view to publish, a copy of the live state, the
    moment, the foreign GPUs and how far the service's projection got. The first event past the
    projection is read from the store once per projection position: `before` (the view this
    one replaces) keeps it while neither the projection nor the log's history moved (a store
    read per group commit was a fifth of the worker's time under a stream of submits on
    PostgreSQL, 2026-12-07)."""
    service = worker.service
    dispatcher = getattr(service, "dispatcher", None)
    ledger = service.ledger
    position = int(ledger.position)
    projected = _projected(service)
    rewound = int(getattr(ledger, "rewound", 0))
    unprojected = None
    if projected >= position:
        pass
    elif _kept_unprojected(before, projected, rewound):
        unprojected = before.unprojected  # type: ignore[union-attr]
    elif not pooled.store_away(worker):
        with contextlib.suppress(Exception):  # the store went away: the lag is not known
            first = ledger.read(projected, 1)
            unprojected = (first[0][0], float(first[0][1].at)) if first else None
    return Copy(
        ledger=Frozen(ledger.state.copy(), position),
        moment=float(service.clock.now()),
        foreign=dict(getattr(dispatcher, "foreign", {})),
        stopping=dict(getattr(dispatcher, "stopping", {})),
        projected=projected,
        unprojected=unprojected,
        rewound=rewound,
        longest_s=getattr(dispatcher, "longest_s", None),
    )


def _kept_unprojected(before: Copy | None, projected: int, rewound: int) -> bool:
    """Whether `before`'s first event past the projection is still it: the same projection
    position and history, and an event was found (events past a position never change)."""
    return (
        before is not None
        and before.unprojected is not None
        and before.projected == projected
        and before.rewound == rewound
    )


def same(view: Copy, worker: Worker) -> bool:
    """Whether `view` still shows the live state (nothing `take` copies has moved): a few
    comparisons, no copy."""
    return view.ledger.position == _position(worker) and only_appended(view, worker)


def only_appended(view: Copy, worker: Worker) -> bool:
    """Whether nothing `take` copies has moved since `view` but the log's position (and the
    state with it: a group commit's appends), if that."""
    service = worker.service
    dispatcher = getattr(service, "dispatcher", None)
    return (
        view.projected == _projected(service)
        and view.foreign == getattr(dispatcher, "foreign", {})
        and view.stopping == getattr(dispatcher, "stopping", {})
        and view.rewound == int(getattr(service.ledger, "rewound", 0))
        and view.longest_s == getattr(dispatcher, "longest_s", None)
    )


def _position(worker: Worker) -> int:
    return int(worker.service.ledger.position)


def _projected(service: Any) -> int:
    return int(getattr(getattr(service, "stats", None), "projection_position", 0))


async def read(
    worker: Worker,
    pool: ReadPool,
    caller: str,
    what: str,
    fn: Callable[[CopiedHandles], T],
    *,
    cache: ReadCache | None = None,
    extra: Callable[[Copy], Any] | None = None,
) -> T:
    """`fn(handles)` in the read pool on the view of the live state the worker published
    (`view`), admitted as one of `caller`'s reads (429 past their share, before anything else);
    `what` names the read in the line of a read stopped at the time limit; `extra(view)`: what
    the read asks of the service beside the state, on the event loop."""
    with pool.admitted(caller, read=True):
        copy = await view(worker, pool)
        await caught_up(worker, pool, copy.ledger.position)
        if extra is not None:
            copy = dataclasses.replace(copy, extra=extra(copy))

        def run(cursor: duckdb.DuckDBPyConnection, _limits: Any) -> T:
            cursor.execute("BEGIN TRANSACTION")  # one snapshot of the projection for the read
            try:
                return fn(CopiedHandles(copy, cursor, cache, caller))
            finally:
                with contextlib.suppress(Exception):  # an interrupted read's is gone already
                    cursor.execute("ROLLBACK")

        return await pool.compute(pooled.stopped(what, run), read=True, live=True, person=caller)


async def on_view(
    worker: Worker, pool: ReadPool, person: str, what: str, fn: Callable[[Copy], T]
) -> T:
    """`fn(view)` in the read pool's lane for the live state, in `person`'s turn, on the view of
    the live state the worker published (`view`): the worker thread runs none of it, so the
    dispatcher cycle and the group commit never wait for it (a budget plan and its dry run, a
    batch's dry run: docs/security.md, row T5). No admission here (the caller's) and no
    catch-up of the projection (`fn` reads the state alone)."""
    copy = await view(worker, pool)
    return await pool.compute(
        pooled.stopped(what, lambda _cursor, _limits: fn(copy)), read=True, live=True, person=person
    )
