"""The lease on a real PostgreSQL: a server that took it but whose worker does not take up the
leader's work (busy, e.g. still waiting on a store that just came back) hands it over within
about one renewal instead of renewing it for nobody (after an outage one held it ~30 s so and
nobody could write: atk33-28 F7), and takes none again before its worker has looked; the
servers' table says until when a server may keep a node's lease while the store is away from
it (attack F1)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from ledger.server.ha import Leadership
from ledger.store import lease
from tests.integration import waits

LEASE_S = 2.0


def _worker_that_leads(ha: Leadership) -> None:
    """What the worker does when woken: look at the role, and lead while the lease runs."""
    ha.turned_at = time.monotonic()
    ha.leading = ha.lease.may_act()


def test_a_server_whose_worker_never_takes_up_the_lease_hands_it_to_one_that_does(
    pg_store: str,
) -> None:
    lease.setup(pg_store)
    busy = Leadership(lease.Lease(pg_store, "busy", "http://busy", LEASE_S))
    ready = Leadership(lease.Lease(pg_store, "ready", "http://ready", LEASE_S))
    ready.notify = lambda: _worker_that_leads(ready)
    busy.start()  # its worker never looks at the role (busy.turned_at stays 0)
    try:
        assert busy.lease.epoch == 1 and lease.leading_now(pg_store) == "http://busy"
        took = time.monotonic()
        ready.start()
        waits.wait_for("the ready server to lead", lambda: ready.leading, 10)
        handed = time.monotonic() - took
        assert handed <= busy.ready_s + LEASE_S / 3 + 1.0, handed  # about one renewal
        assert lease.leading_now(pg_store) == "http://ready"
        assert not busy.lease.may_act() and busy.leader_address() in ("", "http://ready")
        time.sleep(LEASE_S)  # the busy server takes nothing back meanwhile
        assert ready.lease.may_act() and ready.lease.epoch == 2
    finally:
        ready.stop()
        busy.stop()


def test_the_store_says_until_when_a_server_may_keep_a_node_s_lease(pg_store: str) -> None:
    """`keep_bound` on a real PostgreSQL (attack F1): a keep a server reported counts from its
    time; a server silent past `stale_s` may keep until its last report + `keep_s`; a clean
    stop of a server that kept leaves its keep known (and the server out of the list)."""
    lease.setup(pg_store)
    a = lease.Lease(pg_store, "a", "http://a", LEASE_S)
    b = lease.Lease(pg_store, "b", "http://b", LEASE_S)
    try:
        assert a.keep_bound(1.0, 100.0) is None  # nobody reported yet
        a.report("standby", 7)
        b.report("standby", 7)
        assert a.keep_bound(1.0, 100.0) is None  # both fresh, neither kept
        a.report("standby", 7, kept_ago_s=30.0)
        bound = a.keep_bound(1.0, 100.0)
        assert bound is not None and -31.0 < bound < -29.0
        a.report("standby", 7, kept_ago_s=60.0)  # an older keep never moves it back
        bound = a.keep_bound(1.0, 100.0)
        assert bound is not None and -31.0 < bound < -29.0
        time.sleep(1.2)
        a.report("standby", 7)
        bound = b.keep_bound(1.0, 100.0)  # b is silent: it may be keeping
        assert bound is not None and 97.0 < bound < 99.0
        b.report("standby", 7)
        a.forget()  # it kept: its row stays, out of the list
        assert [m.holder for m in b.members()] == ["b"]
        bound = b.keep_bound(1.0, 100.0)
        assert bound is not None and -33.0 < bound < -29.0
        b.forget()  # it never kept: gone
        assert b.members() == []
    finally:
        a.close()
        b.close()


def test_a_keep_granting_a_longer_node_lease_is_counted_by_its_length(pg_store: str) -> None:
    """A server still running by the node lease a `--new-settings` take replaced (3 s + 60 s),
    which had not read the take when the store went away, keeps its agents by that lease; the
    leader (3 s + 4 s) counted a node lost from the keep by its own, and the agent's lease ran
    56 s past the release (atk39-28 F1, the window that remained). The bound now adds the
    difference; a server of an earlier version (no length reported) adds nothing."""
    lease.setup(pg_store)
    old = lease.Lease(pg_store, "old", "http://old", LEASE_S, (3.0, 60.0))
    new = lease.Lease(pg_store, "new", "http://new", LEASE_S, (3.0, 4.0))
    # the bounds count from the database's now: each is read later than the report, by the
    # time passed since (measured here, never assumed: 0.54 s once at load); none of the
    # servers is silent in it (60 s)
    began = time.monotonic()

    def assert_near(bound: float | None, kept: float) -> None:
        """`bound` is `kept` seconds from the report, read at most the time since ago."""
        passed = time.monotonic() - began
        assert bound is not None and kept - passed - 0.05 < bound < kept + 0.05, (bound, passed)

    try:
        old.report("standby", 1, kept_ago_s=10.0)
        new.report("leader", 1)
        assert_near(new.keep_bound(60.0, 100.0), 46.0)  # kept 10 s ago, + 63 s - 7 s
        assert_near(old.keep_bound(60.0, 100.0), -10.0)  # by its own length: nothing added
        with lease.connect(pg_store) as con:
            con.execute("UPDATE gpuledger_servers SET node_lease_s = NULL WHERE holder = 'old'")
        assert_near(new.keep_bound(60.0, 100.0), -10.0)
    finally:
        old.close()
        new.close()


class EarlierLease(lease.Lease):
    """A server of the version before its relay was reported (commit 58109486^): its report
    statement, copied from `ledger/store/lease.py` there, says nothing of a relay."""

    def report(self, role: str, position: int, kept_ago_s: float | None = None,
               relay: lease.RelayWord | None = None) -> None:  # fmt: skip
        self._run(
            "INSERT INTO {servers} AS s (holder, address, role, position, seen_at, "
            "kept_at, node_lease_s) VALUES (%s, %s, %s, %s, now(), "
            "now() - make_interval(secs => %s), %s) ON CONFLICT (holder) "
            "DO UPDATE SET address = excluded.address, role = excluded.role, "
            "position = excluded.position, seen_at = now(), "
            "kept_at = GREATEST(s.kept_at, excluded.kept_at), "
            "node_lease_s = excluded.node_lease_s RETURNING 1",
            (self.holder, self.address, role, position, kept_ago_s, self.node_lease_s),
        )


@pytest.mark.parametrize("earlier", [True, False], ids=["earlier-leader", "leader-without-relay"])
def test_a_standby_under_a_leader_of_an_earlier_version_says_its_relay_is_unreported(
    pg_store: str, earlier: bool
) -> None:
    """Stop 54 (open): in a rolling upgrade a standby of this version under a leader of the
    earlier one, which does not report its relay, said "no relay has run" (`relay status`) and
    "no Kafka" (`status`), as of a leader that runs none. This version always reports (an empty
    state when it runs none): a leader that says nothing is of an earlier version, and a standby
    started with --kafka says so, with no position or lag (none known); under a leader of this
    version that runs no relay it still says none."""
    from ledger.server.app import _leaders_relay

    lease.setup(pg_store)
    kind = EarlierLease if earlier else lease.Lease
    leader = Leadership(kind(pg_store, "lead", "http://lead", LEASE_S))
    leader.notify = lambda: _worker_that_leads(leader)
    standby = Leadership(lease.Lease(pg_store, "stand", "http://stand", LEASE_S))
    leader.start()
    try:
        waits.wait_for("the leader to lead", lambda: leader.leading, 10)
        standby.start()
        waits.wait_for("the standby to read the leader's report",
                       lambda: any(m.role == "leader" for m in standby.members), 10)  # fmt: skip
        position, state, error = _leaders_relay(standby, "127.0.0.1:9092")
        if not earlier:
            assert (position, state, error) == (None, None, None)
            return
        assert (position, state) == (None, "unreported"), (position, state, error)  # was None
        assert error is not None and error.startswith(
            "the leader (http://lead) runs an earlier version, which does not report its relay"
        ), error
        assert "http://lead/v1/health" in error, error
        assert _leaders_relay(standby) == (None, None, None)  # a standby that relays to none
    finally:
        standby.stop()
        leader.stop()


def test_a_server_retires_its_dead_predecessor_at_its_address(pg_store: str) -> None:
    """A server restarted after a kill -9 (or a stop while the store was away) left a silent
    row, which would make every leader wait `KEEP_WITHOUT_STORE_S` before counting a node lost:
    its successor at the same address marks it stopped, its keeps as of now at the latest. A
    live server at that address, or a dead one elsewhere, is left alone."""
    from ledger.server.ha import dead_here

    lease.setup(pg_store)
    host = socket.gethostname()
    dead_pid = _a_dead_pid()
    old = lease.Lease(pg_store, f"{host}:{dead_pid}:old", "http://me", LEASE_S)
    alive = lease.Lease(pg_store, f"{host}:{os.getpid()}:alive", "http://me", LEASE_S)
    elsewhere = lease.Lease(pg_store, f"{host}:{dead_pid}:else", "http://other", LEASE_S)
    new = lease.Lease(pg_store, f"{host}:{os.getpid()}:new", "http://me", LEASE_S)
    try:
        for x in (old, alive, elsewhere):
            x.report("standby", 1)
        time.sleep(1.2)
        new.report("standby", 1)
        bound = new.keep_bound(1.0, 100.0)  # the silent ones may keep for 100 s more
        assert bound is not None and bound > 97.0
        assert new.retire(dead_here) == [f"{host}:{dead_pid}:old"]
        elsewhere.report("standby", 1)
        alive.report("standby", 1)
        bound = new.keep_bound(1.0, 100.0)
        assert bound is not None and -1.0 < bound <= 0.5  # the dead one's keeps: until now
        assert sorted(m.holder for m in new.members()) == sorted(
            [f"{host}:{os.getpid()}:alive", f"{host}:{dead_pid}:else", f"{host}:{os.getpid()}:new"]
        )
    finally:
        for x in (old, alive, elsewhere, new):
            x.close()


def _a_dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_take_says_whether_the_last_holder_stopped_cleanly(pg_store: str) -> None:
    """A new leader's Slurm executor waits 25 s for the last leader's `sbatch` that may still
    land (takeover.InFlight); after a clean stop nothing of its is in flight, so the take says
    so (`Lease.handed_over`): only a release by a clean stop ('-infinity') counts, never a
    lease that ran out (a kill -9) nor one handed over by a server whose worker is busy
    (perhaps in an `sbatch`). Before, the take said nothing and every takeover waited."""
    lease.setup(pg_store)
    a = lease.Lease(pg_store, "a", "http://a", LEASE_S)
    b = lease.Lease(pg_store, "b", "http://b", LEASE_S)
    try:
        assert a.acquire() and a.handed_over  # a row nobody ever held
        a.release()  # a clean stop
        assert b.acquire() and b.handed_over
        assert not a.acquire()
        time.sleep(LEASE_S + 0.3)  # b dies: its lease runs out
        assert a.acquire() and not a.handed_over
        a.release(clean=False)  # handed over by a busy worker
        assert b.acquire() and not b.handed_over
    finally:
        for x in (a, b):
            x.release()
            x.close()


def test_a_dsn_naming_its_own_schema_keeps_the_lease_with_the_events(pg_store: str) -> None:
    """atk48-ha F3: a DSN with `options=-csearch_path=site` (a DBA's own schema) had the lease
    tables and the fence made there, but the lease's connection replaced the DSN's options with
    its timeouts: it took `public`'s lease row while appends were fenced by `site`'s (epoch 0
    for ever): every append refused, the lease taken and handed over again and again. Now every
    lease object is named in the events' schema (`public` here), whatever the search_path: the
    DSN's options are kept all the same (atk48-ha F4)."""
    from ledger.store import pgread

    with pgread.connect(pg_store) as con:
        con.execute("CREATE SCHEMA site")
    sep = "&" if "?" in pg_store else "?"
    dsn = f"{pg_store}{sep}options=-csearch_path%3Dsite"
    lease.setup(dsn)
    held = lease.Lease(dsn, "a", "http://a", LEASE_S)
    try:
        assert held.acquire() and held.epoch == 1
        con = held._connection()
        assert con.execute("SHOW search_path").fetchone()[0] == "site"
        assert con.execute("SHOW lock_timeout").fetchone()[0] != "0"  # its own settings too
        with pgread.connect(pg_store) as plain:
            epoch = plain.execute("SELECT epoch FROM public.gpuledger_leader").fetchone()
            site = plain.execute("SELECT to_regclass('site.gpuledger_leader')").fetchone()
        assert epoch == (1,) and site == (None,)
    finally:
        held.forget()
        held.close()


def test_two_roles_one_with_a_schema_of_its_own_name_share_one_lease(pg_store: str) -> None:
    """atk48-ha F4: the lease's objects were unqualified, so they resolved by the session's
    search_path, `"$user", public` by default: a server connecting as a role with a schema of
    its own name made and took a lease row there, and two servers led one store at the same
    epoch (both took writes, both dispatched). Now one store has one lease whatever role or
    search_path a server connects with: the second role's take waits for the first's lease,
    and its appends are fenced by the one lease row."""
    import uuid

    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from ledger.store import pgread

    role = f"r_{uuid.uuid4().hex[:10]}"
    with pgread.connect(pg_store) as con:
        con.execute(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD 'pw-{role}'")
        con.execute(f"CREATE SCHEMA {role} AUTHORIZATION {role}")
    other = make_conninfo(pg_store, user=role, password=f"pw-{role}")
    assert conninfo_to_dict(other)["user"] == role
    lease.setup(other)  # the second host's server starts first: its role's schema is first in
    lease.setup(pg_store)  # its search_path (the first one's found the lease already made)
    first = lease.Lease(pg_store, "first", "http://first", LEASE_S)
    second = lease.Lease(other, "second", "http://second", LEASE_S)
    try:
        assert first.acquire() and first.epoch == 1
        assert not second.acquire(), "two leaders on one store"
        assert lease.leading_now(other) == "http://first"
        with pgread.connect(other) as con:
            assert con.execute("SHOW search_path").fetchone()[0] == '"$user", public'
            assert con.execute(f"SELECT to_regclass('{role}.gpuledger_leader')").fetchone() == (
                None,
            )
            with pytest.raises(psycopg.errors.RaiseException):  # epoch 1 is the first's
                con.execute("SELECT public.gpuledger_fence(2)")
            con.execute("SELECT public.gpuledger_fence(1)")
        first.release()
        assert second.acquire() and second.epoch == 2
    finally:
        for x in (first, second):
            x.forget()
            x.close()
        with pgread.connect(pg_store) as con:
            con.execute(f"DROP SCHEMA {role} CASCADE")
            con.execute(f"DROP OWNED BY {role}")
            con.execute(f"DROP ROLE {role}")


def test_a_standby_tells_the_leaders_relay_as_the_leader_reported_it(pg_store: str) -> None:
    """atk52-ha F4: relay health was read only from the leader: a standby's health said "no
    Kafka" (no relay lag, no state) whether the leader's relay published or had stopped. Each
    server reports its relay with its position; a standby's health tells the leader's."""
    from ledger.server.app import _leaders_relay

    lease.setup(pg_store)
    leader = Leadership(lease.Lease(pg_store, "lead", "http://lead", LEASE_S))
    leader.notify = lambda: _worker_that_leads(leader)
    leader.relay = lambda: lease.RelayWord("stopped", 12, "fenced by another relay")
    standby = Leadership(lease.Lease(pg_store, "stand", "http://stand", LEASE_S))
    leader.start()
    try:
        waits.wait_for("the leader to lead", lambda: leader.leading, 10)
        standby.start()
        waits.wait_for("the standby to see the leader's relay",
                       lambda: standby.leader_relay() is not None, 10)  # fmt: skip
        got = standby.leader_relay()
        assert got is not None and got[0] == lease.RelayWord(
            "stopped", 12, "fenced by another relay"
        )
        position, state, error = _leaders_relay(standby)
        assert (position, state) == (12, "stopped"), (position, state, error)
        assert error is not None and error.startswith("the leader's relay (http://lead)")
        assert error.endswith(": fenced by another relay"), error
        assert standby.relay() is None  # the standby runs none: its own row says none
        assert [m.relay for m in standby.members if m.holder == "stand"] in ([None], [])
    finally:
        standby.stop()
        leader.stop()


def test_a_leader_keeps_a_3_s_lease_while_its_reports_wait(pg_store: str) -> None:
    """The renewals run on their own clock and connection (stop 57's note: they shared the
    lease's turn with the reports, five statements more, seconds each at load, and 2-3 s leases
    ran out between two renewals, so a leader rarely reached a relay commit). Here every report
    waits 4 s for its relay's word (as a report stuck behind a broker call would), with two busy
    loops beside it: before, the lease ran out at the first report."""
    lease.setup(pg_store)
    lease_s = 3.0
    stuck = threading.Event()

    def relay_word() -> None:
        stuck.set()
        time.sleep(4.0)

    leader = Leadership(lease.Lease(pg_store, "lead", "http://lead", lease_s))
    leader.notify = lambda: _worker_that_leads(leader)
    leader.relay = relay_word  # type: ignore[assignment, return-value]
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        leader.start()
        waits.wait_for("the leader to lead", lambda: leader.leading, 20)
        epoch = leader.lease.epoch
        assert stuck.wait(20)
        until, lapses = time.monotonic() + 12, 0
        while time.monotonic() < until:
            lapses += not leader.lease.may_act()
            time.sleep(0.05)
        assert lapses == 0 and leader.lease.epoch == epoch, (lapses, epoch, leader.lease.epoch)
        assert lease.leading_now(pg_store) == "http://lead"
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        leader.stop()
