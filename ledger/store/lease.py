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

from ledger.store.pgread import connect, redacted
from schemas.errors import InvalidCommand

log = logging.getLogger("gpuledger.lease")

LEADER_TABLE = "gpuledger_leader"
SERVERS_TABLE = "gpuledger_servers"
LEASE_RANGE_S = (1.0, 60.0)
"""The lease a server may be given: long enough to renew under load, short enough that a kill -9
of the leader never leaves the cluster leaderless for long."""
MARGIN = 0.2
"""The part of the lease a holder gives up to be sure it stops first (a fifth)."""

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {LEADER_TABLE} (
    id int PRIMARY KEY CHECK (id = 1),
    epoch bigint NOT NULL,
    holder text NOT NULL,
    address text NOT NULL,
    expires_at timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL
);
INSERT INTO {LEADER_TABLE} VALUES (1, 0, '', '', '-infinity', now()) ON CONFLICT DO NOTHING;
ALTER TABLE {LEADER_TABLE} ADD COLUMN IF NOT EXISTS lease_s double precision NOT NULL DEFAULT 0;
ALTER TABLE {LEADER_TABLE} ADD COLUMN IF NOT EXISTS node_lost_s double precision;
ALTER TABLE {LEADER_TABLE} ADD COLUMN IF NOT EXISTS node_fence_s double precision;
CREATE TABLE IF NOT EXISTS {SERVERS_TABLE} (
    holder text PRIMARY KEY,
    address text NOT NULL,
    role text NOT NULL,
    position bigint NOT NULL,
    seen_at timestamptz NOT NULL
);
ALTER TABLE {SERVERS_TABLE} ADD COLUMN IF NOT EXISTS kept_at timestamptz;
CREATE OR REPLACE FUNCTION gpuledger_fence(want bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM {LEADER_TABLE} WHERE id = 1 AND epoch = want FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'gpuledger: not the leader (epoch % was taken over)', want
            USING ERRCODE = 'raise_exception';
    END IF;
END $$;
"""


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


@dataclass(frozen=True)
class Member:
    holder: str
    address: str
    role: str
    position: int
    seen_s_ago: float


SYNC_WAIT = "canceling wait for synchronous replication"
"""PostgreSQL's warning when a commit that waited for its synchronous standby is cancelled (the
transaction committed locally, and the standby never confirmed it)."""
NOT_COMMITTING = (
    "PostgreSQL does not commit: its synchronous standby does not confirm (a commit waited "
    "{:g} s; synchronous_standby_names names a standby that is down or cut off)"
)


class NotLeader(Exception):
    """An append of a server whose epoch was taken over (the fence refused it)."""


class NotCommitting(Exception):
    """The store takes statements but does not commit them (its synchronous standby is away)."""


def setup(dsn: str) -> None:
    """Create the lease tables and the fence function (idempotent; concurrent starts wait for
    each other on an advisory lock)."""
    with connect(dsn) as con:
        con.execute("SELECT pg_advisory_lock(7346010)")
        try:
            con.execute(_SCHEMA)
        finally:
            con.execute("SELECT pg_advisory_unlock(7346010)")


def agree(dsn: str, lease_s: float, node: tuple[float, float] | None = None) -> None:
    """Refuse (one line) a lease outside `LEASE_RANGE_S`, or a lease or `node` settings (the
    node-lost timeout and the fence, in seconds) other than those of a server leading the store
    now. Every server on a store uses the same: the row carries them, and they change once
    nobody leads, with the next server that takes it. A standby with another fence than the
    leader that registered an agent ran that node's jobs elsewhere while the agent's lease,
    renewed by the old fence, kept the first launch alive (atk37-28 F1)."""
    low, high = LEASE_RANGE_S
    if not low <= lease_s <= high:
        raise InvalidCommand(
            f"--lease {lease_s:g}s is outside {low:g}s-{high:g}s",
            hint="the default 5s suits most clusters: docs/ha.md",
        )
    with connect(dsn) as con:
        row = con.execute(
            f"SELECT lease_s, address, expires_at > now(), node_lost_s, node_fence_s "
            f"FROM {LEADER_TABLE} WHERE id = 1"
        ).fetchone()
    if row is None or not row[2]:
        return
    who = row[1] or "?"
    if row[0] and abs(float(row[0]) - lease_s) > 1e-6:
        raise InvalidCommand(
            f"the servers on this store use a lease of {float(row[0]):g}s (the leader "
            f"{who} holds one now); this server was given {lease_s:g}s",
            hint=f"start it with --lease {float(row[0]):g}s: every server on a store uses the "
            "same lease; to change it, stop them all",
        )
    if node is None or row[3] is None or row[4] is None:
        return  # a leader that records no node settings (an older server): nothing to match
    theirs = (float(row[3]), float(row[4]))
    if any(abs(a - b) > 1e-6 for a, b in zip(theirs, node, strict=True)):
        flags = "--node-lost-after {:g}s --node-fence {:g}s"
        raise InvalidCommand(
            f"the servers on this store run {flags.format(*theirs)} (the leader {who} holds "
            f"the lease now); this server was given {flags.format(*node)}",
            hint=f"start it with {flags.format(*theirs)}: every server on a store counts "
            "nodes lost and fences them alike (agents renew their lease by them); to change "
            "them, stop them all",
        )


def leading_now(dsn: str) -> str | None:
    """The address of the server that holds the lease now (None: nobody leads)."""
    with connect(dsn) as con:
        row = con.execute(
            f"SELECT address, expires_at > now() FROM {LEADER_TABLE} WHERE id = 1 AND holder <> ''"
        ).fetchone()
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
    ) -> None:
        self.dsn = dsn
        self.holder = holder
        self.address = address
        self.lease_s = lease_s
        self.node = node
        """(node-lost timeout, fence) in seconds, recorded in the row with each take (`agree`)."""
        self.epoch = 0
        self.deadline = 0.0
        """monotonic time until which this server may act as leader (0: it is not leader)."""
        self._con: Any = None
        self._notices: list[str] = []

    @property
    def answer_s(self) -> float:
        """How long a statement of the lease may take (a third of the lease, at least 0.2 s)."""
        return max(0.2, self.lease_s / 3)

    def _connection(self) -> Any:
        if self._con is None or self._con.closed:
            timeout_ms = int(self.answer_s * 1000)
            self._con = connect(
                self.dsn,
                connect_timeout=max(1, int(self.lease_s / 3)),
                options=f"-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms}",
            )
            self._con.add_notice_handler(self._noticed)
        return self._con

    def _noticed(self, diag: Any) -> None:
        self._notices.append(str(diag.message_primary or ""))

    def _run(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """`sql` on the lease's connection, answered within `answer_s` or cancelled: a commit
        that waits for a synchronous standby that is down waits forever, whatever the statement
        timeout (the leader stood down and nobody led, while health blamed nobody: atk33-28
        F10); cancelled, it committed only here, unconfirmed, and counts as failed."""
        self._notices = []
        try:
            con = self._connection()
            watchdog = threading.Timer(self.answer_s + 0.1, con.cancel_safe, kwargs={"timeout": 2})
            watchdog.daemon = True
            watchdog.start()
            try:
                rows: list[tuple[Any, ...]] = con.execute(sql, params).fetchall()
            finally:
                watchdog.cancel()
            if any(SYNC_WAIT in n for n in self._notices):
                raise NotCommitting(NOT_COMMITTING.format(round(self.answer_s + 0.1, 1)))
            return rows
        except Exception:
            if self._con is not None:
                self._con.close()
                self._con = None
            raise

    def may_act(self) -> bool:
        """Is this server the leader now, by its own clock (a fifth of the lease to spare)?"""
        return self.epoch > 0 and time.monotonic() < self.deadline

    def acquire(self) -> bool:
        """Take the lease if it has expired (or is ours); True when this server now leads."""
        sent = time.monotonic()
        rows = self._run(
            f"UPDATE {LEADER_TABLE} SET epoch = epoch + 1, holder = %s, address = %s, "
            "expires_at = now() + make_interval(secs => %s), acquired_at = now(), lease_s = %s, "
            "node_lost_s = %s, node_fence_s = %s "
            "WHERE id = 1 AND (expires_at < now() OR holder = %s) RETURNING epoch",
            (self.holder, self.address, self.lease_s, self.lease_s, *(self.node or (None, None)),
             self.holder),
        )  # fmt: skip
        if not rows:
            return False
        self.epoch = int(rows[0][0])
        self.deadline = sent + self.lease_s * (1 - MARGIN)
        return True

    def renew(self) -> bool:
        """Extend the lease; False when another server holds it now (stop at once). A database
        that does not answer raises: the lease still runs until `deadline`."""
        sent = time.monotonic()
        rows = self._run(
            f"UPDATE {LEADER_TABLE} SET expires_at = now() + make_interval(secs => %s) "
            "WHERE id = 1 AND holder = %s AND epoch = %s RETURNING epoch",
            (self.lease_s, self.holder, self.epoch),
        )
        if not rows:
            self.deadline = 0.0
            return False
        self.deadline = sent + self.lease_s * (1 - MARGIN)
        return True

    def release(self) -> None:
        """A clean stop: let a standby take over at once."""
        if self.epoch and self.may_act():
            self._run(
                f"UPDATE {LEADER_TABLE} SET expires_at = '-infinity' "
                "WHERE id = 1 AND holder = %s AND epoch = %s RETURNING 1",
                (self.holder, self.epoch),
            )
        self.deadline = 0.0

    def leader(self) -> Holder | None:
        """Who holds the lease (None: nobody ever did)."""
        rows = self._run(
            f"SELECT epoch, holder, address, extract(epoch FROM expires_at - now()), lease_s "
            f"FROM {LEADER_TABLE} WHERE id = 1"
        )
        if not rows or not rows[0][1]:
            return None
        epoch, holder, address, left, lease_s = rows[0]
        left = float(left) if left is not None else -1e9
        return Holder(int(epoch), holder, address, left, float(lease_s or 0.0))

    def report(self, role: str, position: int, kept_ago_s: float | None = None) -> None:
        """Say where this server is (its role and the log position it has folded) and, with
        `kept_ago_s`, that it kept a node's lease that long ago (kept as the latest such time,
        in the database's clock: the commit comes after the keep, so it never says too early)."""
        self._run(
            f"INSERT INTO {SERVERS_TABLE} AS s VALUES (%s, %s, %s, %s, now(), "
            "now() - make_interval(secs => %s)) ON CONFLICT (holder) "
            "DO UPDATE SET address = excluded.address, role = excluded.role, "
            "position = excluded.position, seen_at = now(), "
            "kept_at = GREATEST(s.kept_at, excluded.kept_at) RETURNING 1",
            (self.holder, self.address, role, position, kept_ago_s),
        )

    def keep_bound(self, stale_s: float, keep_s: float) -> float | None:
        """Seconds from now until which some server may still keep a node's lease (negative:
        that long ago; None: no server ever may have): the latest keep any server reported,
        and for a server silent over `stale_s` (cut off from the store, dead, paused: it may
        keep leases without saying so) its last report + `keep_s` (`ledger.server.ha`)."""
        rows = self._run(
            "SELECT extract(epoch FROM max(GREATEST(kept_at, CASE WHEN seen_at < now() - "
            "make_interval(secs => %s) THEN seen_at + make_interval(secs => %s) END)) - now()) "
            f"FROM {SERVERS_TABLE}",
            (stale_s, keep_s),
        )
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def members(self, within_s: float = 60.0) -> list[Member]:
        """The servers that reported in the last `within_s` seconds."""
        rows = self._run(
            f"SELECT holder, address, role, position, extract(epoch FROM now() - seen_at) "
            f"FROM {SERVERS_TABLE} WHERE seen_at > now() - make_interval(secs => %s) "
            "AND role <> 'stopped' ORDER BY address",
            (within_s,),
        )
        return [Member(h, a, r, int(p), float(s)) for h, a, r, p, s in rows]

    def retire(self, dead: Callable[[str], bool]) -> list[str]:
        """Servers that reported at this server's address and are `dead` (a process gone, e.g.
        this one's predecessor killed, or stopped while the store was away): they keep nothing
        more, so only their keeps count, as of now at the latest (`keep_bound`). Returns them."""
        rows = self._run(
            f"SELECT holder FROM {SERVERS_TABLE} WHERE address = %s AND holder <> %s "
            "AND role <> 'stopped'",
            (self.address, self.holder),
        )
        gone = [h for (h,) in rows if dead(h)]
        for holder in gone:
            self._run(
                f"UPDATE {SERVERS_TABLE} SET role = 'stopped', seen_at = 'infinity', "
                "kept_at = GREATEST(kept_at, now()) WHERE holder = %s RETURNING 1",
                (holder,),
            )
        return gone

    def forget(self) -> None:
        """A clean stop: this server leaves the list, unless it kept a node's lease lately
        (`kept_at` within the last day): then its row stays, as `stopped`, and only its keeps
        count (`keep_bound`: a stopped server keeps nothing more)."""
        self._run(
            f"DELETE FROM {SERVERS_TABLE} WHERE holder = %s AND (kept_at IS NULL OR "
            "kept_at < now() - interval '1 day') RETURNING 1",
            (self.holder,),
        )
        self._run(
            f"UPDATE {SERVERS_TABLE} SET role = 'stopped', seen_at = 'infinity' "
            "WHERE holder = %s RETURNING 1",
            (self.holder,),
        )

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def __repr__(self) -> str:
        return f"Lease({redacted(self.dsn)}, {self.address}, epoch {self.epoch})"
