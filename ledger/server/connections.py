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
  line and headers are at most `HEADERS_MAX_BYTES` (64 KiB: 431, closed).
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
  served: a person's tokens and the job tokens of their jobs are one account (a job token
  was an account of its own: one user with 64 running jobs held 1,024 connections, F1), a
  node token its node's, and a Unix-socket connection is its OS account's from the moment it
  opens (its user name, or `uid N` with none); and `per_address`
  (`GPULEDGER_CONNECTIONS_PER_ADDRESS`, 64) of one TCP source (an address, an IPv6 address's
  /64) that are no one's yet (no request with a valid token); the next waits 2 s for a first
  request with a valid token, else 429 and closed: no address without a token holds it all.
- **Requests of no one are metered**: a request without a valid token (`/v1/health`, the
  OpenAPI document, the dashboard's page shells, a 401, a 404) takes from its source's bucket
  of `anonymous_burst` filling at `anonymous_per_s` (`GPULEDGER_ANONYMOUS_RATE`, 20 a second,
  twice that at once); past it, it waits for its turn, at most a second, and past that it is
  answered 429 with Retry-After, held `REFUSED_HOLD_S` (`Rates`: an outsider looping them
  slowed everyone's submits ~10x: atk36-25 F6). Identified requests never take from it.

`Tally` is pure, as `meters.Rates` and `meters.Progress` are; `Connection`, `Connections` and
`Front` are the edge: the event loop's transports and the ASGI front.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ipaddress
import logging
import math
import os
import socket
import struct
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ledger.server.meters import Progress, Rates
from schemas.errors import InvalidCommand, LedgerError, TooBusy, Unavailable

MAX_CONNECTIONS_ENV = "GPULEDGER_MAX_CONNECTIONS"
PER_PERSON_ENV = "GPULEDGER_CONNECTIONS_PER_PERSON"
SEND_STALL_ENV = "GPULEDGER_SEND_STALL_S"
LOCAL_ENV = "GPULEDGER_LOCAL_CONNECTIONS"
ADMIN_ENV = "GPULEDGER_ADMIN_CONNECTIONS"
PER_ADDRESS_ENV = "GPULEDGER_CONNECTIONS_PER_ADDRESS"
ANONYMOUS_RATE_ENV = "GPULEDGER_ANONYMOUS_RATE"
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
            if len(self.people.get(source, ())) >= lim.per_person:
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

    def claim(self, conn: int, person: str) -> bool:
        """`conn`'s request is `person`'s: False (left as it was) when `person` holds
        `per_person` other connections."""
        if self.owner.get(conn) == person:
            return True
        held = self.people.get(person, set())
        if len(held) >= self.limits.per_person:
            return False
        self._release(conn)
        self._unsourced(conn)
        self.owner[conn] = person
        self.people.setdefault(person, set()).add(conn)
        return True

    def hold_refusal(self, conn: int, person: str) -> bool:
        """Whether `conn`, refused past `person`'s `per_person` (`claim`), may have its answer
        held (`REFUSED_HOLD_S`): True for up to `per_person` of the account's at once, each
        then out of its TCP source's count (held there, a person looping refusals filled their
        address's `per_address` for everyone at it); False past them (answered at once)."""
        held = self.refusing.setdefault(person, set())
        if len(held) >= self.limits.per_person:
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
        person = self.owner.pop(conn, None)
        if person is not None:
            held = self.people[person]
            held.discard(conn)
            if not held:
                del self.people[person]

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
    """Requests without a valid token refused 429 (`Rates`), and those that waited their turn:"""
    delayed_anonymous: int = 0
    dropped_stalled: int = 0
    dropped_no_request: int = 0
    dropped_no_body: int = 0


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
    admissions, and who was admitted (a request is one read: `ReadPool.admitted`)."""

    releases: list[Callable[[], None]] = field(default_factory=list)
    admitted: set[str] = field(default_factory=set)


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
def _holding() -> Iterator[Held]:
    now = Held()
    token = _HELD.set(now)
    try:
        yield now
    finally:
        _HELD.reset(token)


class Front:
    """ASGI, in front of the app: each request's caller claims its connection (`Tally.claim`:
    past `per_person`, 429 and closed), and what the request held until sent
    (`release_after_sent`: its read admission) is released once the answer has left the
    server's buffers."""

    def __init__(
        self,
        app: Any,
        identify: Callable[[Any, str | None], Any],
        connections: Connections,
    ) -> None:
        self.app = app
        self.identify = identify
        self.connections = connections
        limits = connections.limits
        self.rates = Rates(limits.anonymous_per_s, limits.anonymous_burst)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        conn: Connection | None = scope.get(CONN) if scope["type"] == "http" else None
        if conn is None:
            await self.app(scope, receive, send)
            return
        person = self._person(scope)
        tally = self.connections.tally
        if not tally.first_request(id(conn), person):  # past its address's cap, no token
            self.connections.counts.refused_address += 1
            await _send_answer(send, self.connections.address_busy(conn.source))
            return
        if person is not None and not tally.claim(id(conn), person):
            self.connections.counts.refused_person += 1
            if tally.hold_refusal(id(conn), person):  # like every 429 (atk37-25 F5)
                await asyncio.sleep(REFUSED_HOLD_S)
            await _too_many(send, person, self.connections.limits.per_person)
            return
        if person is None:  # no one's: metered by its source (atk36-25 F6)
            now = asyncio.get_running_loop().time()
            wait = self.rates.take(conn.source, now)
            if wait is None:
                self.connections.counts.refused_anonymous += 1
                await asyncio.sleep(REFUSED_HOLD_S)
                retry = self.rates.retry_in(conn.source, now)
                await _anonymous_too_many(send, conn.source, self.rates.per_s, retry)
                return
            if wait > 0:
                self.connections.counts.delayed_anonymous += 1
                await asyncio.sleep(wait)
        with _holding() as holds:
            try:
                await self.app(scope, receive, send)
                if holds.releases:
                    await conn.sent()
            finally:
                for release in holds.releases:
                    release()

    def _person(self, scope: Any) -> str | None:
        """The account the request's caller counts against (`Identity.whose`), or None."""
        from ledger.server.identity import PEER_UID

        bearer = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                bearer = bytes(value).decode("latin-1")
        try:
            return str(self.identify(scope.get(PEER_UID), bearer).whose)
        except Exception:  # no identity: the app answers it (401) as before
            return None


REFUSED_HOLD_S = 0.25
"""How long a refused request (429: a read past its admission, `pooled`; a request of no one's
past its source's rate, or an account's connection past its `per_person`, up to `per_person`
of them at once: `Tally.hold_refusal`; `Front`) waits before its answer is sent: a client that
loops its refusals without heeding Retry-After makes a few a second per connection, and the
event loop, where the submits are committed, spends nothing on them meanwhile
(docs/security.md, row T5)."""


async def _too_many(send: Callable[[Any], Awaitable[None]], person: str, cap: int) -> None:
    err = TooBusy(
        f"{person!r} has {cap} connections open already",
        hint="close some, or send your requests on fewer",
        retry_after=1,
    )
    await _send_answer(send, answer(429, "Too Many Requests", err, 1))


async def _anonymous_too_many(
    send: Callable[[Any], Awaitable[None]], source: str, per_s: float, wait: float
) -> None:
    retry = max(1, math.ceil(wait))
    err = TooBusy(
        f"{source} sent more than {per_s:g} requests a second without a valid token",
        hint=f"retry in {retry} s, or send your token",
        retry_after=retry,
    )
    await _send_answer(send, answer(429, "Too Many Requests", err, retry))


async def _send_answer(send: Callable[[Any], Awaitable[None]], whole: bytes) -> None:
    """A whole answer (`answer`) sent through ASGI."""
    head, _, body = whole.partition(b"\r\n\r\n")
    headers = [tuple(line.split(b": ", 1)) for line in head.split(b"\r\n")[1:]]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})


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
