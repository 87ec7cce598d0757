"""How far the relay publishes (`ledger.store.confirmed`): on SQLite, the head, with no barrier
commit (SQLite's datastore has a pool too: taken for PostgreSQL, every relay on SQLite failed
with "'SQLiteDatastore' object has no attribute 'schema'"). The PostgreSQL side, a synchronous
standby that never confirmed the last commit, is
tests/integration/test_pg_failover_lost.py::test_the_relay_never_publishes_a_commit_the_failover_loses."""

from __future__ import annotations

from ledger.store.application import Ledger
from ledger.store.confirmed import confirmed_head, publishable
from ledger.store.relay import open_store


def test_a_relay_on_sqlite_publishes_up_to_the_head_without_a_barrier(org_ledger: Ledger) -> None:
    recorder = open_store(org_ledger.home)
    assert publishable(recorder, 0) is None
    assert publishable(recorder, 3) is None
    assert confirmed_head(recorder) is None
