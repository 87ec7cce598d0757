"""A lane of the read pool shared fairly by the people reading (docs/security.md, row T5).

The API's reads run on three lanes (small reads, big pages, the reads of the live state on a
copy: `ledger.server.readpool`) of two threads each. Served in arrival order, with the lane
resting after each read, one person looping heavy reads put their reads and their rests in
front of everyone else's: another person's dashboard waited for them. Here each person has a
queue of their own and **one read under way at a time**, the threads serve the person served
longest ago first, and **the rest is the person's**, not the lane's (`Turns`: each person
spends credit that fills at an equal share of the lane's quarter of the time, so the lane is
busy about a quarter of the time at most whoever reads). One person looping reads, however
long each, holds one thread and rests after their own reads; another person's read takes the
other thread at once: it waits for no read of theirs. With k people looping, another's read
waits at most for the shortest of the reads under way.

**Work shared by everyone is nobody's** (`shared_work`): a value every reader builds on and
the server keeps (the dispatcher's preview of the whole queue that the queue and job pages,
`/metrics` and `queue`/`explain` share, `/metrics`' window figures: `ReadCache.shared`), computed
or waited for inside a read, is not charged to whoever happened to ask for it first. Charged,
a person's page at a new log position paid the whole queue's preview (0.1-0.3 s at 10,000
pending) and their next reads rested three times as long: the job page and a warm `/metrics`
scrape of the page benchmark waited 0.2-1.3 s for 0.03-0.12 s of work (issue 29). It stays
bounded without the charge: such a value is computed at most once per log position and
`ReadCache.fresh_s`, whoever asks and however often.

An edge: threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from schemas.errors import TooBusy

T = TypeVar("T")


_charging = threading.local()
"""The lane read running on this thread (`FairLane._serve`): the lane's clock of work (None: no
lane read) and the work its read spent on shared work so far (`shared_work`)."""


@contextlib.contextmanager
def shared_work() -> Iterator[None]:
    """The block is work shared by every reader (see the module docstring): on a lane's
    thread, its time is not charged to the person whose read runs there."""
    clock: Callable[[], float] | None = getattr(_charging, "clock", None)
    if clock is None:
        yield
        return
    began = clock()
    try:
        yield
    finally:
        _charging.shared += clock() - began


@dataclass
class _Read:
    fn: Callable[[], Any]
    at: float
    """When it was handed to the lane (the lane's clock)."""
    done: Future[Any] = field(default_factory=Future)


@dataclass
class Turns:
    """Whose read runs next: the people with reads waiting, served round-robin, each while they
    have credit. Pure: `now` is a parameter.

    Each person's credit is lane time: it fills at an equal share of the lane's duty (1 /
    (1 + `rest`) of the time, shared by the people reading now) up to `burst_s`, and each read
    spends its time (its work: `FairLane.work`). A person with no credit left waits until it is
    back to zero: one person alone looping reads that take t each waits `rest` x t between
    them; a person who reads now and then (a dashboard loading its parts) has credit and never
    waits for a rest at all."""

    rest: float = 3.0
    burst_s: float = 1.0
    """The most lane time a person may spend at once after a pause."""
    cap_s: float = 10.0
    """The longest a person waits for their credit (a read stopped at the time limit is not
    held against its reader longer than the limit)."""
    waiting: dict[str, deque[Any]] = field(default_factory=dict)
    """Each person's reads, oldest first."""
    running: set[str] = field(default_factory=set)
    """The people with a read under way (one each at a time: `next` skips them)."""
    served: dict[str, int] = field(default_factory=dict)
    """The turn each person was last served at (`next`)."""
    turn: int = 0
    credit: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Each person's credit in seconds and when it was last counted (a person absent is full:
    `burst_s`)."""

    def add(self, person: str, read: Any) -> None:
        self.waiting.setdefault(person, deque()).append(read)

    def _share(self) -> float:
        """Lane time per second each person reading earns: the lane's duty shared equally by
        the people waiting or spending credit they have not earned back."""
        reading = set(self.waiting) | set(self.credit)
        return 1.0 / (1.0 + self.rest) / max(1, len(reading))

    def balance(self, person: str, now: float) -> float:
        """`person`'s credit at `now`."""
        got, at = self.credit.get(person, (self.burst_s, now))
        return min(self.burst_s, got + (now - at) * self._share())

    def next(self, now: float) -> tuple[str, Any] | float | None:
        """The next (person, read) to run: of the people waiting with credit, the one served
        longest ago (never: first, in the order they came); or, when everyone waiting is out of
        credit, the moment the first has some again; None when no read waits."""
        soonest: float | None = None
        chosen: str | None = None
        for person in self.waiting:
            if person in self.running:  # one read of a person's at a time
                continue
            left = self.balance(person, now)
            if left < 0:
                ready = now + min(-left / self._share(), self.cap_s)
                soonest = ready if soonest is None else min(soonest, ready)
            elif chosen is None or self.served.get(person, -1) < self.served.get(chosen, -1):
                chosen = person
        if chosen is None:
            return soonest
        reads = self.waiting[chosen]
        read = reads.popleft()
        if not reads:
            del self.waiting[chosen]
        self.turn += 1
        self.served[chosen] = self.turn
        self.running.add(chosen)
        return chosen, read

    def ran(self, person: str, took: float, now: float) -> None:
        """`person`'s read took `took` (ending `now`): spent from their credit, at most
        `cap_s` worth of waiting below zero."""
        self.running.discard(person)
        for who in list(self.credit):
            if who not in self.waiting and self.balance(who, now) >= self.burst_s:
                del self.credit[who]  # full again, nothing waiting: forgotten
                self.served.pop(who, None)
        left = self.balance(person, now) - took
        self.credit[person] = (max(left, -self.cap_s * self._share()), now)


@dataclass
class FairLane:
    """`threads` threads running `Turns`' choice of read (see the module docstring)."""

    turns: Turns = field(default_factory=Turns)
    name: str = "live-reads"
    threads: int = 2
    """Threads serving the lane; a person has one read under way at most (`Turns.running`), so
    one person looping long reads holds one thread and another person's read takes the other."""
    clock: Callable[[], float] = time.monotonic
    work: Callable[[], float] = time.thread_time
    """What a read is charged (`Turns.ran`): the CPU time of the lane's thread while it ran,
    shared work left out: its own work, not the time it waited for a CPU or the interpreter
    lock. Its wall time was charged: at load 18 a project's Budget review took 70-100 ms of
    CPU and 250-630 ms in the lane (the rest waiting for a CPU, `/proc` schedstat), its reader
    rested three times that, and her next pages waited 0.7-1.8 s for their turn (s61-dash)."""
    reads: int = 0
    """Reads the lane ran so far, and the time they waited for their turn (a thread, their
    reader's rest: `gpuledger_read_lane_wait_seconds`):"""
    waited_s: float = 0.0
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _started: list[threading.Thread] = field(default_factory=list)
    _stopped: bool = False

    def submit(self, person: str, fn: Callable[[], T]) -> Future[T]:
        """`fn()` in `person`'s turn on the lane's thread; its outcome in the future."""
        read = _Read(fn, self.clock())
        with self._cond:
            while len(self._started) < self.threads:
                thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                thread.start()
                self._started.append(thread)
            self.turns.add(person, read)
            self._cond.notify_all()
        return read.done

    def stop(self) -> None:
        """No read is taken any more (the ones waiting are cancelled); the one under way ends
        as it would (`joined` waits for it)."""
        with self._cond:
            self._stopped = True
            for reads in self.turns.waiting.values():
                for read in reads:
                    read.done.cancel()
            self._cond.notify_all()

    def joined(self, until: float) -> bool:
        """After `stop`: wait until the lane's threads have ended, or `until` (`time.monotonic`)
        passed; whether they all ended."""
        for thread in self._started:
            thread.join(max(0.0, until - time.monotonic()))
        return not any(thread.is_alive() for thread in self._started)

    def _serve(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                got = self.turns.next(self.clock())
                if not isinstance(got, tuple):
                    self._cond.wait(None if got is None else max(0.0, got - self.clock()))
                    continue
            person, read = got
            began, worked = self.clock(), self.work()
            _charging.clock, _charging.shared = self.work, 0.0
            if read.done.set_running_or_notify_cancel():
                try:
                    read.done.set_result(read.fn())
                except BaseException as err:  # handed to the reader, who raises it
                    read.done.set_exception(err)
            _charging.clock = None
            took = max(0.0, self.work() - worked - _charging.shared)  # their own work only
            with self._cond:
                self.reads += 1
                self.waited_s += max(0.0, began - read.at)
                self.turns.ran(person, took, self.clock())
                self._cond.notify_all()  # their next read, or a rest's end, may be due


@dataclass(frozen=True)
class End:
    """How a piece of `FairSlot` ended: its number, what it was about (`hold`'s `about`), "ok",
    "failed" (it raised) or "stopped" (cancelled: its client left, or the server stops), and when
    (the slot's clock)."""

    number: int
    about: Any
    how: str
    at: float


@dataclass
class FairSlot:
    """One piece of heavy work at a time server-wide (a what-if, a job page's replay), the
    people waiting served in turn on the event loop, by rounds: each person's first waiting
    piece goes in the round under way, in the order they came, and each further piece of
    theirs (or one asked while theirs holds the slot) a round after their last. One person
    looping them delays another's by the one under way at most (a manager re-asking as soon as
    hers ended kept every other manager's what-if 429 for good, atk44-25 F2; one person's looped
    replays queued in front of another's, F3), and a newcomer never goes before anyone waiting
    in an earlier round or earlier in the same one: with one piece a person (a what-if), the
    people waiting go in the order they came, and the number before one only falls (the person
    served longest ago went first, so a newcomer could go before someone already waiting:
    "waiting for 1 what-if ahead of yours" became 2, atk51-29 F4). `per_person`: the most of
    one person's under way or waiting (past it, 429); `max_waiting`: everyone's waiting (past
    it, 429)."""

    what: str
    per_person: int = 1
    max_waiting: int = 16
    busy: bool = False
    waiting: dict[str, deque[tuple[int, int, asyncio.Future[None]]]] = field(default_factory=dict)
    """Each person's pieces waiting: (round, arrival, its future), in the order they go."""
    held: dict[str, int] = field(default_factory=dict)
    """Each person's under way or waiting."""
    last: dict[str, int] = field(default_factory=dict)
    """The round of each person's latest piece under way or waiting."""
    round: int = 0
    """The round of the piece that last took the slot."""
    arrived: int = 0
    holder: str | None = None
    """Whose work holds the slot, since `began` (`clock`)."""
    began: float = 0.0
    about: dict[str, Any] = field(default_factory=dict)
    """What each person's latest piece under way or waiting is about (`hold`'s `about`)."""
    numbered: int = 0
    """Pieces taken so far: each is named by its number (`asked`, `ended`), in this server's
    start only (another start numbers from 1 again)."""
    numbers: dict[str, int] = field(default_factory=dict)
    """The number of each person's latest piece under way or waiting."""
    ends: dict[str, End] = field(default_factory=dict)
    """Each person's last piece that ended, for `keep_s` (`ended`)."""
    keep_s: float = 600.0
    clock: Callable[[], float] = time.monotonic

    @contextlib.asynccontextmanager
    async def hold(self, person: str, about: Any = None) -> AsyncIterator[None]:
        """The slot for the block, in `person`'s turn (TooBusy past `per_person` or
        `max_waiting`). `about`: what the piece is about, for `asked` while it waits or runs,
        and `ended` after."""
        self.refuse(person)
        mine = self.last[person] + 1 if person in self.held else self.round
        self.held[person] = self.held.get(person, 0) + 1
        self.about[person] = about
        self.last[person] = max(mine, self.round)
        self.numbered += 1
        number = self.numbers[person] = self.numbered
        how = "stopped"  # (cancelled: its client left, or the server stops)
        try:
            if self.busy:
                await self._wait(person, self.last[person])
            self.busy = True
            self.holder, self.began = person, self.clock()
            try:
                yield
                how = "ok"
            except Exception:
                how = "failed"
                raise
            finally:
                self.holder = None
                self._next()
        finally:
            self._ended(person, End(number, about, how, self.clock()))
            self.held[person] -= 1
            if not self.held[person]:
                del self.held[person]
                del self.last[person]
                del self.about[person]
                del self.numbers[person]

    def asked(self, person: str) -> Any:
        """What `person`'s piece under way or waiting is about (None: none): another tab of
        hers knows of the what-if one asked (atk53-29 F6: it did not, and its Run said 429)."""
        return self.about.get(person)

    def number(self, person: str) -> int | None:
        """The number of `person`'s piece under way or waiting (None: none)."""
        return self.numbers.get(person)

    def ended(self, person: str) -> End | None:
        """`person`'s last piece that ended, if it ended in the last `keep_s`: another tab of
        hers that saw it under way tells its end from its loss with a server that stopped (a
        server started again has no such piece, and numbers from 1 again; atk55-29 F1)."""
        end = self.ends.get(person)
        return end if end is not None and self.clock() - end.at <= self.keep_s else None

    def _ended(self, person: str, end: End) -> None:
        self.ends[person] = end
        for who in [p for p, e in self.ends.items() if end.at - e.at > self.keep_s]:
            del self.ends[who]

    def place(self, person: str) -> tuple[int, float | None]:
        """Where `person`'s work stands: (how many go before it, the one under way counted;
        the seconds it has run, None while it waits or when it has none). The page shows it
        while it waits (atk50-29 F3: it said "running" while it only waited)."""
        if self.holder == person:
            return 0, self.clock() - self.began
        if person not in self.waiting:
            return 0, None
        mine = self.waiting[person][0][:2]
        ahead = sum(1 for q in self.waiting.values() for w in q if w[:2] < mine)
        return ahead + (1 if self.busy else 0), None

    def refuse(self, person: str) -> None:
        """TooBusy when `person` may not hold or wait for the slot now (`hold` would refuse)."""
        if self.held.get(person, 0) >= self.per_person:
            raise TooBusy(f"{self.what} of yours is under way", hint="retry when it ends",
                          retry_after=10)  # fmt: skip
        if self.busy and sum(len(q) for q in self.waiting.values()) >= self.max_waiting:
            raise TooBusy(f"{self.max_waiting} people wait for {self.what}",
                          hint="retry in a while", retry_after=10)  # fmt: skip

    async def _wait(self, person: str, turn: int) -> None:
        got: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.arrived += 1
        mine = (turn, self.arrived, got)
        self.waiting.setdefault(person, deque()).append(mine)
        try:
            await got
        except asyncio.CancelledError:
            if got.done() and not got.cancelled():
                self._next()  # handed the slot as it left: hand it on
            else:
                queue = self.waiting.get(person)
                if queue is not None and mine in queue:
                    queue.remove(mine)
                    if not queue:
                        del self.waiting[person]
            raise

    def _next(self) -> None:
        """Hand the slot to the piece waiting in the earliest round, the first come in it, or
        free it."""
        while self.waiting:
            person = min(self.waiting, key=lambda p: self.waiting[p][0][:2])
            queue = self.waiting[person]
            turn, _, got = queue.popleft()
            if not queue:
                del self.waiting[person]
            if not got.done():
                self.round = max(self.round, turn)
                got.set_result(None)
                return
        self.busy = False
