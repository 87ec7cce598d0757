"""Servers started together on one store (attack atk39-28 F4): each start runs eventsourcing's
table creation, whose `CREATE OR REPLACE FUNCTION` fails with "tuple concurrently updated" when
another start replaces the same function at that moment, and the server died in one "internal
error" line. The store's schema is now made under the ledger's advisory lock (as the lease's
tables are), so concurrent starts wait for each other: real PostgreSQL, real recorders."""

from __future__ import annotations

import threading

from eventsourcing.utils import Environment

from ledger.store.postgres import LedgerPostgresFactory

STARTS, ROUNDS = 4, 15


def test_recorders_made_at_once_on_one_store_never_fail(pg_store: str) -> None:
    env = Environment(
        "gpuledger",
        {"GPULEDGER_STORE_DSN": pg_store, "CREATE_TABLE": "n", "GPULEDGER_STORE_CREATE": "1"},
    )
    factories = [LedgerPostgresFactory(env) for _ in range(STARTS)]
    recorders = [f.application_recorder() for f in factories]
    errors: list[BaseException] = []
    try:
        for _ in range(ROUNDS):
            gate = threading.Barrier(STARTS)

            def start(recorder: object, gate: threading.Barrier = gate) -> None:
                gate.wait()
                try:
                    recorder.create_table()  # type: ignore[attr-defined]
                except BaseException as err:  # every failure is the finding
                    errors.append(err)

            threads = [threading.Thread(target=start, args=(r,)) for r in recorders]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        assert not errors, [f"{type(e).__name__}: {e}" for e in errors]
    finally:
        for f in factories:
            f.close()
