"""The CLI's side of the API: a small HTTP client over TCP (http/https) or a Unix socket.

Errors come back as problem details with the LedgerError code; the client raises the same
class with the same message and hint, so the CLI prints the same line as in embedded mode.
Standard library only (http.client), so a client command starts fast.

Several servers on one store (docs/ha.md): the URL may be a comma-separated list. A server that
does not answer, or answers 503 as a standby or while no server leads, is left for the next one
(the leader it names first), for up to `GPULEDGER_RETRY_S` seconds (default 30). Every write
carries an `Idempotency-Key` made once per command and sent again with each retry, so a write
whose answer was lost is answered, never appended twice. Reads ask for at least the position of
this client's last write (`X-Gpuledger-Min-Position`), so a standby answers with it included.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import secrets
import socket
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import msgspec

from ledger.store.appended import Appended
from ledger.wire import OUTCOME_HEADER, SOCKET_NAME
from ledger.wire.written import last_written, remember, stale_line, written_file
from schemas import api
from schemas.bounds import check_command
from schemas.commands import AnyCommand
from schemas.errors import ERROR_CODES, InvalidCommand, LedgerError, Unavailable

NDJSON = "application/x-ndjson"
"""A streamed answer (the whole-log audits': `Client.streamed`)."""

TIMEOUT_S = 60.0
LIST_TIMEOUT_S = 10.0
"""A request's timeout on one server of a list (unless the caller gives one): a server that
accepts connections and answers nothing (a frozen process) is left for the next in seconds."""
SILENT_SKIP_S = 5.0
"""How long a server of a list that let a request time out is passed over (`Silent`) while
another server of the list is not, unless another server names it as the leader: a frozen
server costs its timeout once, not once per round of the list (each round of an agent's retries
went back to it: atk36-28 F2). A leader the others name is asked again whatever its silence: a
server names a leader only while the store answers it and that leader's lease runs, and that
leader is the only one that can take the request (a leader that took 2.6-2.8 s to answer was
passed over for 5 s at a time and its agents' nodes were counted lost: atk37-28 F2); a frozen
one is named no longer than its lease."""


class Silent:
    """The servers of a list that last let a request time out (a frozen process accepts and
    never answers), by URL: passed over until `SILENT_SKIP_S` later, or until they answer.
    Shared by the clients of one process (an agent's join, reporter and poller), so one
    client's timeout spares the others theirs. Thread-safe: one dict item set at a time."""

    def __init__(self, skip_s: float = SILENT_SKIP_S) -> None:
        self.skip_s = skip_s
        self._until: dict[str, float] = {}

    def mark(self, url: str, now: float) -> None:
        self._until[url] = now + self.skip_s

    def clear(self, url: str) -> None:
        self._until.pop(url, None)

    def skipped(self, url: str, now: float) -> bool:
        return self._until.get(url, 0.0) > now


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


def token_file() -> Path:
    """Where `token create --save` keeps the caller's token: a 0600 file in their config dir."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpuledger" / "token"


def load_token() -> str | None:
    """$GPULEDGER_TOKEN, else a job's own $GPULEDGER_JOB_TOKEN (set inside jobs that node agents
    run), else the token file (refused unless only its owner can read it)."""
    env = os.environ.get("GPULEDGER_TOKEN") or os.environ.get("GPULEDGER_JOB_TOKEN")
    if env:
        return env.strip()
    path = token_file()
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidCommand(
            f"{path} is readable by others", hint=f"run `chmod 600 {path}` (it holds a secret)"
        )
    return path.read_text().strip() or None


def retry_s() -> float:
    """How long a request keeps trying the servers of a list (GPULEDGER_RETRY_S, default 30)."""
    try:
        return max(0.0, float(os.environ.get("GPULEDGER_RETRY_S", "30")))
    except ValueError:
        return 30.0


ROUND_PAUSE_S = 0.25
"""The longest pause between two rounds of a server list. A round that finds no leader is a
failover in progress (the old leader's lease runs out, then a standby takes it within half a
second): a client asleep when the new leader starts answers that much later (a 1 s pause made
the submits in flight across a kill -9 wait up to 0.9 s after the takeover; docs/ha.md)."""


def round_pause_s(rounds: int) -> float:
    """The pause after `rounds` whole rounds of the list found no leader: 50 ms more each
    round, at most `ROUND_PAUSE_S` (8 clients on 3 servers then ask ~100 times a second, each
    answered at once: a refused connection or a standby's 503)."""
    return min(ROUND_PAUSE_S, 0.05 * rounds)


def sent(cmd: AnyCommand | msgspec.Struct) -> dict[str, Any]:
    """Pure: `cmd` as sent to a server: every field left at its default is left out (the server
    fills it in the same), so a newer CLI reaches an older server, whose commands refuse the
    fields they do not know, unless the caller asked for what it added (`node remove` always
    sent `force`: refused by a server without it). The node agent sends its reports so too
    (`Report.reaping`)."""
    out: dict[str, Any] = msgspec.to_builtins(cmd)
    for f in msgspec.structs.fields(cmd):
        if f.default is not msgspec.NODEFAULT:
            default = f.default
        elif f.default_factory is not msgspec.NODEFAULT:
            default = f.default_factory()
        else:
            continue
        if getattr(cmd, f.name) == default:
            out.pop(f.encode_name, None)
    return out


class Client:
    """Talks to a server: `http(s)://HOST:PORT` or `unix:/PATH`, or to the first that leads of
    a comma-separated list of them."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float | None = None,
        silent: Silent | None = None,
    ) -> None:
        urls = [u.strip() for u in url.split(",") if u.strip()]
        if not urls:
            raise InvalidCommand("no server URL given", hint="use http(s)://HOST:PORT[,...]")
        if timeout is None:
            timeout = TIMEOUT_S if len(urls) == 1 else LIST_TIMEOUT_S
        self.urls = urls
        self.position = 0
        """The newest log position this client wrote or read (reads ask for at least it)."""
        self.on_keep: Callable[[float, int, tuple[float, float] | None], None] | None = None
        """Called (monotonic time the request was sent, epoch, the node-lease settings it
        grants: `node_lease`) at once for every 503 whose server
        says it keeps the node's lease while its store is away (`X-Gpuledger-Keep`; agents)."""
        self.token = token
        self.timeout = timeout
        self.silent = silent if silent is not None else Silent()
        """The servers of the list passed over for now (a timeout; `Silent`)."""
        self.node_lease: tuple[float, float] | None = None
        """(node-lost timeout, fence) the last answer said it renews the node's lease under
        (`X-Gpuledger-Node-Lease`; None: it said none). Agents renew by it alone."""
        self.headers: dict[str, str] = {}
        """Sent with every request (a node agent's name for itself: `AGENT_HEADER`)."""
        self._servers = [_Server(u, timeout) for u in urls]
        self._in_flight: _Server | None = None
        """The server a request of this client waits on now (None: none)."""
        self._at = 0
        self.url = urls[0]
        self._stale_said = False
        self.written = written_file(urls) if len(urls) > 1 else None
        """Where the position of this user's last write through this list of servers is kept
        (`ledger.wire.written`): a read asks for at least it in the next command too."""
        self.position = last_written(self.written)

    @property
    def _server(self) -> _Server:
        return self._servers[self._at]

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        key: str | None = None,
        idempotent: bool = False,
        on_line: Callable[[bytes], None] | None = None,
    ) -> bytes:
        """One request, to the leader: the servers of the list in turn (the one a standby names
        first) until one answers or `retry_s()` has passed. A write is retried only with its
        idempotency `key` (then a retry after a lost answer is answered, not appended twice),
        or when it is `idempotent` by itself (the agent API's: a report not answered is sent
        again anyway)."""
        accept = f"{NDJSON}, application/json" if on_line is not None else "application/json"
        headers = {"Accept": accept, **self.headers}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.token:  # on the Unix socket too: a token given is the caller (a job's own)
            headers["Authorization"] = f"Bearer {self.token}"
        if key is not None:
            headers["Idempotency-Key"] = key
        if method == "GET" and self.position:
            headers["X-Gpuledger-Min-Position"] = str(self.position)
        # safe to send again after a lost answer
        may_retry = method == "GET" or key is not None or idempotent
        began = time.monotonic()
        deadline = began + (retry_s() if len(self.urls) > 1 else 0.0)
        busy_until = time.monotonic() + retry_s()  # a 429 is waited out this long at most
        tried = 0
        lost = ""
        """A server this write reached (or may have) and whose answer was lost, or that said
        its outcome is unknown (`X-Gpuledger-Outcome`): the write may be stored, so no later
        refusal is its fate (`_in_doubt`)."""
        away: LedgerError | None = None
        """A server's answer that its store does not answer: said rather than a later server's
        refused connection (the one clear reason), and at once once no server of the list may
        take the request (each said so, or is down)."""
        answered: set[str] = set()
        if self.silent.skipped(self._server.url, time.monotonic()):
            answered |= self._next(tried, pause=False)  # begin on one that is not silent
        while True:
            server = self._server
            sent = time.monotonic()
            self._in_flight = server
            try:
                status, data, leader, position = server.send(method, path, body, headers, on_line)
            except Unavailable as err:
                self._in_flight = None
                tried += 1
                if isinstance(err, _TimedOut):
                    self.silent.mark(server.url, time.monotonic())
                # the next request starts on the next server, whatever happens
                answered |= self._next(tried)
                # a write without a key is sent again only where it never arrived; every server
                # of the list is tried once, however long the others took
                retry = may_retry or isinstance(err, _Refused)
                answered.add(server.url)  # passed over: said nothing, as a silent one
                if key is not None and not isinstance(err, _Refused):
                    lost = lost or server.url
                done = not retry or (time.monotonic() > deadline and tried >= len(self.urls))
                if lost and not done:
                    continue  # it may be stored: asked again under its key until the deadline
                if away is not None and (done or answered >= set(self.urls)):
                    raise _in_doubt(away, lost, key, path) from err
                if done and lost:
                    raise _in_doubt(err, lost, key, path) from err
                if done:
                    raise
                continue
            self._in_flight = None
            self.silent.clear(server.url)
            if position:
                self.position = max(self.position, position)
            if status == 503 and server.keep and self.on_keep is not None:
                self.on_keep(sent, server.keep, server.node_lease)
            self.node_lease = server.node_lease
            if status == 503 and server.unknown and key is not None:
                lost = lost or server.url
            if status == 503 and server.store_away:
                away = _error(status, data)
                answered.add(server.url)
                if answered >= set(self.urls) and not lost:
                    raise away
            else:
                answered.discard(server.url)
            if status == 503 and self._follow(server.url, leader):
                deadline = max(deadline, began + retry_s())  # a list of two now
            if status == 503 and len(self.urls) > 1 and time.monotonic() <= deadline:
                answered |= self._next(tried := tried + 1, leader)
                if away is not None and answered >= set(self.urls) and not lost:
                    raise away  # the others are passed over as silent: said at once
                continue
            # a 429: the caller's share is used (its own reads at once, a minute's worth): wait
            # as the server asks, as a person would, while that stays within `retry_s()`; a
            # 429 appended nothing, so a keyed write may go again
            waits = status == 429 and may_retry and server.retry_after > 0
            if waits and time.monotonic() + server.retry_after <= busy_until:
                time.sleep(server.retry_after)
                continue
            self.url = server.url
            if status >= 400:
                refused = _error(status, data)
                raise _in_doubt(refused, lost, key, path) if status == 503 else refused
            if server.stale_s is not None and not self._stale_said:  # one line a command
                self._stale_said = True
                sys.stderr.write(stale_line(server.url, server.stale_s))
            return data

    def abandon_unless(self, url: str) -> bool:
        """Give up the request this client waits on (another thread's) when it waits on a
        server other than `url`, the one that leads now by another client's answer: its
        connection is shut and the request goes on to the next server of the list (a node
        agent's long poll waited its wait + 5 s on a frozen leader while the new one's orders
        waited: atk48-ha F6). True when one was given up."""
        server = self._in_flight
        if server is None or server.url == url:
            return False
        server.abandon()
        return True

    def _follow(self, named_by: str, leader: str) -> bool:
        """Add the `leader` a server of the list names to the list when it is not in it (a
        server added since this client's list was written; a standby that did not win a
        takeover names its successor): asked as the listed ones are, with the same token and
        the same checks of its certificate, from then on. Only an http(s) URL of the scheme of
        the server that named it (never a Unix socket, never https to http). True when added.
        Without it, a standby's 503 naming a leader outside the list was the end: a write
        through it failed, an agent's node was counted lost (atk38-28 F2, F2b)."""
        if not leader or leader in self.urls:
            return False
        parts, by = urlsplit(leader), urlsplit(named_by)
        if parts.scheme not in ("http", "https") or parts.scheme != by.scheme:
            return False
        try:
            server = _Server(leader, self._servers[0].timeout)
        except InvalidCommand:
            return False
        self.urls.append(leader)
        self._servers.append(server)
        return True

    def _next(self, tried: int, leader: str = "", *, pause: bool = True) -> set[str]:
        """Go to the `leader` a server names (in the list, or added to it by `_follow`; silent
        or not: see
        `SILENT_SKIP_S`), else the next one, passing over the silent ones (`Silent`) while one
        of the list is not; after a whole round, wait a little (the servers may be electing).
        Returns the URLs passed over."""
        now = time.monotonic()
        n = len(self._servers)
        named = leader in self.urls
        first = self.urls.index(leader) if named else (self._at + 1) % n
        order = [(first + i) % n for i in range(n)]
        heard = [i for i in order if (named and i == first)
                 or not self.silent.skipped(self.urls[i], now)]  # fmt: skip
        self._at = heard[0] if heard else first
        passed = {self.urls[i] for i in order if i not in heard and i != self._at}
        if pause and n > 1 and tried % n == 0:
            time.sleep(round_pause_s(tried // n))
        return passed

    def execute(self, cmd: AnyCommand, key: str | None = None) -> Appended:
        """Send `cmd` under the idempotency `key` (None: a new one; `submit --idempotency-key`
        gives the key of an earlier try whose outcome was unknown: `_in_doubt`)."""
        check_command(cmd)  # out of bounds: the same line as embedded mode, before any request

        tag = type(cmd).__struct_config__.tag
        data = self.request(
            "POST", f"/v1/commands/{tag}", msgspec.json.encode(sent(cmd)),
            key=key or secrets.token_hex(16),
        )  # fmt: skip
        result = msgspec.json.decode(data, type=api.CommandResult)
        self.position = max(self.position, result.position)
        remember(self.written, result.position)
        return Appended(events=list(result.events), position=result.position)

    def execute_all(self, cmds: list[AnyCommand]) -> Appended:
        for cmd in cmds:
            check_command(cmd)

        body = {"commands": [sent(cmd) for cmd in cmds]}  # `api.Batch`
        data = self.request("POST", "/v1/batch", msgspec.json.encode(body))
        result = msgspec.json.decode(data, type=api.CommandResult)
        self.position = max(self.position, result.position)
        remember(self.written, result.position)
        return Appended(events=list(result.events), position=result.position)

    def get(self, path: str, query: dict[str, Any] | None = None, type: Any = Any) -> Any:
        q = {k: v for k, v in (query or {}).items() if v is not None}
        # a list is the parameter repeated (?job_ids=1&job_ids=7), as the server reads it
        data = self.request("GET", f"/v1/{path}" + (f"?{urlencode(q, doseq=True)}" if q else ""))
        return msgspec.json.decode(data, type=type)

    def streamed(
        self, path: str, type: Any, on_step: Callable[[api.AuditStep], None] | None = None
    ) -> Any:
        """GET /v1/`path` streamed as NDJSON (`api.AuditFrame` lines: the whole-log audits):
        each step given to `on_step` as it comes, the result decoded as `type`, an error
        raised as `get` raises it. The timeout is the longest silence between two lines (the
        server sends one at least every second), so a walk of any length is waited for."""

        def line(data: bytes) -> None:
            frame = msgspec.json.decode(data, type=api.AuditFrame)
            if frame.step is not None and on_step is not None:
                on_step(frame.step)

        data = self.request("GET", f"/v1/{path}", on_line=line)
        frame = msgspec.json.decode(data, type=api.AuditFrame)
        if frame == api.AuditFrame():  # a server that does not stream: its plain answer
            return msgspec.json.decode(data, type=type)
        if frame.error is not None:
            raise _error(frame.error.status, msgspec.json.encode(frame.error))
        if bytes(frame.result) == b"null":  # no result line: the server stopped mid-way
            raise Unavailable(
                "the server ended the answer before its result",
                hint="is `gpuledger serve` stopping? retry once it is back",
            )
        return msgspec.json.decode(frame.result, type=type)

    def post(self, path: str, body: Any, type: Any = Any, *, read: bool = False) -> Any:
        """POST a request Struct to /v1/`path` and decode the answer as `type`; `read`: a read
        asked with a body (nothing appended: a 429 is waited out, as a GET's)."""
        data = self.request("POST", f"/v1/{path}", msgspec.json.encode(body), idempotent=read)
        return msgspec.json.decode(data, type=type)

    def close(self) -> None:
        for server in self._servers:
            server.close()


def _node_lease(text: str) -> tuple[float, float] | None:
    """Pure: `X-Gpuledger-Node-Lease` (`<node-lost timeout>,<fence>`, seconds) read, or None."""
    lost, _, fence = text.partition(",")
    try:
        got = (float(lost), float(fence))
    except ValueError:
        return None
    return got if all(0 <= x < 1e9 for x in got) else None


class _Server:
    """One server of the list: its connection, kept alive between requests."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self.timeout = timeout
        self.keep = 0
        """`X-Gpuledger-Keep` of the last answer (0: none)."""
        self.node_lease: tuple[float, float] | None = None
        """`X-Gpuledger-Node-Lease` of the last answer (None: none)."""
        self.retry_after = 0
        """`Retry-After` of the last answer when it was a 429 (seconds; 0: none)."""
        self.store_away = False
        """The last answer said the server's store does not answer (`X-Gpuledger-Store`)."""
        self.stale_s: float | None = None
        """`X-Gpuledger-Stale` of the last answer: how old the log it was read from is."""
        self.unknown = False
        """The last answer (a 503) said the write may be stored all the same (`OUTCOME_HEADER`:
        a commit that waited for the synchronous standby was cancelled, a stop answered a
        waiting write)."""
        self._conn: http.client.HTTPConnection | None = None
        self._abandoned = False
        """The request under way was given up (`abandon`): not sent to this server again."""
        if url.startswith("unix:"):
            self._unix: str | None = url[len("unix:") :]
            return
        self._unix = None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidCommand(
                f"invalid server URL {url!r}", hint="use http(s)://HOST:PORT or unix:/PATH"
            )
        self._parts = parts

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._unix is not None:
                self._conn = _UnixConnection(self._unix, self.timeout)
            elif self._parts.scheme == "https":
                import ssl  # only for https: a plain or Unix-socket client starts faster

                ctx = ssl.create_default_context(cafile=os.environ.get("GPULEDGER_CA_FILE"))
                self._conn = http.client.HTTPSConnection(
                    self._parts.hostname or "", self._parts.port or 443, timeout=self.timeout,
                    context=ctx,
                )  # fmt: skip
            else:
                self._conn = http.client.HTTPConnection(
                    self._parts.hostname or "", self._parts.port or 80, timeout=self.timeout
                )
        return self._conn

    def send(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        on_line: Callable[[bytes], None] | None = None,
    ) -> tuple[int, bytes, str, int]:
        """(status, body, the leader a standby names, the position the answer was made at).
        An NDJSON answer is read line by line, each given to `on_line` but the last (the body
        returned): the socket's timeout applies between two lines."""
        self._abandoned = False
        delivered = False
        """The first attempt's request was written and the server closed the connection without
        an answer: it may have been read and applied (a server killed in its commit closes
        cleanly), so the second attempt's refused connection is no proof it never arrived."""
        for attempt in (0, 1):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                streamed = (resp.getheader("Content-Type") or "").startswith(NDJSON)
                data = _lines(resp, on_line) if streamed and on_line else resp.read()
                break
            except (ConnectionError, http.client.HTTPException, OSError) as err:
                conn.close()
                self._conn = None
                if self._abandoned:  # another leads: passed over for now, as a silent one
                    self._abandoned = False
                    raise _TimedOut(
                        f"the server at {self.url} leads no more (its answer was given up)",
                        hint="asking the leader",
                    ) from err
                if attempt == 0 and isinstance(
                    err, http.client.RemoteDisconnected | BrokenPipeError
                ):
                    # a kept-alive connection the server closed (found on reading the answer,
                    # or, idle longer, on sending: then nothing was sent): once more
                    delivered = isinstance(err, http.client.RemoteDisconnected)
                    continue
                refused = not delivered and isinstance(
                    err, ConnectionRefusedError | FileNotFoundError
                )
                timed_out = isinstance(err, TimeoutError)
                kind = _Refused if refused else _TimedOut if timed_out else Unavailable
                raise kind(
                    f"cannot reach the server at {self.url}: {err}",
                    hint="is `gpuledger serve` running? check GPULEDGER_URL",
                ) from err
        position = resp.getheader("X-Gpuledger-Position") or ""
        leader = resp.getheader("X-Gpuledger-Leader") or ""
        keep = resp.getheader("X-Gpuledger-Keep") or ""
        self.keep = int(keep) if keep.isdigit() else 0
        self.node_lease = _node_lease(resp.getheader("X-Gpuledger-Node-Lease") or "")
        after = (resp.getheader("Retry-After") or "") if resp.status == 429 else ""
        self.retry_after = min(int(after), 60) if after.isdigit() else 0
        self.store_away = resp.getheader("X-Gpuledger-Store") == "away"
        self.unknown = resp.getheader(OUTCOME_HEADER) == "unknown"
        stale = resp.getheader("X-Gpuledger-Stale") or ""
        self.stale_s = float(stale) if stale.replace(".", "", 1).isdigit() else None
        cut = resp.getheader("X-Gpuledger-Truncated") or ""
        if cut:  # a page cut at its bytes (pooled.MAX_PAGE_BYTES): said, never silently short
            sys.stderr.write(
                f"note: the server cut this page at {cut} rows (at most 32 MiB of rows in one "
                "page); ask for the rest after its last row (`jobs --before-id` its job, `log "
                "--after` its position)\n"
            )
        return resp.status, data, leader, int(position) if position.isdigit() else 0

    def abandon(self) -> None:
        """Shut the socket of the request under way (from another thread): it fails at once."""
        conn = self._conn
        sock = getattr(conn, "sock", None)
        if sock is None:
            return
        self._abandoned = True
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _lines(resp: http.client.HTTPResponse, on_line: Callable[[bytes], None]) -> bytes:
    """An NDJSON body read as it comes: every line but the last given to `on_line`; the last."""
    last = b""
    for line in resp:
        if not line.strip():
            continue
        if last:
            on_line(last)
        last = line
    return last


class _Refused(Unavailable):
    """The server refused the connection: the request never arrived (any request may go to the
    next server of the list)."""


class _TimedOut(Unavailable):
    """The server did not answer within the timeout (a frozen process still accepts): passed
    over for a while (`Silent`)."""


def _in_doubt(err: LedgerError, lost: str, key: str | None, path: str = "") -> LedgerError:
    """The error a keyed write ends with: `err` itself when no try of it may be stored; else
    (a try reached `lost` and its answer was lost, or was said unknown) one line that says the
    write may be stored and how to send it again under the same key, so the retry is answered
    with the first try's outcome, never doubles it. A refusal of the next server ("no write is
    taken until it does") was the whole answer, and the user's new submit made a second job
    once the first try's commit was confirmed (atk50b-ha F1). Only a submit (`path`) can be
    sent again under its key from the CLI: another write's hint says how to tell whether it
    was applied (a cancel in doubt was told to run `gpuledger submit --idempotency-key`)."""
    if not lost or key is None:
        return err
    last = err.message.split(": no write is taken")[0].split("; ")[0]
    hint = (
        f"check `gpuledger queue` once the store answers; `gpuledger submit --idempotency-key "
        f"{key}` with the same options is answered with the first one's job if it was stored, "
        "and submits it once if not"
        if path.endswith("/submit")
        else "once the store answers, `gpuledger log` (or `gpuledger jobs`) says whether it was "
        "applied; send it again only if it was not"
    )
    return InDoubt(
        f"this write's outcome is unknown: it reached {lost} and got no sure answer there, so it "
        f"may be stored (the commit under way there may go through; the last answer: {last}); "
        f"its idempotency key is {key}",
        hint=hint,
        key=key,
    )


class InDoubt(Unavailable):
    """A write that may be stored though no server said so (`_in_doubt`); `fields["key"]` is
    its idempotency key."""


def _error(status: int, data: bytes) -> LedgerError:
    try:
        p = msgspec.json.decode(data, type=api.Problem)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return LedgerError(f"the server answered {status}: {data[:200]!r}")
    cls = ERROR_CODES.get(p.code, LedgerError)
    # the answer's status and code kept: a caller tells a route the server lacks (an older
    # one: 404 "http") from a refusal by what was answered, never by the words of a line
    # that may carry a URL (atk56-23 F1)
    if p.message:
        return cls(p.message, hint=p.hint, status=status, answered=p.code)
    return cls(p.detail, status=status, answered=p.code)


def local_socket(home: Path) -> Path | None:
    """The Unix socket of a server running on `home`, if one answers there."""
    path = home / SOCKET_NAME
    if not path.exists():
        return None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return None  # stale: the server is gone
    finally:
        probe.close()
    return path
