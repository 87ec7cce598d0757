"""User queries beside the worker, never on it: the audit's tables (`POST /v1/audit/table`, one
SELECT a caller wrote, a job's history, the preemptions, the budget changes) and the job page's
decision history run here (docs/security.md, rows T5 and T6).

- **Their own connection and threads.** Each query runs on a DuckDB cursor of its own (a
  connection to the projection's database, read-only by use: only SELECTs reach it, with file
  and network access off) on a thread of this pool (`threads` of them), so the dispatcher's
  cycle, the group commit and every other read on the worker thread never wait for one.
  DuckDB runs a query without the GIL; it reads a snapshot of the projection (MVCC) while the
  projector writes beside it.
- **Second in line for the CPU.** The database runs every query on its caller's thread alone
  (`SET threads = 1`: no engine threads shared by all), and the pool's threads run at a lower
  priority (`nice`, 10: the kernel gives the worker thread about nine tenths of a core they
  compete for), so a heavy query takes the CPU the dispatcher leaves.
- **A time limit** (`timeout_s`) on the read's own work: a query still running when its
  thread has spent that much CPU time is interrupted (`cursor.interrupt()`) and answered with
  one line saying so; and one that has been under way `awake_times` the limit of its
  running time (its wall time, each look at it every `TICK_S` adding `GAP_S` at most: a
  stopped process's gap counts once; less the time its thread waited for a CPU and the time
  the process was stopped in short spells: atk61-ha F3) is too, whatever its CPU (a read that
  waits in DuckDB without working). The limit was wall-clock: a read in flight across a 28 s SIGSTOP
  of the server was stopped at SIGCONT and its caller told to narrow the query (atk60-29 F4);
  a pause of the process, or a machine so loaded that the read gets a tenth of a core, is no
  part of the read's time now (`ReadTime`). The thread's CPU is the query's whole work because
  the database runs it on its caller's thread alone (`SET threads = 1`, above); on a
  connection with more threads the others' share is not counted (the backstop still holds).
- **A row and a byte limit** (`max_rows`, `max_bytes`): the result is fetched in record
  batches and the query stops at the first batch past either limit (nothing larger is held).
- **Per-caller limits**: at most `per_caller` queries of one caller at a time and `per_minute`
  a minute, and `max_waiting` of everyone's under way, the last `fresh_reserve` of them for
  people with none under way (a few people leaving their answers unread never hold every
  slot); past any, the answer is 429 with Retry-After (`TooBusy`). A caller waits for a free
  thread behind others' queries, never beside the worker.
- **One admission for every read a person can make** (`admitted`), before anything else:
  the audit queries, the API's reads of the projection (`pooled`: the projection's status
  too) and the reads of the live state on the view the worker publishes (`copied`: the
  previews, /metrics, the dashboard, a decision's record, the what-if's check). No read runs
  on the worker thread; the calls on it a read may still make (the first view, before the
  worker's first turn published one; a standby's view behind its follow; who may see what
  for a pooled read while no view is) are timed (`worker_call`: `worker_read_s`)
  (docs/security.md, row T5).

An edge: threads, a database connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ledger.history.tables import Limits
from ledger.server import children, connections, meters
from ledger.server.fairlane import FairLane, Turns
from schemas.errors import TooBusy

if TYPE_CHECKING:
    import duckdb

T = TypeVar("T")


SWITCH_S = 0.0005
"""The interpreter's thread switch interval while reads run beside the worker (see `start`)."""
STOP_WAIT_S = 5.0
"""How long a stop waits for the read threads once their queries are interrupted (`stop`)."""
TICK_S = 0.1
"""How often the reads under way are looked at for their time limit (`ReadTime`)."""
GAP_S = 0.5
"""The most running time one look adds to a read's: a longer gap between two looks is the
process stopped (SIGSTOP, a suspended machine) or not given a CPU, not the read's."""
AWAKE_TIMES = 2.0
"""A read under way this many times its time limit of the process's running time is stopped,
whatever its CPU time (`ReadTime`)."""
TIMEOUT_ENV = "GPULEDGER_READ_TIMEOUT"
MAX_ROWS_ENV = "GPULEDGER_READ_MAX_ROWS"


def limits_from_env() -> Limits:
    """The limits, with `GPULEDGER_READ_TIMEOUT` (seconds) and `GPULEDGER_READ_MAX_ROWS` when
    set; InvalidCommand (one line) for a value that is not a positive number."""
    settings = ((TIMEOUT_ENV, "timeout_s", float), (MAX_ROWS_ENV, "max_rows", int))
    out = connections.positive_settings(dict(os.environ), settings)
    return dataclasses.replace(Limits(), **out)


def sent_from_env() -> meters.Written:
    """Each person's allowance of answers' bytes (`ReadPool.sent`), with
    `GPULEDGER_READ_SENT_RATE` (bytes a second) and `GPULEDGER_READ_SENT_BURST` (bytes) when
    set; InvalidCommand (one line) for a value that is not a positive number."""
    settings = ((meters.READ_RATE_ENV, "per_s", float), (meters.READ_BURST_ENV, "burst", float))
    got = connections.positive_settings(dict(os.environ), settings)
    return meters.Written(**{"per_s": meters.READ_BYTES_PER_S, "burst": meters.READ_BYTES_BURST,
                             **got})  # fmt: skip


@dataclass
class ReadTime:
    """One read's time as its limit counts it (pure): the CPU time its thread spent since it
    began (`cpu` at each look, None where no thread clock is: then its running time alone, at
    one times the limit) and its running time, each look adding its gap since the last one
    `GAP_S` at most, less the time its thread waited for a CPU meanwhile (`queued`: its
    run-queue wait so far, `/proc/.../schedstat`; None: not known) and the time the process
    was stopped (`stopped`, `stopped_s`): what is left is the read's work and its own waits.
    Counted as wall time, a read with two busy loops beside it, or in 100 ms slices of a CPU
    quota, was cut after 0.4 s of its 2 s limit's CPU (atk61-ha F3)."""

    cpu0: float | None
    last: float
    awake: float = 0.0
    spent: float = 0.0
    queued: float | None = None

    def past(
        self,
        cpu: float | None,
        now: float,
        limit_s: float,
        awake_times: float,
        queued: float | None = None,
        stopped: float = 0.0,
    ) -> bool:
        """Look at the read at `now` (its thread's CPU clock reading `cpu`): whether it ran
        past `limit_s` of work, or `awake_times` the limit of running time."""
        gap = max(0.0, min(max(0.0, now - self.last), GAP_S) - stopped)
        if queued is not None and self.queued is not None:
            gap = max(0.0, gap - max(0.0, queued - self.queued))
        self.awake += gap
        self.last, self.queued = now, queued
        if cpu is None or self.cpu0 is None:
            return self.awake >= limit_s
        self.spent = cpu - self.cpu0
        return self.spent >= limit_s or self.awake >= awake_times * limit_s


def _cpu_clock() -> int | None:
    """The calling thread's CPU clock (Linux), None where there is none."""
    try:
        return time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):
        return None


def _queued(tid: int | None) -> float | None:
    """How long thread `tid` (native id; None: the caller's) has waited for a CPU so far (s: the
    run-queue wait, `/proc/self/task/TID/schedstat`'s second field), None where it is not
    known (another system, a kernel without schedstats, the thread ended)."""
    path = "/proc/thread-self/schedstat" if tid is None else f"/proc/self/task/{tid}/schedstat"
    try:
        with open(path, "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def stopped_s(gap: float, queued: float | None, tick_s: float) -> float:
    """Pure: how long the process was stopped (SIGSTOP, a suspended machine) in a watcher's
    `gap` between two looks that should be `tick_s` apart, of which its own thread waited
    `queued` for a CPU (None: not known, then none counted stopped): the rest of the oversleep,
    past half a tick of timer slack."""
    if queued is None:
        return 0.0
    return max(0.0, gap - 1.5 * tick_s - queued)


def _cpu(clock: int | None) -> float | None:
    if clock is None:
        return None
    try:
        return time.clock_gettime(clock)
    except OSError:  # (the thread ended: the read is over)
        return None


@dataclass
class ReadPool:
    """Queries on their own cursors and threads, with limits (see the module docstring)."""

    connect: Callable[[], duckdb.DuckDBPyConnection]
    """A connection to the projection's database that cursors are made from (called once,
    through `on_worker`: the service's connection is the worker's)."""
    on_worker: Callable[[Callable[[], Any]], Awaitable[Any]]
    threads: int = 2
    limits: Limits = field(default_factory=Limits)
    per_caller: int = 2
    per_minute: int = 60
    max_waiting: int = 16
    """Queries admitted and not finished, everyone's together: past it, 429 (many callers
    cannot queue without bound)."""
    fresh_reserve: int = 4
    """Of `max_waiting`, the last this many are for people with none under way: a person with
    one under way is refused once `max_waiting - fresh_reserve` are (eight people who each left
    two answers unread held everyone's 16, and another person's reads were refused: atk36-25
    F3)."""
    nice: int = 10
    rest: float = 3.0
    """After each of the API's reads, its thread rests this many times as long as it took: the
    reads take at most a quarter of the interpreter (see `_pages`)."""
    reads_per_minute: int = 1200
    """The API's reads a caller may make a minute (a client polling `jobs` is not an audit
    query; the time limit and the pages bound each one)."""
    sent: meters.Written = field(
        default_factory=lambda: meters.Written(meters.READ_BYTES_PER_S, meters.READ_BYTES_BURST)
    )
    """Each person's bytes of answers to their reads: every answer sent, **kept or not**, is
    charged its body's size once sent (`admitted`), and a person whose allowance is below zero
    has their reads refused 429 until it is back (a kept answer takes no turn in a lane, and
    one user re-reading a kept 1.25 MB page ~54 times a second, within her 50 requests a
    second, slowed everyone else's pages 8-60x: atk47-29 F1)."""
    clock: Callable[[], float] = time.monotonic
    _pool: ThreadPoolExecutor | None = None
    _lanes: dict[str, FairLane] = field(default_factory=dict)
    """The API's reads' lanes: "pages" (small reads), "big" (pages of more than a part: a
    person looping 10,000-row pages never holds another's 5-row read behind a page) and "live"
    (the reads of the live state on a copy, `copied`). Each is one thread at the service's
    priority: their work is Python holding the interpreter lock, and a thread the kernel leaves
    waiting (nice 10 on a busy machine) while it holds the lock would stall the worker and the
    event loop behind it (priority inversion); the audit queries' work is DuckDB's, without the
    lock, at nice 10. Each lane serves the people reading in turn, and the rest after a read is
    its reader's own, `rest` times its work (the CPU time it took) times the people reading
    (`ledger.server.fairlane`): a lane is busy about a quarter of the time at most, besides the
    work shared by every reader that no one is charged (the queue preview: once per log
    position and 2 s at most), and one person looping reads delays another's by the one read
    under way at most, never by their queue or their rests."""
    _base: duckdb.DuckDBPyConnection | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _cursors: set[duckdb.DuckDBPyConnection] = field(default_factory=set)
    """The cursors of the queries under way (`_one`)."""
    _running: dict[str, int] = field(default_factory=dict)
    _recent: dict[str, deque[float]] = field(default_factory=dict)
    queries: int = 0
    """Queries run so far, and of them stopped by the time limit:"""
    timed_out: int = 0
    refused: int = 0
    """Reads and queries refused 429 (`admit`) so far."""
    worker_reads: int = 0
    """Reads' calls on the worker thread (`worker_call`) so far, and their time there:"""
    worker_read_s: float = 0.0
    projected: int = 0
    """The projection's position when a read last caught it up (`copied.caught_up`), when,
    whether one is under way, and the projector thread's time spent so (never the worker's):"""
    caught_up_at: float = 0.0
    catching: asyncio.Future[None] | None = None
    catch_up_s: float = 0.0
    catch_up_rest: float = 0.0
    """How long after the last catch-up ended the next may begin."""
    stalled: bool = False
    """The last catch-up brought the projection no further (the store is away)."""
    catch_ups: int = 0
    """Catch-ups begun so far, and the last one ended (`copied.caught_up`)."""
    caught_up_by: int = 0
    projector: Any = None
    """The projector the reads catch the projection up with (`Projector.beside` the service's:
    a connection and a source of its own, the service's lock), on `_projecting`'s thread, never
    the worker's (`copied.caught_up`); None: they ask the worker."""
    _projecting: ThreadPoolExecutor | None = None
    _ahead: ThreadPoolExecutor | None = None
    _ahead_busy: bool = False
    _stopped: bool = False
    """`stop` began: nothing more is run beside (`beside`)."""
    awake_times: float = AWAKE_TIMES
    _timed: dict[int, tuple[duckdb.DuckDBPyConnection, tuple[int | None, int], ReadTime]] = field(
        default_factory=dict
    )
    """The reads under way by their cursor's id: the cursor, its thread's CPU clock, its time
    (`_watch`)."""
    _watching: threading.Event = field(default_factory=threading.Event)
    """Set at `stop`: the thread looking at the reads' time ends."""

    def start(self) -> ReadPool:
        self._pool = ThreadPoolExecutor(
            self.threads, thread_name_prefix="reads", initializer=self._lower_priority
        )
        self._projecting = ThreadPoolExecutor(1, thread_name_prefix="projector")
        self._ahead = ThreadPoolExecutor(1, thread_name_prefix="ahead")
        threading.Thread(target=self._watch, name="read-limits", daemon=True).start()
        for name in ("pages", "big", "live"):
            turns = Turns(rest=self.rest, cap_s=self.limits.timeout_s)
            self._lanes[name] = FairLane(turns, name=f"{name}-reads")
        # A read's Python holds the interpreter lock for up to the switch interval each time the
        # worker or the event loop wants it back (after every DuckDB call, every socket read):
        # 5 ms by default, which a submit pays dozens of times. 0.5 ms keeps them near idle.
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_S))
        return self

    def connect_now(self) -> ReadPool:
        """Make the pool's connection here, before the worker thread that owns the service's
        connection starts (then nothing else uses it): a first read that came only once a
        PostgreSQL store went away would otherwise wait for a worker held by the store."""
        if self._base is None:
            self._base = self.connect()
        return self

    async def projecting(self, fn: Callable[[], T]) -> T:
        """`fn()` on the thread that catches the projection up for the reads (at the service's
        priority: the projector's Python holds the interpreter lock, see `_live`)."""
        assert self._projecting is not None, "ReadPool.start() first"
        return await asyncio.get_running_loop().run_in_executor(self._projecting, fn)

    def _lower_priority(self) -> None:
        children.mark_reader()  # not the server's level for its children (`children.READER`)
        with contextlib.suppress(OSError):  # Linux: a thread's nice value is its own
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)

    def stop(self, wait_s: float = STOP_WAIT_S) -> bool:
        """At the server's stop, before the interpreter's end: no read is taken any more, the
        queries under way are interrupted, and their threads are waited for (`wait_s` at
        most); then the connection is closed. Whether every read thread ended. A lane's thread
        is a daemon the interpreter does not wait for: one still in DuckDB (the query runs
        without the interpreter lock) when the interpreter finalises is ended by a forced
        unwind through DuckDB's C++ as it takes the lock back, and the process aborted ("FATAL:
        exception not rethrown", SIGABRT at a server's stop: once in the suite)."""
        self._stopped = True
        self._watching.set()
        for pool in (self._pool, self._projecting, self._ahead):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        for lane in self._lanes.values():
            lane.stop()
        with self._lock:
            under_way = list(self._cursors)
        for cur in under_way:
            with contextlib.suppress(Exception):  # one that ended meanwhile
                cur.interrupt()
        until = time.monotonic() + wait_s
        ended = all([lane.joined(until) for lane in self._lanes.values()])
        for pool in (self._pool, self._ahead):  # (the interpreter waits for these at its exit)
            for thread in list(getattr(pool, "_threads", ())):
                thread.join(max(0.0, until - time.monotonic()))
                ended = ended and not thread.is_alive()
        if ended and self._base is not None:  # never closed under a cursor still in use
            self._base.close()
        return ended

    def admit(self, caller: str, now: float, per_minute: int | None = None) -> None:
        """Raise TooBusy when `caller` has `per_caller` queries running or ran `per_minute` in
        the last minute, or `max_waiting` queries of everyone's are under way (on the event
        loop: no lock needed). `per_minute` given: the reads' own rate (`reads_per_minute`,
        counted apart from the audit queries')."""
        try:
            self._admit(caller, now, per_minute)
        except TooBusy:
            self.refused += 1
            raise

    @contextlib.contextmanager
    def admitted(self, caller: str, *, read: bool = False) -> Iterator[None]:
        """Admit `caller` (`admit`; `read`: one of the API's reads, at `reads_per_minute`) and
        count the read under way until the block ends and, in a request the server serves,
        until its answer has been sent (`connections.release_after_sent`: an answer a client
        does not read still counts against its reader, until the stalled send is dropped).
        A request the server serves is one read: admitted once, however many parts of it
        ask (a kept answer looked up, then computed; the projection caught up, then queried),
        its count held until its answer is sent (issue 25: a read that missed the cache
        counted twice in its person's minute)."""
        held = connections.held()
        if held is not None and caller in held.admitted:
            yield
            return
        self.admit(caller, self.clock(), self.reads_per_minute if read else None)
        self._running[caller] = self._running.get(caller, 0) + 1
        if held is not None:
            held.admitted.add(caller)

        def release() -> None:
            self._running[caller] -= 1
            if not self._running[caller]:
                del self._running[caller]
            if read and held is not None and held.sent:  # its answer's bytes (`sent`)
                self.sent.charge(caller, held.sent, self.clock())

        try:
            yield
        finally:
            connections.release_after_sent(release)

    def charge_answer(self, caller: str) -> None:
        """The answer of the request under way charged to `caller` once sent (`sent`), for a
        request whose reads were admitted `connections.apart` (none of them held to it)."""
        held = connections.held()
        if held is None:
            return

        def charge() -> None:
            if held.sent:
                self.sent.charge(caller, held.sent, self.clock())

        connections.release_after_sent(charge)

    @property
    def under_way(self) -> int:
        """Reads and queries admitted whose answers are not yet sent, everyone's."""
        return sum(self._running.values())

    def _admit(self, caller: str, now: float, per_minute: int | None) -> None:
        under_way = self.under_way
        if under_way >= self.max_waiting:
            raise TooBusy(
                f"the server has {self.max_waiting} queries under way",
                hint="retry in a few seconds",
                retry_after=5,
            )
        if self._running.get(caller, 0) and under_way >= self.max_waiting - self.fresh_reserve:
            raise TooBusy(
                f"the server has {under_way} queries under way, {caller!r}'s among them; the "
                f"last {self.fresh_reserve} are for people with none",
                hint="wait for yours (or run fewer at once)",
                retry_after=1,
            )
        if self._running.get(caller, 0) >= self.per_caller:
            raise TooBusy(
                f"{caller!r} has {self.per_caller} queries running already",
                hint="wait for them (or run fewer at once)",
                retry_after=1,
            )
        owed = self.sent.retry_in(caller, now) if per_minute is not None else 0.0
        if owed > 0:
            raise TooBusy(
                f"{caller!r} was sent more than {self.sent.burst / (1 << 20):g} MiB of answers "
                f"at once and is over {self.sent.per_s / (1 << 20):g} MiB a second",
                hint="ask for smaller pages, or less often",
                retry_after=max(1, math.ceil(owed)),
            )
        limit = self.per_minute if per_minute is None else per_minute
        recent = self._recent.setdefault(caller if per_minute is None else caller + "\0", deque())
        while recent and recent[0] <= now - 60:
            recent.popleft()
        if len(recent) >= limit:
            wait = max(1, math.ceil(recent[0] + 60 - now))
            raise TooBusy(
                f"{caller!r} ran {limit} queries in the last minute",
                hint=f"retry in {wait} s",
                retry_after=wait,
            )
        recent.append(now)

    async def run(
        self,
        caller: str,
        fn: Callable[[duckdb.DuckDBPyConnection, Limits], T],
        *,
        read: bool = False,
        big: bool = False,
    ) -> T:
        """`fn(cursor, limits)` on a cursor of its own, on a thread of this pool, stopped at
        the time limit. `caller` is who asked (limited per caller); `read`: one of the API's
        reads (`/v1/jobs`, `/v1/log`, ...: `reads_per_minute`), not an audit query; `big`: a
        read of more than a part (`pooled.PART` rows), run in a lane of its own."""
        with self.admitted(caller, read=read):
            return await self.compute(fn, read=read, big=big, person=caller)

    async def compute(
        self,
        fn: Callable[[duckdb.DuckDBPyConnection, Limits], T],
        *,
        read: bool = False,
        big: bool = False,
        live: bool = False,
        person: str = "",
    ) -> T:
        """`run` for a caller already `admitted` (a read that also asks the worker first), by
        `person`; `live`: a read of the live state on a copy (`copied`), in a lane of its
        own."""
        assert self._pool is not None, "ReadPool.start() first"
        if self._base is None:
            base = await self.on_worker(self.connect)
            if self._base is None:
                self._base = base
            else:
                base.close()
        if read:
            lane = self._lanes["live" if live else "big" if big else "pages"]
            return await asyncio.wrap_future(lane.submit(person, lambda: self._one(fn)))
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._one, fn)

    def lanes(self) -> dict[str, FairLane]:
        """The API's reads' lanes by name (`pages`, `big`, `live`)."""
        return dict(self._lanes)

    def beside(self, fn: Callable[[duckdb.DuckDBPyConnection, Limits], Any]) -> bool:
        """From any thread: `fn(cursor, limits)` on the thread of work done ahead
        (`copied.ahead`: one thread at the service's priority, as the worker that did it
        before; not in a lane, whose time is the people's: it counted against the person
        reading and slowed their next reads by seconds), not awaited; False when the pool has
        no connection yet, that thread is busy (nothing queues behind it), or the pool was
        stopped: the worker's idle hooks run on after `stop` while the server finishes its cycle
        and hands over, and each logged "idle work failed ... cannot schedule new futures after
        shutdown" with a traceback at an HA leader's SIGTERM (atk58 F6)."""
        if self._ahead is None or self._base is None or self._ahead_busy or self._stopped:
            return False
        self._ahead_busy = True

        def run() -> None:
            try:
                self._one(fn)
            finally:
                self._ahead_busy = False

        try:
            done = self._ahead.submit(run)
        except RuntimeError:  # shut down by a `stop` since the look above
            self._ahead_busy = False
            return False
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        return True

    async def worker_call(self, fn: Callable[[], T], took: list[float] | None = None) -> T:
        """`fn` on the worker thread for a read (admitted by the caller), its time there (not
        its wait in the queue) counted in `worker_reads` and `worker_read_s` (so every moment
        the worker spends on reads is: `gpuledger_worker_read_seconds`) and set in `took[0]`."""
        took = [0.0] if took is None else took

        def timed() -> T:
            began = time.perf_counter()
            try:
                return fn()
            finally:
                took[0] = time.perf_counter() - began

        try:
            return await self.on_worker(timed)  # type: ignore[no-any-return]
        finally:
            self.worker_reads += 1
            self.worker_read_s += took[0]

    def _one(self, fn: Callable[[duckdb.DuckDBPyConnection, Limits], T]) -> T:
        with self._lock:
            assert self._base is not None
            cur = self._base.cursor()
            self._cursors.add(cur)  # interrupted at a stop (`stop`)
            clock, tid = _cpu_clock(), threading.get_native_id()
            took = ReadTime(_cpu(clock), time.monotonic(), queued=_queued(tid))
            self._timed[id(cur)] = (cur, (clock, tid), took)
        self.queries += 1
        try:
            return fn(cur, self.limits)
        finally:
            with self._lock:
                self._cursors.discard(cur)
                self._timed.pop(id(cur), None)
            cur.close()

    def _watch(self) -> None:
        """Every `TICK_S` until `stop`: the reads past their time limit interrupted
        (`ReadTime`; one thread for every read, where each read had a timer thread of its
        own)."""
        looked, waited = time.monotonic(), _queued(None)
        while not self._watching.wait(TICK_S):
            limit_s = self.limits.timeout_s
            now, mine = time.monotonic(), _queued(None)
            own = None if mine is None or waited is None else mine - waited
            stopped = stopped_s(now - looked, own, TICK_S)
            looked, waited = now, mine
            with self._lock:
                timed = list(self._timed.items())
            past = [
                (key, cur)
                for key, (cur, (clock, tid), took) in timed
                if took.past(
                    _cpu(clock), time.monotonic(), limit_s, self.awake_times, _queued(tid), stopped
                )
            ]
            for key, cur in past:
                with self._lock:  # still under way (not ended since the look)
                    if self._timed.pop(key, (None,))[0] is not cur:
                        continue
                    self.timed_out += 1
                    with contextlib.suppress(Exception):
                        cur.interrupt()
