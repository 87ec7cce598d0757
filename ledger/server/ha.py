"""Several servers on one PostgreSQL store: who leads, what a standby does, and where writes go.

- `Leadership` runs the lease (`ledger.store.lease`) in a thread of its own: a standby tries to
  take it twice a second, the leader renews it every third of the lease. The worker thread
  turns the lease into a role at its next turn (`Worker`): promote (fence appends by the new
  epoch, open the executor, adopt what runs, start the relay, then cycle) or step down (stop
  cycling and relaying; jobs keep running). `may_act()` is the lease's own clock: the moment it
  is false nothing acts, even before the worker's next turn.
- A standby follows the log (its live state and projection stay warm), answers reads itself
  with the position it answers at (`X-Gpuledger-Position`; a client may ask for at least a
  position with `X-Gpuledger-Min-Position`, to read its own writes), and sends writes to the
  leader: a request with a bearer token is forwarded as it came (the leader authenticates it
  again); one that cannot be forwarded (a Unix socket's peer, the agent API, no leader known) is
  answered 503 naming the leader (`X-Gpuledger-Leader`), and the CLI and agents go there.
- The store away: every server that cannot reach it keeps its agents' node leases
  (`Leadership.keeps`; an agent call is answered 503 with `X-Gpuledger-Keep: <epoch>`, and the
  agent renews its lease by it), from `KeepTiming.delay_s` after its last report to the store
  until `KEEP_WITHOUT_STORE_S` after it, and only for nodes it does not count lost: while no
  server can reach the store nothing can be placed elsewhere, so nothing may be fenced, and no
  server is a single point of failure for it (a leader stopped or killed meanwhile leaves the
  others keeping). Each server reports the time of its last keep (`gpuledger_servers.kept_at`);
  a leader counts no node lost before the latest keep any server reported, nor before a silent
  server's last report + `KEEP_WITHOUT_STORE_S` (it may be keeping), plus the node-lost timeout
  (`Leadership.keeping`, `AgentExecutor(keeping=...)`), so a kept node is never fenced. A server
  begins keeping only once every leader sees it silent (`delay_s` > `stale_s`): a leader never
  counts a node lost on a bound that a keep already passed (docs/ha.md).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ledger.server.ha_wire import (
    ROLE_HEADER,
    abandon,
    body_within,
    connection,
    exchange,
    not_authenticated,
)
from ledger.server.peers import (
    REFUSED_ROLE,
    Key,
    address_key,
    no_taker,
    older_words,
    others_at,
    same_address_words,
    server_states,
)
from ledger.server.store_seen import STALE_HEADER, stale_s, store_trouble
from ledger.store.lease import Holder, Lease, Member, NotCommitting, dead_here
from ledger.wire import OUTCOME_HEADER
from schemas import api

log = logging.getLogger("gpuledger.ha")

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
KEEP_WITHOUT_STORE_S = 900.0
"""How long a server cut off from its store keeps its agents' node leases (counted from its last
report to the store), and so how long after a silent server's last report a leader waits before
it may count a node lost (docs/ha.md, the failure table)."""
NODE_LEASE_HEADER = "x-gpuledger-node-lease"
"""On every answer to an agent: `<node-lost timeout>,<fence>` (s) it renews the node's lease
under; the agent renews by these alone (a keep said none: a job ran twice, atk39-28 F1)."""
STORE_HEADER = "x-gpuledger-store"
"""On a 503 because the store does not answer or commit: `away` (the CLI says it in one line)."""


@dataclass(frozen=True)
class KeepTiming:
    """When a server cut off from its store may begin to keep node leases, and when a leader
    calls a server silent (`keep_timing`)."""

    stale_s: float
    """A server not seen reporting for this long may be keeping leases without saying so."""
    fresh_s: float
    """How long a leader's bound (`Lease.keep_bound`) holds after it was read."""
    delay_s: float
    """A server keeps leases only this long after its last report, or later."""


def keep_timing(lease_s: float) -> KeepTiming:
    """Pure: the keep timing of servers with lease `lease_s`. A server reports once a second at
    most one renewal (a third of the lease) late, its statements answering within a third of the
    lease: silent past `stale_s` it is out of touch (one only slow is counted keeping while it
    is silent: node losses wait, nothing worse). A keep that a
    leader's bound (read at most `fresh_s` ago) did not include comes `delay_s` after a report
    that was at most `stale_s` old when it was read, and the report's commit (the database's
    time of it) may lag its sending by one statement: so `delay_s` exceeds `stale_s` + one
    statement + `fresh_s` (+ 1 s of the two clocks' drift)."""
    third = lease_s / 3
    statement = max(0.2, third)
    stale = 1.0 + third + statement + 1.0
    fresh = 1.0 + third + 1.0
    return KeepTiming(stale_s=stale, fresh_s=fresh, delay_s=stale + statement + fresh + 1.0)


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


@dataclass
class Leadership:
    """The lease, kept by a thread; what the worker and the HTTP front ask of it."""

    lease: Lease
    poll_s: float = 0.5
    leading: bool = False
    """Set by the worker thread once it has promoted (cleared once it has stepped down)."""
    leader: Holder | None = None
    """The lease's holder as last read (standbys: where writes go)."""
    members: list[Member] = field(default_factory=list)
    position: Callable[[], int] = lambda: 0
    """The log position this server has folded (reported for its lag)."""
    unreachable: str | None = None
    """Why the store does not answer the lease, when it does not (health, status)."""
    refused: str | None = None
    """Why this server takes no lease (its settings are not the ones the store records:
    `Lease.refusal`), when it does not (log, health, status)."""
    older: str | None = None
    """Servers of an earlier version refused the lease lately (`Lease.refused_older`)."""
    same_address: str | None = None
    """Why another server at this server's address is a fault, while one reports there
    (`peers.others_at`): this server takes no lease meanwhile (health `address_error`)."""
    _older_at: frozenset[str] = frozenset()
    """Their addresses."""
    changed: threading.Event = field(default_factory=threading.Event)
    """Set when the role may have changed: the worker looks at its next turn, at once."""
    notify: Callable[[], None] = lambda: None
    """Wakes the worker (its next turn looks at the role)."""
    turned_at: float = 0.0
    """monotonic time the worker last looked at the role (`Worker._take_role`)."""
    failed_at: float = 0.0
    """monotonic time the worker last failed to take up the leader's work (the store failed
    it): the lease is handed over rather than renewed for nobody."""
    _took_at: float = 0.0
    """monotonic time this server last took the lease (0: it does not hold one it took)."""
    _held_back_at: float = 0.0
    """This server handed a lease back because its worker did not look at the role: it takes
    none again before the worker has (0: it takes one whenever it is free)."""
    _uncommitted: str | None = None
    _erred: tuple[float, str] | None = None
    """The last lease statement that failed (monotonic time, why): said for a lease after it."""
    _asking_since: float | None = None
    """monotonic time the lease statements under way were begun (None: none under way)."""
    """Why the store commits none of this server's writes (`NotCommitting`), until one does."""
    _leader_read_at: float = 0.0
    reported_at: float = 0.0
    """monotonic time this server sent its last report that the store took (0: none yet)."""
    kept_at: float = 0.0
    """monotonic time this server last kept a node's lease (`HAFront`; 0: never)."""
    _bound: float | None = None
    """The store's `keep_bound` as last read (None: no server ever kept or went silent)."""
    _bound_read_at: float = 0.0
    _reporting: bool = False
    """A report is under way: no keep is decided meanwhile (it might miss the report)."""
    _keys: dict[str, Key] = field(default_factory=dict)
    """What server each address reported names (`_address_key`)."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def may_act(self) -> bool:
        return self.lease.may_act()

    @property
    def role(self) -> str:
        """What this server is by the lease's own clock: a leader paused past its lease says
        standby from its first answer, before its worker has stepped down."""
        return "leader" if self.acting() else "standby"

    @property
    def epoch(self) -> int:
        """The leader's epoch as this server knows it (0: it has seen no lease)."""
        return self.lease.epoch if self.leading else (self.leader.epoch if self.leader else 0)

    def acting(self) -> bool:
        """Leading, and the lease still runs by this server's own clock (the worker may not
        have stepped down yet: from this moment nothing here acts as leader)."""
        return self.leading and self.lease.may_act()

    @property
    def timing(self) -> KeepTiming:
        return keep_timing(self.lease.lease_s)

    def keeps(self) -> int:
        """The epoch (as this server last read it) it says with a keep of its agents' node
        leases while its store is away (0: it keeps none): its last report to the store was
        from `KeepTiming.delay_s` to `KEEP_WITHOUT_STORE_S` ago. Any server keeps, leader or
        standby: a leader counts every server's keeps (`keeping`)."""
        if self.unreachable is None or self.refused is not None:
            return 0  # a server whose settings are not the store's grants no lease by them
        if self.acting():  # its own executor counts the keep as contact; a new leader counts
            return self.lease.epoch  # none lost before its promotion + the node-lost timeout
        if not self.reported_at or self._reporting:
            return 0
        if not may_keep(time.monotonic() - self.reported_at, self.timing):
            return 0
        return max(self.epoch, 1)

    def keeping(self) -> float | None:
        """Until when, in seconds from now, some server may keep a node's lease (negative: the
        last keep was that long ago; -inf: no server ever kept one or went silent), by the
        store's `keep_bound` read at the last report; None: not known (not read lately, e.g.
        the store was away): no node may be counted lost meanwhile."""
        age = time.monotonic() - self._bound_read_at
        if not self._bound_read_at or age > self.timing.fresh_s:
            return None
        return max(-math.inf if self._bound is None else self._bound - age, self._held())

    def _held(self) -> float:
        """Seconds from now until which no node is counted lost: an agent may hold a lease of
        older, longer settings till `Holder.held_in_s` (a job ran twice: atk38-28 F3)."""
        h, node = self.leader, self.lease.node
        if h is None or h.held_in_s is None or node is None:
            return -math.inf
        return h.held_in_s - (time.monotonic() - self._leader_read_at) - sum(node)

    def leader_address(self) -> str:
        if self.acting():
            return self.lease.address
        if self.unreachable is not None:  # nobody can lead meanwhile: a lease row that looks
            return ""  # held may be a takeover the store never committed (atk33-28 F10)
        h = self.leader
        left = 0.0 if h is None else h.expires_in_s - (time.monotonic() - self._leader_read_at)
        return h.address if h is not None and left > 0 else ""  # never a lease seen expire

    def lease_times(self) -> tuple[float | None, float | None]:
        """(seconds until the leader's lease expires, seconds since its holder last renewed it),
        now, from the row as last read (the database's clock) moved on by this server's own
        clock; negative expiry: it ran out and nobody took it yet. (None, None): no lease seen."""
        h = self.leader
        if h is None:
            return None, None
        since = time.monotonic() - self._leader_read_at
        left = h.expires_in_s - since
        if left < -1e6:  # '-infinity': released by a clean stop (a standby takes it at once)
            return None, None
        return left, (h.lease_s - h.expires_in_s + since) if h.lease_s else None

    def uncommitted(self, why: str) -> None:
        """The store commits none of this server's writes (`NotCommitting`), as its start found
        (`address_taken`): said once (`WAITS`), and this server waits as a standby."""
        if self.unreachable is None:
            log.error(WAITS.format(why))
        self.unreachable = self._uncommitted = why
        self._erred = (time.monotonic(), why)

    def start(self) -> None:
        try:  # a predecessor at this address killed, or stopped while the store was away
            for holder in self.lease.retire(dead_here):
                log.info("%s (this server's address) is gone: it keeps no lease", holder)
        except NotCommitting as err:
            self.uncommitted(err.message)
        except Exception as err:  # its silent row only makes leaders wait longer
            log.warning("could not retire this address's dead servers: %s", err)
        self._tick()  # the first health answer already names the leader and its epoch
        self._thread = threading.Thread(target=self._run, name="ledger-lease", daemon=True)
        self._thread.start()

    def stop(self, clean: bool = True) -> None:
        """A stop: hand the lease over at once (a standby takes it at its next try); `clean`:
        nothing of this server's may still be submitted (`takeover.hands_over_cleanly`), so
        the next leader waits for nothing."""
        self._stop.set()
        if self._thread is not None:  # while the store is away its turn may wait on a statement
            # or a connection (a second per host of the DSN): nothing of it is needed then, no
            # release is tried (a leader's stop waited 3 s more for it: atk49 F4)
            self._thread.join(timeout=0.3 if self.unreachable is not None else 10)
            if self.unreachable is not None and self._thread.is_alive():
                return  # it ends with the process; its connection with it
        try:
            if self.unreachable is None:  # else it would wait for a connection: it expires
                self.lease.release(clean)
                self._report()  # its last keep stays known (`forget` then keeps its row)
                self.lease.forget()
        except Exception as err:  # the store is away: the lease expires by itself
            log.warning("could not release the lease: %s", err)
        self.lease.close()

    def _run(self) -> None:
        last_report = 0.0
        while not self._stop.is_set():
            began = time.monotonic()
            report = began - last_report >= 1.0
            if report:
                last_report = began
            self._tick(report)
            step = self.lease.lease_s / 3 if self.lease.may_act() else self.poll_s
            self._stop.wait(max(0.05, step - (time.monotonic() - began)))

    @property
    def ready_s(self) -> float:
        """How long the worker has to look at the role once this server took the lease, before
        the lease is handed over (about one renewal)."""
        return max(1.0, self.lease.lease_s / 3)

    def _unready(self) -> bool:
        """This server holds the lease it took, but its worker has not looked at the role since
        (`ready_s`): it is busy, e.g. waiting on the store, and cannot lead."""
        if self.leading or not self._took_at:
            return False
        if self.failed_at > self._took_at:
            return True
        return self.turned_at < self._took_at and time.monotonic() - self._took_at > self.ready_s

    def _tick(self, report: bool = False) -> None:
        """One turn of the lease: take, renew or hand it over, read who holds it, and (with
        `report`) say where this server is. A store that takes statements but commits none (its
        synchronous standby is away: `NotCommitting`) is said as one that does not answer, until
        a write of this server commits again."""
        held = self.lease.may_act()
        if self._held_back_at and self.turned_at > self._held_back_at:
            self._held_back_at = 0.0
        self._asking_since = time.monotonic()
        try:
            if held and self._unready():
                # renewing a lease nobody here acts on locks every server out (after an outage
                # one held it ~30 s so, while its worker still waited on the store: atk33-28 F7)
                failed = self.failed_at > self._took_at
                why = (
                    "could not take up the leader's work"
                    if failed
                    else "has not taken up "
                    f"the leader's work within {self.ready_s:.1f} s (waiting on the store?)"
                )
                log.error("took the lease (epoch %d) but the worker %s: handing it over",
                          self.lease.epoch, why)  # fmt: skip
                self._took_at, self._held_back_at = 0.0, time.monotonic()
                held = False
                self.lease.release(clean=False)  # its worker may be in an sbatch
                self._changed()
            elif held:
                if not self.lease.renew():
                    log.error("lost the lease (epoch %d): another server leads", self.lease.epoch)
                    self._changed()
                else:
                    self._uncommitted = None
            elif not self._held_back_at and self.same_address is None and self.lease.acquire():
                self._took_at = time.monotonic()
                self._uncommitted = None
                log.info("took the lease: leading at epoch %d", self.lease.epoch)
                self._changed()
            self.leader, self._leader_read_at = self.lease.leader(), time.monotonic()
            self._refusal(held)
            if report:
                self._report()
            if self.unreachable is not None and self._uncommitted is None:
                log.warning("the store answers the lease again")
            self.unreachable = self._uncommitted
        except Exception as err:
            why = (str(err).strip().splitlines() or [type(err).__name__])[0]
            if isinstance(err, NotCommitting):
                self._uncommitted = why
            if self.unreachable is None:
                log.error(WAITS.format(why) if isinstance(err, NotCommitting) else
                          f"the store does not answer the lease: {why}")  # fmt: skip
            self.unreachable, self._erred = why, (time.monotonic(), why)
        self._asking_since = None
        if held and not self.lease.may_act():
            log.error("the lease ran out (epoch %d): stepping down", self.lease.epoch)
            self._changed()
        elif self.leading and not self.lease.may_act():
            self._changed()  # the worker has not stepped down yet

    def store_error(self) -> str | None:
        """Health's `store_error` (`store_seen.store_trouble`): any failed lease statement for a
        lease after it, and one unanswered for a third of the lease (atk45ha F3)."""
        return store_trouble(time.monotonic(), self.unreachable, self._erred,
                             self._asking_since, self.lease.lease_s)  # fmt: skip

    def lease_read_s_ago(self) -> float | None:
        """Seconds since this server last read the lease row (None: never)."""
        return time.monotonic() - self._leader_read_at if self._leader_read_at else None

    def _refusal(self, held: bool) -> None:
        """Say once (log, health) why this server takes no lease: its settings are not the
        store's (checked at every take, not only at start: atk38-28 F1, F1b)."""
        why = None if held else self.lease.refusal(self.leader)
        if why != self.refused:
            if why is not None:
                log.error("this server will not lead: %s", why)
            else:
                log.warning("this server's settings are the store's: it may lead")
        self.refused = why

    def _report(self) -> None:
        """Say where this server is and when it last kept a node's lease, then read until when
        any server may keep one (`keeping`)."""
        self._reporting = True
        try:
            sent = time.monotonic()
            kept = sent - self.kept_at if self.kept_at else None
            role = self.role if self.refused is None or self.acting() else REFUSED_ROLE
            self.lease.report(role, self.position(), kept)
            self.reported_at = sent
        finally:
            self._reporting = False
        self._uncommitted = None
        self.members = self.lease.members()
        clash = others_at(self.members, self.lease.address, self.lease.holder, api.SILENT_S,
                          self._address_key)  # fmt: skip
        same = same_address_words(self.lease.address, clash) if clash else None
        if same is not None and same != self.same_address:
            log.error("%s; this server takes no lease meanwhile", same)
        self.same_address = same
        self._older_at, older = older_words(self.lease.refused_older(), self.members, api.SILENT_S)
        if older != self.older and older is not None:
            log.warning("the store refuses the lease to servers of an earlier version: %s "
                        "(docs/ha.md, Upgrading)", older)  # fmt: skip
        self.older = older
        self._bound = self.lease.keep_bound(self.timing.stale_s, KEEP_WITHOUT_STORE_S)
        self._bound_read_at = time.monotonic()

    def _address_key(self, address: str) -> Key:
        """`peers.address_key`, each address resolved once (its first report) for the life of
        this server: no lookup in the lease's turns after that."""
        if address not in self._keys:
            self._keys[address] = address_key(address, resolved)
        return self._keys[address]

    def _changed(self) -> None:
        self.changed.set()
        self.notify()

    def no_taker(self) -> str | None:
        """Why no running server takes the lease once the leader's runs out (None: a standby
        may): `no_taker` of the servers as last read, but the lease's holder (its lease may
        have run out: dead, its last report may say standby)."""
        holder = self.leader.address if self.leader is not None else ""
        return no_taker(self.members, holder, self._older_at, api.SILENT_S)

    def servers(self, head: int) -> list[api.ServerState]:
        """Every server on the store that reported lately, with its lag behind `head`
        (`peers.server_states`)."""
        return server_states(self.members, self.leader_address(), head)


WAITS = (
    "{}: nobody can lead; this server waits as a standby (it answers reads, refuses writes "
    "with 503, and takes the lease once PostgreSQL commits again)"
)
"""The one line a server says when the store commits none of its writes (docs/ha.md)."""


def resolved(host: str, port: int) -> list[str]:
    """The IP addresses `host` resolves to (getaddrinfo), sorted; none when it does not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return sorted({str(info[4][0]) for info in infos})


def may_keep(since_report_s: float, timing: KeepTiming) -> bool:
    """Pure: may a server whose store is away keep node leases `since_report_s` after its last
    report to the store? From `timing.delay_s` (every leader sees it silent by then) until
    `KEEP_WITHOUT_STORE_S` (a leader waits that long after a silent server's last report)."""
    return timing.delay_s <= since_report_s < KEEP_WITHOUT_STORE_S


def store_words(why: str) -> str:
    """Why the store takes no write, in words: `why` is the lease's last error."""
    return why if "does not commit" in why else f"the store does not answer ({why})"


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
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        agent = scope["path"].startswith("/v1/agent/")
        read = scope["method"] in ("GET", "HEAD") and not agent
        if agent and self.ha.unreachable and self.ha.keeps():
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
        if await self._taking_over():
            await self.app(scope, receive, self._stamped(send, agent))
            return
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
        if self.ha.unreachable is not None:  # not "a standby": nobody can lead meanwhile
            await self._refuse(
                send,
                f"{store_words(self.ha.unreachable)}: no write is taken until it does",
            )
            return
        await self._refuse(send, "this server is a standby")

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
            electing = not leader and self.ha.unreachable is None
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
        if self.ha.unreachable is not None:  # nobody can lead meanwhile: no leader to name
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
        if self.ha.unreachable is not None:
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
