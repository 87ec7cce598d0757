"""A direct CLI read on a PostgreSQL home (the `store` file names the database): `queue`, `jobs`
and `shares` read the store through libpq alone (`ledger.store.libpq`): they load neither
psycopg (~90 ms of CPU per command) nor its pool nor eventsourcing, and open one server session
per command: the live view and the projection's catch-up share it (a second session costs a
connection, a backend started by the server and its round trips)."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from ledger.store import locate
from tests.integration.serverkit import cli, set_up_ledger
from tests.integration.test_cli_imports import _probe

HEAVY = (
    "psycopg",
    "psycopg_pool",
    "eventsourcing",
    "pyarrow",
    "litestar",
    "uvicorn",
    "kafka",
    "rich",
)


@pytest.fixture(scope="module")
def pg_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import drop_database, fresh_database, pg_admin_dsn

    tmp = tmp_path_factory.mktemp("pg-reads")
    home = tmp / "ledger"
    name = f"t_pg_cli_reads_{int(time.time() * 1000) % 10**9}"
    dsn = fresh_database(pg_admin_dsn(), name)
    locate.remember(home, dsn)
    set_up_ledger(home, tmp)
    cli(home, "jobs", GPULEDGER_USER="root")  # catches the projection up
    yield home
    drop_database(pg_admin_dsn(), name)


def _sessions(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute("SELECT pg_stat_clear_snapshot()")
        row = con.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("command", ["queue", "jobs", "shares"])
def test_a_read_on_postgresql_opens_one_session_and_loads_no_psycopg(
    pg_home: Path, command: str
) -> None:
    dsn = locate.store_of(pg_home)
    assert dsn is not None
    before = _sessions(dsn)
    proc, probe = _probe(pg_home, command)
    assert "olmo" in proc.stdout
    assert [m for m in HEAVY if m in probe["modules"]] == []
    time.sleep(0.5)  # a session's end reaches the statistics as its backend exits
    assert _sessions(dsn) - before == 2  # the read's one, and this count's own first one
