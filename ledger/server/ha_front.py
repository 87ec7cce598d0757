"""The HTTP side of several servers on one store (`HAFront`): what a standby answers and where
writes go; the lease, the roles and the keeps are `ledger.server.ha`.

- A standby follows the log (its live state and projection stay warm), answers reads itself
  with the position it answers at (`X-Gpuledger-Position`; a client may ask for at least a
  position with `X-Gpuledger-Min-Position`, to read its own writes), and sends writes to the
  leader: a request with a bearer token is forwarded as it came (the leader authenticates it
  again); one that cannot be forwarded (a Unix socket's peer, the agent API, no leader known) is
  answered 503 naming the leader (`X-Gpuledger-Leader`), and the CLI and agents go there.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from ledger.server.ha import Leadership, store_words
from ledger.server.ha_wire import (
    ROLE_HEADER,
    abandon,
    body_within,
    connection,
    exchange,
    not_authenticated,
)
from ledger.server.store_seen import STALE_HEADER, stale_s
from ledger.wire import OUTCOME_HEADER
from schemas import api

Scope = Any
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]

POSITION_HEADER = "x-gpuledger-position"
MIN_POSITION_HEADER = "x-gpuledger-min-position"
LEADER_HEADER = "x-gpuledger-leader"
HOP_HEADER = "x-gpuledger-forwarded"
"""Set on a write a standby forwards: a server that does not lead refuses it rather than
forwarding it again (two standbys that each name the other never bounce a write around)."""
FORWARDED = {"authorization", "content-type", "accept", "idempotency-key", "x-request-id"}
"""The request headers a standby passes on with a forwarded write."""
KEEP_HEADER = "x-gpuledger-keep"
"""On a 503 to an agent: the server that led at this epoch cannot reach its store and keeps the
node's lease (the agent renews it by this answer; `ledger.agent.node`)."""
NODE_LEASE_HEADER = "x-gpuledger-node-lease"
"""On every answer to an agent: `<node-lost timeout>,<fence>` (s) it renews the node's lease
under; the agent renews by these alone (a keep said none: a job ran twice, atk39-28 F1)."""
STORE_HEADER = "x-gpuledger-store"
"""On a 503 because the store does not answer or commit: `away` (the CLI says it in one line)."""
READ_YOUR_WRITES_S = 5.0
"""How long a read that asks for a position waits for the standby to fold it."""
TAKEOVER_WAIT_S = 3.0
"""How long a write waits for a server that holds the lease (or may take it: nobody leads) to
take up the leader's work, before it is forwarded or refused."""
TOKEN_FOLD_S = 0.5
"""How long a standby waits for its folded state to hold a forwarded write's token (one made on
the leader moments ago) before it answers 401 itself."""
FORWARD_THREADS = 16
"""The threads a standby forwards writes on, its own (not the event loop's default executor,
which every `asyncio.to_thread` of the process shares)."""


class HAFront:
    """ASGI layer in front of the app on a server of several: a standby answers reads and sends
    writes to the leader; every answer says the role and the position it was made at."""

    def __init__(
        self,
        app: Any,
        ha: Leadership,
        position: Callable[[], int],
        keep_node: Callable[[str, str], bool] = lambda node, authorization: False,
        valid: Callable[[str], bool] = lambda authorization: True,
        read_at: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.app = app
        self.read_at = read_at
        """monotonic time of this server's last read of the log that answered (`stale_s`)."""
        self.ha = ha
        self.position = position
        self.keep_node = keep_node
        """(node, Authorization header) -> whether to keep that node's lease while the store is
        away: a node this server does not count lost, and that node's own token."""
        self.valid = valid
        """(Authorization header) -> whether this server's folded state holds it a valid token:
        a write forwarded only then (`_forwardable`)."""
        self._pool: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        agent = scope["path"].startswith("/v1/agent/")
        read = scope["method"] in ("GET", "HEAD") and not agent
        keeping = agent and self.ha.unreachable and self.ha.keeps()
        if not keeping and self.ha.acting():  # the leader's every request: nothing more to read
            await self.app(scope, receive, self._stamped(send, agent))
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if keeping:
            keep = await self._keep(scope, receive, headers)
            await self._refuse(send, "the store does not answer; "
                               + ("this server keeps the node's lease" if keep else "retry"),
                               keep=keep)  # fmt: skip
            return
        if self.ha.acting() or (read and scope["path"] in ("/v1/health", "/metrics")):
            await self.app(scope, receive, self._stamped(send, agent))
            return
        if read:
            want = headers.get(MIN_POSITION_HEADER, "")
            # ASCII digits only, at most a position's (atk48-ha F2: "²" passed `isdigit` and a
            # 5,000-digit value passed it too; `int` raised: a 500 and a traceback a request)
            if re.fullmatch(r"[0-9]{1,18}", want) and not await self._reached(int(want)):
                await self._refuse(send, f"this standby has not folded position {want} yet")
                return
            await self.app(scope, receive, self._stamped(send, agent))
            return
        away = self.ha.away()  # its own lease ran out unanswered: no election to wait for
        if away is None and await self._taking_over():
            await self.app(scope, receive, self._stamped(send, agent))
            return
        if away is None:  # the take it waited on had no answer for a statement's time: the
            away = self.ha.away()  # store's words, not "a standby" (atk61-ha F2)
        leader = self.ha.leader_address()
        forwardable = (
            "authorization" in headers
            and not scope["path"].startswith("/v1/agent/")
            and HOP_HEADER not in headers
        )
        if leader and leader != self.ha.lease.address and forwardable:
            if not await self._known(headers["authorization"]):
                await not_authenticated(send, self.ha.role)
                return
            await self._forward(leader, scope, receive, send, headers)
            return
        if away is not None:  # not "a standby": nobody can lead meanwhile, as far as it knows
            await self._refuse(send, f"{store_words(away)}: no write is taken until it does")
            return
        held = self.ha.held_back  # it handed back a lease it took: why (atk61-ha F1, F4)
        await self._refuse(send, self.ha.taking_up() or "this server is a standby"
                           + (f": it {held}" if held else ""))  # fmt: skip

    def _stamped(self, send: Send, agent: bool = False) -> Send:
        async def stamped(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                headers = list(message.get("headers", []))
                if not any(k.lower() == POSITION_HEADER.encode() for k, _ in headers):
                    # a read of the projection says its own position (ledger.server.pooled)
                    headers.append((POSITION_HEADER.encode(), str(self.position()).encode()))
                more = self._node_lease() if agent else self._stale()
                message["headers"] = [*headers, (ROLE_HEADER.encode(), self.ha.role.encode()),
                                      *more]  # fmt: skip
            await send(message)

        return stamped

    def _stale(self) -> list[tuple[bytes, bytes]]:
        """`STALE_HEADER` when this server's last read of the log is older than one lease."""
        read = self.read_at()
        if not read:
            return []
        age = stale_s(time.monotonic(), read, self.ha.acting(), self.ha.lease.lease_s)
        return [] if age is None else [(STALE_HEADER.encode(), f"{age:.1f}".encode())]

    def _node_lease(self) -> list[tuple[bytes, bytes]]:
        node = self.ha.lease.node  # `NODE_LEASE_HEADER` (none: no node settings)
        return [(NODE_LEASE_HEADER.encode(), f"{node[0]:g},{node[1]:g}".encode())] if node else []

    async def _taking_over(self) -> bool:
        """Wait, at most `TAKEOVER_WAIT_S`, while this server holds the lease and its worker is
        taking up the leader's work, or while no server leads and the store answers (an
        election is on): True once this server acts. (A server that has just started listens
        before its first turn takes the lease: its first writes used to be refused with "the
        leader is" itself.)"""
        deadline = time.monotonic() + TAKEOVER_WAIT_S
        while not self.ha.acting():
            leader = self.ha.leader_address()
            electing = not leader and self.ha.away() is None
            if not (self.ha.lease.may_act() or electing) or time.monotonic() > deadline:
                return False
            self.ha.notify()
            await asyncio.sleep(0.02)
        return True

    async def _known(self, authorization: str) -> bool:
        """Whether the write's token is valid in this standby's folded state, waiting at most
        `TOKEN_FOLD_S` for the log to bring it (a token made on the leader moments ago). One
        it never holds is answered 401 here, never forwarded: an outsider's writes with a junk
        token held the forwarding threads while the leader metered them by the standby's
        address, and every person's forwarded write waited behind them (atk37-25 F3)."""
        deadline = time.monotonic() + TOKEN_FOLD_S
        while not self.valid(authorization):
            if time.monotonic() > deadline:
                return False
            at = self.position()
            self.ha.notify()  # the worker follows the log at once
            while self.position() == at and time.monotonic() <= deadline:
                await asyncio.sleep(0.02)
        return True

    async def _reached(self, want: int) -> bool:
        deadline = time.monotonic() + READ_YOUR_WRITES_S
        while self.position() < want:
            if time.monotonic() > deadline:
                return False
            self.ha.notify()  # the worker follows the log at once
            await asyncio.sleep(0.02)
        return True

    async def _keep(self, scope: Scope, receive: Receive, headers: dict[str, str]) -> int:
        """The epoch to keep the calling node's lease by (0: not that node's): only a node this
        server does not count lost, asked with a token of that node."""
        node = ""
        if scope["method"] == "GET":
            from urllib.parse import parse_qs

            node = (parse_qs(scope["query_string"].decode()).get("node") or [""])[0]
        else:
            body, more = b"", True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return 0
                body += message.get("body", b"")
                more = message.get("more_body", False)
                if len(body) > 1 << 20:
                    return 0
            try:
                node = msgspec.json.decode(body, type=_NodeOnly).node
            except (msgspec.DecodeError, msgspec.ValidationError):
                return 0
        if not self.keep_node(node, headers.get("authorization", "")):
            return 0
        # said before it is decided: a report under way either carries it, or makes `keeps`
        # refuse (`Leadership.keeps`); a leader counts every reported keep (`keeping`)
        self.ha.kept_at = time.monotonic()
        return self.ha.keeps()

    async def _refuse(
        self, send: Send, why: str, keep: int = 0, status: int = 503, unknown: bool = False
    ) -> None:
        """A 503 (or `status`) in one line; `unknown`: the write went on to a leader that may
        have stored it (`OUTCOME_HEADER`: its client asks again under its key, never takes it
        for refused: atk51-ha F3)."""
        leader = self.ha.leader_address()
        where = f"the leader is {leader}" if leader else "no server leads right now"
        hint = "retry: the CLI and agents find the leader from their list of servers"
        if status == 504:
            hint = "`gpuledger log` and `gpuledger jobs` say what the ledger holds"
        away = self.ha.away() is not None
        if away:  # nobody can lead meanwhile: no leader to name
            leader, where = "", "reads still answer"
            hint = "retry once the store answers again; `gpuledger status` says when it does"
        body = msgspec.json.encode(
            api.Problem(
                title="unavailable",
                status=status,
                detail=f"{why}; {where}",
                code="unavailable",
                message=f"{why}; {where}",
                hint=hint,
            )
        )
        headers = [
            (b"content-type", b"application/problem+json"),
            (b"content-length", str(len(body)).encode()),
            (ROLE_HEADER.encode(), self.ha.role.encode()),
            (b"retry-after", b"1"),
        ]
        if leader:
            headers.append((LEADER_HEADER.encode(), leader.encode()))
        if away:
            headers.append((STORE_HEADER.encode(), b"away"))
        if unknown:
            headers.append((OUTCOME_HEADER.lower().encode(), b"unknown"))
        if keep:
            headers.append((KEEP_HEADER.encode(), str(keep).encode()))
            headers.extend(self._node_lease())
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _forward(
        self, leader: str, scope: Scope, receive: Receive, send: Send, headers: dict[str, str]
    ) -> None:
        """Send the write to `leader` and its answer back, for as long as `leader` is the one
        this server names: a leader frozen past its lease is named no more, and its successor
        takes the write, this server itself or the one it names (a keyed write is answered
        there by its key; a write without one is refused in one line, its fate unknown). A
        cancel through a standby waited 10 s on a frozen leader, then the CLI its own 10 s
        (atk37-28 F5)."""
        body = await body_within(receive, scope["path"], send, self.ha.role)
        if body is None:
            return
        query = scope["query_string"].decode()
        path = scope["path"] + (f"?{query}" if query else "")
        sent = {k: v for k, v in headers.items() if k in FORWARDED} | {HOP_HEADER: "1"}
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(FORWARD_THREADS, thread_name_prefix="gpuledger-fwd")
        conn = connection(leader)
        call = asyncio.get_running_loop().run_in_executor(
            self._pool, exchange, conn, scope["method"], path, body, sent
        )
        while not call.done() and self.ha.leader_address() == leader and not self.ha.acting():
            await asyncio.wait({call}, timeout=0.05)
        if not call.done():  # another leads, or nobody: the leader never answered
            abandon(conn)
            call.add_done_callback(lambda c: c.exception())  # its error is expected
            await self._after_forward(leader, scope, body, send, headers)
            return
        try:
            status, reply, kind, outcome = call.result()
        except ConnectionRefusedError as err:  # nothing was sent: not taken (atk61-ha F6)
            await self._refuse(send, f"the leader {leader} refused the connection ({err}): this "
                               "write was not sent, so it is not taken; retry")  # fmt: skip
            return
        except OSError as err:  # (sent, maybe taken: its answer lost)
            await self._refuse(send, f"the leader did not answer ({err})", unknown=True)
            return
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", kind.encode()),
                    (b"content-length", str(len(reply)).encode()),
                    (LEADER_HEADER.encode(), leader.encode()),
                    *([(OUTCOME_HEADER.lower().encode(), outcome.encode())] if outcome else []),
                ],
            }
        )
        await send({"type": "http.response.body", "body": reply})

    async def _after_forward(
        self, gone: str, scope: Scope, body: bytes, send: Send, headers: dict[str, str]
    ) -> None:
        """A write forwarded to `gone`, which leads no more before it answered: taken here if
        this server leads now (or once it has taken up the lease's work), else refused 503
        naming the leader now (the client goes there; its retry carries the write's key). A
        write without a key may have been taken by `gone`: refused in one line, never sent
        again (504)."""
        if "idempotency-key" not in headers:
            await self._refuse(
                send,
                f"the leader {gone} did not answer before it stopped leading: this write may "
                "or may not have been taken (it carried no idempotency key); check before you "
                "send it again",
                status=504,
            )
            return
        if await self._taking_over():
            given = False

            async def replay() -> Any:
                nonlocal given
                if given:
                    return {"type": "http.disconnect"}
                given = True
                return {"type": "http.request", "body": body, "more_body": False}

            await self.app(scope, replay, self._stamped(send))
            return
        await self._refuse(
            send, f"the leader {gone} did not answer and leads no more", unknown=True
        )


class _NodeOnly(msgspec.Struct):
    node: str = ""
