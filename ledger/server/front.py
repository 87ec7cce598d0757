"""The ASGI front of the server's app (docs/security.md, row T23; docs/server.md,
"Connections"): each request's caller claims its connection (`Tally.claim`), and every request
is metered before the app sees it:

- **A request of no one** (no valid token: `/v1/health`, the OpenAPI document, the dashboard's
  page shells, a 401, a 404) takes from three buckets at once (`meters.Levels`): its source's
  (`GPULEDGER_ANONYMOUS_RATE`, 20 a second), its address prefix's (`connections.prefix_of`, an
  IPv4 /24 or IPv6 /48: `GPULEDGER_ANONYMOUS_PREFIX_RATE`, 40) and everyone's
  (`GPULEDGER_ANONYMOUS_TOTAL_RATE`, 100), each twice that at once; it waits for its turn, at
  most a second, and past that is answered 429 with Retry-After. (Per source only, an outsider
  looping them from one address slowed everyone's submits ~10x, atk36-25 F6; from 64 addresses
  each under its own rate, 1,475 a second slowed them ~9x, atk38-25 F2.)
- **A request with a valid token** takes from its account's bucket (`GPULEDGER_REQUEST_RATE`,
  50 a second, twice that at once), whatever its route: past a quarter second's wait, 429 with
  Retry-After (one user's 404s and whoamis on her 16 connections, never counted, slowed another
  person's submits 7-12x: atk38-25 F3; a job token takes from its owner's jobs' bucket,
  `Identity.pool`). Each account has a bucket of its own, so one's flood
  never takes another's turns; the ledger's admins and the nodes' agents (whose reports and
  heartbeats the scheduler lives on) are never metered.

Every refusal is held `REFUSED_HOLD_S` before it is sent and closes its connection.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

from ledger.server import encoding
from ledger.server.connections import (
    CONN,
    REFUSED_HOLD_S,
    Connection,
    Connections,
    Held,
    _holding,
    answer,
    prefix_of,
)
from ledger.server.meters import Levels, Rates
from schemas.errors import InvalidCommand, TooBusy

EVERYONE = ""
"""The key of everyone's bucket of requests without a token."""

ACCOUNT_WAIT_S = 0.25
"""How long a request with a token may wait for its account's turn before it is refused: a
client asking one at a time (or a dozen at once) is slowed to the rate, never refused; one
asking on its 16 connections as fast as it can is refused."""


def _anonymous_levels(connections: Connections) -> Levels:
    lim = connections.limits
    return Levels(
        tuple(
            Rates(per_s, 2 * per_s)
            for per_s in (
                lim.anonymous_per_s,
                lim.anonymous_prefix_per_s,
                lim.anonymous_total_per_s,
            )
        )
    )


class Front:
    """ASGI, in front of the app: each request's caller claims its connection (`Tally.claim`:
    past its account's cap, 429 and closed), each request is metered (the module's
    docstring), and what the request held until sent (`release_after_sent`: its read
    admission) is released once the answer has left the server's buffers."""

    def __init__(
        self,
        app: Any,
        identify: Callable[[Any, str | None], Any],
        connections: Connections,
        unmetered: Callable[[Any], bool] = lambda _who: False,
    ) -> None:
        self.app = app
        self.identify = identify
        self.connections = connections
        self.unmetered = unmetered
        """Whether an identity's requests are never metered (the ledger's admins, nodes)."""
        self.squeezed = encoding.Squeezed()
        """The large answers' gzip'd bytes, kept (`encoding.Squeezed`)."""
        limits = connections.limits
        self.anonymous = _anonymous_levels(connections)
        self.accounts = Rates(limits.account_per_s, 2 * limits.account_per_s, ACCOUNT_WAIT_S)
        self.stop_reads: Callable[[], object] = lambda: True
        """Called once the listeners have stopped: ends the app's read threads
        (`ReadPool.stop`) before the interpreter's end."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        conn: Connection | None = scope.get(CONN) if scope["type"] == "http" else None
        if scope["type"] == "http":  # HEAD as GET, gzip (`ledger.server.encoding`)
            scope, head = encoding.head_as_get(scope)
            gzip_ok = encoding.accepts_gzip(scope)
            send = encoding.wrap(send, head=head, gzip_ok=gzip_ok, kept=self.squeezed)
        if conn is None:
            await self.app(scope, receive, send)
            return
        if sum(name == b"authorization" for name, _ in scope["headers"]) > 1:
            # the meter and the app would each read another one (atk39-25 F2: a person's real
            # token for the app, a junk one for the meter: 40 connections against a cap of 16)
            err = InvalidCommand("more than one Authorization header", hint="send one token")
            await _send_answer(send, answer(400, "Bad Request", err, None), 400)
            return
        person, pool, metered = self._person(scope)
        tally = self.connections.tally
        if not tally.first_request(id(conn), person):  # past its address's cap, no token
            self.connections.counts.refused_address += 1
            await _send_answer(send, self.connections.address_busy(conn.source))
            return
        if person is not None and not tally.claim(id(conn), person, pool):
            self.connections.counts.refused_person += 1
            if tally.hold_refusal(id(conn), person):  # like every 429 (atk37-25 F5)
                await asyncio.sleep(REFUSED_HOLD_S)
            full = len(tally.people.get(person, ())) >= self.connections.limits.cap(person)
            who, cap = (person, self.connections.limits.cap(person))
            if not full and pool is not None:
                who, cap = pool, self.connections.limits.per_person
            await _too_many(send, who, cap)
            return
        if person is None:
            if not await self._anonymous_turn(conn.source, send):
                return
        elif metered and not await self._account_turn(pool or person, send):
            return
        with _holding() as holds:
            try:
                # the answer's bytes are charged to its reader (`ReadPool.sent`), as its
                # requests are: never an admin's or a node's (unmetered)
                await self.app(scope, receive, _counting(send, holds) if metered else send)
                if holds.releases:
                    await conn.sent()
            finally:
                for release in holds.releases:
                    release()

    async def _anonymous_turn(self, source: str, send: Any) -> bool:
        """Wait for the turn of a request of no one's from `source` (its address's, its
        prefix's and everyone's buckets); False: refused (answered 429)."""
        counts = self.connections.counts
        keys = (source, prefix_of(source), EVERYONE)
        now = asyncio.get_running_loop().time()
        wait = self.anonymous.take(keys, now)
        if wait is None:
            level = self.anonymous.refusing(keys, now) or 0
            counts.refused_anonymous += 1
            counts.refused_anonymous_by[level] += 1
            await asyncio.sleep(REFUSED_HOLD_S)
            retry = self.anonymous.retry_in(keys, asyncio.get_running_loop().time())
            who = (source, f"{keys[1]}", "everyone")[level]
            per_s = self.anonymous.rates[level].per_s
            await _refuse(send, f"{who} sent more than {per_s:g} requests a second without a "
                                "valid token", "or send your token", retry)  # fmt: skip
            return False
        if wait > 0:
            counts.delayed_anonymous += 1
            await asyncio.sleep(wait)
        return True

    async def _account_turn(self, person: str, send: Any) -> bool:
        """Wait for the turn of a request of `person`'s account; False: refused (429)."""
        counts = self.connections.counts
        now = asyncio.get_running_loop().time()
        wait = self.accounts.take(person, now)
        if wait is None:
            counts.refused_account += 1
            await asyncio.sleep(REFUSED_HOLD_S)
            retry = self.accounts.retry_in(person, asyncio.get_running_loop().time())
            per_s = self.accounts.per_s
            await _refuse(send, f"{person!r} sent more than {per_s:g} requests a second",
                          "send fewer at once", retry)  # fmt: skip
            return False
        if wait > 0:
            counts.delayed_account += 1
            await asyncio.sleep(wait)
        return True

    def _person(self, scope: Any) -> tuple[str | None, str | None, bool]:
        """The account the request's caller counts against (`Identity.whose`), or None, its
        pool (`Identity.pool`), and whether its requests are metered."""
        from ledger.server.identity import PEER_UID

        bearer = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                bearer = bytes(value).decode("latin-1")
        try:
            who = self.identify(scope.get(PEER_UID), bearer)
        except Exception:  # no identity: the app answers it (401) as before
            return None, None, True
        return str(who.whose), who.pool, not self.unmetered(who)


async def _too_many(send: Callable[[Any], Awaitable[None]], person: str, cap: int) -> None:
    err = TooBusy(
        f"{person!r} has {cap} connections open already",
        hint="close some, or send your requests on fewer",
        retry_after=1,
    )
    await _send_answer(send, answer(429, "Too Many Requests", err, 1))


async def _refuse(
    send: Callable[[Any], Awaitable[None]], what: str, hint: str, wait: float
) -> None:
    retry = max(1, math.ceil(wait))
    err = TooBusy(what, hint=f"retry in {retry} s, {hint}", retry_after=retry)
    await _send_answer(send, answer(429, "Too Many Requests", err, retry))


async def _send_answer(
    send: Callable[[Any], Awaitable[None]], whole: bytes, status: int = 429
) -> None:
    """A whole answer (`connections.answer`) sent through ASGI."""
    head, _, body = whole.partition(b"\r\n\r\n")
    headers = [tuple(line.split(b": ", 1)) for line in head.split(b"\r\n")[1:]]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _counting(send: Any, holds: Held) -> Any:
    """`send` with the bytes of the answer's body counted in `holds.sent` (a read's answer
    is charged to its reader once sent, kept or not: `ReadPool.admitted`)."""

    async def counted(message: Any) -> None:
        if message["type"] == "http.response.body":
            holds.sent += len(message.get("body", b""))
        await send(message)

    return counted
