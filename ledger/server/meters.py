"""The pure meters of the server's connections (`ledger.server.connections`, docs/server.md
"Connections"): `Rates`, each source's bucket of requests without a valid token, and
`Progress`, whether a connection's send has stalled. Pure: `now` is a parameter."""

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
        wait = max(0.0, (1 - left) / self.per_s)
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
