"""The pure meters of the server's connections (`ledger.server.connections`, docs/server.md
"Connections"): `Rates`, a bucket of requests per key (a source's without a valid token, an
account's), `Levels`, several buckets a request takes from at once (its address's, its
prefix's, everyone's without a token), and `Progress`, whether a connection's send has
stalled. Pure: `now` is a parameter."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Rates:
    """Each source's requests without a valid token: a bucket of `burst` requests filling at
    `per_s` a second, one taken per request; a request that finds it empty waits for its turn
    (its token taken ahead), at most `max_wait_s`, and past that is refused (nginx's
    `limit_req` with a delay). One client asking one request at a time is slowed to `per_s`,
    never refused; many at once are refused. Pure: `now` is a parameter."""

    per_s: float
    burst: float
    max_wait_s: float = 1.0
    level: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Each source's requests left (below zero: turns taken ahead) and when that was counted
    (a source absent is full)."""

    def take(self, source: str, now: float) -> float | None:
        """The seconds `source`'s request waits for its turn (0: none; taken), or None: it
        would wait longer than `max_wait_s` (refused, nothing taken: `retry_in` says when to
        ask again)."""
        left = self._left(source, now)
        wait = self.retry_in(source, now)
        if wait > self.max_wait_s:
            self.level[source] = (left, now)
            return None
        self.level[source] = (left - 1, now)
        if len(self.level) > PRUNE_AT:
            self._forget_full(now)
        return wait

    def retry_in(self, source: str, now: float) -> float:
        """The seconds until a request of `source`'s would be taken at once."""
        return max(0.0, (1 - self._left(source, now)) / self.per_s)

    def _left(self, source: str, now: float) -> float:
        left, at = self.level.get(source, (self.burst, now))
        return min(self.burst, left + max(0.0, now - at) * self.per_s)

    def _forget_full(self, now: float) -> None:
        for who, (left, at) in list(self.level.items()):
            if left + (now - at) * self.per_s >= self.burst:
                del self.level[who]


@dataclass
class Levels:
    """Buckets a request takes from together, one key each (its address's, its address
    prefix's, everyone's: `Front`'s requests without a valid token): it waits for its turn in
    the slowest, and is refused, taking from none, when any would make it wait past its
    `max_wait_s` (many addresses each under their own rate took, together, the worker's whole
    time from everyone with a token: atk38-25 F2). Pure: `now` is a parameter."""

    rates: tuple[Rates, ...]

    def take(self, keys: tuple[str, ...], now: float) -> float | None:
        """The seconds the request of `keys` (one per bucket) waits (taken from each), or None
        (refused, nothing taken: `refusing` says which bucket)."""
        if self.refusing(keys, now) is not None:
            return None
        waits = [rates.take(key, now) for rates, key in zip(self.rates, keys, strict=True)]
        return max((w for w in waits if w is not None), default=0.0)

    def refusing(self, keys: tuple[str, ...], now: float) -> int | None:
        """The first bucket that would refuse the request of `keys` (its index), or None."""
        for i, (rates, key) in enumerate(zip(self.rates, keys, strict=True)):
            if rates.retry_in(key, now) > rates.max_wait_s:
                return i
        return None

    def retry_in(self, keys: tuple[str, ...], now: float) -> float:
        """The seconds until a request of `keys` would be taken at once by every bucket."""
        return max(r.retry_in(k, now) for r, k in zip(self.rates, keys, strict=True))


PRUNE_AT = 4096
"""Sources a `Rates` remembers before forgetting those whose bucket is full again."""


@dataclass
class Progress:
    """Whether a connection's sending stalls: bytes wait in the server's buffer and none of
    them left for `stall_s`. Pure: `now`, the bytes written so far and those still buffered
    are parameters."""

    stall_s: float
    sent: int = 0
    """Bytes that had left the buffer when last seen, and when that count last grew (or bytes
    began to wait), and whether bytes waited then:"""
    since: float | None = None
    waiting: bool = False

    def observe(self, written: int, buffered: int, now: float) -> bool:
        """True when the send has stalled (see the class docstring)."""
        sent, waited = written - buffered, self.waiting
        self.waiting = buffered > 0
        if not self.waiting or not waited or self.since is None or sent > self.sent:
            self.sent, self.since = sent, now  # nothing waited, or bytes left: progress
            return False
        return now - self.since >= self.stall_s


WRITE_RATE_ENV = "GPULEDGER_WRITE_RATE"
"""Overrides `WRITE_BYTES_PER_S` (bytes a second)."""
WRITE_BURST_ENV = "GPULEDGER_WRITE_BURST"
"""Overrides `WRITE_BYTES_BURST` (bytes)."""
WRITE_BYTES_PER_S = 128 * 1024
"""How fast a person's allowance of bytes written to the log fills (7.5 MiB a minute)."""
WRITE_BYTES_BURST = 32 << 20
"""A person's allowance when full: a 10,000-task array of an ordinary command fits in it."""
READ_RATE_ENV = "GPULEDGER_READ_SENT_RATE"
"""Overrides `READ_BYTES_PER_S` (bytes a second)."""
READ_BURST_ENV = "GPULEDGER_READ_SENT_BURST"
"""Overrides `READ_BYTES_BURST` (bytes)."""
READ_BYTES_PER_S = 4 << 20
"""How fast a person's allowance of bytes of answers to their reads fills (`ReadPool.sent`:
kept answers too; atk47-29 F1: one user re-reading a kept 1.25 MB queue page ~54 times a
second, 67 MB/s of JSON, slowed everyone else's pages 8-60x). A dashboard refreshing every
few seconds reads well under a tenth of it."""
READ_BYTES_BURST = 32 << 20
"""A person's allowance of answers' bytes when full: the largest page
(`pooled.MAX_PAGE_BYTES`) is always answered from a full one."""


@dataclass
class Written:
    """Each person's bytes written to the log (atk44-25 F9: one user looping 4 MB submits and
    cancels grew the log ~15 MiB/s, for good, and slowed another's submits ~190x): a bucket of
    `burst` bytes filling at `per_s`. A write *reserves* what it may write before it is made
    (`reserve`: refused, nothing taken, while the person's bucket is below zero) and is settled
    at what it wrote once written (`settle`: its true size is known only then); a person whose
    bucket is below zero is refused until it is full enough again (`retry_in`). Writes under
    way at once have reserved theirs, so together they pass the burst by one request at most
    (checked before and charged after, 16 concurrent submits wrote 136 MiB against 32: atk44z
    F2). One request writes at most `schemas.bounds.MAX_REQUEST_WRITTEN`, so the debt is
    bounded. Pure: `now` is a parameter."""

    per_s: float = WRITE_BYTES_PER_S
    burst: float = WRITE_BYTES_BURST
    level: dict[str, tuple[float, float]] = field(default_factory=dict)

    def retry_in(self, who: str, now: float) -> float:
        """0 when `who` may write now, else the seconds until their bucket is above zero."""
        return max(0.0, -self._left(who, now) / self.per_s)

    def reserve(self, who: str, size: int, now: float) -> float:
        """Take `size` from `who`'s bucket and return 0 when they may write now, else the
        seconds to wait (`retry_in`), nothing taken."""
        wait = self.retry_in(who, now)
        if wait == 0:
            self.charge(who, size, now)
        return wait

    def settle(self, who: str, reserved: int, written: int, now: float) -> None:
        """A write that reserved `reserved` wrote `written`: the difference given back (or
        taken, when it wrote more)."""
        if written != reserved:
            self.charge(who, written - reserved, now)

    def charge(self, who: str, size: int, now: float) -> None:
        self.level[who] = (self._left(who, now) - size, now)
        if len(self.level) > PRUNE_AT:
            for key, (left, at) in list(self.level.items()):
                if left + (now - at) * self.per_s >= self.burst:
                    del self.level[key]

    def _left(self, who: str, now: float) -> float:
        left, at = self.level.get(who, (self.burst, now))
        return min(self.burst, left + max(0.0, now - at) * self.per_s)
