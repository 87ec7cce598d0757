"""The ledger that may make a new PostgreSQL store's tables: `init --store` and `store copy`
(atk49 F3). Every other opening of a PostgreSQL store (reads, the audit, replay, `serve`, the
relay) reads the tables that are there, or refuses in one line naming the schema, creating
nothing (`ledger.store.postgres`, `_Bounded.create_table`)."""

from __future__ import annotations

from ledger.store.application import Ledger


class NewLedger(Ledger):
    """`Ledger`, allowed to make the store's tables (a SQLite store: the same as `Ledger`)."""

    name = Ledger.name  # the same tables (eventsourcing names a subclass's by its class)
    env = {**Ledger.env, "GPULEDGER_STORE_CREATE": "1"}  # noqa: RUF012 (eventsourcing's)
