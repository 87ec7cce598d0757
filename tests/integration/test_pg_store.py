"""The PostgreSQL store from the command line: init on PostgreSQL, reads and the audit on it, and
`store copy` between SQLite and PostgreSQL (either way) byte for byte, refusing what would lose or
mix a log.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from uuid import UUID

import psycopg
import pytest
from click.testing import CliRunner

from ledger.cli import cli
from ledger.store import EVENTS_DB, locate
from ledger.store.application import Ledger
from ledger.store.creating import NewLedger
from schemas import commands as c


def run(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


def small_ledger(home: Path, store: str | None = None) -> int:
    """A ledger with a node, a project and three pending jobs; its head position."""
    led = NewLedger(home, store=store, live=True)  # makes a new store's tables
    try:
        led.execute(c.InitLedger(actor="root", admin="root"))
        led.execute_all(
            [
                c.RegisterNode(actor="root", node="n1", gpus=8, gpu_type="h100"),
                c.OpenAccount(actor="root", path="ai2", kind="program"),
                c.OpenAccount(actor="root", path="ai2/olmo", kind="project"),
                c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            ]
        )
        for _ in range(3):
            led.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=60))
        return led.position
    finally:
        led.close()


def sqlite_rows(home: Path) -> list[tuple[object, ...]]:
    con = sqlite3.connect(home / EVENTS_DB)
    try:
        return con.execute("SELECT rowid, * FROM stored_events ORDER BY rowid").fetchall()
    finally:
        con.close()


def test_init_on_postgresql_records_the_store_and_every_read_uses_it(
    tmp_path: Path, pg_store: str
) -> None:
    home = tmp_path / "home"
    run("--home", str(home), "init", "--admin", "root", "--store", pg_store)
    assert not (home / EVENTS_DB).exists()
    assert oct((home / locate.STORE_FILE).stat().st_mode & 0o777) == "0o600"
    run("--home", str(home), "--as", "root", "node", "add", "n1", "--gpus", "4", "--gpu-type", "a")
    assert "n1" in run("--home", str(home), "node", "list")
    where = run("--home", str(home), "store", "where")
    assert "postgresql://" in where and "@127.0.0.1" in where
    assert "chain intact over 2 events" in run("--home", str(home), "audit", "verify")


def test_copy_sqlite_to_postgresql_and_back_is_byte_for_byte(tmp_path: Path, pg_store: str) -> None:
    from ledger.store import relay_progress
    from ledger.store.relay import open_store

    src, back = tmp_path / "src", tmp_path / "back"
    n = small_ledger(src)
    key, topic, stamp = b"k" * 32, "gpuledger.events", 1_765_000_000_000
    relay_progress.keep(open_store(src), topic, n - 1, key, topic_id="X", offset=n - 2,
                        stamp=stamp)  # fmt: skip  # the relay's, carried over (v3: append time)
    out = run("store", "copy", str(src), pg_store)
    assert f"copied {n} events (positions 1-{n})" in out and "chain verified" in out
    password = pg_store.split("@")[0].split("//")[1].partition(":")[2]
    assert not password or password not in out
    assert relay_progress.rows(open_store(tmp_path, pg_store)) == [("gpuledger.events", n - 1)]
    run("store", "copy", pg_store, str(back))
    assert sqlite_rows(back) == sqlite_rows(src)
    assert relay_progress.rows(open_store(back)) == [("gpuledger.events", n - 1)]
    for store in (open_store(tmp_path, pg_store), open_store(back)):  # the time and its MAC
        assert relay_progress.read_anchor(store, topic) == ("X", n - 2, stamp)
        word = relay_progress.Kept(store, topic, key=key).word(n)
        assert word == relay_progress.Word(n - 1, True, "X", n - 2, stamp), word
    # the copy is a ledger: it opens, folds to the same state and takes writes
    a, b = Ledger(src, live=True), NewLedger(tmp_path / "pg", store=pg_store, live=True)
    try:
        assert (a.position, a.last_hash, sorted(a.state.jobs)) == (
            b.position,
            b.last_hash,
            sorted(b.state.jobs),
        )
        b.execute(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=60))
        assert b.position == n + 1
    finally:
        a.close()
        b.close()


def test_copy_refuses_a_destination_that_holds_events(tmp_path: Path, pg_store: str) -> None:
    src, other = tmp_path / "src", tmp_path / "other"
    n = small_ledger(src)
    small_ledger(other)
    run("store", "copy", str(src), pg_store)
    out = run("store", "copy", str(other), pg_store, code=1)
    assert f"the destination already holds {n} events" in out
    out = run("store", "copy", str(src), str(other), code=1)
    assert "already holds" in out


def test_copy_stops_at_a_broken_chain_and_writes_nothing_past_it(
    tmp_path: Path, pg_store: str
) -> None:
    src = tmp_path / "src"
    small_ledger(src)
    con = sqlite3.connect(src / EVENTS_DB)
    with con:
        (state,) = con.execute("SELECT state FROM stored_events WHERE rowid = 5").fetchone()
        con.execute(
            "UPDATE stored_events SET state = ? WHERE rowid = 5",
            (state + b" ",),  # still the same event, but not the bytes the next one links to
        )
    con.close()
    out = run("store", "copy", str(src), pg_store, code=1)
    assert "position 6: prev_hash" in out and "[copy]" in out
    with psycopg.connect(pg_store) as pg:
        (n,) = pg.execute("SELECT count(*) FROM gpuledger_events").fetchone()  # type: ignore[misc]
    assert n == 0  # a page is written once it verifies whole: nothing of this one


def test_a_home_with_a_sqlite_log_is_never_pointed_at_postgresql(
    tmp_path: Path, pg_store: str
) -> None:
    home = tmp_path / "home"
    small_ledger(home)
    out = run("--home", str(home), "init", "--admin", "root", "--store", pg_store, code=1)
    assert "holds a SQLite ledger" in out


@pytest.mark.parametrize("bad", ["mysql://x", "postgresql://[::1", "/no/such/dir/at/all"])
def test_a_bad_store_is_one_line(tmp_path: Path, bad: str) -> None:
    out = run("--home", str(tmp_path / "h"), "init", "--admin", "r", "--store", bad, code=1)
    assert out.startswith("error: ") and out.count("\n") == 1


def pg_rows(dsn: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as pg:
        return pg.execute(
            "SELECT notification_id, originator_id::text, originator_version, topic, state "
            "FROM gpuledger_events ORDER BY notification_id"
        ).fetchall()


def test_restore_from_kafka_rebuilds_the_lost_store_byte_for_byte(
    tmp_path: Path, pg_store: str, kafka_bootstrap: str, kafka_topic: str, transactional_id: str
) -> None:
    """The relay's topic is the off-site copy: the database is lost (dropped and made again,
    empty), `store restore --from-kafka` rebuilds it equal, row for row and byte for byte; into
    a SQLite home too."""
    from ledger.store.relay import Relay, open_store
    from tests.conftest import fresh_database, pg_admin_dsn

    home = tmp_path / "home"
    locate.remember(home, pg_store)
    n = small_ledger(home, pg_store)
    relay = Relay(open_store(home), kafka_bootstrap, topic=kafka_topic,
                  transactional_id=transactional_id)  # fmt: skip
    try:
        assert relay.publish_pending() == n
    finally:
        relay.close()
    from ledger.store.relay_progress import read_anchor

    _id, _offset, stamp = read_anchor(open_store(home), kafka_topic)  # the broker's append time
    assert stamp is not None and stamp > 1_700_000_000_000, stamp
    lost = pg_rows(pg_store)
    assert len(lost) == n
    fresh_database(pg_admin_dsn(), pg_store.rsplit("/", 1)[1].split("?")[0])  # the disaster
    with pytest.raises(psycopg.errors.UndefinedTable):
        pg_rows(pg_store)
    out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
              "--to", pg_store)  # fmt: skip
    assert f"restored {n} events (positions 1-{n})" in out and "chain verified" in out, out
    assert pg_rows(pg_store) == lost
    assert "chain intact" in run("--home", str(home), "audit", "verify")
    # the relay's progress is the topic's head (the store holds nothing the topic lacks)
    from ledger.store.relay_progress import read

    assert read(open_store(home), kafka_topic) == n
    back = tmp_path / "sqlite"
    run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
        "--to", str(back))  # fmt: skip
    assert read(open_store(back), kafka_topic) == n
    same = [(p, UUID(str(o)), v, t, bytes(s)) for p, o, v, t, s in lost]  # type: ignore[misc]
    assert same == [
        (p, UUID(str(o)), v, t, bytes(s))
        for p, o, v, t, s in sqlite_rows(back)  # type: ignore[misc]
    ]
    # a second restore into a store that holds the log (a rerun after one killed after its
    # write) finds every event equal and writes nothing new (it was refused, "already holds";
    # a store holding another log still is: test_relay_forgeries.py)
    out = run("store", "restore", "--from-kafka", kafka_bootstrap, "--topic", kafka_topic,
              "--to", pg_store)  # fmt: skip
    assert f"restored {n} events" in out, out
    assert pg_rows(pg_store) == lost


def test_a_snapshot_of_megabytes_is_written_in_binary_and_read_back_byte_for_byte(
    tmp_path: Path, pg_store: str
) -> None:
    """A snapshot's state goes to PostgreSQL as bytes, not escaped to text in Python
    (eventsourcing's composite type: ~90 ms of the worker's CPU for 3 MB, and the store's
    parsing of the text after it; 8 MB here took ~240 ms before, ~20 ms after)."""
    import os
    import time

    from eventsourcing.persistence import StoredEvent

    locate.remember(tmp_path / "home", pg_store)
    led = NewLedger(tmp_path / "home", store=pg_store)
    try:
        assert led.snapshots is not None
        recorder = led.snapshots.recorder
        state = os.urandom(8_000_000) + b"\x00\\'\"x"
        stream = UUID(int=5)
        began = time.thread_time()
        recorder.insert_events(
            [StoredEvent(originator_id=stream, originator_version=1, topic="t", state=state)]
        )
        cpu = time.thread_time() - began
        (got,) = recorder.select_events(stream, desc=True, limit=1)
        assert (got.originator_version, got.topic, got.state) == (1, "t", state)
        assert cpu < 0.1, f"{cpu:.3f} s of CPU to write an 8 MB snapshot"
    finally:
        led.close()
