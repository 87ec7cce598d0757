"""Mixed versions during an upgrade (docs/ha.md, "Upgrading"): a server of an earlier version
neither records nor checks the settings every server of a store runs alike (the admission
settings, which Slurm cluster), so the database itself refuses its takes and keeps of the lease
(`gpuledger_leader_guard`: a take or keep must bump `stamp`, which an earlier version's SQL does
not know) and records how many (`gpuledger_refused`). Real PostgreSQL; the earlier version's
statements are its own text, copied from `ledger/store/lease.py` at commit 3418081. Before,
such a server took the lease whatever the recorded settings said."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import psycopg
import pytest

from ledger.store import lease
from ledger.store.pgread import connect
from ledger.wire.config import ServeConfig, admission_of
from schemas.errors import InvalidCommand
from tests.integration import waits
from tests.integration.hakit import make_group
from tests.integration.serverkit import cli
from tests.integration.test_ha_settings import one_line

OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS gpuledger_leader (
    id int PRIMARY KEY CHECK (id = 1),
    epoch bigint NOT NULL,
    holder text NOT NULL,
    address text NOT NULL,
    expires_at timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL
);
INSERT INTO gpuledger_leader VALUES (1, 0, '', '', '-infinity', now()) ON CONFLICT DO NOTHING;
ALTER TABLE gpuledger_leader ADD COLUMN IF NOT EXISTS lease_s double precision NOT NULL DEFAULT 0;
ALTER TABLE gpuledger_leader ADD COLUMN IF NOT EXISTS node_lost_s double precision;
ALTER TABLE gpuledger_leader ADD COLUMN IF NOT EXISTS node_fence_s double precision;
ALTER TABLE gpuledger_leader ADD COLUMN IF NOT EXISTS work text;
ALTER TABLE gpuledger_leader ADD COLUMN IF NOT EXISTS settings_at timestamptz;
ALTER TABLE gpuledger_leader ADD COLUMN IF NOT EXISTS held_until timestamptz;
ALTER TABLE gpuledger_leader ADD COLUMN IF NOT EXISTS admission text;
CREATE TABLE IF NOT EXISTS gpuledger_servers (
    holder text PRIMARY KEY,
    address text NOT NULL,
    role text NOT NULL,
    position bigint NOT NULL,
    seen_at timestamptz NOT NULL
);
ALTER TABLE gpuledger_servers ADD COLUMN IF NOT EXISTS kept_at timestamptz;
ALTER TABLE gpuledger_servers ADD COLUMN IF NOT EXISTS node_lease_s double precision;
CREATE OR REPLACE FUNCTION gpuledger_fence(want bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM gpuledger_leader WHERE id = 1 AND epoch = want FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'gpuledger: not the leader (epoch % was taken over)', want
            USING ERRCODE = 'raise_exception';
    END IF;
END $$;
"""
"""The earlier version's schema (`setup`), at 3418081."""
_OLD_SAME = (
    "(lease_s = %(lease)s AND node_lost_s IS NOT DISTINCT FROM COALESCE(%(lost)s::float8, "
    "node_lost_s) AND node_fence_s IS NOT DISTINCT FROM COALESCE(%(fence)s::float8, "
    "node_fence_s) AND work IS NOT DISTINCT FROM COALESCE(%(work)s::text, work) "
    "AND admission IS NOT DISTINCT FROM COALESCE(%(admission)s::text, admission))"
)
_OLD_AGREES = (
    "((lease_s = 0 OR lease_s = %(lease)s) "
    "AND (node_lost_s IS NULL OR %(lost)s::float8 IS NULL OR node_lost_s = %(lost)s::float8) "
    "AND (node_fence_s IS NULL OR %(fence)s::float8 IS NULL OR node_fence_s = %(fence)s::float8) "
    "AND (work IS NULL OR %(work)s::text IS NULL OR work = %(work)s::text) "
    "AND (admission IS NULL OR %(admission)s::text IS NULL OR admission = %(admission)s::text))"
)
OLD_TAKE = (
    "UPDATE gpuledger_leader SET epoch = epoch + 1, holder = %(holder)s, address = %(address)s, "
    "expires_at = now() + make_interval(secs => %(lease)s), acquired_at = now(), "
    f"settings_at = CASE WHEN {_OLD_SAME} THEN settings_at ELSE now() END, "
    "held_until = CASE WHEN node_lost_s + node_fence_s > %(lost)s::float8 + %(fence)s::float8 "
    "THEN GREATEST(held_until, now() + make_interval(secs => node_lost_s + node_fence_s)) "
    "ELSE held_until END, "
    "lease_s = %(lease)s, node_lost_s = COALESCE(%(lost)s::float8, node_lost_s), "
    "node_fence_s = COALESCE(%(fence)s::float8, node_fence_s), "
    "work = COALESCE(%(work)s::text, work), admission = COALESCE(%(admission)s::text, admission) "
    "WHERE id = 1 AND (expires_at < now() OR holder = %(holder)s) "
    f"AND ({_OLD_AGREES} OR settings_at IS NULL AND %(since)s::timestamptz IS NOT NULL "
    "OR settings_at < %(since)s::timestamptz) RETURNING epoch"
)
"""The earlier version's take (`_TAKE`), at 3418081."""
OLD_RENEW = (
    "UPDATE gpuledger_leader SET expires_at = now() + make_interval(secs => %s) "
    "WHERE id = 1 AND holder = %s AND epoch = %s RETURNING epoch"
)
"""The earlier version's keep (`Lease.renew`), at 3418081."""
OLD_RELEASE = (
    "UPDATE gpuledger_leader SET expires_at = '-infinity' "
    "WHERE id = 1 AND holder = %s AND epoch = %s RETURNING 1"
)
"""The earlier version's clean stop (`Lease.release`), at 3418081."""

LEASE_S = 2.0
ADMISSION = '{"min_uid":1}'
"""What the earlier server admits: other than what the new servers record."""


def _old_take(con: psycopg.Connection, holder: str, admission: str = ADMISSION) -> list[tuple[int]]:
    params = {"holder": holder, "address": f"http://{holder}", "lease": LEASE_S, "lost": 60.0,
              "fence": 300.0, "work": '{"executor":"agents"}', "since": None,
              "admission": admission}  # fmt: skip
    return con.execute(OLD_TAKE, params).fetchall()


def _refused(con: psycopg.Connection) -> dict[str, int]:
    rows = con.execute(f"SELECT holder, refused FROM {lease.REFUSED_TABLE}").fetchall()
    return {h: int(n) for h, n in rows}


def test_an_earlier_version_s_takes_and_keeps_are_refused_by_the_database(pg_store: str) -> None:
    with psycopg.connect(pg_store, autocommit=True) as con:
        # before the upgrade: a server of the earlier version leads, by its own SQL
        con.execute(OLD_SCHEMA)
        assert _old_take(con, "old-1", _admission(earlier=True)) == [(1,)]
        assert con.execute(OLD_RENEW, (LEASE_S, "old-1", 1)).fetchall() == [(1,)]
        # a server of this version starts: the schema gets the guard
        lease.setup(pg_store)
        new = _lease(pg_store, "new", _admission())  # the same settings
        try:
            # the earlier leader's next keep is refused: it stands down (its renew finds no row)
            assert con.execute(OLD_RENEW, (LEASE_S, "old-1", 1)).fetchall() == []
            assert _refused(con) == {"old-1": 1}
            # its lease runs out; this version's server takes over (its settings recorded)
            time.sleep(LEASE_S + 0.2)
            assert new.acquire() and new.epoch == 2
            assert new.renew()
            row = con.execute("SELECT holder, admission, stamp FROM gpuledger_leader").fetchone()
            assert row is not None and row[:2] == ("new", _admission()) and row[2] >= 2, row
            # the lease free, the earlier version takes nothing, even where its own check of
            # the recorded text passes (it knows nothing of what this version records and
            # checks, e.g. which Slurm cluster), and its refusals are counted
            new.release()
            recorded = _admission()
            assert _old_take(con, "old-2", recorded) == []
            assert _old_take(con, "old-1", recorded) == []
            assert _old_take(con, "old-2", recorded) == []
            assert _refused(con) == {"old-1": 2, "old-2": 2}
            assert new.refused_older() == [
                ("http://old-1", "old-1", 2),
                ("http://old-2", "old-2", 2),
            ]
            row = con.execute("SELECT epoch, holder, admission FROM gpuledger_leader").fetchone()
            assert row == (2, "new", recorded), row
            # a clean stop of the earlier version still frees the lease (it only shortens it)
            assert new.acquire()
            assert con.execute(OLD_RELEASE, ("new", new.epoch)).fetchall() == [(1,)]
            with connect(pg_store) as c2:
                left = c2.execute("SELECT expires_at < now() FROM gpuledger_leader").fetchone()
            assert left == (True,)
        finally:
            new.close()


def _admission(min_uid: int = 1000, earlier: bool = False) -> str:
    """What a server of this version records (`admission_of`: `max_array_size` 0 as 10,000,
    the built-in groups, the service account), or, `earlier`, what an earlier version recorded
    for the same settings: written as given and without the service account, which it had
    not (before 9fdc1ec and b4925e2)."""
    config = ServeConfig(max_array_size=0, min_uid=min_uid)
    mine = admission_of(config, (995, "svc"))
    if not earlier:
        return mine
    text = json.loads(mine)
    del text["service_account"]
    text.update(max_array_size=0, privileged_groups=[])
    return json.dumps(text, sort_keys=True, separators=(",", ":"))


def _lease(dsn: str, name: str, admission: str) -> lease.Lease:
    return lease.Lease(dsn, name, f"http://{name}", LEASE_S, (60.0, 300.0),
                       '{"executor":"agents"}', admission=admission)  # fmt: skip


def test_admission_settings_an_earlier_version_recorded_are_compared_by_what_they_mean(
    pg_store: str,
) -> None:
    """atk43ha F1: an earlier version's text was not compared at all (`admission_epoch` behind
    the epoch), so across an upgrade a standby with `min_uid` 1 took over from the earlier
    leader's 1000. Now it is compared by what it means (`admission_meaning`) for the keys it
    has: a server that admits otherwise is refused, at its start and at its take, and one with
    the same settings, written as this version writes them, is not (the service account, which
    the earlier version did not record, is not compared)."""
    with psycopg.connect(pg_store, autocommit=True) as con:
        con.execute(OLD_SCHEMA)
        assert _old_take(con, "old-1", _admission(earlier=True)) == [(1,)]
        assert con.execute(OLD_RELEASE, ("old-1", 1)).fetchall() == [(1,)]
        lease.setup(pg_store)
        loose, new = _lease(pg_store, "loose", _admission(1)), _lease(pg_store, "new", _admission())
        said = "min_uid 1000 (recorded) against 1 here"
        try:
            # refused at its start, and by the take itself (after reading the row, as a
            # running standby does every turn)
            with pytest.raises(InvalidCommand, match=re.escape(said)):
                lease.agree(pg_store, loose.settings)
            why = loose.refusal(loose.leader())
            assert why is not None and said in why, why
            assert not loose.acquire()
            # the same settings: not refused, and its take records them as this version does
            assert lease.agree(pg_store, new.settings) is not None
            assert new.refusal(new.leader()) is None
            assert new.acquire() and new.epoch == 2
            row = con.execute("SELECT admission FROM gpuledger_leader").fetchone()
            assert row == (_admission(),), row
            new.release()
            # from then on this version's text is compared, as before
            why = loose.refusal(loose.leader())
            assert why is not None and said in why, why
            assert not loose.acquire()
        finally:
            new.close()
            loose.close()


def test_a_take_after_an_earlier_version_s_text_changed_is_refused(pg_store: str) -> None:
    """The take compares an earlier version's text only as the exact text this server last
    read and found to agree (what it means is Python's): a row that records another one by the
    time of the take is not taken, and the next read says why."""
    with psycopg.connect(pg_store, autocommit=True) as con:
        con.execute(OLD_SCHEMA)
        assert _old_take(con, "old-1", _admission(earlier=True)) == [(1,)]
        assert con.execute(OLD_RELEASE, ("old-1", 1)).fetchall() == [(1,)]
        lease.setup(pg_store)
        new = _lease(pg_store, "new", _admission())
        try:
            assert new.refusal(new.leader()) is None  # it agrees with what it read
            # an earlier version's take (it bumps the stamp, not `admission_epoch`: c0b674b)
            # records min_uid 1, and its server stops
            con.execute("UPDATE gpuledger_leader SET epoch = epoch + 1, stamp = stamp + 1, "
                        "admission = %s, expires_at = '-infinity'",
                        (_admission(1, earlier=True),))  # fmt: skip
            assert not new.acquire()
            why = new.refusal(new.leader())
            assert why is not None and "min_uid 1 (recorded) against 1000 here" in why, why
            assert not new.acquire()
        finally:
            new.close()


def _an_old_leader(dsn: str, kept: threading.Event) -> None:
    """A leader of the earlier version: it keeps its lease (epoch 1) every 0.3 s, by its own
    SQL, until a keep is refused (it then stands down, as `Lease.renew` returns False)."""
    with psycopg.connect(dsn, autocommit=True) as con:
        while con.execute(OLD_RENEW, (LEASE_S, "old-1", 1)).fetchall():
            kept.set()
            time.sleep(0.3)


def test_health_and_status_name_the_servers_of_an_earlier_version(
    tmp_path: Path, pg_store: str
) -> None:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    with psycopg.connect(pg_store, autocommit=True) as con:
        con.execute(OLD_SCHEMA)
        params = {"holder": "old-1", "address": "http://old-1", "lease": LEASE_S, "lost": 60.0,
                  "fence": 300.0, "work": None, "since": None, "admission": None}  # fmt: skip
        assert con.execute(OLD_TAKE, params).fetchall() == [(1,)]
    kept = threading.Event()
    old = threading.Thread(target=_an_old_leader, args=(pg_store, kept), daemon=True)
    old.start()
    assert kept.wait(10)
    g = make_group(tmp_path, pg_store, 1, home=home)
    g.lease = f"{LEASE_S:g}s"
    try:
        g.start(g.members[0])  # this version: the guard is made, the old leader stands down
        old.join(30)
        assert not old.is_alive(), "the earlier version's keeps were not refused"
        s0 = g.leader()

        def named() -> str | None:
            return (s0.health() or {}).get("older_servers")

        said = waits.wait_for("health to name the earlier server", named, 30, g.why)
        assert said.startswith("http://old-1 ("), said
        out = cli(home, "status", GPULEDGER_URL=s0.url).stdout
        assert "refused the lease (an earlier version): http://old-1 (" in out, out
        assert "the store refuses the lease to servers of an earlier version" in s0.text()
    finally:
        g.stop()


def _guarded(con: psycopg.Connection) -> bool:
    return con.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'gpuledger_leader_guard'"
                       ).fetchone() == (1,)  # fmt: skip


def test_a_server_that_is_refused_at_its_start_changes_nothing_in_the_store(
    tmp_path: Path, pg_store: str
) -> None:
    """atk42-28 F2: a server of this version started with other settings than the
    earlier version's leader records made the guard (and `stamp`) before it was refused: the
    earlier leader's next keep was refused, and nobody led. Now the check comes first, in the
    schema's transaction: a refused server leaves the store as it found it."""
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    with psycopg.connect(pg_store, autocommit=True) as con:
        con.execute(OLD_SCHEMA)
        assert _old_take(con, "old-1") == [(1,)]
        columns = con.execute("SELECT attname FROM pg_attribute WHERE attrelid = "
                              "'gpuledger_leader'::regclass AND attnum > 0").fetchall()  # fmt: skip
        # another lease than the earlier leader's (2 s): refused in one line at its start
        args = ("--listen", "127.0.0.1:0", "--lease", "3s", "--executor", "agents")
        err = one_line(cli(home, "serve", "--store", pg_store, *args, ok=False, timeout=120))
        assert "lease of 2s" in err and "given 3s" in err, err
        assert not _guarded(con)
        assert (
            con.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = "
                "'gpuledger_leader'::regclass AND attnum > 0"
            ).fetchall()
            == columns
        )
        # the earlier version's leader keeps its lease: it was never locked out
        assert con.execute(OLD_RENEW, (LEASE_S, "old-1", 1)).fetchall() == [(1,)]
        assert not _refused_table(con)
        # --new-settings recovers as before (once nobody leads): it is not refused, and the
        # guard is made with its start
        con.execute(OLD_RELEASE, ("old-1", 1))
        mine = lease.Settings(3.0, (60.0, 300.0), '{"executor":"agents"}', '{"min_uid":1000}')
        assert lease.agree(pg_store, mine, change=True) is not None
        assert _guarded(con)


def _refused_table(con: psycopg.Connection) -> bool:
    return con.execute(f"SELECT to_regclass('{lease.REFUSED_TABLE}')").fetchone() != (None,)


ROLLBACK = """BEGIN;
DROP TRIGGER gpuledger_leader_guard ON gpuledger_leader;
UPDATE gpuledger_leader SET admission = NULL;
COMMIT;"""
"""docs/ha.md, "Upgrading": going back to an earlier version, with every server stopped."""


def test_the_documented_rollback_and_a_new_upgrade_work(pg_store: str) -> None:
    """atk42-28 F2: after the rollback, the earlier version's take wrote its own admission
    text (of the same settings); a server of this version started again was refused by it (its
    `stamp` still > 0). Now that text is compared by what it means (atk43ha F1), and the
    same settings agree."""
    with psycopg.connect(pg_store, autocommit=True) as con:
        con.execute(OLD_SCHEMA)
        lease.setup(pg_store)
        new = _lease(pg_store, "new", _admission())
        mine = new.settings
        assert lease.agree(pg_store, mine) is not None
        try:
            assert new.acquire()
            new.release()
            # the rollback: every server stopped, the documented SQL, the earlier version leads
            con.execute(ROLLBACK)
            assert _old_take(con, "old-1", _admission(earlier=True)) == [(2,)]  # its own text
            assert con.execute(OLD_RELEASE, ("old-1", 2)).fetchall() == [(1,)]
            # upgraded again: this version's server is not refused by the earlier text, and
            # its take records its own settings
            assert lease.agree(pg_store, mine) is not None
            assert new.refusal(new.leader()) is None
            assert new.acquire() and new.epoch == 3
            row = con.execute("SELECT admission FROM gpuledger_leader").fetchone()
            assert row == (_admission(),), row
            # from then on the recorded settings are compared again
            other = lease.Settings(LEASE_S, mine.node, mine.work, _admission(1))
            new.release()
            with pytest.raises(InvalidCommand, match=r"min_uid 1000 \(recorded\) against 1 here"):
                lease.agree(pg_store, other)
        finally:
            new.close()
