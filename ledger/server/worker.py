"""Who touches the ledger, the projection and the executor in `serve`: one at a time, under one
lock (the projection's catch-ups for reads run beside it, under the projector's own lock:
`ledger.server.copied`).

Commands are group-committed: the commands the event loop receives until a turn of it brings no
more (a few turns at most; `_gather`) are decided and appended in one store transaction
(`Ledger.execute_each`, each command still decided and rejected on its own), right on the event
loop when the worker thread does not hold the ledger, else handed to the worker thread. Nothing
is acknowledged before its transaction has committed. (On the event loop, a burst of submits
costs no thread hand-off: no wake-up of another thread, no GIL passed back and forth, no wake-up
of the loop from outside; the loop is the one that waited anyway.)

The worker thread runs reads and calls in order, a dispatcher cycle whenever one is due, and the
ahead-of-time work of the read cache once the log has stayed still.

Whoever moves the live state (a group commit, a call, a cycle, a standby's follow) publishes it,
before anyone is answered (`view`: `ledger.server.copied.take`, an immutable copy, taken only
when the state moved; after a group commit only while someone reads, else before this thread
rests or runs anything else: `_publish_after_writes`): the pages, `/metrics` and the previews
read that view in the read pool and never ask this thread anything, the first read after a
quiet spell too (docs/server.md, "Reads beside the worker"); a read that finds it behind the
writes answered waits for the next one (`current_view`). Nothing the dispatcher decides reads
the view.

One of several servers on a PostgreSQL store (`ha`, docs/ha.md) cycles only while it leads: at
each turn the worker turns the lease into a role (`promote` once it holds it, `demote` once it
does not), and a standby follows the log instead of cycling, every `follow_s`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ledger.cycle.loop import ServiceLoop, wait_time
from ledger.server.ha import Leadership, store_words
from ledger.store.appended import Appended
from schemas.codec import freeze_heap
from schemas.commands import AnyCommand, SubmitJob
from schemas.errors import LedgerError, Unavailable

log = logging.getLogger("gpuledger.server")


@dataclass
class _Task:
    loop: asyncio.AbstractEventLoop | None
    future: asyncio.Future[Any] | None
    command: AnyCommand | None = None
    call: Callable[[], Any] | None = None
    key: str | None = None


_WAKE = _Task(None, None)
"""Tells the worker thread the log moved (its idle work waits for the next quiet moment)."""


AWAY_STOP_S = 2.0
"""How long a stop waits for the worker while the store does not answer (`Worker.stop`)."""
LAPSE_LOOK_S = 0.25
"""How often a write waiting on the worker looks whether this server still leads (`_answered`);
it looks at its lease's deadline too."""
LINGER_S, LINGER_POLL_S = 0.005, 0.0003
"""The longest a group waits for the writers the last commit answered, and how often it looks."""
WANTED_S = 1.0
"""After a read took the view, how long the worker publishes one after every group commit
(`_publish_after_writes`): a page's reads, or a stream of them, never wait for a view."""
READ_WAIT_S = 8.0
"""The longest a read waits for the worker thread on a PostgreSQL store (then 503): every read
answers within 10 s while PostgreSQL is down (docs/security.md, row T5)."""


@dataclass
class Worker:
    service: ServiceLoop
    tick_s: float = 2.0
    max_batch: int = 256
    accepting: bool = True
    _queue: queue.SimpleQueue[_Task | list[_Task] | None] = field(default_factory=queue.SimpleQueue)
    """What the worker thread is handed: a task, the tasks one event loop gathered for a group
    commit (one item: one wake-up of the thread, and the whole group in its next turn), None
    to stop."""
    quiet_s: float = 0.5
    """How long the log must stay still before `idle` hooks run: not between a burst's writes,
    nor in the moment after an append, when the reads it prompts arrive (a page loaded after an
    action): those would wait behind work done ahead that most of them do not need (the queue
    preview costs ~0.1-0.3 s at 10k pending; a page that needs it computes it as soon)."""
    idle: list[Callable[[], bool | None]] = field(default_factory=list)
    """Run on the worker thread once the log has moved and then stayed still for `quiet_s`
    (the read cache computes the queue preview ahead of the first read); a hook that returns
    True has more to do and is called again `again_s` later, while nothing is queued."""
    again_s: float = 0.05
    """The pause between the steps of idle work done in steps (a long history's team hours)."""
    freeze_every_s: float | None = None
    """How often the worker moves the live state out of the collector's sight (`_freeze`;
    None: never, the default of a worker in another process's heap; `serve`: `FREEZE_EVERY_S`)."""
    _frozen_at: float = -math.inf
    _thread: threading.Thread | None = None
    _next_cycle: float = 0.0
    _moved_at: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    """Held by whoever touches the ledger: the worker thread, or the event loop committing."""
    _open: set[asyncio.Future[Any]] = field(default_factory=set)
    """The HTTP side's requests waiting on the worker (`refuse_waiting`)."""
    _lapsing: dict[asyncio.AbstractEventLoop, set[asyncio.Future[Any]]] = field(
        default_factory=dict
    )
    """The writes each event loop waits on while this server leads one of several (`_answered`),
    and the loops with a look at them due (`_look_later`):"""
    _looking: set[asyncio.AbstractEventLoop] = field(default_factory=set)
    _pending: dict[asyncio.AbstractEventLoop, list[_Task]] = field(default_factory=dict)
    """The commands each event loop is gathering for its next group commit."""
    _cohort: int = 0
    """The writes the last group commit answered while another group waited (`_linger`)."""
    _answered_at, _commit_s = 0.0, 0.0
    _held: list[_Task | list[_Task] | None] = field(default_factory=list)
    gather_turns: int = 6
    """How many turns of the event loop a group commit may wait for more commands."""
    commits: int = 0
    """Group commits (store transactions of commands) so far, and the commands in them:"""
    committed: int = 0
    ha: Leadership | None = None
    """The lease, on a store shared by several servers (None: the only server, always leading)."""
    promote: Callable[[], None] = lambda: None
    """Take up the leader's work (on the worker thread, once the lease is held)."""
    demote: Callable[[], None] = lambda: None
    """Give it up (on the worker thread, once the lease is lost)."""
    follow_s: float = 0.2
    """How often a standby folds what the log gained."""
    follow_error: str | None = None
    """Why the last follow failed (the store is away), for health; None once it works."""
    read_at: float = 0.0
    """monotonic time of the last read of the log that answered (a standby's follow, a leader's
    cycle): a standby's reads say how old it is past one lease (`store_seen.stale_s`)."""
    _epoch: int = 0
    """The lease epoch this server last took up the leader's work at."""
    _early_at: float = float("-inf")
    """When a submission last brought a cycle forward (`_cycle_soon`)."""
    view: Any = None
    """The live state as of the last change that was answered (`copied.Copy`: the state copied
    at a log position, with what the engine was last seen holding), published under the lock
    by whoever moved it, before the moves are acknowledged (after a group commit nobody reads,
    before the worker rests: `_publish_after_writes`; a read after a quiet spell waits for
    nothing); None only until the worker's first turn."""
    views: int = 0
    """Views published so far, and group commits after which none was (`_publish_after_writes`):"""
    skipped: int = 0
    answered: int = 0
    """The log's position once the last group commit the worker thread answered was made: a
    read's view holds at least this (`current_view`)."""
    rest_s: float = 0.002
    """How long the worker waits for more work before it publishes a view behind the writes
    answered (`_wait`): the next group of a stream of submits comes sooner, and a copy at every
    pause between two group commits was most of the copies left (bench_pg, 2026-12-07)."""
    _read_at: float = -math.inf
    """monotonic time a read last took the view (`viewed`)."""
    _view_waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], int]] = field(
        default_factory=list
    )
    """The reads waiting for a view at a position (`current_view`), under `_waiting_lock`."""
    _waiting_lock: threading.Lock = field(default_factory=threading.Lock)
    calls: int = 0
    """Calls run on the worker thread so far (atomic batches, agents' reports, the calls reads
    still make), and their time there (`gpuledger_worker_call_seconds`): every moment the
    dispatcher cycle and the group commit may have waited for one."""
    call_s: float = 0.0

    def leading(self) -> bool:
        return self.ha is None or self.ha.leading

    def acting(self) -> bool:
        """Leading, with the lease still running by this server's own clock."""
        return self.ha is None or self.ha.acting()

    def epoch(self) -> int:
        """The leader epoch this server acts under (0: the only server of its store)."""
        return 0 if self.ha is None else self.ha.lease.epoch

    def viewed(self) -> Any:
        """On the event loop: the published view (None: none yet; `publish_view` on this
        thread takes one), which may be behind the writes answered (`current_view`)."""
        self._read_at = time.monotonic()
        return self.view

    async def current_view(self) -> Any:
        """On the event loop: the published view once it holds every write answered so far
        (None: none yet). It does at once unless writes have streamed in with no read for
        `WANTED_S` (`_publish_after_writes`); then this waits for the worker's next
        publication: its group commit under way and the next at most, never a cycle or a
        call (published before them), nor the worker's rest (published before it)."""
        got = self.viewed()
        target = self.answered
        if got is None or got.ledger.position >= target:
            return got
        loop, future = self._future()
        with self._waiting_lock:
            self._view_waiting.append((loop, future, target))
        got = self.view  # published meanwhile, before the worker took the waiting list
        if got.ledger.position >= target:
            return got
        self._queue.put(_WAKE)  # a worker between two group commits publishes at once
        return await future

    def publish_view(self) -> Any:
        """On the worker thread (the lock held): publish the view now and return it."""
        self._publish()
        return self.view

    def _publish(self) -> None:
        """With the lock, after whatever may have moved the live state and before it is
        answered: a new view when it moved (the log's position, the engine's observation;
        a few comparisons when it did not: `copied.same`)."""
        from ledger.server import copied

        if self.view is None or not copied.same(self.view, self):
            self.view = copied.take(self, self.view)
            self.views += 1
        if self._view_waiting:
            self._hand_view()

    def _publish_after_writes(self) -> None:
        """After a group commit: the view published only when a read took one in the last
        `WANTED_S`, or when more than the log's position moved. Copying the live state at
        every group commit (~1 ms at 10k live jobs) was a fifth of the worker's time under a
        stream of submits with nobody reading (bench_pg, 2026-12-07); a read that finds the
        view behind the writes answered waits for the next one (`current_view`), published
        before the worker rests, runs a cycle, a call or idle work."""
        from ledger.server import copied

        view = self.view
        if (
            view is not None
            and time.monotonic() - self._read_at > WANTED_S
            and copied.only_appended(view, self)
        ):
            self.skipped += 1
            return
        self._publish()

    def _hand_view(self) -> None:
        """The reads waiting for a view (`current_view`) that this one satisfies, answered."""
        at = self.view.ledger.position
        with self._waiting_lock:
            ready = [w for w in self._view_waiting if w[2] <= at]
            self._view_waiting = [w for w in self._view_waiting if w[2] > at]
        for loop, future, _ in ready:
            loop.call_soon_threadsafe(_settle_one, _Task(loop, future), self.view)

    def nudge(self) -> None:
        """Look at the role (and follow the log) at once, from any thread."""
        self._next_cycle = 0.0
        self._queue.put(_WAKE)

    # --- the HTTP side ---------------------------------------------------------------------------

    async def execute(self, command: AnyCommand, key: str | None = None) -> Appended:
        """Append one command (group-committed with the others arriving meanwhile); `key`: its
        idempotency key (a retry of it is answered, not appended again)."""
        if not self.accepting:
            raise Unavailable("the server is stopping and takes no more writes", hint="retry")
        self._check_leading()
        loop, future = self._future()
        pending = self._pending.get(loop)
        if pending is None:
            pending = self._pending[loop] = []
            loop.call_soon(self._gather, loop, 0, 0)
        pending.append(_Task(loop, future, command=command, key=key))
        self._track(future)
        return await self._answered(future)  # type: ignore[no-any-return]

    def _gather(self, loop: asyncio.AbstractEventLoop, seen: int, turns: int) -> None:
        """Commit once a turn of `loop` brings no more commands (at most `gather_turns` turns):
        a turn polls the sockets without waiting, so this costs no latency when nothing else
        is arriving, and under a burst it makes the batches larger (fewer transactions)."""
        waiting = len(self._pending.get(loop, ()))
        more = seen < waiting or turns < 2
        if more and waiting < self.max_batch and turns < self.gather_turns:
            loop.call_soon(self._gather, loop, waiting, turns + 1)
        else:
            self._commit(loop)

    def _commit(self, loop: asyncio.AbstractEventLoop) -> None:
        """Commit what `loop` gathered, here when the ledger is free, else hand it to the worker
        thread (busy with a cycle or a read)."""
        tasks = self._pending.pop(loop, [])
        # one of several servers: a store behind a cut network may hang a transaction, never
        # the event loop (it still refuses writes and answers health once the lease runs out)
        if self.ha is not None or not self._lock.acquire(blocking=False):
            if tasks:  # as one item: a put per command was a tenth of the event loop's time
                self._queue.put(tasks)  # under bench_pg, and woke the worker for a part
            return
        try:
            wake = self._moved_at is None
            for at in range(0, len(tasks), self.max_batch):
                done = self._execute_each(tasks[at : at + self.max_batch])
                self._publish()  # before anyone is answered: a read after it sees it
                for task, result in done:
                    _settle_one(task, result)
            self._moved_at = time.monotonic()
        finally:
            self._lock.release()
        if wake:  # the worker sleeps until its next cycle: its idle work now waits for quiet
            self._queue.put(_WAKE)

    async def call(self, fn: Callable[[], Any], *, write: bool = False) -> Any:
        """Run `fn` on the worker thread (reads, and atomic batches when `write`)."""
        if write and not self.accepting:
            raise Unavailable("the server is stopping and takes no more writes", hint="retry")
        if write:
            self._check_leading()
        task = _Task(*self._future(), call=fn)
        if write or self.service.ledger.dsn is None:
            return await self._submit(task, write)
        # a PostgreSQL store that went away keeps the worker waiting on it (a cycle, a follow,
        # a connection's timeout): a read is answered 503 in one line past `READ_WAIT_S`, never
        # left hanging (it still runs when the worker gets to it; nothing is lost)
        try:
            return await asyncio.wait_for(asyncio.shield(self._submit(task)), READ_WAIT_S)
        except TimeoutError:
            raise Unavailable(
                f"the server's worker did not get to this read within {READ_WAIT_S:g} s (it "
                "waits on the store: PostgreSQL does not answer?)",
                hint="retry; /v1/jobs, /v1/log, /v1/shares and /v1/usage answer from what is "
                "folded",
            ) from None

    def _check_leading(self) -> None:
        away = None if self.ha is None else self.ha.away()
        if away is not None:  # the words and header of HAFront's own (atk60-ha F6)
            raise Unavailable(
                f"{store_words(away)}: no write is taken until it does; reads still answer",
                hint="retry once the store answers again; `gpuledger status` says when it does",
                store="away",
            )
        if self.ha is not None and not self.ha.acting():
            where = self.ha.leader_address()
            raise Unavailable(
                (self.ha.taking_up() or "this server does not lead")
                + (f"; the leader is {where}" if where else "; no server leads right now"),
                hint="retry: clients find the leader",
            )

    def _future(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]:
        loop = asyncio.get_running_loop()
        return loop, loop.create_future()

    async def _submit(self, task: _Task, write: bool = False) -> Any:
        assert task.future is not None
        self._track(task.future)
        self._queue.put(task)
        return await (self._answered(task.future) if write else task.future)

    async def _answered(self, future: asyncio.Future[Any]) -> Any:
        """A write's answer, or, once this server's lease has run out by its own clock while
        the write still waits on the worker (its append unanswered: a silent link, a hung or
        slow store, or one the leader handed the lease over for: `Leadership.stalled`), a 503
        at once with its outcome unknown (`_lapsed`). Such writes waited for the whole outage,
        a raw client for ever, while later ones were refused at once (atk60-ha F1)."""
        if self.ha is not None and not future.done():
            loop = future.get_loop()
            waiting = self._lapsing.setdefault(loop, set())
            waiting.add(future)
            future.add_done_callback(waiting.discard)
            if loop not in self._looking:
                self._look_later(loop)
        return await future

    def _look_later(self, loop: asyncio.AbstractEventLoop) -> None:
        """`_look` on `loop` in `LAPSE_LOOK_S`, or at the lease's deadline if sooner: one timer
        for all the writes waiting there (a wait with a timeout of its own per write was a
        twentieth of the event loop's time under a stream of submits, 2026-12-07)."""
        assert self.ha is not None
        left = self.ha.lease.deadline - time.monotonic()
        self._looking.add(loop)
        loop.call_later(min(LAPSE_LOOK_S, max(0.02, left)), self._look, loop)

    def _look(self, loop: asyncio.AbstractEventLoop) -> None:
        """On `loop`: the writes waiting there answered `_lapsed` once this server no longer
        acts; looked at again while any waits."""
        self._looking.discard(loop)
        waiting = self._lapsing.get(loop)
        if not waiting or self.ha is None:
            return
        if not self.ha.acting():
            for future in list(waiting):
                _refuse(future, self._lapsed())
        if waiting:
            self._look_later(loop)

    def _lapsed(self) -> Unavailable:
        """Why a write that waited on its append is answered now: this server stopped leading
        (its lease ran out, or it handed it over) before the store answered it. The append is
        fenced by the lease (its epoch, and the row's expiry in the database's clock), so it
        lands only if it committed before any other server could lead: its client asks again
        under its key (`X-Gpuledger-Outcome: unknown`; the CLI does), and is answered once."""
        away = None if self.ha is None else self.ha.away()
        why = "this server's lease ran out" if away is None else store_words(away)
        return Unavailable(
            f"{why}, and this write had no answer from the store before this server stopped "
            "leading: it may still be stored",
            hint="retry under its idempotency key: another server answers it, once (the CLI does)",
            outcome="unknown",
            store="away" if away is not None else "",
        )

    def _track(self, future: asyncio.Future[Any]) -> None:
        self._open.add(future)
        future.add_done_callback(self._open.discard)

    def refuse_waiting(self, why: str) -> int:
        """On the event loop, at a stop while the store does not answer (`why`): answer 503 every
        request still waiting on the worker (queued behind, or in, the statement the store
        does not answer), now. The web server's graceful stop waited 10 s for them and then
        cancelled them with a traceback each: agents' reports queued behind a leader's cycle
        held its SIGTERM 14-16 s (atk49 F4). A write so answered may still be stored when the
        store wakes (fenced by the lease like any append; a retry under its key is answered
        once). Returns how many were answered."""
        err = Unavailable(
            f"the server is stopping, and {store_words(why)}: this request was not answered",
            hint="retry: another server answers (a retried write under its key is taken once)",
            outcome="unknown",  # a write in the statement under way may still be stored
        )
        waiting = [f for f in self._open if not f.done()]
        for future in waiting:
            future.get_loop().call_soon_threadsafe(_refuse, future, err)
        return len(waiting)

    # --- the thread ------------------------------------------------------------------------------

    @property
    def thread_id(self) -> int | None:
        """The worker thread's ident (None: not started): its store calls hold the writes."""
        return None if self._thread is None else self._thread.ident

    @property
    def started(self) -> bool:
        """Whether the worker thread was started (then the service's connection is its own)."""
        return self._thread is not None

    def start(self) -> None:
        self._moved_at = time.monotonic()  # what the reads build on is computed ahead at start
        self._thread = threading.Thread(target=self._run, name="ledger-worker", daemon=True)
        self._thread.start()

    def stop(self, away: Callable[[], bool] = lambda: False) -> None:
        """Finish what is queued and the current cycle, then end the thread; while the store
        is `away` (it does not answer the lease), not waited for past `AWAY_STOP_S`: a thread
        waiting on a store that hangs (its processes stopped) held a SIGTERM'd server until
        the store answered again (atk48-ha F5); its statement is the store's to run, fenced
        by the epoch like any append, or to drop, as with a kill -9."""
        self.accepting = False
        self._queue.put(None)
        if self._thread is not None:
            given = time.monotonic() + AWAY_STOP_S
            while self._thread.is_alive():
                self._thread.join(timeout=0.2)
                if away() and time.monotonic() > given:
                    log.warning("the worker waits on a store that does not answer: stopping "
                                "without it")  # fmt: skip
                    return
        if self.commits:
            log.info("group commit: %d commands in %d transactions", self.committed, self.commits)

    def _run(self) -> None:
        self._next_cycle = time.monotonic()
        stopping = False
        while not stopping:
            first = self._wait()
            if self._cohort and isinstance(first, list):
                first = self._linger(first)
            with self._lock:
                stopping = self._turn(first)

    def _wait(self) -> _Task | list[_Task] | None:
        """Without the lock: the next item of the queue (None: stop), or `_WAKE` once something
        is due (a cycle, or idle work after the log has stayed still for `quiet_s`)."""
        while True:
            if self._view_waiting and self.view is not None:  # a read waits for the view
                with self._lock:
                    self._publish()
            wake = self._next_cycle
            if self._moved_at is not None:
                wake = min(wake, self._moved_at + self.quiet_s)
            try:
                try:  # the next group of a stream comes within `rest_s`: no copy between
                    item = self._queue.get(
                        timeout=min(self.rest_s, max(0.0, wake - time.monotonic()))
                    )
                except queue.Empty:
                    if self.view is not None:  # once it rests, it holds every write answered
                        with self._lock:  # (the first: the first turn's, as a read's first)
                            self._publish()
                    item = self._queue.get(timeout=max(0.0, wake - time.monotonic()))
            except queue.Empty:
                now, moved = time.monotonic(), self._moved_at
                if now >= self._next_cycle or (moved is not None and now >= moved + self.quiet_s):
                    return _WAKE
                continue  # the log moved meanwhile (commits on the event loop): not quiet yet
            if item is not _WAKE:  # _WAKE in the queue: the log moved, the wait is recomputed
                return item

    def _linger(self, group: list[_Task]) -> list[_Task]:
        """A group that waited while the last commit ran takes the writes of the clients that
        commit answered, arriving within as long as that commit took (at most `LINGER_S`):
        one commit for both, where a stream of writers split in two cohorts paid a commit
        (the store's flush) for each half. Anything else that comes meanwhile is its turn's."""
        wanted, self._cohort = self._cohort, 0
        deadline = self._answered_at + min(LINGER_S, self._commit_s)
        while wanted > 0 and len(group) < self.max_batch:
            try:  # polled, not waited on: the put that woke it here held the event loop's
                item = self._queue.get_nowait()  # GIL (a fifth of its samples under bench_pg)
            except queue.Empty:
                if time.monotonic() >= deadline:
                    break
                time.sleep(LINGER_POLL_S)
                continue
            if not isinstance(item, list):
                self._held.append(item)
                break
            group, wanted = group + item, wanted - len(item)
        return group

    def _turn(self, first: _Task | list[_Task] | None) -> bool:
        """With the lock: what is queued, then what is due; True once told to stop."""
        stopping = first is None
        tasks: list[_Task] = []
        _take(tasks, first)
        while self._held:
            held = self._held.pop()
            stopping = stopping or held is None
            _take(tasks, held)
        while len(tasks) < self.max_batch:
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                break
            if more is None:
                stopping = True
            _take(tasks, more)
        if self.ha is not None:
            role = (self.ha.leading, self._epoch)
            self._take_role()
            if (self.ha.leading, self._epoch) != role:
                self._publish()
        self._handle(tasks)
        now = time.monotonic()
        if not tasks and self._moved_at is not None and now >= self._moved_at + self.quiet_s:
            self._publish()  # the work done ahead is done on the view
            self._when_idle()
        if time.monotonic() >= self._next_cycle or stopping:
            self._publish()  # a read meanwhile finds the writes answered: it waits for no cycle
            self._cycle()
            self._publish()  # before the freeze (0.1-0.2 s): a read after the cycle sees it
            self._freeze()
        else:
            self._publish_after_writes()
        return stopping

    def _freeze(self) -> None:
        """After a cycle, at start and every `freeze_every_s`: the live state out of the
        cyclic collector's sight (`freeze_heap`, ~0.1-0.2 s here), so no read pays a full
        collection over it (issue 29: 2 in 7 cold Queue pages did, 80-105 ms of CPU each)."""
        now = time.monotonic()
        if self.freeze_every_s is None or now < self._frozen_at + self.freeze_every_s:
            return
        self._frozen_at = now
        freeze_heap()

    def _take_role(self) -> None:
        """Turn the lease into a role: promote once it is held, demote once it is not."""
        ha = self.ha
        assert ha is not None
        ha.changed.clear()
        ha.turned_at = time.monotonic()
        acting = ha.may_act()
        if acting and ha.leading and ha.lease.epoch != self._epoch:
            # the lease ran out and was taken again (a new epoch) before this turn saw it go:
            # step down and take up the work again, fenced by the new epoch
            ha.leading = False
            self._step_down()
        if acting and not ha.leading:
            try:
                self._epoch = ha.lease.epoch
                self.service.ledger.refresh()
                self.promote()
            except Exception as err:
                _failed("could not take up the leader's work", err)
                ha.failed_at = time.monotonic()  # the lease is handed over, not held for nobody
                self._step_down()
                return
            ha.leading = True
            self._next_cycle = 0.0
        elif not acting and ha.leading:
            ha.leading = False
            self._step_down()

    def _step_down(self) -> None:
        try:
            self.demote()
        except Exception as err:
            _failed("stepping down failed", err)

    def _when_idle(self) -> None:
        self._moved_at = None
        for hook in self.idle:
            try:
                more = hook()
            except Exception as err:  # ahead-of-time work only: the read that needs it says why
                _failed("idle work failed", err)
                continue
            if more:  # again soon, not after a whole `quiet_s`: the log is still
                self._moved_at = time.monotonic() - self.quiet_s + self.again_s
            if not self._queue.empty():
                self._moved_at = time.monotonic()
                break  # requests first; the rest at the next idle moment

    def _handle(self, tasks: list[_Task]) -> None:
        writes = [t for t in tasks if t.command is not None]
        if tasks:  # writes, and calls that may write (batches, agents' reports)
            self._moved_at = time.monotonic()
        for at in range(0, len(writes), self.max_batch):
            began = time.monotonic()
            done = self._execute_each(writes[at : at + self.max_batch])
            self.answered = int(self.service.ledger.position)
            self._publish_after_writes()
            _resolve_all(done)
            self._answered_at = time.monotonic()
            self._commit_s = self._answered_at - began
            # more was gathered meanwhile: it waits for these writers' next (`_linger`)
            self._cohort = 0 if self._queue.empty() else len(done)
        if any(t.call is not None for t in tasks):
            self._publish()  # a read meanwhile waits for no call (a batch of 2,000 commands)
        called = False
        for t in tasks:
            if t.call is not None:
                if called and time.monotonic() >= self._next_cycle:
                    # the cycle first once it is due, between calls (batches of 2,000 commands
                    # from several people at once held it for all of them: atk44-25 F7)
                    self._cycle()
                    self._publish()
                called = True
                began = time.perf_counter()
                try:
                    result = t.call()
                except Exception as err:
                    if not isinstance(err, LedgerError):
                        _failed("read failed", err)
                    result = err
                self.calls += 1
                self.call_s += time.perf_counter() - began
                self._publish()  # a call may write (a batch, an agent's report)
                _resolve_all([(t, result)])

    def _execute_each(self, writes: list[_Task]) -> list[tuple[_Task, Any]]:
        """One group commit (the caller holds the lock): each task's result or error."""
        self.commits += 1
        self.committed += len(writes)
        try:
            self._check_leading()
            results: list[Any] = list(
                self.service.ledger.execute_each(
                    [t.command for t in writes],  # type: ignore[misc]
                    [t.key for t in writes],
                )
            )
        except LedgerError as err:  # an expected refusal of the whole commit: one line
            # (fenced: another server leads; the store away), never a traceback (atk60-ha)
            log.warning("group commit of %d command(s) not taken: %s", len(writes), err.message)
            results = [err] * len(writes)
        except Exception as err:  # the store failed: nobody is acknowledged
            _failed("group commit failed", err)
            results = [err] * len(writes)
        if any(  # an accepted submission (a refused one gives the dispatcher nothing new)
            isinstance(t.command, SubmitJob) and not isinstance(r, BaseException)
            for t, r in zip(writes, results, strict=True)
        ):
            self._cycle_soon()
        return list(zip(writes, results, strict=True))

    def _cycle_soon(self) -> None:
        """A submission brings the next cycle forward to `quiet_s` from now (a burst's other
        submissions join it), at most once per `tick_s`: a job waits for the cycle that places
        it no longer than one cycle, not the rest of the interval too, and a stream of
        submissions costs at most twice the cycles."""
        now = time.monotonic()
        if now - self._early_at < self.tick_s or self._next_cycle <= now + self.quiet_s:
            return
        self._early_at = now
        self._next_cycle = now + self.quiet_s
        self._queue.put(_WAKE)  # a worker asleep until the old time wakes for the new one

    def _cycle(self) -> None:
        if not self.leading():
            if self.accepting:  # a standby that stops has nothing to follow the log for
                self._follow()
            return
        if not self.acting():  # the lease ran out: nothing acts; the next turn steps down
            self._next_cycle = time.monotonic() + self.follow_s
            return
        self._moved_at = time.monotonic()
        clock = self.service.clock
        try:
            result = self.service.step(clock.now())
        except LedgerError as err:
            log.error("cycle failed: %s", err.line())
            self._next_cycle = time.monotonic() + self.tick_s
            return
        except Exception as err:
            _failed("cycle failed", err)
            self._next_cycle = time.monotonic() + self.tick_s
            return
        self.follow_error = None  # the store answers (a standby that now leads said otherwise)
        self.read_at = time.monotonic()
        self._next_cycle = time.monotonic() + wait_time(result, self.tick_s, clock.now())

    def _follow(self) -> None:
        """A standby's turn: fold what the log gained (reads answer at that position); while
        the store does not answer, every 2 s (the reads in between answer from what is held)."""
        self._next_cycle = time.monotonic() + (
            self.follow_s if self.follow_error is None else max(self.follow_s, 2.0)
        )
        before = self.service.ledger.position
        try:
            if self.service.follow() != before:
                self._moved_at = time.monotonic()
        except Exception as err:
            why = (str(err).strip().splitlines() or [type(err).__name__])[0]
            if self.follow_error is None:
                log.error("cannot follow the log: %s", why)
            self.follow_error = why
            return
        if self.follow_error is not None:
            log.warning("following the log again at position %d", self.service.ledger.position)
        self.follow_error, self.read_at = None, time.monotonic()


STORE_MODULES = ("psycopg", "psycopg_pool", "eventsourcing")
"""The packages whose errors are the store's (named, not imported: the server imports neither)."""


def store_failed(err: BaseException) -> bool:
    """Pure: is `err` the store's own error (PostgreSQL's: a lock or statement timeout, a
    connection lost), said in one line rather than a traceback? The deposed leader of a store
    whose table a DBA locked logged 45 lines a cycle (atk61-ha F4)."""
    return type(err).__module__.split(".")[0] in STORE_MODULES


def _failed(what: str, err: BaseException) -> None:
    """Log `what` failed: the store's error (a lock, a timeout, a connection) in one line,
    anything else with its traceback."""
    if store_failed(err):
        log.error("%s: the store: %s", what, (str(err).strip().splitlines() or ["?"])[0])
    else:
        log.error("%s", what, exc_info=err)


def _take(tasks: list[_Task], item: _Task | list[_Task] | None) -> None:
    """`item` of the worker's queue added to the turn's `tasks` (None and `_WAKE`: none)."""
    if isinstance(item, list):
        tasks += item
    elif item is not None and item is not _WAKE:
        tasks.append(item)


def _resolve_all(done: list[tuple[_Task, Any]]) -> None:
    """Hand the results to the HTTP side: one wake-up of each event loop for the whole batch
    (a group commit of 8 answers 8 requests with one call, not 8)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Task, Any]]] = {}
    for task, result in done:
        if task.loop is not None:
            by_loop.setdefault(task.loop, []).append((task, result))
    for loop, settled in by_loop.items():
        loop.call_soon_threadsafe(_settle, settled)


def _settle(settled: list[tuple[_Task, Any]]) -> None:
    for task, result in settled:
        _settle_one(task, result)


def _settle_one(task: _Task, result: Any) -> None:
    """On the task's event loop: answer its request (unless its client has gone)."""
    if task.future is None or task.future.done():
        return
    if isinstance(result, BaseException):
        task.future.set_exception(result)
    else:
        task.future.set_result(result)


def _refuse(future: asyncio.Future[Any], err: BaseException) -> None:
    if not future.done():
        future.set_exception(err)
