"""The server's HTTP protocol (uvicorn's httptools one, `PeerCredProtocol`) and the judgement
of a request's head on its raw bytes before the parser sees it (`body_length`; docs/server.md,
"Connections"; docs/security.md, row T23)."""

from __future__ import annotations

import asyncio
import re
import socket
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ledger.server import identity
from ledger.server.app import PEER_UID
from ledger.server.connections import (
    CONN,
    HEADERS_MAX_BYTES,
    REFUSED_HOLD_S,
    Connection,
    Connections,
    answer,
    source_of,
)
from schemas.errors import InvalidCommand, LedgerError

HEADER_LINES_MAX = 100
"""A request's header lines at most (Apache's `LimitRequestFields` default): past it, one 431
line and the connection closed, counted on the raw bytes before the parser calls Python once
per line (10,000 lines of `a:b` under the 64 KiB cost ~8 ms of the event loop per request,
before any meter: a few hundred tokenless connections cut another person's submits from ~240 to
2-10 in 15 s and a node was counted lost, atk39-25 F1). Our clients send under 10."""


BLANK_BEFORE_MAX = 4
"""Bytes of empty lines (CR, LF) taken before a request line (RFC 9112 section 2.2: a server
should ignore at least one CRLF there): past it, one 400 line and the connection closed. The
parser skips any number of them without starting a request, so no meter, hold or bound saw
them: one tokenless connection sending only CRLFs walked the event loop through its buffer four
bytes at a time, another person's submits fell to 2 in 15 s and a node was counted lost
(atk40-25 F1)."""
REQUEST_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+ [!-~\x80-\xff]+ HTTP/1\.[01]\r?")
HEADER_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:")


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused before it is parsed: its status, phrase and error; `reason`
    is its count's (`Counts.refused_head`)."""

    status: int
    phrase: str
    err: LedgerError
    reason: str


def header_lines_over(lines: int) -> bool:
    """Whether `lines` newlines in a request's head (its line, its headers and the blank line
    that ends them) pass `HEADER_LINES_MAX` header lines. Pure."""
    return lines > HEADER_LINES_MAX + 2


def malformed(what: str) -> Refusal:
    err = InvalidCommand(f"not an HTTP/1.1 request: {what}", hint="send a well-formed request")
    return Refusal(400, "Bad Request", err, "malformed")


def too_long_head(what: str) -> Refusal:
    err = InvalidCommand(f"the request's {what}", hint="send fewer or shorter headers")
    return Refusal(431, "Request Header Fields Too Large", err, "headers")


def body_length(head: bytes) -> int | Refusal:
    """The length of the body that follows `head` (a request's line and headers through the
    blank line that ends them, as received), or why the request is refused before the parser
    sees it: more than `HEADER_LINES_MAX` header lines (431); a `Transfer-Encoding` (411
    Length Required: a chunked body of 1-byte chunks cost the parser one Python call per
    chunk, ~20 s of the event loop for a 1 MB body; one person's 16 requests froze the whole
    API ~2.5 minutes and every node was counted lost, 8 tokenless ones killed running jobs:
    atk39-25 F4; our CLI, agents, standbys and dashboard always send Content-Length, and RFC
    9112 section 6.3 lets a server refuse a body without one); a Content-Length that is not
    one number (400: the parser would refuse it too; one length, one reading of where the
    request ends). Pure."""
    if header_lines_over(head.count(b"\n")):
        return too_long_head(f"headers pass {HEADER_LINES_MAX} lines")
    first, *lines = head.split(b"\n")[:-2]  # the blank line that ends the head, and after it
    if not REQUEST_LINE.fullmatch(first):
        return malformed("its request line is not METHOD TARGET HTTP/1.x")
    length: int | None = None
    for line in lines:
        if not HEADER_LINE.match(line):  # the parser refuses it (atk40-25 F2: at once, unheld)
            return malformed("a header line is not NAME: VALUE")
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            err = InvalidCommand(
                "a request body must come with a Content-Length (Transfer-Encoding is refused)",
                hint="send the body whole, with its Content-Length",
            )
            return Refusal(411, "Length Required", err, "length")
        if name == b"content-length":
            text = value.strip()
            if length is not None or not text.isdigit() or len(text) > 18:
                err = InvalidCommand(
                    "a request needs one Content-Length of digits", hint="send exactly one"
                )
                return Refusal(400, "Bad Request", err, "length")
            length = int(text)
    return length or 0


TOO_MANY_BYTES = f"line and headers pass {HEADERS_MAX_BYTES // 1024} KiB"


class PeerCredProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol, plus the caller's uid from the kernel on Unix sockets, and the
    connection counted and watched (`ledger.server.connections`: the caps, a send that stalls,
    a request whose headers do not come). `ours` is set on the subclass `serve` makes
    (`protocol_for`); uvicorn's own `connections` is its set of protocols.

    **The gate** (`data_received`): the parser is given one request at a time, and only once
    its head has passed `connections.body_length` on the raw bytes: its line and headers whole
    within 64 KiB and 100 header lines (else 431), no Transfer-Encoding (411), one
    Content-Length. Then exactly that many body bytes, and nothing more of the connection until
    the request's answer is complete (the rest waits here, reading paused past 64 KiB, as
    uvicorn's h11 protocol does). httptools calls Python once per header line, per body chunk
    and per request in whatever it is fed: 10,000 tiny header lines, a body of 1-byte chunks and
    20,000 pipelined requests in one send were all parsed before any meter (atk39-25 F1, F4,
    F6); a meter now sees each request before the next is parsed."""

    peer: int | None = None
    ours: Connections
    conn: Connection | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._unread = bytearray()  # received, not given to the parser yet
        self._scanned = 0  # of `_unread`, the bytes searched for the head's end
        self._lines = 0  # their newlines
        self._blank = 0  # empty-line bytes taken before the request line awaited
        self._body_left: int | None = None  # None: a request's head is awaited
        self._answering = False  # the request is given whole; its answer is not complete
        self._held = False  # reading paused for `_unread`
        sock = transport.get_extra_info("socket")
        self.peer = None
        local = sock is not None and sock.family == socket.AF_UNIX
        if local:
            self.peer = identity.peer_uid(sock)
            source, admin = self.ours.whose_uid(self.peer)
        else:
            admin = False
            source = source_of(transport.get_extra_info("peername"))
            if sock is not None:
                # a response whose parts are written apart must not wait for the client's
                # delayed ACK (Nagle: ~40 ms per request)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # None: over a cap, answered and closed
        self.conn = self.ours.made(transport, source, local=local, admin=admin)
        super().connection_made(self.conn or transport)  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.conn.lost()
        self._unread.clear()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()  # every byte, as before: our own timers judge
        self._unread += data
        self._feed()

    def _feed(self) -> None:
        """Give the parser what the request under way may take (the class's docstring)."""
        while self._unread and not self._answering and not self.transport.is_closing():
            if self._body_left is None:
                if not self._head():
                    break
            else:
                part = bytes(self._unread[: self._body_left])
                del self._unread[: len(part)]
                self._body_left -= len(part)
                super().data_received(part)
            if self._body_left == 0:  # given whole: the next waits for its answer
                self._body_left = None
                self._answering = self.cycle is not None and not self.cycle.response_complete
        if len(self._unread) >= HEADERS_MAX_BYTES and not self._held:
            self._held = True
            self.flow.pause_reading()
        elif self._held and len(self._unread) < HEADERS_MAX_BYTES:
            self._held = False
            self.flow.resume_reading()

    def _head(self) -> bool:
        """A request's head whole in `_unread`, passed and given to the parser; False: not
        whole yet, or refused (answered and closed)."""
        if self._scanned == 0 and self._unread[:1] in (bytearray(b"\r"), bytearray(b"\n")):
            # empty lines first: a few taken, then refused (lstrip copies: only when some)
            lead = len(self._unread) - len(self._unread.lstrip(b"\r\n"))
            self._blank += lead
            del self._unread[:lead]
            if self._blank > BLANK_BEFORE_MAX:
                self._refuse(malformed("empty lines where its request line belongs"))
                return False
            if not self._unread:
                return False
        end = self._unread.find(b"\r\n\r\n", max(0, self._scanned - 3))
        if end < 0:
            self._lines += self._unread.count(b"\n", self._scanned)
            self._scanned = len(self._unread)
            if self._scanned > HEADERS_MAX_BYTES:
                self._refuse(too_long_head(TOO_MANY_BYTES))
            elif header_lines_over(self._lines):
                self._refuse(too_long_head(f"headers pass {HEADER_LINES_MAX} lines"))
            return False
        if end + 4 > HEADERS_MAX_BYTES:
            self._refuse(too_long_head(TOO_MANY_BYTES))
            return False
        head = bytes(self._unread[: end + 4])
        del self._unread[: end + 4]
        self._scanned = self._lines = self._blank = 0
        length = body_length(head)
        if isinstance(length, Refusal):
            self._refuse(length)
            return False
        self._body_left = length
        super().data_received(head)
        return True

    def _refuse(self, refusal: Refusal) -> None:
        """One line, the connection closed, nothing more read (atk36-25 F5, atk39-25 F1, F4),
        held `REFUSED_HOLD_S` like every refusal (answered at once, a client looping chunked
        requests had ~2,000 refusals a second made on the event loop)."""
        self._unread.clear()
        self._answering = True  # nothing more is given to the parser
        if not self.transport.is_closing():
            self.ours.counts.refused_head[refusal.reason] += 1
            self.flow.pause_reading()
            self.loop.call_later(REFUSED_HOLD_S, self._answer_refusal, refusal)

    def _answer_refusal(self, refusal: Refusal) -> None:
        if not self.transport.is_closing():
            self.transport.write(answer(refusal.status, refusal.phrase, refusal.err, None))
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.peer is not None:
            self.scope[PEER_UID] = self.peer  # type: ignore[literal-required]
        if self.conn is not None:
            self.scope[CONN] = self.conn  # type: ignore[literal-required]

    def on_headers_complete(self) -> None:
        if self.conn is not None:
            self.conn.body_awaited()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self.conn is not None:
            self.conn.body_came()
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self.conn is not None:
            self.conn.body_done()
            if self.cycle is not None and self.cycle.response_complete:
                self.conn.awaiting_request()  # answered before its body (`commands`): idle now
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._answering = False
        idle = self.cycle is None or self.cycle.response_complete  # no request parsed waits
        # a request answered before its body came (a 401 from its headers: `commands`) still
        # awaits that body, under the body's deadlines (dropped if it stops coming)
        body_due = bool(self._body_left)
        if self.conn is not None and idle and not body_due and not self.transport.is_closing():
            self.conn.awaiting_request()
        if self._unread and not self.transport.is_closing():
            self.loop.call_soon(self._feed)  # the next request, once this answer's task ends


def protocol_for(connections: Connections) -> type[PeerCredProtocol]:
    """The protocol class of a server whose listeners share `connections`."""
    return type("Protocol", (PeerCredProtocol,), {"ours": connections})
