"""The server's connections, bounded (docs/security.md, row T23; docs/server.md, "Connections").

One person opening many connections and asking for big answers (10,000-row pages, audit
tables) while reading them slowly or never (a slowloris on the response side) tied the server
up: an answer stopped counting against its person's read admission once computed, sat in the
server's memory for as long as the client liked, and connections piled up without a bound
until the process ran out of descriptors, when everyone's submits failed (issue 25). Here:

- **An answer counts until it is sent.** A read's admission (`ReadPool.admitted`) ends when
  its answer has left the server's buffers for the kernel, not when it is computed (`hold`:
  the request's task holds the release until `Connection.sent`), so a person's two reads at
  once are two answers being computed *or sent*, and everyone's 16 bound the memory held.
- **A send that stalls is dropped.** A connection with bytes waiting to be sent, none of which
  leave for `send_stall_s` (`GPULEDGER_SEND_STALL_S`, 10 s), is aborted (`Progress`); so is a
  connection that does not finish a request's headers within that time (a request-side
  slowloris: uvicorn's keep-alive timer is reset by every byte), and one whose request body
  stops coming for that time or is not whole within six times it (`body_awaited`); a request's
  line and headers are at most `HEADERS_MAX_BYTES` (64 KiB) and `HEADER_LINES_MAX` (100)
  lines (431, closed), its body needs a Content-Length (`protocol.body_length`: a
  Transfer-Encoding is 411), checked on the raw bytes before the parser (`protocol`, which
  also gives the parser one pipelined request at a time).
- **Connections are capped**: `max_connections` (`GPULEDGER_MAX_CONNECTIONS`, 1,024) open at
  once over TCP, the next answered 503 in one line and closed at once; the Unix socket has
  `local_reserve` (`GPULEDGER_LOCAL_CONNECTIONS`, 64) more that TCP never takes (an outsider
  refilling the cap over TCP kept the host's own admin out: atk36-25), and TCP's room while
  TCP does not use it: every connection counts against one total, `max_connections +
  local_reserve`, that TCP's admission checks too (TCP admitted its 1,024 beside a full socket:
  2,112 connections against the 1,344 files `serve` had sized, atk37-25 F4); the host's admins
  (root, a ledger admin's OS account) have `admin_reserve` (`GPULEDGER_ADMIN_CONNECTIONS`, 16)
  more on the socket that no one else takes (local accounts together filled the socket's
  reserve: F2). `per_person` (`GPULEDGER_CONNECTIONS_PER_PERSON`, 16) of one *account*,
  claimed or not, the next answered 429 with Retry-After and closed, while everyone else is
  served: a person's tokens are one account, a job's tokens its job's with `per_job`
  (`GPULEDGER_CONNECTIONS_PER_JOB`, 4: counted as their owner's, a manager's job tokens for a
  member's job locked her out, atk38-25 F6; each its own at 16, one user with 64 running jobs
  held 1,024, atk37-25 F1), a node token its node's, and a Unix-socket connection is its OS
  account's from the moment it opens (its user name, or `uid N` with none); and `per_address`
  (`GPULEDGER_CONNECTIONS_PER_ADDRESS`, 64) of one TCP source (an address, an IPv6 address's
  /64) that are no one's yet (no request with a valid token); the next waits 2 s for a first
  request with a valid token, else 429 and closed: no address without a token holds it all.
  `serve` fits the caps to its open files (`fit_files`).
- **Requests are metered** (`ledger.server.front`): one without a valid token by its
  source's, its prefix's and everyone's buckets; one with a token by its account's.

`Tally` is pure, as `meters.Rates` and `meters.Progress` are; `Connection` and `Connections`
are the edge: the event loop's transports.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import ipaddress
import logging
import os
import socket
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ledger.server.meters import Progress
from schemas.errors import InvalidCommand, LedgerError, TooBusy, Unavailable

MAX_CONNECTIONS_ENV = "GPULEDGER_MAX_CONNECTIONS"
PER_PERSON_ENV = "GPULEDGER_CONNECTIONS_PER_PERSON"
SEND_STALL_ENV = "GPULEDGER_SEND_STALL_S"
LOCAL_ENV = "GPULEDGER_LOCAL_CONNECTIONS"
ADMIN_ENV = "GPULEDGER_ADMIN_CONNECTIONS"
PER_ADDRESS_ENV = "GPULEDGER_CONNECTIONS_PER_ADDRESS"
ANONYMOUS_RATE_ENV = "GPULEDGER_ANONYMOUS_RATE"
ANONYMOUS_PREFIX_ENV = "GPULEDGER_ANONYMOUS_PREFIX_RATE"
ANONYMOUS_TOTAL_ENV = "GPULEDGER_ANONYMOUS_TOTAL_RATE"
REQUEST_RATE_ENV = "GPULEDGER_REQUEST_RATE"
PER_JOB_ENV = "GPULEDGER_CONNECTIONS_PER_JOB"
CONN = "gpuledger.connection"
"""The scope key of the request's `Connection` (set by the server's protocol)."""


@dataclass(frozen=True)
class Limits:
    """How many connections, whose, and how long a send may stall."""

    max_connections: int = 1024
    per_person: int = 16
    send_stall_s: float = 10.0
    local_reserve: int = 64
    """Connections beyond `max_connections` that only the Unix socket may open."""
    admin_reserve: int = 16
    """Connections beyond those that only the host's admins may open, on the Unix socket."""
    per_address: int = 64
    """Connections of one TCP source that are no one's yet (no request with a valid token)."""
    anonymous_per_s: float = 20.0
    """Requests without a valid token a source may make a second (twice it at once)."""
    anonymous_prefix_per_s: float = 40.0
    """Those of one address prefix (`prefix_of`: an IPv4 /24, an IPv6 /48) together."""
    anonymous_total_per_s: float = 100.0
    """Those of everyone together (atk38-25 F2: 64 addresses made 1,475 a second)."""
    account_per_s: float = 50.0
    """Requests of one account a second (twice it at once), whatever their route: past a
    quarter second's wait, 429 (admins and nodes are not metered: `Front`)."""
    per_job: int = 4
    """Connections of one job's tokens (`@job:N`): its own allowance, not its owner's
    `per_person` (a manager's job tokens for a member's job locked her out: atk38-25 F6)."""
    token_wait_s: float = 2.0
    """How long a connection past its source's `per_address` has to send its first request's
    headers (`Tally.opened`: "waiting"): admitted only if that request has a valid token."""

    @property
    def most(self) -> int:
        """Every connection that can be open at once, both listeners' (what `serve` sizes its
        open files for)."""
        return self.max_connections + self.local_reserve + self.admin_reserve

    @property
    def check_s(self) -> float:
        """How often a connection with bytes waiting is looked at."""
        return min(1.0, self.send_stall_s / 4)

    @property
    def anonymous_burst(self) -> float:
        return 2 * self.anonymous_per_s

    def cap(self, account: str) -> int:
        """The connections `account` may hold: a job's `per_job`, anyone else's `per_person`."""
        return self.per_job if account.startswith("@job:") else self.per_person


def fit_files(limits: Limits, files: int, spare: int) -> Limits:
    """`limits` with every cap inside `files` open descriptors, `spare` of them kept for the
    server's own: as they are when `Limits.most` fits; else the admins' reserve, then the
    socket's, then TCP's cap shrunk to what is left (at most an eighth each for the two
    reserves), so the caps, not the descriptors, run out first and the admins' reserve is real
    (caps of 1,104 under a hard limit of 1,024: 17 tokenless addresses took every descriptor
    and root's `status` on the socket was reset, atk38-25 F7). InvalidCommand when fewer than
    16 TCP connections would fit. Pure."""
    room = files - spare
    if room >= limits.most:
        return limits
    admin = min(limits.admin_reserve, max(1, room // 8))
    local = min(limits.local_reserve, max(1, room // 8))
    tcp = room - admin - local
    if tcp < 16:
        raise InvalidCommand(
            f"open files limited to {files}: too few for the server's connections",
            hint=f"raise the limit (LimitNOFILE=) to at least {spare + admin + local + 16}",
        )
    return dataclasses.replace(
        limits, max_connections=tcp, local_reserve=local, admin_reserve=admin
    )


def positive_settings(
    env: dict[str, str], settings: tuple[tuple[str, str, type], ...]
) -> dict[str, Any]:
    """The server's numeric settings from the environment: (variable, field, int or float)
    each; only those set; InvalidCommand (one line) for a value that is not a positive number
    (the one reading of the read pool's and the connections' settings)."""
    out: dict[str, Any] = {}
    for name, key, kind in settings:
        text = env.get(name, "")
        if not text:
            continue
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise InvalidCommand(f"invalid {name} {text!r}", hint="give a positive number")
        out[key] = value
    return out


def limits_from_env(env: dict[str, str] | None = None) -> Limits:
    """The limits, with the environment's settings when set; InvalidCommand (one line) for a
    value that is not a positive number."""
    env = dict(os.environ) if env is None else env
    return Limits(
        **positive_settings(
            env,
            (
                (MAX_CONNECTIONS_ENV, "max_connections", int),
                (PER_PERSON_ENV, "per_person", int),
                (SEND_STALL_ENV, "send_stall_s", float),
                (LOCAL_ENV, "local_reserve", int),
                (ADMIN_ENV, "admin_reserve", int),
                (PER_ADDRESS_ENV, "per_address", int),
                (ANONYMOUS_RATE_ENV, "anonymous_per_s", float),
                (ANONYMOUS_PREFIX_ENV, "anonymous_prefix_per_s", float),
                (ANONYMOUS_TOTAL_ENV, "anonymous_total_per_s", float),
                (REQUEST_RATE_ENV, "account_per_s", float),
                (PER_JOB_ENV, "per_job", int),
            ),
        )
    )


def source_of(peer: Any) -> str:
    """Whose connections count together before a request names its caller: a TCP peer's
    address (an IPv6 address's /64, the prefix one site is given; an IPv4-mapped one as IPv4).
    Pure."""
    host = peer[0] if isinstance(peer, tuple) and peer else str(peer or "")
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


def prefix_of(source: str) -> str:
    """The address prefix a source's requests without a token are also counted by: an IPv4
    address's /24, an IPv6 source's /48 (one site); anything else (`uid N`) itself. Pure."""
    try:
        net = ipaddress.ip_network(source, strict=False)
    except ValueError:
        return source
    bits = 24 if net.version == 4 else 48
    return str(net.supernet(new_prefix=bits)) if net.prefixlen > bits else str(net)


def local_source(uid: int | None) -> str:
    """The account of a Unix-socket connection whose uid has no user name on this host."""
    return f"uid {uid}"


def os_account(uid: int | None) -> tuple[str, bool]:
    """The account a Unix-socket connection of `uid` counts against from the moment it opens
    (its user name, as the socket's requests act: `identity.from_peer`; `uid N` without one),
    and whether it is the host's admin (root; `Connections.whose_uid` adds the ledger's
    admins)."""
    import pwd

    try:
        return (pwd.getpwuid(uid).pw_name if uid is not None else local_source(uid)), uid == 0
    except (KeyError, OSError):
        return local_source(uid), uid == 0


@dataclass
class Tally:
    """Which connections are open, whose (the account of their latest request with a valid
    token; a Unix-socket connection's OS account from the start), and, while a TCP one is no
    one's, where from (its source). Pure.

    Every connection counts against one total: a TCP connection is refused when
    `max_connections` TCP ones are open or `max_connections + local_reserve` of both
    listeners'; a Unix-socket one when that total is reached, or, for the host's admins,
    `admin_reserve` more (`Limits.most`, what the open files are sized for). An account holds
    at most `per_person`, claimed by a token or opened on the socket; a TCP connection no one
    has claimed counts against its source's `per_address`."""

    limits: Limits = field(default_factory=Limits)
    open: set[int] = field(default_factory=set)
    local: set[int] = field(default_factory=set)
    """Of `open`, the Unix socket's."""
    owner: dict[int, str] = field(default_factory=dict)
    people: dict[str, set[int]] = field(default_factory=dict)
    pool_of: dict[int, str] = field(default_factory=dict)
    """Each connection of a job token: its job's owner's jobs' pool (`claim`), and by pool:"""
    pools: dict[str, set[int]] = field(default_factory=dict)
    source: dict[int, str] = field(default_factory=dict)
    """Each TCP connection no one has claimed yet: its source; and those by source:"""
    sources: dict[str, set[int]] = field(default_factory=dict)
    refusing: dict[str, set[int]] = field(default_factory=dict)
    """Each account's connections refused past its `per_person` whose answer is being held
    (`hold_refusal`), and their accounts:"""
    refused_for: dict[int, str] = field(default_factory=dict)
    waiting: dict[int, str] = field(default_factory=dict)
    """Each TCP connection opened past its source's `per_address`: its source (counted in the
    total, not its source's); and by source, oldest first, those with no headers yet:"""
    unheard: dict[str, dict[int, None]] = field(default_factory=dict)

    def opened(
        self, conn: int, source: str = "", *, local: bool = False, admin: bool = False
    ) -> str | None:
        """Count connection `conn` from `source` (`local`: the Unix socket's, `source` its OS
        account, which holds it from now on; `admin`: the host's admin there); None, "waiting"
        (counted, past its source's `per_address`: its first request decides, and it has
        `token_wait_s` to send it), or why it is refused (not counted): "server_full" (503) or
        "per_person" (429). (Refused at once past `per_address`, a node agent's and a standby's
        forwards were refused before their token was read: atk38-25 F4, F5.)"""
        lim = self.limits
        room = lim.max_connections + lim.local_reserve
        if local and admin:
            room += lim.admin_reserve
        tcp_full = not local and len(self.open) - len(self.local) >= lim.max_connections
        if tcp_full or len(self.open) >= room:
            return "server_full"
        if local:
            if len(self.people.get(source, ())) >= lim.cap(source):
                return "per_person"
            self.open.add(conn)
            self.local.add(conn)
            self.owner[conn] = source
            self.people.setdefault(source, set()).add(conn)
            return None
        self.open.add(conn)
        if len(self.sources.get(source, ())) >= lim.per_address:
            self.waiting[conn] = source
            self.unheard.setdefault(source, {})[conn] = None
            return "waiting"
        self.source[conn] = source
        self.sources.setdefault(source, set()).add(conn)
        return None

    def crowded(self, source: str) -> int | None:
        """The connection to refuse when `source` has more than `per_address` waiting with no
        headers (its oldest: an agent's sends its headers at once), or None: else one address
        would hold TCP's whole cap, opening connections every `token_wait_s`."""
        unheard = self.unheard.get(source, {})
        if len(unheard) <= self.limits.per_address:
            return None
        return next(iter(unheard))

    def headers_in(self, conn: int) -> None:
        """`conn`'s request's headers are in (or it is refused): a waiting one is no longer
        `crowded`'s to drop (its request decides)."""
        source = self.waiting.get(conn)
        if source is not None:
            self._unheard(conn, source)

    def first_request(self, conn: int, person: str | None) -> bool:
        """Whether the request of `person` (None: no valid token) may go on on `conn`: not a
        waiting connection's without a valid token (then refused 429, as past `per_address`).
        A waiting connection's with one goes on to `claim`, which makes it that account's."""
        return person is not None or conn not in self.waiting

    def claim(self, conn: int, person: str, pool: str | None = None) -> bool:
        """`conn`'s request is `person`'s (`pool`: a job token's, its owner's jobs' pool,
        `Identity.pool`): False (left as it was) when `person` holds its cap
        (`Limits.cap`) of other connections, or `pool` `per_person` (a job's tokens have
        `per_job`, an owner's jobs together `per_person`, never their owner's own: atk38-25
        F6; each job its own 16, one user's 64 jobs held 1,024, atk37-25 F1)."""
        if self.owner.get(conn) == person:
            return True
        held = self.people.get(person, set())
        if len(held) >= self.limits.cap(person):
            return False
        if pool is not None and len(self.pools.get(pool, ())) >= self.limits.per_person:
            return False
        self._release(conn)
        self._unsourced(conn)
        self.owner[conn] = person
        self.people.setdefault(person, set()).add(conn)
        if pool is not None:
            self.pool_of[conn] = pool
            self.pools.setdefault(pool, set()).add(conn)
        return True

    def hold_refusal(self, conn: int, person: str) -> bool:
        """Whether `conn`, refused past `person`'s `per_person` (`claim`), may have its answer
        held (`REFUSED_HOLD_S`): True for up to `per_person` of the account's at once, each
        then out of its TCP source's count (held there, a person looping refusals filled their
        address's `per_address` for everyone at it); False past them (answered at once)."""
        held = self.refusing.setdefault(person, set())
        if len(held) >= self.limits.cap(person):
            if not held:
                del self.refusing[person]
            return False
        self._unsourced(conn)
        held.add(conn)
        self.refused_for[conn] = person
        return True

    def closed(self, conn: int) -> None:
        self.open.discard(conn)
        self.local.discard(conn)
        self._release(conn)
        self._unsourced(conn)
        person = self.refused_for.pop(conn, None)
        if person is not None:
            held = self.refusing[person]
            held.discard(conn)
            if not held:
                del self.refusing[person]

    def _release(self, conn: int) -> None:
        for key, by in ((self.owner.pop(conn, None), self.people),
                        (self.pool_of.pop(conn, None), self.pools)):  # fmt: skip
            if key is not None:
                held = by[key]
                held.discard(conn)
                if not held:
                    del by[key]

    def _unheard(self, conn: int, source: str) -> None:
        unheard = self.unheard.get(source)
        if unheard is not None:
            unheard.pop(conn, None)
            if not unheard:
                del self.unheard[source]

    def _unsourced(self, conn: int) -> None:
        waited = self.waiting.pop(conn, None)
        if waited is not None:
            self._unheard(conn, waited)
        source = self.source.pop(conn, None)
        if source is not None:
            same = self.sources[source]
            same.discard(conn)
            if not same:
                del self.sources[source]


@dataclass
class Counts:
    """What the connections' limits did, for /metrics."""

    refused_full: int = 0
    refused_person: int = 0
    refused_address: int = 0
    refused_anonymous: int = 0
    """Requests without a valid token refused 429 (`front.Front`), by the bucket that refused
    them (their source's, prefix's, everyone's), and those that waited their turn:"""
    refused_anonymous_by: list[int] = field(default_factory=lambda: [0, 0, 0])
    delayed_anonymous: int = 0
    refused_account: int = 0
    """Requests with a valid token refused 429 for their account's rate, and those that waited
    their turn:"""
    delayed_account: int = 0
    dropped_stalled: int = 0
    dropped_no_request: int = 0
    dropped_no_body: int = 0
    refused_head: dict[str, int] = field(
        default_factory=lambda: {"headers": 0, "length": 0, "malformed": 0}
    )
    """Requests refused before they were parsed (`protocol.body_length`): "headers" (431: past
    64 KiB or 100 lines), "length" (411 for a Transfer-Encoding, 400 for a bad Content-Length),
    "malformed" (400: empty lines where a request line belongs, a request or header line the
    parser would refuse)."""


class Connection:
    """One client connection's transport as the app sees it: its writes of one turn of the
    event loop leave in one `send` (uvicorn writes a response's head and body apart: joined,
    a small answer is one segment and one wake-up), counted, and watched while bytes wait
    (`Progress`: a stalled send is aborted)."""

    def __init__(self, transport: asyncio.Transport, owner: Connections, source: str = "") -> None:
        self._transport = transport
        self._owner = owner
        self.source = source
        self._parts: list[bytes] = []
        self.written = 0
        self._progress = Progress(owner.limits.send_stall_s)
        self._watch: asyncio.TimerHandle | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._body_until: float | None = None
        self._lost = asyncio.Event()

    # the transport's interface, as uvicorn uses it
    def write(self, data: bytes) -> None:
        if not self._parts:
            asyncio.get_running_loop().call_soon(self._flush)
        self._parts.append(bytes(data))

    def _flush(self) -> None:
        if self._parts:
            data = b"".join(self._parts)
            self._parts.clear()
            if not self._transport.is_closing():
                self.written += len(data)
                self._transport.write(data)
                self._watch_sending()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    # the limits
    def buffered(self) -> int:
        """Bytes the server still holds for this connection (not yet the kernel's)."""
        if self._transport.is_closing() and self._lost.is_set():
            return 0
        return sum(map(len, self._parts)) + self._transport.get_write_buffer_size()

    async def sent(self) -> None:
        """Return once every byte written so far has left the server's buffers (or the
        connection is gone)."""
        await asyncio.sleep(0)  # this turn's writes are flushed
        while self.buffered() > 0 and not self._lost.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), SENT_POLL_S)

    def _watch_sending(self) -> None:
        if self._watch is None and self._transport.get_write_buffer_size() > 0:
            self._progress.observe(self.written, self.buffered(), self._now())
            self._watch = asyncio.get_running_loop().call_later(
                self._owner.limits.check_s, self._check
            )

    def _check(self) -> None:
        self._watch = None
        if self._lost.is_set():
            return
        buffered = self.buffered()
        if self._progress.observe(self.written, buffered, self._now()):
            self._owner.counts.dropped_stalled += 1
            self._abort()
            return
        if buffered > 0:
            self._watch = asyncio.get_running_loop().call_later(
                self._owner.limits.check_s, self._check
            )

    def awaiting_request(self) -> None:
        """No request under way: one must have its headers within `send_stall_s`, else the
        connection is closed (a request-side slowloris)."""
        self.request_begun()
        self._deadline = asyncio.get_running_loop().call_later(
            self._owner.limits.send_stall_s, self._no_request
        )

    def awaiting_token(self) -> None:
        """Opened past its source's `per_address` ("waiting"): its first request's headers in
        within `token_wait_s` (with a valid token: `Front`), else refused 429."""
        self.request_begun()
        wait = min(self._owner.limits.token_wait_s, self._owner.limits.send_stall_s)
        self._deadline = asyncio.get_running_loop().call_later(wait, self.refuse_unclaimed)

    def refuse_unclaimed(self) -> None:
        """Answer 429 (its source's unclaimed connections are at their cap) and close."""
        self._deadline = None
        self._owner.tally.headers_in(id(self))  # decided: never `crowded`'s again
        if not self._transport.is_closing():
            self._owner.counts.refused_address += 1
            self._transport.write(self._owner.address_busy(self.source))
            self._transport.close()

    def request_begun(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def body_awaited(self, now: float | None = None) -> None:
        """A request's headers are in: its body (none is a body that has arrived) must keep
        coming, some bytes every `send_stall_s`, and be whole within `BODY_STALLS` times
        that, else the connection is dropped (a body announced and never sent held a
        connection, a person's or, before any token was read, no one's, for as long as the
        client liked: atk36-25 F1)."""
        self.request_begun()
        self._owner.tally.headers_in(id(self))
        loop = asyncio.get_running_loop()
        self._body_until = (loop.time() if now is None else now) + (
            BODY_STALLS * self._owner.limits.send_stall_s
        )
        self.body_came()

    def body_came(self) -> None:
        """Some of the body arrived: the next must within `send_stall_s` (and all by the
        body's deadline)."""
        if self._body_until is None:
            return
        self.request_begun()
        loop = asyncio.get_running_loop()
        wait = min(self._owner.limits.send_stall_s, max(0.0, self._body_until - loop.time()))
        self._deadline = loop.call_later(wait, self._no_body)

    def body_done(self) -> None:
        self._body_until = None
        self.request_begun()

    def _no_body(self) -> None:
        self._deadline = None
        if not self._transport.is_closing():
            self._owner.counts.dropped_no_body += 1
            self._abort()

    def _no_request(self) -> None:
        self._deadline = None
        if not self._transport.is_closing():
            self._owner.counts.dropped_no_request += 1
            self._abort()

    def _abort(self) -> None:
        """Drop the connection with a reset: what the kernel still holds for it is freed at
        once (a plain close leaves it queued behind a FIN the client never takes)."""
        sock = self._transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._transport.abort()

    def lost(self) -> None:
        self._lost.set()
        self._owner.waiting.pop(id(self), None)
        self.request_begun()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self._owner.tally.closed(id(self))

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()


BODY_STALLS = 6
"""A request's body is whole within this many `send_stall_s` of its headers (60 s by default:
the largest body, a budget plan or a batch of submits, takes well under a second)."""

HEADERS_MAX_BYTES = 64 * 1024
"""A request's line and headers together (`PeerCredProtocol`): past it, one 431 line and the
connection closed (32 MiB of tiny header lines grew the server by 1.3 GB: atk36-25 F5)."""

SENT_POLL_S = 0.05
"""How often an answer still in the server's buffers is looked at (`Connection.sent`)."""


@dataclass
class Connections:
    """Every connection of the server's listeners (one count for the Unix socket and TCP)."""

    limits: Limits = field(default_factory=Limits)
    tally: Tally = field(init=False)
    counts: Counts = field(default_factory=Counts)
    whose_uid: Callable[[int | None], tuple[str, bool]] = os_account
    """A Unix-socket peer's account and whether it is the host's admin (`os_account`; the
    server adds the ledger's admins)."""
    said_full_at: float | None = None
    """When a refusal for the server's cap was last logged (once per `FULL_LOG_S`)."""
    waiting: dict[int, Connection] = field(default_factory=dict)
    """The connections opened past their source's `per_address` (`Tally.waiting`)."""

    def __post_init__(self) -> None:
        self.tally = Tally(self.limits)

    def made(
        self,
        transport: asyncio.Transport,
        source: str = "",
        *,
        local: bool = False,
        admin: bool = False,
    ) -> Connection | None:
        """A new connection from `source` (`local`: on the Unix socket, `source` its account;
        `admin`: the host's admin there): its `Connection`, or None (answered in one line and
        closed) past the server's cap (503) or its source's or account's (429;
        `Tally.opened`)."""
        conn = Connection(transport, self, source)
        refused = self.tally.opened(id(conn), source, local=local, admin=admin)
        if refused is None:
            conn.awaiting_request()
            return conn
        if refused == "waiting":  # its first request's token decides (atk38-25 F4, F5)
            self.waiting[id(conn)] = conn
            conn.awaiting_token()
            crowded = self.tally.crowded(source)
            if crowded is not None:
                self.waiting[crowded].refuse_unclaimed()
            return conn
        if refused == "server_full":
            self.counts.refused_full += 1
            self._say_full(local)
            lim = self.limits
            cap = lim.max_connections + (lim.local_reserve if local else 0)
            cap += lim.admin_reserve if local and admin else 0
            err: LedgerError = Unavailable(
                f"the server has {cap} connections open", hint="retry in a few seconds"
            )
            transport.write(answer(503, "Service Unavailable", err, 5))
        elif refused == "per_person":
            self.counts.refused_person += 1
            err = TooBusy(
                f"{source!r} has {self.limits.per_person} connections open already",
                hint="close some, or send your requests on fewer",
                retry_after=1,
            )
            transport.write(answer(429, "Too Many Requests", err, 1))
        transport.close()
        return None

    def address_busy(self, source: str) -> bytes:
        """The 429 answer of a connection of `source` past its `per_address` whose first
        request had no valid token (or did not come within `token_wait_s`)."""
        cap = self.limits.per_address
        err = TooBusy(
            f"{source} has {cap} connections open that no request with a token has claimed",
            hint="send your requests with your token, on fewer connections",
            retry_after=1,
        )
        return answer(429, "Too Many Requests", err, 1)

    @property
    def open(self) -> int:
        return len(self.tally.open)

    def _say_full(self, local: bool) -> None:
        """One line in the log, at most every `FULL_LOG_S`, when a connection is refused for
        the server's cap (an outage of the caps said nothing in the log: atk37-25 F4)."""
        now = asyncio.get_running_loop().time()
        if self.said_full_at is not None and now - self.said_full_at < FULL_LOG_S:
            return
        self.said_full_at = now
        lim, tally = self.limits, self.tally
        log.warning(
            "refusing %s connections (503): %d open, %d of them on the Unix socket; the caps "
            "allow %d over TCP and %d in all (%d more for the host's admins on the socket), "
            "the open files were sized for %d",
            "Unix-socket" if local else "TCP", len(tally.open), len(tally.local),
            lim.max_connections, lim.max_connections + lim.local_reserve, lim.admin_reserve,
            lim.most,
        )  # fmt: skip


FULL_LOG_S = 10.0
"""How often a refusal for the server's cap is said in the log, at most."""

log = logging.getLogger("gpuledger.server")


@dataclass
class Held:
    """What the request under way holds until its answer is sent: the releases of its read
    admissions, who was admitted (a request is one read: `ReadPool.admitted`), and the bytes
    of its answer's body sent so far (`Front`: charged to its reader, `ReadPool.sent`)."""

    releases: list[Callable[[], None]] = field(default_factory=list)
    admitted: set[str] = field(default_factory=set)
    sent: int = 0


_HELD: contextvars.ContextVar[Held | None] = contextvars.ContextVar("gpuledger_held", default=None)


def held() -> Held | None:
    """What the request under way holds (None outside a request `Front` serves)."""
    return _HELD.get()


def release_after_sent(release: Callable[[], None]) -> None:
    """`release()` once the answer of the request under way is sent (at once outside a
    request that `Front` serves)."""
    now = _HELD.get()
    if now is None:
        release()
    else:
        now.releases.append(release)


@contextlib.contextmanager
def apart() -> Iterator[None]:
    """The reads admitted in the block are released when it ends, not held until the request's
    answer is sent: for a request whose answer comes only after heavy work that waits its turn
    (a what-if, a job page's replay: `fairlane.FairSlot`, bounded on its own). Held to the
    answer, such a request counted as one of its person's reads and of everyone's for minutes:
    her other tabs were refused 429 meanwhile (atk51-29 F2)."""
    token = _HELD.set(None)
    try:
        yield
    finally:
        _HELD.reset(token)


@contextlib.contextmanager
def _holding() -> Iterator[Held]:
    now = Held()
    token = _HELD.set(now)
    try:
        yield now
    finally:
        _HELD.reset(token)


REFUSED_HOLD_S = 0.25
"""How long a refused request (429: a read past its admission, `pooled`; a request of no one's
past its source's rate, or an account's connection past its `per_person`, up to `per_person`
of them at once: `Tally.hold_refusal`; `Front`) waits before its answer is sent: a client that
loops its refusals without heeding Retry-After makes a few a second per connection, and the
event loop, where the submits are committed, spends nothing on them meanwhile
(docs/security.md, row T5)."""


def answer(status: int, phrase: str, err: LedgerError, retry_after: int | None) -> bytes:
    """A whole HTTP answer, problem+json (`schemas.api.Problem`, as the app's handlers answer
    an error), the connection closed after it (`retry_after` None: no Retry-After)."""
    import msgspec

    from schemas import api

    body = msgspec.json.encode(
        api.Problem(title=err.code, status=status, detail=err.line(), code=err.code,
                    message=err.message, hint=err.hint)
    )  # fmt: skip
    retry = b"" if retry_after is None else b"retry-after: %d\r\n" % retry_after
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/problem+json\r\n%s"
        b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
        % (status, phrase.encode(), retry, len(body), body)
    )
