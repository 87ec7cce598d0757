"""The API's reads of the projection (`/v1/jobs`, `/v1/log`, `/v1/shares`, `/v1/usage`,
`/v1/report/delivered`, `/v1/audit/preemptions|budget-changes`: the `READS` entries marked
`pooled`) in the read pool, never on the worker thread (docs/security.md, rows T5 and T6).

One mechanism for every heavy read: the audit tables' pool (`ledger.server.readpool`), so the
same cursor of its own, lower-priority threads, time limit with interruption and per-caller
admission bound them. The worker only copies who may see what (a few microseconds); the
projection is caught up for the reads beside it (`copied.caught_up`), and the read itself, its
JSON included, is built beside it. A page is at most
`PAGE_MAX` rows (`limit`, `tail`): a client wanting more pages with `after`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from ledger.reads import layer as reads
from ledger.server import connections
from schemas import views as v
from schemas.bounds import MAX_READ_ROWS
from schemas.errors import InvalidCommand

if TYPE_CHECKING:
    import duckdb

    from ledger.history.tables import Limits
    from ledger.reads.table import ReadSpec
    from ledger.server.readpool import ReadPool
    from ledger.server.worker import Worker

T = TypeVar("T")

PAGE_MAX = MAX_READ_ROWS
"""The most rows one read of `jobs` or `log` answers through the server."""


@dataclass(frozen=True)
class _CursorStore:
    """What the read layer uses of a projection `Store`: its connection (here a cursor)."""

    con: duckdb.DuckDBPyConnection


@dataclass(frozen=True)
class _Live:
    state: Any


@dataclass(frozen=True)
class PooledHandles:
    """The `Handles` a pooled read runs with: the pool's cursor, a copy of what the viewer may
    see (taken on the worker), the service's clock."""

    cursor: duckdb.DuckDBPyConnection
    viewer: str
    seen: Any
    clock: Callable[[], float]

    @property
    def ledger(self) -> Any:
        return _Live(self.seen)

    def store(self) -> Any:
        return _CursorStore(self.cursor)

    def now(self) -> float:
        return self.clock()

    def foreign(self) -> Mapping[str, frozenset[int]]:
        """None known here: no pooled read shows nodes (`node list` is answered on the worker)."""
        return {}

    def stopping(self) -> Mapping[str, frozenset[int]]:
        return {}

    def heard_from(self) -> Mapping[str, float]:
        return {}

    def longest_s(self) -> float | None:
        return None


def check_page(name: str, args: Any) -> None:
    """One line for a page larger than `PAGE_MAX`."""
    for name_ in ("limit", "tail"):
        asked = getattr(args, name_, None)
        if name in ("jobs", "log") and asked is not None and asked > PAGE_MAX:
            raise InvalidCommand(
                f"{name} answers at most {PAGE_MAX:,} rows a page through the server, "
                f"asked for {name_}={asked:,}",
                hint="page: ask again with after=<the last position> (the CLI pages by itself)"
                if name == "log"
                else "page: ask again with before_id=<the last job> (the CLI pages by itself), "
                "or narrow the filter (user, account, status, since)",
            )


def seen_by(worker: Worker, viewer: str) -> Any:
    """On the worker: a copy of who `viewer` may see now (a few microseconds)."""
    return reads.Viewer(viewer, worker.service.ledger.state).detached().state


WORKER_WAIT_S = 1.0
"""How long a read waits for the worker thread to copy who may see what before it copies it
itself (a PostgreSQL store that went away leaves the worker waiting on the store)."""


def store_away(worker: Worker) -> bool:
    """Whether the service knows its store does not answer (a PostgreSQL store that is down:
    the standby's follow failed, or the lease could not be read)."""
    ha = getattr(worker, "ha", None)
    return worker.follow_error is not None or (ha is not None and ha.unreachable is not None)


def tracked(cursor: duckdb.DuckDBPyConnection) -> int:
    """The log position the projection holds, as a read pool's cursor sees it."""
    from projections.store import PROJECTION

    row = cursor.execute(
        "SELECT position FROM tracking WHERE projection = ?", [PROJECTION]
    ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


async def answer(
    worker: Worker,
    pool: ReadPool,
    name: str,
    spec: ReadSpec,
    args: Any,
    viewer: str,
    busy: Callable[[], bool] | Writes = lambda: False,
) -> tuple[bytes, int, int | None]:
    """The encoded answer of a pooled read for `viewer`, computed in `pool`, the log position
    it answers at (read in the same transaction as the answer), and, when a page was cut at
    `MAX_PAGE_BYTES` before its `limit`, how many rows it holds (else None).

    The worker thread only copies who may see what (`seen_by`; within `WORKER_WAIT_S`, else it
    is copied here). The projection is caught up to the log's position when the read was asked
    off the worker (`copied.caught_up`: one catch-up shared by every read waiting, begun at
    once unless the last one's rest is not over, on the read pool's projector thread): a client
    reads its own writes. A store known to be away (or a catch-up that does not end within
    `copied.WAIT_MAX_S`) is not waited for: the read answers from the projection as it stands
    and says its position.

    `jobs` and `log` are built `paged`: in parts of `PART` rows, each part giving way to the
    writes under way (`busy`)."""
    check_page(name, args)
    with pool.admitted(viewer, read=True):  # before the worker is asked anything (T5)
        return await _answer(worker, pool, name, spec, args, viewer, busy)


async def _answer(
    worker: Worker,
    pool: ReadPool,
    name: str,
    spec: ReadSpec,
    args: Any,
    viewer: str,
    busy: Callable[[], bool] | Writes,
) -> tuple[bytes, int, int | None]:
    import asyncio

    from ledger.server import copied

    service = worker.service
    target = int(service.ledger.position)
    view = await worker.current_view()  # who may see what as of the view the worker published
    if view is not None:
        seen = reads.Viewer(viewer, view.ledger.state).detached().state
    else:
        on_worker = asyncio.ensure_future(pool.worker_call(lambda: seen_by(worker, viewer)))
        on_worker.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            seen = await asyncio.wait_for(asyncio.shield(on_worker), WORKER_WAIT_S)
        except TimeoutError:
            seen = reads.Viewer(viewer, service.ledger.state).detached().state
    await copied.caught_up(worker, pool, target)
    clock = service.clock.now

    def run(cursor: duckdb.DuckDBPyConnection, _limits: Limits) -> tuple[int, bytes, int | None]:
        cursor.execute("BEGIN TRANSACTION")  # the position and the answer: one snapshot
        try:
            at = tracked(cursor)
            now = clock()  # one moment for the whole page
            handles = PooledHandles(cursor, viewer, seen, lambda: now)
            if name in PAGED:
                rows, cut = paged(name, spec, handles, args, busy)
                return at, b"[" + b",".join(rows) + b"]", len(rows) if cut else None
            return at, _encode(spec.run(handles, args)), None
        finally:
            with contextlib.suppress(Exception):
                cursor.execute("ROLLBACK")

    big = is_big(name, args)
    what = f"the {name} read"
    at, data, cut = await pool.compute(stopped(what, run), read=True, big=big, person=viewer)
    return data, at, cut


def is_big(name: str, args: Any) -> bool:
    """Whether a read is a page of more than a part (`PART` rows) of `jobs` or `log`: it runs in
    the read pool's lane for big reads, so small reads never wait behind it (T5)."""
    if name not in PAGED:
        return False
    size = getattr(args, "tail", None) if name == "log" else None
    size = size if size is not None else getattr(args, "limit", None)
    return size is None or size > PART


PAGED = frozenset({"jobs", "log"})
PART = 500
"""Rows built at a time (a few milliseconds of the interpreter's time)."""
TRUNCATED_HEADER = "x-gpuledger-truncated"
"""The header of a page cut at `MAX_PAGE_BYTES`: the rows it holds."""
FIRST_PART = 50
"""Rows of a page's first part: the next parts are sized by the rows' bytes so far, so a part
of large rows never holds much more than the page may (`MAX_PAGE_BYTES`)."""
MAX_PAGE_BYTES = 32 << 20
"""The most a `jobs` or `log` page holds, its rows encoded: the page ends before the row that
would pass it (one row at least), and the answer says so (`X-Gpuledger-Truncated`: its rows;
ask the next page after the last). 52 jobs of 4 MB commands made each page 214 MB and the
server grew from 0.9 to 3.3 GB (atk44-25 F10)."""
GIVE_WAY_S = 0.05
"""The longest a part waits for the writes under way to end (then it goes on regardless: under
a constant stream of writes, a page still ends)."""


def paged(
    name: str,
    spec: ReadSpec,
    handles: PooledHandles,
    args: Any,
    busy: Callable[[], bool] | Writes,
) -> tuple[list[bytes], bool]:
    """The encoded rows of a `jobs` or `log` page, and whether it was cut at `MAX_PAGE_BYTES`
    before its limit; built `PART` rows at a time (`FIRST_PART`, then as many as the rows'
    bytes so far say fit, at most `PART`); before each part
    after the first, while `busy()` (a write is under way) and for at most `GIVE_WAY_S`, the
    thread sleeps: it gives the interpreter to the event loop and the worker thread. A read
    holds the interpreter lock in turn with them (every 0.5 ms: `readpool.SWITCH_S`), so a
    write that arrives while a part is built shares the interpreter with at most that part;
    parts are read one after the other exactly as the whole page would be."""
    from ledger.reads import layer as reads

    encode = msgspec.json.Encoder().encode
    out: list[bytes] = []
    if name == "jobs" and args.at is not None:  # the jobs as they were: rebuilt, not paged
        return bounded_rows([encode(x) for x in spec.run(handles, args)])
    left = args.tail if name == "log" and args.tail is not None else args.limit
    after = args.after if name == "log" else 0
    if name == "log" and args.tail is not None:  # the last `tail`: from where they begin
        row = handles.cursor.execute(
            "SELECT position FROM events WHERE position > ? ORDER BY position DESC "
            "LIMIT 1 OFFSET ?",
            [args.after, args.tail - 1],
        ).fetchone()
        after = args.after if row is None else int(row[0]) - 1
    below: int | None = args.before_id if name == "jobs" else None  # the page after it
    viewer = reads.Viewer(handles.viewer, handles.seen)
    size = 0
    while left > 0:
        if out:
            give_way(busy)
        room = (MAX_PAGE_BYTES - size) * len(out) // size if size else FIRST_PART
        n = min(PART, left, max(1, room))
        part: list[Any]
        if name == "log":
            part = reads.log(handles.store(), v.LogFilter(after=after, limit=n), viewer)
            after = part[-1].position if part else after
        else:
            f = msgspec.structs.replace(args, limit=n)
            part = reads.jobs(handles.store(), f, handles.now(), viewer, below=below)
            below = part[-1].job_id if part else below
        out += [encode(x) for x in part]
        size += sum(len(row) for row in out[-len(part) :]) if part else 0
        left -= len(part)
        if len(part) < n:
            break
        if size >= MAX_PAGE_BYTES:
            rows, cut = bounded_rows(out)
            return rows, cut or left > 0
    return bounded_rows(out)


def bounded_rows(rows: list[bytes]) -> tuple[list[bytes], bool]:
    """`rows` up to the one that would pass `MAX_PAGE_BYTES` (one at least), and whether any
    was left out."""
    size = 0
    for i, row in enumerate(rows):
        size += len(row) + 1
        if size > MAX_PAGE_BYTES and i > 0:
            return rows[:i], True
    return rows, False


def give_way(busy: Callable[[], bool] | Writes) -> None:
    """Wait while a write is under way, for at most `GIVE_WAY_S` (see `paged`): on the `Writes`
    counter's event (the thread sleeps in the kernel, asking nothing of the interpreter until
    the last write ends or the time is up), else by asking `busy()` now and then."""
    import time

    if isinstance(busy, Writes):
        busy.idle.wait(GIVE_WAY_S)
        return
    deadline = time.monotonic() + GIVE_WAY_S
    while busy() and time.monotonic() < deadline:
        time.sleep(0.005)


@dataclass
class Writes:
    """ASGI: `app` (the command path, `ledger.server.commands.CommandPath`), with the writes
    under way counted (`counting`) for the reads to give way to (`paged`). A write counts from
    the moment its body has arrived and its caller is known until it is answered, never
    before: a client sending a body slowly, or none, or a caller who is no one, made every
    page give way to a write that was not there (issue 25). Only the routes that change the
    ledger are writes (`WRITES`: the commands, batches, the agents' reports), not the reads
    asked with a body (`/v1/audit/table`, `/v1/budget/plan`, the what-if)."""

    app: Any = None
    under_way: int = 0
    idle: threading.Event = field(default_factory=threading.Event)
    """Set while no write is under way."""

    def __post_init__(self) -> None:
        self.idle.set()

    def busy(self) -> bool:
        return self.under_way > 0

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """A write under way for the block."""
        self.under_way += 1
        self.idle.clear()
        try:
            yield
        finally:
            self.under_way -= 1
            if not self.under_way:
                self.idle.set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # every read's 429 is held, the reads asked with a body too (a refused POST
        # /v1/audit/table looped made ~2,000 answers a second: atk36-25 F4)
        if scope["type"] == "http" and not is_write(scope.get("path", "")):
            await self.app(scope, receive, _held(send))
            return
        await self.app(scope, receive, send)


WRITES = ("/v1/commands/", "/v1/batch", "/v1/agent/")
"""The routes that change the ledger (their requests are the writes the reads give way to)."""


def is_write(path: str) -> bool:
    return path.startswith(WRITES)


REFUSED_HOLD_S = connections.REFUSED_HOLD_S
"""How long a read refused 429 (a GET, or a read asked with a body: not one of `WRITES`)
waits before its answer is sent: a client that loops its refusals without heeding Retry-After
(one person's third read at once: ~1,000 a second before) makes a few a second per connection
(docs/security.md, row T5)."""


def _held(send: Any) -> Any:
    """`send` with a 429's answer held `REFUSED_HOLD_S` first."""
    import asyncio

    async def held(message: Any) -> None:
        if message["type"] == "http.response.start" and message.get("status") == 429:
            await asyncio.sleep(REFUSED_HOLD_S)
        await send(message)

    return held


def cursor_store(cursor: duckdb.DuckDBPyConnection) -> Any:
    """A read pool's cursor as the read layer's projection `Store` (its `con`)."""
    return _CursorStore(cursor)


def stopped(
    what: str, fn: Callable[[duckdb.DuckDBPyConnection, Limits], T]
) -> Callable[[duckdb.DuckDBPyConnection, Limits], T]:
    """`fn` in the read pool, its interruption at the time limit said in one line."""

    def run(cursor: duckdb.DuckDBPyConnection, limits: Limits) -> T:
        import duckdb

        try:
            return fn(cursor, limits)
        except duckdb.InterruptException as err:
            raise InvalidCommand(
                f"{what} ran past its time limit of {limits.timeout_s:g} s and was stopped",
                hint="ask for a smaller window or page, or narrow the filter",
            ) from err

    return run


def _encode(value: Any) -> bytes:
    """JSON of a read's answer; a list item by item (one encode of 10,000 rows would hold the
    interpreter lock for all of them: the worker and the event loop wait meanwhile)."""
    if not isinstance(value, list):
        return msgspec.json.encode(value)
    encode = msgspec.json.Encoder().encode
    return b"[" + b",".join([encode(x) for x in value]) + b"]"
