"""The write side's store: the eventsourcing application, its snapshots, the live state, the relay
and the clock (the only package that knows eventsourcing's tables).

`EVENTS_DB`, `STORE_FILE`, `recorded` and `has_log` live here, not in a module, so a command that
only asks whether a home has a log (every CLI start) loads none of the store (no eventsourcing, no
psycopg)."""

from pathlib import Path

EVENTS_DB = "events.sqlite"
"""The embedded event log inside a ledger home (the eventsourcing SQLite store)."""

STORE_FILE = "store"
"""In a ledger home: the DSN of its PostgreSQL store (absent: the SQLite file beside it)."""


def recorded(home: Path) -> str | None:
    """The DSN `home` records for its log (None: its SQLite file)."""
    try:
        text = (home / STORE_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    return text or None


def has_log(home: Path) -> bool:
    """Does `home` name a log (a SQLite file, or a recorded PostgreSQL store)?"""
    return recorded(home) is not None or (home / EVENTS_DB).exists()
