"""The CLI's light reader of a PostgreSQL store (`PgSource(light=True)`: libpq through ctypes,
`ledger.store.libpq`) answers every read exactly as the psycopg reader does, on a real store:
the same rows and bytes, an empty store read as empty, a store that does not answer in one
line, and a connection the server dropped replaced once."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from ledger.store import locate, snapshots
from ledger.store.application import Ledger
from ledger.store.pgread import PgSource
from projections.errors import SourceUnavailable
from schemas.errors import InvalidCommand
from tests.integration.serverkit import set_up_ledger


@pytest.fixture
def dsn(tmp_path: Path, pg_store: str) -> str:
    """A ledger on `pg_store` with a few commands and a snapshot."""
    home = tmp_path / "home"
    locate.remember(home, pg_store)
    set_up_ledger(home, tmp_path)
    ledger = Ledger(home, live=True)
    ledger.snapshot_state()
    ledger.close()
    return pg_store


def test_the_light_reader_reads_what_psycopg_reads(dsn: str) -> None:
    with PgSource(dsn) as full, PgSource(dsn, light=True) as light:
        assert light._light and not full._light  # libpq loaded: the test runs the light path
        head = full.head()
        assert head > 5 and light.head() == head
        assert light.read(0, 1000) == full.read(0, 1000)
        assert light.read_rows(2, 3) == full.read_rows(2, 3)
        assert light.read_stored(0, 1000) == full.read_stored(0, 1000)
        tags = ["job.submitted.v2", 'no"such\\tag']
        assert light.read_tagged(0, 1000, tags) == full.read_tagged(0, 1000, tags)
        assert len(light.read_tagged(0, 1000, tags)) == 1
        stream = snapshots.STREAM_ID.hex
        assert light.snapshots(stream, 3) == full.snapshots(stream, 3) != []
        assert light.snapshot_rows(stream, 3) == full.snapshot_rows(stream, 3)
        assert all(isinstance(d, bytes) for _, _, d in light.read_rows(0, 1000))


def test_a_store_with_no_ledger_in_its_schema_is_refused_in_one_line(pg_store: str) -> None:
    """Not read as an empty log (atk49 F3: "chain intact over 0 events", an empty job list)."""
    for light_or_not in (True, False):
        with PgSource(pg_store, light=light_or_not) as source:
            assert source.snapshots("x", 1) == []  # no snapshots table: no snapshots
            with pytest.raises(InvalidCommand, match="holds no ledger in schema 'public'"):
                source.head()


def test_a_store_that_does_not_answer_is_one_line() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed at once: nobody listens
    with pytest.raises(SourceUnavailable, match="cannot reach the PostgreSQL store") as err:
        PgSource(f"postgresql://u:secret@127.0.0.1:{port}/db", light=True)
    assert "\n" not in err.value.message and "secret" not in err.value.message


def test_a_connection_the_server_dropped_is_replaced_once(dsn: str) -> None:
    with PgSource(dsn, light=True) as light:
        head = light.head()
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        assert light.head() == head
