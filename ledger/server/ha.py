"""Several servers on one PostgreSQL store: who leads and when a server keeps node leases (the
HTTP side, what a standby answers and where writes go, is `ledger.server.ha_front`).

- `Leadership` runs the lease (`ledger.store.lease`) in a thread of its own: a standby tries to
  take it twice a second, the leader renews it every third of the lease. The worker thread
  turns the lease into a role at its next turn (`Worker`): promote (fence appends by the new
  epoch, open the executor, adopt what runs, start the relay, then cycle) or step down (stop
  cycling and relaying; jobs keep running). `may_act()` is the lease's own clock: the moment it
  is false nothing acts, even before the worker's next turn.
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

import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

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
from ledger.server.store_seen import lapsed, store_trouble, unelected
from ledger.store.lease import (
    MARGIN,
    Holder,
    Lease,
    Member,
    NotCommitting,
    RelayWord,
    dead_here,
)
from schemas import api

log = logging.getLogger("gpuledger.ha")

KEEP_WITHOUT_STORE_S = 900.0
"""How long a server cut off from its store keeps its agents' node leases (counted from its last
report to the store), and so how long after a silent server's last report a leader waits before
it may count a node lost (docs/ha.md, the failure table)."""


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
    appending: Callable[[], float | None] = lambda: None
    """monotonic time the leader's store call under way that its writes wait behind was begun
    (its append, or any statement of its worker thread: a read; None: none under way): one
    that waits past `stall_s` hands the lease over (`stalled`)."""
    relay: Callable[[], RelayWord | None] = lambda: None
    """This server's relay's health (None: it runs none), reported with its position: a
    standby tells the leader's from it (atk52-ha F4: "no Kafka" from every standby)."""
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
    abandon: Callable[[], float | None] = lambda: None
    """Shut the store connection the worker waits on (its statement fails at once), and how
    long it had waited (None: it waits on none): a lease it took and cannot act on."""
    held_back: str | None = None
    """Why this server handed back a lease it took and takes none until its worker turns
    (health's `store_error` meanwhile: it said nothing, atk61-ha F1)."""
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
    _members_read_at: float = 0.0
    """monotonic time `members` was last read (their ages are as of then)."""
    _bound: float | None = None
    """The store's `keep_bound` as last read (None: no server ever kept or went silent)."""
    _bound_read_at: float = 0.0
    _reporting: bool = False
    """A report is under way: no keep is decided meanwhile (it might miss the report)."""
    _keys: dict[str, Key] = field(default_factory=dict)
    """What server each address reported names (`_address_key`)."""
    giving_up: bool = False
    """A stop began (`give_up`): this server takes no lease again."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _renewer: threading.Thread | None = None
    _turn: threading.Lock = field(default_factory=threading.Lock)
    """Held by a renewal, a take and a hand-over: never two at once (a renewal answered after
    a hand-over would give the lease back to the server that handed it over)."""

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

    def away(self) -> str | None:
        """Why this server's store does not answer it, for a write's refusal: a lease statement
        failed (`unreachable`), or its own lease ran out with its renewal unanswered and no
        statement answered since (`store_seen.lapsed`: it knows of no election), or, a standby,
        no lease runs as it last read the row and its lease statement has had no answer
        (`store_seen.unelected`: nobody is elected without the store); None otherwise."""
        if self.unreachable is not None:
            return self.unreachable
        lease, now = self.lease, time.monotonic()
        why = lapsed(now, lease.deadline, lease.renewing, lease.answered_at, lease.answer_s)
        if why is None and not self.leading:
            why = unelected(now, self.lease_times()[0], self._asking_since, lease.answer_s)
        return why

    def leader_address(self) -> str:
        if self.acting():
            return self.lease.address
        if self.away() is not None:  # nobody can lead meanwhile: a lease row that looks
            return ""  # held may be a takeover the store never committed (atk33-28 F10)
        h = self.leader
        left = 0.0 if h is None else h.expires_in_s - (time.monotonic() - self._leader_read_at)
        if h is not None and h.address == self.lease.address:  # never itself while it does not
            return ""  # act: it took the lease and is taking up the work (atk61-ha F4)
        return h.address if h is not None and left > 0 else ""  # never a lease seen expire

    def taking_up(self) -> str | None:
        """Why this server, holding a lease it took, does not act yet: its worker is taking up
        the leader's work, and how long its store call has waited once that is a second or more
        (a table lock, a slow store); None when it leads or holds no lease. It said "standby"
        naming itself the leader for 13 s while a DBA's lock held its worker (atk61-ha F4)."""
        if self.leading or not self.lease.may_act():
            return None
        began = self.appending()
        waited = 0.0 if began is None else time.monotonic() - began
        slow = (f": its store call has waited {waited:.1f} s (the store is locked or slow)"
                if waited >= 1.0 else "")  # fmt: skip
        return (f"this server took the lease (epoch {self.lease.epoch}) and its worker is "
                f"taking up the leader's work{slow}")  # fmt: skip

    def lease_times(self) -> tuple[float | None, float | None]:
        """(seconds until the leader's lease expires, seconds since its holder last renewed it),
        now, from the row as last read (the database's clock) moved on by this server's own
        clock; negative expiry: it ran out and nobody took it yet. (None, None): no lease seen.
        The leader itself says its own: from the sending of its last renewal that answered (the
        row expires a lease after its commit, later), so it never says a lease run out while it
        says it leads."""
        if self.acting():  # its own renewal clock: the row as last read may be seconds old
            # (a leader cut off said -0.5 s there while it still led: atk60-ha F4)
            left = self.lease.deadline + self.lease.lease_s * MARGIN - time.monotonic()
            return left, self.lease.lease_s - left
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
        self._renewer = threading.Thread(target=self._renew, name="ledger-lease-renew",
                                         daemon=True)  # fmt: skip
        self._renewer.start()

    def give_up(self) -> None:
        """A stop began (SIGINT/SIGTERM): from now on this server takes no lease, not even one
        that lapsed while it stops; one it holds is renewed until `stop` hands it over, once its
        worker has finished its cycle. A stopping leader took the lease again twice and
        republished 25,000 events after the signal (atk56-25 F1)."""
        self.giving_up = True

    def stop(self, clean: bool = True) -> None:
        """A stop: hand the lease over at once (a standby takes it at its next try); `clean`:
        nothing of this server's may still be submitted (`takeover.hands_over_cleanly`), so
        the next leader waits for nothing."""
        self._stop.set()
        for thread in (self._thread, self._renewer):
            if thread is None:  # while the store is away a turn may wait on a statement or a
                continue  # connection (a second per host of the DSN): nothing of it is needed
            # then, no release is tried (a leader's stop waited 3 s more for it: atk49 F4)
            thread.join(timeout=0.3 if self.unreachable is not None else 10)
            if self.unreachable is not None and thread.is_alive():
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

    def _renew(self) -> None:
        """The renewals, on their own clock and connection: every third of the lease while
        this server holds it. They shared the turn of `_run` with the reports (five statements
        more, each seconds at load): under load a 2-3 s lease ran out between two renewals,
        every 10-20 s, and a leader rarely reached a relay commit (atk56-25 F2). A statement
        that fails is the turn's to tell (its own fail too); the lease runs until `deadline`."""
        step = self.lease.lease_s / 3
        while not self._stop.is_set():
            due = self.lease.deadline - self.lease.lease_s * (1 - MARGIN) + step
            if not self.lease.may_act():
                self._stop.wait(0.1)  # taken at the turn's next try: renewed a third later
                continue
            if self.stalled() is not None:  # not renewed: handed over at the next turn
                self._stop.wait(0.1)
                continue
            if time.monotonic() < due:
                self._stop.wait(min(0.1, max(0.01, due - time.monotonic())))
                continue
            with self._turn:
                if not self.lease.may_act() or self._stop.is_set():
                    continue
                try:
                    kept = self.lease.renew()
                except Exception as err:  # the turn's statements say the store is away
                    log.debug("the lease's renewal failed: %s", err)
                    self._stop.wait(0.1)
                    continue
            if not kept:
                log.error("lost the lease (epoch %d): another server leads", self.lease.epoch)
                self._changed()

    @property
    def stall_s(self) -> float:
        return append_stall_s(self.lease.lease_s)

    def stalled(self) -> float | None:
        """How long this leader's store call under way (`appending`: its append, or a read its
        worker waits on) has waited, once that is past `stall_s` (None otherwise): its lease is
        no longer renewed, and is handed over (`_tick`). Over a slow link (1 s a packet)
        renewals went through while no append committed for 17 s, and every write waited with
        it: a standby forwards to the leader (atk60-ha F5); a slow read held them as long (s61)."""
        began = self.appending()
        if not self.leading or began is None:
            return None
        waited = time.monotonic() - began
        return waited if waited > self.stall_s else None

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
            self._held_back_at, self.held_back = 0.0, None
        self._asking_since = time.monotonic()
        try:
            if held and self._unready():
                # renewing a lease nobody here acts on locks every server out (after an outage
                # one held it ~30 s so, while its worker still waited on the store: atk33-28 F7)
                failed = self.failed_at > self._took_at
                waited = None if failed else self.abandon()  # a statement a cut swallowed
                why = (  # fails now: the worker turns and this server takes the lease again
                    "could not take up the leader's work"
                    if failed
                    else "has not taken up "
                    f"the leader's work within {self.ready_s:.1f} s ("
                    + ("waiting on the store?" if waited is None else "its store statement "
                       f"had no answer for {waited:.1f} s: its connection is abandoned")
                    + ")"
                )  # fmt: skip
                log.error("took the lease (epoch %d) but the worker %s: handing it over",
                          self.lease.epoch, why)  # fmt: skip
                self.held_back = (f"took the lease but its worker {why}: handed it over; "
                                  "takes it again once the worker is free")  # fmt: skip
                self._took_at, self._held_back_at = 0.0, time.monotonic()
                held = False
                with self._turn:
                    self.lease.release(clean=False)  # its worker may be in an sbatch
                self._changed()
            elif held and (waited := self.stalled()) is not None:
                log.error("the leader's store call (its append, or a read its writes wait "
                          "behind) has had no answer for %.1f s (over %.1f s): "
                          "handing the lease over (epoch %d)", waited, self.stall_s,
                          self.lease.epoch)  # fmt: skip
                self._took_at, self._held_back_at = 0.0, time.monotonic()
                held = False
                try:  # its waiting writes are answered once it stops acting (`Worker`)
                    with self._turn:
                        self.lease.release(clean=False)  # the append may still commit: fenced
                finally:
                    self.lease.deadline = 0.0
                    self._changed()
            elif held:
                pass  # renewed on its own clock (`_renew`)
            elif (not self.giving_up and not self._held_back_at and self.same_address is None
                  and self._acquire()):  # fmt: skip
                if self.giving_up:  # the stop began while it was taken
                    log.info("took the lease (epoch %d) while stopping: handing it over",
                             self.lease.epoch)  # fmt: skip
                    with self._turn:
                        self.lease.release(clean=False)
                    raise _GaveUp
                self._took_at = time.monotonic()
                self._uncommitted = None
                self._erred = None  # its take committed: a new leader says no old failure
                log.info("took the lease: leading at epoch %d", self.lease.epoch)
                self._changed()
            self.leader, self._leader_read_at = self.lease.leader(), time.monotonic()
            self._refusal(held)
            if report:
                self._report()
            if self.unreachable is not None and self._uncommitted is None:
                log.warning("the store answers the lease again")
            self.unreachable = self._uncommitted
        except _GaveUp:
            pass
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

    def _acquire(self) -> bool:
        with self._turn:
            return self.lease.acquire()

    def store_error(self) -> str | None:
        """Health's `store_error` (`store_seen.store_trouble`): any failed lease statement for a
        lease after it, and one unanswered for a third of the lease (atk45ha F3); a standby's
        unanswered statement while no lease runs says so (`away`: it waits for no election)."""
        why = self.unreachable if self.leading else self.away()
        if why is None and self.held_back is not None and not self.leading:
            return self.held_back
        taking = self.taking_up() if why is None else None
        if taking is not None and "waited" in taking:
            return taking
        return store_trouble(time.monotonic(), why, self._erred,
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
            self.lease.report(role, self.position(), kept, self.relay())
            self.reported_at = sent
        finally:
            self._reporting = False
        self._uncommitted = None
        self.members = self.lease.members()
        self._members_read_at = time.monotonic()
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

    def leader_relay(self) -> tuple[RelayWord, float] | None:
        """The leader's relay as the leader last reported it to the store, and how long ago
        (None: no leader now, or it reported none): what a standby's health tells. The age
        counts on from the last read of the servers while the store does not answer (it stood
        still at the last read's: atk54-25 F2)."""
        leader = self.leader_address()
        since = time.monotonic() - self._members_read_at if self._members_read_at else 0.0
        for m in self.members:
            if m.address == leader and m.role == "leader" and m.relay is not None:
                return m.relay, m.seen_s_ago + max(0.0, since)
        return None

    def leader_of_earlier_version(self) -> bool:
        """Whether the leader's last report says nothing of its relay: a server of an earlier
        version (this one reports an empty state when it runs none: `Member.relay_told`)."""
        leader = self.leader_address()
        return any(
            m.address == leader and m.role == "leader" and not m.relay_told for m in self.members
        )

    @property
    def relay_word_s(self) -> float:
        """How old the leader's word on its relay may be before a standby calls it stale."""
        return relay_word_s(self.lease.lease_s)

    def servers(self, head: int) -> list[api.ServerState]:
        """Every server on the store that reported lately, with its lag behind `head`
        (`peers.server_states`)."""
        return server_states(self.members, self.leader_address(), head)


class _GaveUp(Exception):
    """The lease was taken as the stop began, and handed over (`Leadership.give_up`)."""


WAITS = (
    "{}: nobody can lead; this server waits as a standby (it answers reads, refuses writes "
    "with 503, and takes the lease once PostgreSQL commits again)"
)
"""The one line a server says when the store commits none of its writes (docs/ha.md)."""


APPEND_STALL_MIN_S = 5.0
"""The shortest `append_stall_s`: a group commit retried after a broken connection may take
`ledger.store.postgres.RETRY_FOR_S` (4 s) on a store that answers."""


def append_stall_s(lease_s: float) -> float:
    """Pure: how long a leader's append may wait before it hands the lease over: one lease,
    `APPEND_STALL_MIN_S` at least (docs/ha.md, "A slow link")."""
    return max(APPEND_STALL_MIN_S, lease_s)


def statement_bound_s(lease_s: float, lock_timeout_s: float) -> float:
    """Pure: how long a store connection of a server may stay lent before it is abandoned
    (`ledger.store.pgdeadline`): twice a leader's `append_stall_s` (a stalled leader hands its
    lease over first), and past the store's lock timeout (a lock wait ends in PostgreSQL's
    own words first): 12 s with a 5 s lease and the default 10 s lock timeout."""
    return max(2 * append_stall_s(lease_s), lock_timeout_s + 2.0)


def relay_word(state: tuple[str | None, str | None], position: int | None) -> RelayWord | None:
    """Pure: a service's relay health ((state, error), position) as a server reports it (None:
    it runs no relay; a position None: not known to be its topic's, atk58 F4)."""
    if state[0] is None:
        return None
    return RelayWord(state[0], position, state[1] or "")


RELAY_WORD_MARGIN_S = 3.0
"""How late past its interval a leader's report may come before its word on its relay is stale
(about what a home's own relay.json gets: `relay_health`)."""


def relay_word_s(lease_s: float) -> float:
    """Pure: the age past which a leader's report of its relay is stale: its reporting interval
    (a third of the lease, a second at least) plus `RELAY_WORD_MARGIN_S`. A standby said
    "publishing", exit 0, for 28-29 s after the leader was killed -9 or paused with a 30 s lease
    (atk54-25 F1): the word had no age limit."""
    return max(1.0, lease_s / 3) + RELAY_WORD_MARGIN_S


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
