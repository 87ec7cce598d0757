"""The settings every server of a store runs alike (lease, node-lost timeout, fence, executor,
policy, and what it admits: the uid range, run-as, the caps, the grace, ...) are recorded in
the store and checked at every take of the lease, not only at a server's start against a live
lease (attack atk38-28 F1, F1b, F3): real PostgreSQL, real
servers, a real agent and a real job (with a child), checked from the job's side.

- Two servers with other settings never lead by turns: one started while the leader was frozen
  past its lease is refused at its start, and once one server has recorded new settings
  (`--new-settings`) a server with the old ones takes no lease and says why (log, health,
  `status`). Before, both ran, and a failover to the shorter fence ran a job twice (or to
  `--executor none` left the agents' jobs to die).
- A new, shorter fence waits out the node leases the old one granted: a node out of contact
  while the servers were restarted with the new fence has its job released only once its
  lease (by the old fence) has ended (the job ran in two launches for 21-42 s).
- A server that admits otherwise (`min_uid` 1 against the leader's 1000) never leads and says
  why, so a failover never admits what the leader refused (a manager made a system account a
  member: atk39-28 F2); a store recorded before these settings were records them at its first
  take by a server that has them."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from ledger.store import lease
from ledger.store.pgread import connect
from schemas.errors import LedgerError
from tests.integration import userkit, waits
from tests.integration.hakit import alive, job_on_agents, make_group, run_the_job
from tests.integration.serverkit import cli, init_on_store, make_token
from tests.integration.test_ha_settings import one_line, serve


def test_a_lease_with_other_settings_than_the_recorded_ones_is_never_taken(pg_store: str) -> None:
    lease.setup(pg_store)
    long = lease.Lease(pg_store, "long", "http://long", 2.0, (3.0, 60.0), '{"executor":"agents"}')
    short = lease.Lease(pg_store, "short", "http://short", 2.0, (3.0, 4.0), '{"executor":"agents"}')
    none = lease.Lease(pg_store, "none", "http://none", 2.0, (3.0, 60.0), '{"executor":"none"}')
    try:
        # started together on a new store: both agreed (nothing recorded, nobody led)
        assert long.acquire()
        long.release()
        # the lease is free, and neither may take it: their settings are not the recorded ones
        assert not short.acquire() and not none.acquire()
        why = short.refusal(short.leader())
        assert why is not None and "--node-fence 60s" in why and "recorded by" in why, why
        why = none.refusal(none.leader())
        assert why is not None and "ran --executor" in why, why
        with pytest.raises(LedgerError, match="--node-fence 60s"):
            lease.agree(pg_store, short.settings)
        # --new-settings: replaces settings recorded before it started, never ones after
        since = lease.agree(pg_store, short.settings, change=True)
        late = lease.Lease(pg_store, "late", "http://late", 2.0, (3.0, 30.0), None, since)
        short.since = since
        assert short.acquire() and short.refusal(short.leader()) is None
        short.release()
        assert not late.acquire() and not long.acquire()  # recorded after `late` started
        late.close()
        # one started to change them gives up once another leads by the recorded ones
        since = lease.agree(pg_store, long.settings, change=True)
        changer = lease.Lease(pg_store, "changer", "http://changer", 2.0, (3.0, 60.0), None, since)
        assert short.acquire()  # the recorded settings' server leads
        assert changer.refusal(changer.leader()) is not None and changer.since is None
        short.release()
        assert not changer.acquire()
        changer.close()
        assert "--node-fence 4s" in str(long.refusal(long.leader()))
    finally:
        for one in (long, short, none):
            one.close()


def _frozen_past_its_lease(m: object, lease_s: float) -> None:
    m.proc.send_signal(signal.SIGSTOP)  # type: ignore[attr-defined]
    time.sleep(lease_s + 1.5)  # its lease ran out: nobody leads


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (("--node-lost-after", "3s", "--node-fence", "20s"),
         ("--node-lost-after", "3s", "--node-fence", "4s"), "--node-fence 4s"),
        (("--executor", "record"), ("--executor", "none"), "ran --executor none"),
        (("--grace", "30s"), ("--grace", "5s"), "grace_s 5.0 (recorded) against 30.0 here"),
    ],
    ids=["fence", "executor", "admission"],
)  # fmt: skip
def test_servers_with_other_settings_never_lead_by_turns(
    tmp_path: Path, pg_store: str, old: tuple[str, ...], new: tuple[str, ...], said: str
) -> None:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    g = make_group(tmp_path, pg_store, 2, *old, home=home)
    s0, s1 = g.members
    frozen = None
    try:
        g.start(s0)
        g.leader()
        _frozen_past_its_lease(s0, 2.0)
        frozen = s0
        # nobody leads, but the store records s0's settings: another server is refused at once
        err = one_line(serve(tmp_path / "other", pg_store, "--lease", g.lease, *new))
        assert "recorded by the last leader" in err or "the store records it" in err, err
        # one started to change them (--new-settings) leads, and records them
        g.args = (*new, "--new-settings")
        g.start(s1)
        s0.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        frozen = None
        assert g.leader() is s1
        s1.kill(signal.SIGTERM)  # a clean stop: the lease is free at once
        # s0, started with the old settings, never takes it, and says why
        until = time.monotonic() + 4 * 2.0
        while time.monotonic() < until:
            h = s0.health() or {}
            assert h.get("role") == "standby", (h, g.why())
            time.sleep(0.2)
        h = s0.health() or {}
        assert said in str(h.get("settings_error")), (h, g.why())
        assert "this server will not lead" in s0.text() and said in s0.text(), g.why()
        out = cli(home, "status", GPULEDGER_URL=s0.url)
        assert "this server will not lead" in out.stdout and said in out.stdout, out.stdout
        # started again with the recorded settings, s1 leads (s0 stands by, naming it)
        g.args = new
        g.start(s1)
        assert g.leader() is s1
    finally:
        if frozen is not None and frozen.proc is not None:
            frozen.proc.send_signal(signal.SIGCONT)
        g.stop()


OLD_LOST_S, OLD_FENCE_S, NEW_FENCE_S = 3, 20, 4
"""A node lease of 3 + 20 - 3 = 20 s under the old settings; the new fence releases a lost
node's job 4 s + 1 s of grace after the node is counted lost, 3 s after its last word."""


def test_a_shorter_fence_waits_out_the_node_leases_granted_by_the_old_one(
    tmp_path: Path, pg_store: str
) -> None:
    common = ("--executor", "agents", "--run-as", "service", "--interval", "0.5s", "--grace", "1s")
    w = job_on_agents(tmp_path, pg_store, *common, "--node-lost-after", f"{OLD_LOST_S}s",
                      "--node-fence", f"{OLD_FENCE_S}s")  # fmt: skip
    try:
        run_the_job(w)
        assert w.cut is not None and w.cut.proc is not None
        s0, s1 = w.g.members
        w.cut.proc.send_signal(signal.SIGSTOP)  # its node is out of contact from now on
        # the documented way to change the fence: stop them all, start with the new one
        s0.kill(signal.SIGTERM)
        w.g.args = (*common, "--node-lost-after", f"{OLD_LOST_S}s",
                    "--node-fence", f"{NEW_FENCE_S}s", "--new-settings")  # fmt: skip
        w.g.start(s1)
        again = waits.wait_for("the job to start again", lambda: w.starts()[1:] or None, 120,
                               w.why)  # fmt: skip
        # the first launch's processes had stopped by then (their node lease ran out)
        assert not any(alive(p) for p in w.pids), (w.pids, again, w.why())
    finally:
        w.close()


def test_new_settings_is_a_flag_that_acts_once(tmp_path: Path, pg_store: str) -> None:
    """`new_settings = true` left in a config file reverted the store's settings at every start
    while nobody led, and then only that server might lead (atk39-28 F3): it is refused in one
    line, and the flag changes nothing when the store records the server's settings already."""
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    stale = tmp_path / "stale.toml"
    stale.write_text('new_settings = true\nnode_fence = "60s"\n')
    err = one_line(serve(tmp_path / "stale", pg_store, "--config", str(stale)))
    assert "new_settings" in err and "command line only" in err, err
    lease.setup(pg_store)
    mine = lease.Settings(2.0, (3.0, 4.0), '{"executor":"agents"}')
    taker = lease.Lease(pg_store, "a", "http://a", 2.0, (3.0, 4.0), '{"executor":"agents"}')
    try:
        assert taker.acquire()
        taker.release()
        assert lease.agree(pg_store, mine, change=True) is None  # recorded already: nothing
        other = lease.Settings(2.0, (3.0, 60.0), '{"executor":"agents"}')
        assert lease.agree(pg_store, other, change=True) is not None
    finally:
        taker.close()


def _add_member(m: object, token: str, user: str) -> tuple[int, str]:
    """A manager's AddMember of `user` to ai2/olmo, sent to server `m`: (status, body)."""
    code, body = m.server().request(  # type: ignore[attr-defined]
        "POST", "/v1/commands/member.add", {"actor": "", "user": user, "project": "ai2/olmo"},
        token,
    )  # fmt: skip
    return code, json.dumps(body)


def test_a_server_that_admits_otherwise_never_leads_until_new_settings(
    tmp_path: Path, pg_store: str
) -> None:
    """atk39-28 F2: s0 refused a manager's system account (uid 994 < min_uid 1000); killed, a
    standby started with min_uid 1 led and admitted it. Now that server never leads, and says
    why (in one line at its start, or, running, in its log, health and `status`), until it is
    started with `--new-settings`."""
    home = tmp_path / "server-0"
    init_on_store(home, tmp_path, pg_store)
    mgr = make_token(home, "--user", "mgr")
    strict, loose = tmp_path / "strict.toml", tmp_path / "loose.toml"
    strict.write_text("min_uid = 1000\n")
    loose.write_text("min_uid = 1\n")
    record = ("--executor", "record")
    g = make_group(tmp_path, pg_store, 2, *record, home=home)
    s0, s1 = g.members
    try:
        with userkit.os_user("gls", uid=994) as system:
            g.args = (*record, "--config", str(strict))
            g.start(s0)
            assert g.leader() is s0
            code, body = _add_member(s0, mgr, system.name)
            assert code == 403 and "uid 994 < min_uid 1000" in body, (code, body)
            # a server that would admit it is refused at its start while s0 leads, and once
            # s0 is gone (killed: nobody leads, the store records s0's settings)
            said = "min_uid 1000 (recorded) against 1 here"
            loose_args = ("--lease", g.lease, *record, "--config", str(loose))
            err = one_line(serve(tmp_path / "loose-a", pg_store, *loose_args))
            assert said in err and "holds the lease now" in err, err
            s0.kill()
            waits.wait_for("s0's lease to run out", lambda: lease.leading_now(pg_store) is None,
                           30, g.why)  # fmt: skip
            err = one_line(serve(tmp_path / "loose-b", pg_store, *loose_args))
            assert said in err and "recorded by the last leader" in err, err
            # the failover goes to a server with the recorded settings: it refuses the same
            g.start(s1)
            assert g.leader() is s1
            code, body = _add_member(s1, mgr, system.name)
            assert code == 403 and "uid 994 < min_uid 1000" in body, (code, body)
            s1.kill(signal.SIGTERM)
            # the way to change them: --new-settings, once nobody leads
            g.args = (*record, "--config", str(loose), "--new-settings")
            g.start(s1)
            assert g.leader() is s1
            code, body = _add_member(s1, mgr, system.name)
            assert code == 200, (code, body)
            err = one_line(serve(tmp_path / "strict", pg_store, "--lease", g.lease, *record,
                                 "--config", str(strict)))  # fmt: skip
            assert "min_uid 1 (recorded) against 1000 here" in err, err
    finally:
        g.stop()


def test_a_store_recorded_before_the_admission_settings_records_them_at_the_next_take(
    tmp_path: Path, pg_store: str
) -> None:
    """A lease row of a store from before the admission settings were recorded (no column):
    a server of this version adds the column (under the schema's advisory lock), leads, and
    records its own; from then on a server that admits otherwise is refused."""
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    g = make_group(tmp_path, pg_store, 2, "--executor", "record", "--grace", "5s", home=home)
    s0, s1 = g.members
    try:
        g.start(s0)
        assert g.leader() is s0
        s0.kill(signal.SIGTERM)
        with connect(pg_store) as con:  # the row as a server of the last version left it
            con.execute("ALTER TABLE gpuledger_leader DROP COLUMN IF EXISTS admission")
            con.execute("COMMENT ON TABLE gpuledger_leader IS NULL")  # nor this version's mark
        # another grace than s0 ran: nothing recorded says otherwise, so it leads, and records
        g.args = ("--executor", "record", "--grace", "7s")
        g.start(s1)
        assert g.leader() is s1
        with connect(pg_store) as con:
            row = con.execute("SELECT admission FROM gpuledger_leader").fetchone()
        assert row is not None and json.loads(row[0])["grace_s"] == 7.0, row
        err = one_line(serve(tmp_path / "other", pg_store, "--lease", g.lease,
                             "--executor", "record", "--grace", "5s"))  # fmt: skip
        assert "grace_s 7.0 (recorded) against 5.0 here" in err, err
    finally:
        g.stop()
