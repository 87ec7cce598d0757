"""Leadership over a PostgreSQL store: one lease row, an epoch, and appends fenced by it.

Two or more servers on one store: the one holding the lease leads (runs the dispatcher, the relay
and the executors), the others follow the log. The lease is a row (`gpuledger_leader`) with an
epoch, a holder, the holder's address and an expiry in the database's clock:

- *taking it*: an UPDATE that succeeds only once the expiry has passed; it adds one to the epoch;
- *keeping it*: the holder renews every third of the lease; a renewal that finds another holder
  is the end at once;
- *stepping down before anyone else can lead*: the holder counts its lease from the moment it
  *sent* its last successful renewal (`Lease.deadline`, its own monotonic clock, with a margin);
  the database counts from the commit, which comes later. So the holder's own deadline always
  passes before the row's expiry does, and a server cut off from the database stops acting
  before another one may start;
- *fencing*: every append of the leader checks, in its own transaction, that the row still holds
  its epoch (`fence` below, a row lock in share mode: a takeover waits for the appends in flight,
  and an append after a takeover fails). With the (stream, version) key this makes a split brain
  impossible: two servers never both append, and a deposed leader's decisions are never stored,
  so no executor carries them out.

The settings every server runs alike, and the refusals of other ones: `ledger.store.leasesettings`.

Each server also says where it is (`gpuledger_servers`: address, role, folded position), which
is how a leader reports each standby's lag, and when it last kept a node's lease while the store
was away from it (`kept_at`), which is how a leader knows when no server may still keep one
(`keep_bound`, `ledger.server.ha`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ledger.store.leaseconn import NOT_COMMITTING as NOT_COMMITTING
from ledger.store.leaseconn import SYNC_WAIT as SYNC_WAIT
from ledger.store.leaseconn import NotCommitting as NotCommitting
from ledger.store.leaseconn import _sync_waits, watched
from ledger.store.leaseconn import abandon_connection as abandon_connection
from ledger.store.leaseconn import cancel_quietly as cancel_quietly
from ledger.store.leaseconn import end_sessions as end_sessions
from ledger.store.leaseschema import (
    LEADER_TABLE as LEADER_TABLE,
)
from ledger.store.leaseschema import (
    REFUSED_TABLE as REFUSED_TABLE,
)
from ledger.store.leaseschema import SCHEMA_LOCK as SCHEMA_LOCK
from ledger.store.leaseschema import (
    SERVERS_TABLE as SERVERS_TABLE,
)
from ledger.store.leaseschema import (
    lock_holder,
    make_schema,
    qualified,
)
from ledger.store.leaseschema import made as schema_made
from ledger.store.leasesettings import MEANT_OTHERWISE as MEANT_OTHERWISE
from ledger.store.leasesettings import Settings as Settings
from ledger.store.leasesettings import _disagreement, _read_row, _recorded
from ledger.store.leasesettings import admission_differences as admission_differences
from ledger.store.leasesettings import compared_admission as compared_admission
from ledger.store.leasesettings import earlier_admission as earlier_admission
from ledger.store.leasesettings import refusal as refusal
from ledger.store.pgread import connect, redacted, store_schema
from ledger.store.sessions import APP_PREFIX as APP_PREFIX
from ledger.store.sessions import app_name, cancel_orphans, own_name
from ledger.store.sessions import dead_here as dead_here
from schemas.errors import InvalidCommand, Unavailable

log = logging.getLogger("gpuledger.lease")

LEASE_RANGE_S = (1.0, 60.0)
"""The lease a server may be given: long enough to renew under load, short enough that a kill -9
of the leader never leaves the cluster leaderless for long."""
MARGIN = 0.2
"""The part of the lease a holder gives up to be sure it stops first (a fifth)."""


@dataclass(frozen=True)
class Holder:
    epoch: int
    holder: str
    address: str
    expires_in_s: float
    """Seconds until the lease expires (negative: expired), in the database's clock."""
    lease_s: float = 0.0
    """The lease's length: the holder's last renewal was `lease_s - expires_in_s` seconds ago
    (a renewal sets the expiry to the commit's time plus the lease)."""
    recorded: Settings | None = None
    """The settings the row records (None: none yet, a new store)."""
    changeable: bool = False
    """They were recorded before this server started with `--new-settings` (it may replace
    them when it takes the lease)."""
    held_in_s: float | None = None
    """Seconds from now until which an agent may hold a node lease granted by settings the
    store recorded before (a longer node-lost timeout + fence); None: none."""


@dataclass(frozen=True)
class Member:
    holder: str
    address: str
    role: str
    position: int
    seen_s_ago: float
    relay: RelayWord | None = None
    """Its relay's health as it last reported (None: it runs none, or is of an earlier
    version): what a standby tells of the leader's relay (atk52-ha F4)."""
    relay_told: bool = True
    """Whether its row says anything of its relay: a server of this version always does (an
    empty state: it runs none); False: one of an earlier version, which does not report it (a
    standby said "no relay has run" under such a leader in a rolling upgrade)."""


@dataclass(frozen=True)
class RelayWord:
    """A server's relay as it reports it to the store: state, position on the topic, error."""

    state: str
    position: int | None
    """None: not known to be the topic's (before the relay's first connect: atk58 F4)."""
    error: str = ""


START_WAIT_S = 10.0
"""The statement and lock timeouts of a start's settings check (`agree`): a concurrent start's
DDL holds the lease's tables a moment; a killed one's, waiting for a synchronous standby, is
cancelled first (`cancel_orphans`)."""


UNANSWERED = "a lease statement had no answer for {:.1f} s: its connection was given up"
"""Why a lease statement failed when its watchdog abandoned its connection (`Lease._watch`)."""


class Unanswered(Exception):
    """A lease statement whose connection this server gave up: the store did not answer it."""


class NotLeader(Exception):
    """An append of a server whose epoch was taken over (the fence refused it)."""


def setup(dsn: str) -> None:
    """Make the lease tables and the fence function unless the store has them as this version
    makes them (`leaseschema.make_schema`: concurrent starts wait for each other)."""
    with connect(dsn) as con:
        make_schema(con, schema=store_schema())


def agree(
    dsn: str,
    mine: Settings,
    change: bool = False,
    vet: Callable[[Settings], None] | None = None,
    uncommitted: list[str] | None = None,
) -> Any:
    """Refuse (one line) a lease outside `LEASE_RANGE_S`, or settings (`Settings`: the lease,
    the node-lost timeout and fence, the executor and policy) other than those the store
    records: the last taker's, kept in the row while nobody leads too. Every server on a store
    runs the same: a server given others takes no lease (`Lease.acquire`) and says why
    (`Lease.refusal`). With `change` (`serve --new-settings`) a server starts with others once
    nobody leads, and records them when it takes the lease. The check reads the row first,
    whatever columns an earlier version left (a read takes no lock a keep waits for), and only
    a server it accepts makes the lease's schema (`setup`: the guard of "Upgrading" and its
    `stamp`; once per version): a server that is refused changes nothing in the store (it made
    the guard before its check, and the earlier version's leader was locked out while this one
    never led: atk42-28 F2) and holds no lock on it (it made the schema in its check's
    transaction, and held the table's ACCESS EXCLUSIVE lock while it was slow or frozen: the
    leader could not keep the lease, and nobody led: atk43ha F3). Returns the database's time
    now: settings recorded later are never replaced by this server (two servers started
    together with different settings never take turns: atk38-28 F1); None with `change` when
    the store records these settings already (the flag has nothing to change, and changes
    nothing). `vet`, with `change`: asked about the recorded settings this server would replace
    before anything is made, and refuses (raises) a change it may not make (runs left on
    another Slurm cluster: atk43ha F2). `uncommitted`: gets why the store commits nothing, when
    the lease's tables were made and their commit waited for the synchronous standby (the
    start says it once, `Leadership.uncommitted`)."""
    low, high = LEASE_RANGE_S
    if not low <= mine.lease_s <= high:
        raise InvalidCommand(
            f"--lease {mine.lease_s:g}s is outside {low:g}s-{high:g}s",
            hint="the default 5s suits most clusters: docs/ha.md",
        )
    from psycopg.errors import LockNotAvailable, QueryCanceled

    schema = store_schema()
    within = max(0.2, mine.lease_s / 3)
    try:
        return _agreed(dsn, mine, change, vet, schema, within, uncommitted)
    except (QueryCanceled, LockNotAvailable) as err:  # a statement of the start unanswered, or
        # the schema's lock not had, within START_WAIT_S (atk50b-ha F2: "internal error:
        # LockNotAvailable" after 60 s of silence)
        raise Unavailable(
            f"the store {redacted(dsn)} did not answer this server's start within "
            f"{START_WAIT_S:g} s: " + (str(err).strip().splitlines() or [type(err).__name__])[0],
            hint="a session may hold the lease's tables (pg_stat_activity); docs/ha.md",
        ) from err


def holder_waits(con: Any, within_s: float) -> None:
    """The start could not have the schema's lock (`make_schema`): `NotCommitting` in one line
    when its holder's commit has waited for the synchronous standby for `within_s` (another
    start, of another host perhaps, killed or not, made the lease's tables and waits on its
    commit: it holds the lock until the standby confirms, so this start cannot go on)."""
    got = lock_holder(con)
    if got is None or got[2] != "SyncRep" or got[3] < within_s:
        return
    pid, name, _, waited = got
    raise NotCommitting(
        NOT_COMMITTING.format(round(waited, 1))
        + f": the lease's tables are being made by another start (backend {pid}, {name!r}), "
        "whose commit waits for it; this server can start once PostgreSQL commits again"
    )


def _agreed(
    dsn: str,
    mine: Settings,
    change: bool,
    vet: Callable[[Settings], None] | None,
    schema: str,
    within: float,
    uncommitted: list[str] | None,
) -> Any:
    ms = int(START_WAIT_S * 1000)
    with connect(dsn, application_name=own_name("start"),
                 options=f"-c statement_timeout={ms} -c lock_timeout={ms}") as con:  # fmt: skip
        cancel_orphans(con)  # what a killed start or server of this host left waiting
        exists = qualified("SELECT to_regclass('{leader}') IS NOT NULL, now()", schema)
        made, now = con.execute(exists).fetchone()
        row = None
        if made:  # a read: the lock a keep waits for is never taken by a server refused here
            row = con.execute(qualified(
                "SELECT to_jsonb(l) || jsonb_build_object('live', l.expires_at > now()) "
                "FROM {leader} l WHERE id = 1", schema,
            )).fetchone()  # fmt: skip
        recorded, live, who = _read_row(row[0] if row else {}, mine)
        if recorded is not None and mine.differs(recorded) and (live or not change):
            raise _disagreement(mine, recorded, who, live)
        if change and vet is not None and recorded is not None and mine.differs(recorded):
            vet(recorded)
        try:  # its commit waits for a synchronous standby that is away: cancelled in `within`
            make_schema(con, START_WAIT_S, schema, lambda sql: watched(con, within, sql, dsn),
                        lambda c: holder_waits(c, within))  # fmt: skip
        except NotCommitting as err:
            if not schema_made(con, schema):
                raise
            if uncommitted is not None:  # made here, unconfirmed: the start waits as a standby
                uncommitted.append(err.message)
    if change and recorded is not None and not mine.differs(recorded):
        return None  # nothing to change: the flag does nothing (it acts once: atk39-28 F3)
    return now


_SAME = (
    "(lease_s = %(lease)s AND node_lost_s IS NOT DISTINCT FROM COALESCE(%(lost)s::float8, "
    "node_lost_s) AND node_fence_s IS NOT DISTINCT FROM COALESCE(%(fence)s::float8, "
    "node_fence_s) AND work IS NOT DISTINCT FROM COALESCE(%(work)s::text, work) "
    "AND admission IS NOT DISTINCT FROM COALESCE(%(admission)s::text, admission))"
)
"""The row records exactly these settings (a part given as NULL is not compared)."""
_AGREES = (
    "((lease_s = 0 OR lease_s = %(lease)s) "
    "AND (node_lost_s IS NULL OR %(lost)s::float8 IS NULL OR node_lost_s = %(lost)s::float8) "
    "AND (node_fence_s IS NULL OR %(fence)s::float8 IS NULL OR node_fence_s = %(fence)s::float8) "
    "AND (work IS NULL OR %(work)s::text IS NULL OR work = %(work)s::text) "
    "AND (admission IS NULL OR %(admission)s::text IS NULL "
    "OR admission_epoch = epoch AND NOT EXISTS (SELECT 1 FROM jsonb_each(admission::jsonb) "
    "AS r WHERE r.value IS DISTINCT FROM %(admission)s::jsonb -> r.key) "
    "OR admission_epoch IS DISTINCT FROM epoch AND admission = %(earlier)s::text))"
)
"""The row records no other settings (`Settings.differs`): a key the admission settings lack
is not compared (one an earlier version did not record: the next take records it,
`admission_differences`). Admission settings recorded by an earlier version (the take that
recorded them left `admission_epoch` behind the epoch) are compared by what they mean
(`earlier_admission`), which only this server's Python knows: the take passes, as `earlier`,
the text it read last and found to agree (`Lease.leader`), and takes the lease only while the
row still records exactly that text."""
_RECORDED_ADMISSION = "admission, admission_epoch IS NOT DISTINCT FROM epoch"
"""The recorded admission settings, and whether this version's take recorded them (an earlier
version's take, e.g. during an upgrade or after a rollback, docs/ha.md "Upgrading", moves the
epoch and not `admission_epoch`: `compared_admission`)."""
_TAKE = (
    "UPDATE {leader} SET epoch = epoch + 1, stamp = stamp + 1, holder = %(holder)s, "
    "address = %(address)s, "
    "expires_at = now() + make_interval(secs => %(lease)s), acquired_at = now(), "
    f"settings_at = CASE WHEN {_SAME} THEN settings_at ELSE now() END, "
    "held_until = CASE WHEN node_lost_s + node_fence_s > %(lost)s::float8 + %(fence)s::float8 "
    "THEN GREATEST(held_until, now() + make_interval(secs => node_lost_s + node_fence_s)) "
    "ELSE held_until END, "
    "lease_s = %(lease)s, node_lost_s = COALESCE(%(lost)s::float8, node_lost_s), "
    "node_fence_s = COALESCE(%(fence)s::float8, node_fence_s), "
    "work = COALESCE(%(work)s::text, work), admission = COALESCE(%(admission)s::text, admission), "
    "admission_epoch = CASE WHEN %(admission)s::text IS NOT NULL OR admission_epoch = epoch "
    "THEN epoch + 1 ELSE admission_epoch END "
    "FROM (SELECT expires_at AS was_until, stamp AS was_stamp FROM {leader} "
    "WHERE id = 1) AS was "
    "WHERE id = 1 AND (expires_at < now() OR holder = %(holder)s) "
    f"AND ({_AGREES} OR settings_at IS NULL AND %(since)s::timestamptz IS NOT NULL "
    "OR settings_at < %(since)s::timestamptz) "
    "RETURNING epoch, was.was_until = '-infinity' AND was.was_stamp + 1 = stamp"
)
"""Take the lease (`Lease.acquire`). A node lease granted by the old settings runs at most
their node-lost timeout + fence after the last renewal, which came before this take: until
`held_until` (the latest of every such change). Its second column: the lease taken was
released by a clean stop (`Lease.release`: '-infinity'), as the row was when this take read
it and still is (the stamp it read is the one it raised: no take or renewal between; a
release between is not seen, and counts as not clean)."""


def leading_now(dsn: str) -> str | None:
    """The address of the server that holds the lease now (None: nobody leads)."""
    with connect(dsn) as con:
        row = con.execute(qualified(
            "SELECT address, expires_at > now() FROM {leader} WHERE id = 1 AND holder <> ''",
            store_schema(),
        )).fetchone()  # fmt: skip
    return (row[0] or "?") if row is not None and row[1] else None


class Lease:
    """One server's side of the lease, on a connection of its own (never the store's pool: a
    busy pool must not delay a renewal)."""

    def __init__(
        self,
        dsn: str,
        holder: str,
        address: str,
        lease_s: float,
        node: tuple[float, float] | None = None,
        work: str | None = None,
        since: Any = None,
        *,
        admission: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.schema = store_schema()
        """The store's schema (`leaseschema.store_schema`): every lease object is named in it."""
        self.holder = holder
        self.address = address
        self.lease_s = lease_s
        self.node = node
        """(node-lost timeout, fence) in seconds, recorded in the row with each take (`agree`)."""
        self.work = work
        """The executor and policy (`Settings.work`), recorded with each take."""
        self.admission = admission
        """The admission and security settings (`Settings.admission`), recorded with each
        take (a row without them, from before they were, gets them from the first take)."""
        self.since = since
        """With `serve --new-settings`: the database's time this server started (`agree`);
        settings the row recorded before then are replaced by this server's when it takes the
        lease. None: it takes the lease only while the row records its own settings."""
        self.epoch = 0
        self.handed_over = False
        """The last take followed a clean stop of the last holder (`release`): nothing of its
        was in flight (its worker had finished its cycle: no `sbatch` may still land)."""
        self.deadline = 0.0
        """monotonic time until which this server may act as leader (0: it is not leader)."""
        self.renewing: float | None = None
        """monotonic time the last renewal was sent while it has had no answer (under way, or
        failed; None: it answered): a lease run out so is one the store did not answer."""
        self.answered_at = 0.0
        """monotonic time a statement of the lease last answered (`store_seen.lapsed`)."""
        self._cons: dict[str, Any] = {}
        """Its connections: the renewals' own ("renew", its own thread's: `Leadership`) and
        the rest's ("lease"): a renewal never waits behind a report's statements."""
        self._notices: dict[str, list[str]] = {"lease": [], "renew": [], "relay": []}
        self._earlier: str | None = None
        """The admission text an earlier version recorded that this server read last and found
        to agree with its own by meaning (`earlier_admission`): the take passes it (`_AGREES`)."""
        self._said: str | None = None
        """The recorded admission text whose uncompared keys this server said last."""
        self._read = False
        """This server has read the row (`leader`) since it started."""

    @property
    def answer_s(self) -> float:
        """How long a statement of the lease may take (a third of the lease, at least 0.2 s)."""
        return max(0.2, self.lease_s / 3)

    def _connection(self, which: str = "lease") -> Any:
        con = self._cons.get(which)
        if con is None or con.closed:
            timeout_ms = int(self.answer_s * 1000)
            con = self._cons[which] = connect(
                self.dsn,
                connect_timeout=max(1, int(self.lease_s / 3)),
                options=f"-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms}",
                application_name=app_name(self.holder),
            )
            notices = self._notices[which]
            con.add_notice_handler(lambda diag: notices.append(str(diag.message_primary or "")))
        return con

    def _run(self, sql: str, params: Any = (), which: str = "lease") -> list[tuple[Any, ...]]:
        """`sql` on the lease's connection `which`, answered within `answer_s` or cancelled: a
        commit that waits for a synchronous standby that is down waits forever, whatever the
        statement timeout (the leader stood down and nobody led, while health blamed nobody:
        atk33-28 F10); cancelled, it committed only here, unconfirmed, and counts as failed."""
        notices = self._notices[which]
        notices.clear()
        abandoned = threading.Event()
        try:
            con = self._connection(which)
            answered = threading.Event()
            watchdog = threading.Timer(self.answer_s + 0.1, self._watch,
                                       (con, answered, abandoned))  # fmt: skip
            watchdog.daemon = True
            watchdog.start()
            try:
                rows: list[tuple[Any, ...]] = con.execute(
                    qualified(sql, self.schema), params
                ).fetchall()
            finally:
                answered.set()
                watchdog.cancel()
            if any(SYNC_WAIT in n for n in notices):
                raise NotCommitting(NOT_COMMITTING.format(round(self.answer_s + 0.1, 1)))
            self.answered_at = time.monotonic()
            return rows
        except Exception as err:
            from psycopg.errors import QueryCanceled

            if abandoned.is_set():  # its error is the socket this server shut, not the store's
                gone = self._cons.pop(which, None)  # ("server closed the connection": atk60-ha F3)
                if gone is not None:
                    gone.close()
                raise Unanswered(UNANSWERED.format(2 * self.answer_s + 0.1)) from err
            con = self._cons.pop(which, None)
            unconfirmed = isinstance(err, QueryCanceled) and _sync_waits(con)
            if con is not None:
                con.close()
            if unconfirmed:  # a lock or statement timeout behind a commit that waits
                raise NotCommitting(NOT_COMMITTING.format(round(self.answer_s, 1))) from err
            raise

    def _watch(self, con: Any, answered: threading.Event, abandoned: threading.Event) -> None:
        """The watchdog of a statement unanswered past `answer_s`: cancel it (a commit waiting
        for a synchronous standby that is down ends so, `NotCommitting`), and if it is still
        unanswered `answer_s` later, abandon the connection (its socket shut: the statement
        raises at once). A PostgreSQL that hangs (its postmaster and backends stopped: a
        storage stall) answers neither the statement, nor its own `statement_timeout`, nor the
        cancel, and TCP keepalives are answered by its host's kernel: the statement waited
        forever, the server never counted the store away, nobody kept the agents' node leases,
        and every running job was fenced at the node lease's end (atk48-ha F5). The cancel
        goes on its own thread: over a silent link it hangs too (its own `answer_s`), and the
        connection was abandoned only after it, 5.2-5.6 s after the statement with a 5 s lease
        where 3.4 s is said (atk60-ha F2)."""
        threading.Thread(target=cancel_quietly, args=(con, self.answer_s), name="lease-cancel",
                         daemon=True).start()  # fmt: skip
        if not answered.wait(self.answer_s):
            log.warning("a lease statement has had no answer for %.1f s: its connection is "
                        "abandoned", 2 * self.answer_s + 0.1)  # fmt: skip
            abandoned.set()
            abandon_connection(con)

    def may_act(self) -> bool:
        """Is this server the leader now, by its own clock (a fifth of the lease to spare)?"""
        return self.epoch > 0 and time.monotonic() < self.deadline

    def holds(self) -> bool:
        """Whether this server holds the lease now by its own clock *and* by the store's answer
        (the row names its epoch and has not expired in the database's clock), on a connection
        of the relay's: its relay asks before its producer's `init_transactions` and before each
        transaction. A leader paused or cut off in the middle of its relay's connect went on with
        it after another server took the lease, and its init (the ledger's one transactional id)
        fenced the new leader's relay (atk58 F5). False when the store does not answer."""
        if not self.may_act():
            return False
        try:
            rows = self._run(
                "SELECT 1 FROM {leader} WHERE id = 1 AND holder = %s AND epoch = %s "
                "AND expires_at > clock_timestamp()",
                (self.holder, self.epoch),
                "relay",
            )
        except Exception as err:  # the store away: not known to be ours, so not acted on
            log.debug("the relay's lease check had no answer: %s", err)
            return False
        return bool(rows) and self.may_act()

    @property
    def settings(self) -> Settings:
        return Settings(self.lease_s, self.node, self.work, self.admission)

    def acquire(self) -> bool:
        """Take the lease if it has expired (or is ours) and the row records this server's
        settings (or none yet, or, with `since`, ones recorded before this server started; of
        admission settings an earlier version recorded, the text the last read found to mean
        these, `_earlier`: the first take reads the row first); True when this server now
        leads. A change of settings is recorded with its time
        (`settings_at`), and a shorter node lease than the recorded one leaves, in
        `held_until`, until when an agent may still hold one granted by the old settings
        (a new leader counts no node lost before then: `Leadership.keeping`, atk38-28 F3)."""
        if not self._read:
            self.leader()  # what the row records, as this server compares it (`_earlier`)
        sent = time.monotonic()
        lost, fence = self.node or (None, None)
        rows = self._run(_TAKE, {
            "holder": self.holder, "address": self.address, "lease": self.lease_s,
            "lost": lost, "fence": fence, "work": self.work, "since": self.since,
            "admission": self.admission, "earlier": self._earlier,
        })  # fmt: skip
        if not rows:
            return False
        self.epoch = int(rows[0][0])
        self.handed_over = bool(rows[0][1])
        self.renewing = None  # a renewal unanswered before says nothing of this lease
        self.deadline = sent + self.lease_s * (1 - MARGIN)
        return True

    def renew(self) -> bool:
        """Extend the lease unless it ran out (in the database's clock as the statement runs:
        one sent before PostgreSQL hung, run as it woke, extended a lease its holder had given
        up); False then, or when another server holds it (stop at once). A database that does
        not answer raises: the lease still runs until `deadline`."""
        sent = self.renewing = time.monotonic()
        rows = self._run(
            "UPDATE {leader} SET expires_at = now() + make_interval(secs => %s), "
            "stamp = stamp + 1 WHERE id = 1 AND holder = %s AND epoch = %s "
            "AND expires_at > clock_timestamp() RETURNING epoch",
            (self.lease_s, self.holder, self.epoch),
            "renew",
        )
        self.renewing = None
        if not rows:
            self.deadline = 0.0
            return False
        self.deadline = sent + self.lease_s * (1 - MARGIN)
        return True

    def release(self, clean: bool = True) -> None:
        """Let a standby take over at once: a `clean` stop ('-infinity': its worker has
        finished, nothing of its is in flight, so the next take is `handed_over`), or a lease
        handed over by a server whose worker is busy (expired now: it may be in an `sbatch`)."""
        if self.epoch and self.may_act():
            until = "'-infinity'" if clean else "now()"
            self._run(
                f"UPDATE {{leader}} SET expires_at = {until} "
                "WHERE id = 1 AND holder = %s AND epoch = %s RETURNING 1",
                (self.holder, self.epoch),
            )
        self.deadline = 0.0

    def leader(self) -> Holder | None:
        """Who holds the lease (None: nobody ever did)."""
        rows = self._run(
            "SELECT epoch, holder, address, CASE WHEN isfinite(expires_at) THEN "
            "extract(epoch FROM expires_at - now()) END, lease_s, "
            "node_lost_s, node_fence_s, work, settings_at IS NULL OR settings_at < "
            "%s::timestamptz, extract(epoch FROM held_until - now()), "
            f"{_RECORDED_ADMISSION} FROM {{leader}} WHERE id = 1",
            (self.since,),
        )
        self._read = True
        if not rows or not rows[0][1]:
            return None
        epoch, holder, address, left, lease_s, lost, fence, work, changeable, held = rows[0][:10]
        text, current = rows[0][10:]
        left = float(left) if left is not None else -1e9
        admits = self._compared(text, bool(current), int(epoch), address)
        recorded = _recorded(lease_s, lost, fence, work, admits)
        return Holder(int(epoch), holder, address, left, float(lease_s or 0.0), recorded,
                      bool(changeable) and self.since is not None,
                      None if held is None else float(held))  # fmt: skip

    def _compared(self, text: str | None, current: bool, epoch: int, address: str) -> str | None:
        """The recorded admission text `text` as this server compares it (`compared_admission`);
        says once in the log which keys it does not compare, and keeps an earlier version's
        text that agrees with this server's for the take (`_earlier`)."""
        admits, skipped = compared_admission(text, current, self.admission)
        agrees = admits is not None and not admission_differences(admits, self.admission)
        self._earlier = text if not current and agrees else None
        if skipped and text != self._said:
            log.warning(
                "the store's admission settings were recorded by an earlier version (the lease "
                "last taken by %s, epoch %d)%s; not compared: %s (that version recorded none; "
                "this server's take records them)", address or "?", epoch,
                "" if current else ", compared by what they mean", ", ".join(skipped),
            )  # fmt: skip
        self._said = text if skipped else None
        return admits

    def refusal(self, holder: Holder | None) -> str | None:
        """Why this server may not take the lease from the row `holder` read (its settings
        are not the recorded ones, and it may not replace them), in one line; None: it may."""
        if holder is None:
            return None
        live = holder.expires_in_s > 0 and holder.holder != self.holder
        if live and holder.recorded is not None and self.settings.differs(holder.recorded):
            self.since = None  # another leads by the recorded ones: this server changes none
        if holder.changeable and self.since is not None:
            return None
        return refusal(self.settings, holder.recorded, holder.address or "?", live)

    @property
    def node_lease_s(self) -> float | None:
        """The node lease this server's keeps grant: its node-lost timeout + fence (None: no
        node settings)."""
        return None if self.node is None else sum(self.node)

    def report(
        self,
        role: str,
        position: int,
        kept_ago_s: float | None = None,
        relay: RelayWord | None = None,
    ) -> None:
        """Say where this server is (its role and the log position it has folded) and, with
        `kept_ago_s`, that it kept a node's lease that long ago (kept as the latest such time,
        in the database's clock: the commit comes after the keep, so it never says too early),
        how long a node lease its keeps grant (`node_lease_s`), and its relay's health
        (`relay`; None: it runs none, reported as an empty state: `Member.relay_told`)."""
        state, at, error = (
            ("", None, None) if relay is None else (relay.state, relay.position, relay.error)
        )
        self._run(
            "INSERT INTO {servers} AS s (holder, address, role, position, seen_at, "
            "kept_at, node_lease_s, relay_state, relay_position, relay_error) VALUES (%s, %s, "
            "%s, %s, now(), now() - make_interval(secs => %s), %s, %s, %s, %s) "
            "ON CONFLICT (holder) "
            "DO UPDATE SET address = excluded.address, role = excluded.role, "
            "position = excluded.position, seen_at = now(), "
            "kept_at = GREATEST(s.kept_at, excluded.kept_at), "
            "node_lease_s = excluded.node_lease_s, relay_state = excluded.relay_state, "
            "relay_position = excluded.relay_position, relay_error = excluded.relay_error "
            "RETURNING 1",
            (self.holder, self.address, role, position, kept_ago_s, self.node_lease_s, state,
             at, error),
        )  # fmt: skip

    def keep_bound(self, stale_s: float, keep_s: float) -> float | None:
        """Seconds from now until which some server may still keep a node's lease (negative:
        that long ago; None: no server ever may have): the latest keep any server reported,
        and for a server silent over `stale_s` (cut off from the store, dead, paused: it may
        keep leases without saying so) its last report + `keep_s` (`ledger.server.ha`). A
        server whose keeps grant a longer node lease than this one's (`node_lease_s`: one still
        running by the settings a `--new-settings` take replaced, which it had not read when
        the store went away) counts later by the difference: this server counts a node lost
        by its own settings from the bound, and the agent holds the lease the keep granted
        (atk39-28 F1: a job ran twice when keeps granted the old, longer lease)."""
        rows = self._run(
            "SELECT extract(epoch FROM max(GREATEST(kept_at, CASE WHEN seen_at < now() - "
            "make_interval(secs => %(stale)s) THEN seen_at + make_interval(secs => %(keep)s) "
            "END) + make_interval(secs => GREATEST(0, COALESCE(node_lease_s - %(own)s::float8, "
            "0)))) - now()) FROM {servers}",
            {"stale": stale_s, "keep": keep_s, "own": self.node_lease_s},
        )
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def refused_older(self, within_s: float = 3600.0) -> list[tuple[str, str, int]]:
        """The servers of an earlier version whose takes or keeps of the lease the database
        refused in the last `within_s` seconds (`gpuledger_leader_guard`): (address, holder,
        how many in all), by address."""
        rows = self._run(
            "SELECT address, holder, refused FROM {refused} "
            "WHERE last_at > now() - make_interval(secs => %s) ORDER BY address, holder",
            (within_s,),
        )
        return [(str(a), str(h), int(n)) for a, h, n in rows]

    def members(self, within_s: float = 60.0) -> list[Member]:
        """The servers that reported in the last `within_s` seconds."""
        rows = self._run(
            "SELECT holder, address, role, position, extract(epoch FROM now() - seen_at), "
            "relay_state, relay_position, relay_error "
            "FROM {servers} WHERE seen_at > now() - make_interval(secs => %s) "
            "AND role <> 'stopped' ORDER BY address",
            (within_s,),
        )
        return [
            Member(h, a, r, int(p), float(s),
                   RelayWord(str(rs), None if rp is None else int(rp), str(re or ""))
                   if rs else None,
                   relay_told=rs is not None)
            for h, a, r, p, s, rs, rp, re in rows
        ]  # fmt: skip

    def retire(self, dead: Callable[[str], bool]) -> list[str]:
        """Servers that reported at this server's address and are `dead` (a process gone, e.g.
        this one's predecessor killed, or stopped while the store was away): they keep nothing
        more, so only their keeps count, as of now at the latest (`keep_bound`). Returns them."""
        rows = self._run(
            "SELECT holder FROM {servers} WHERE address = %s AND holder <> %s "
            "AND role <> 'stopped'",
            (self.address, self.holder),
        )
        gone = [h for (h,) in rows if dead(h)]
        for holder in gone:
            self._run(
                "UPDATE {servers} SET role = 'stopped', seen_at = 'infinity', "
                "kept_at = GREATEST(kept_at, now()) WHERE holder = %s RETURNING 1",
                (holder,),
            )
        return gone

    def forget(self) -> None:
        """A clean stop: this server leaves the list, unless it kept a node's lease lately
        (`kept_at` within the last day): then its row stays, as `stopped`, and only its keeps
        count (`keep_bound`: a stopped server keeps nothing more)."""
        self._run(
            "DELETE FROM {servers} WHERE holder = %s AND (kept_at IS NULL OR "
            "kept_at < now() - interval '1 day') RETURNING 1",
            (self.holder,),
        )
        self._run(
            "UPDATE {servers} SET role = 'stopped', seen_at = 'infinity' "
            "WHERE holder = %s RETURNING 1",
            (self.holder,),
        )

    def close(self) -> None:
        for con in list(self._cons.values()):
            con.close()
        self._cons.clear()

    def __repr__(self) -> str:
        return f"Lease({redacted(self.dsn)}, {self.address}, epoch {self.epoch})"
