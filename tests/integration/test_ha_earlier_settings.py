"""The admission settings an earlier version recorded are compared by what they mean (docs/ha.md,
"Upgrading"; attack atk43ha F1): real PostgreSQL, real servers of this version, and an earlier
version's leader by its own lease SQL (`test_pg_lease_versions.OLD_TAKE`, as of 3418081) after
the documented rollback.

Before, a take of an earlier version (it moves the epoch, not `admission_epoch`) left its text
uncompared: a server of this version with `min_uid = 1` (and another service account) was
accepted as a standby beside the earlier leader's `min_uid = 1000`, and took over when it died,
silently. Now it is refused in one line, a server with the same settings starts, says which
settings the earlier version did not record (so not compared), takes over, and records them."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import psycopg

from ledger.store import lease
from tests.integration import waits
from tests.integration.hakit import make_group
from tests.integration.serverkit import cli
from tests.integration.test_ha_settings import one_line, serve
from tests.integration.test_pg_lease_versions import OLD_RENEW, OLD_TAKE, ROLLBACK


def _earlier_leader(dsn: str, params: dict[str, object], stop: threading.Event) -> None:
    """A leader of the earlier version: its take, then a keep every 0.3 s until `stop` (a
    kill -9: its lease runs out) or until a keep is refused (the guard a server of this
    version makes at its start: it stands down, docs/ha.md "Upgrading")."""
    with psycopg.connect(dsn, autocommit=True) as con:
        epoch = con.execute(OLD_TAKE, params).fetchall()[0][0]
        while not stop.wait(0.3):
            if not con.execute(OLD_RENEW, (params["lease"], params["holder"], epoch)).fetchall():
                return


def test_an_earlier_version_s_settings_refuse_a_server_that_admits_otherwise(
    tmp_path: Path, pg_store: str
) -> None:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    strict, loose = tmp_path / "strict.toml", tmp_path / "loose.toml"
    strict.write_text("min_uid = 1000\n")
    loose.write_text("min_uid = 1\n")
    g = make_group(tmp_path, pg_store, 2, "--executor", "record", "--config", str(strict),
                   home=home)  # fmt: skip
    s0, s1 = g.members
    stop = threading.Event()
    old = None
    try:
        # this version led and recorded its settings; every server stopped, then rolled back
        g.start(s0)
        assert g.leader() is s0
        s0.kill(signal.SIGTERM)
        with psycopg.connect(pg_store, autocommit=True) as con:
            row = con.execute("SELECT lease_s, node_lost_s, node_fence_s, work, admission "
                              "FROM gpuledger_leader").fetchone()  # fmt: skip
            assert row is not None and "service_account" in row[4], row
            con.execute(ROLLBACK)
        # the earlier version leads, recording the same settings as it wrote them: without
        # the service account, which it had not
        earlier = json.loads(row[4])
        del earlier["service_account"]
        params = {"holder": "old-1", "address": "http://old-1", "lease": row[0], "lost": row[1],
                  "fence": row[2], "work": row[3], "since": None,
                  "admission": json.dumps(earlier, sort_keys=True)}  # fmt: skip
        old = threading.Thread(target=_earlier_leader, args=(pg_store, params, stop), daemon=True)
        old.start()
        waits.wait_for("the earlier leader", lambda: lease.leading_now(pg_store), 30, g.why)
        # a server that admits otherwise is refused at its start, naming the difference
        err = one_line(serve(tmp_path / "loose", pg_store, "--lease", g.lease, "--executor",
                             "record", "--config", str(loose)))  # fmt: skip
        assert "min_uid 1000 (recorded) against 1 here" in err, err
        assert "the leader http://old-1 holds the lease now" in err, err
        # one with the same settings stands by, and says what it does not compare
        g.start(s1)
        said = "not compared: service_account (that version recorded none"
        waits.wait_for("s1 to name what it does not compare", lambda: said in s1.text(), 30,
                       g.why)  # fmt: skip
        assert "will not lead" not in s1.text(), g.why()
        # the earlier leader stands down (its keep refused) or dies: s1 takes over and
        # records this version's settings
        stop.set()
        old.join(10)
        assert g.leader() is s1
        with psycopg.connect(pg_store, autocommit=True) as con:
            now = con.execute("SELECT admission FROM gpuledger_leader").fetchone()
        assert now == (row[4],), (now, row)
        assert s1.text().count(said) == 1, g.why()
    finally:
        stop.set()
        g.stop()
