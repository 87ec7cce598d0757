"""The write side's store: the eventsourcing application, its snapshots, the live state, the relay
and the clock (the only package that knows eventsourcing's tables).

`EVENTS_DB` lives here, not in a module, so a command that only asks whether a home has a log (every
CLI start) loads none of the store."""

EVENTS_DB = "events.sqlite"
"""The embedded event log inside a ledger home (the eventsourcing SQLite store)."""
