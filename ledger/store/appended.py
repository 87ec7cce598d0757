"""What an append returns, in the embedded ledger and at a server's client alike: its own module,
so a client's write (`ledger.wire.client`) loads none of the store (no eventsourcing)."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.events import AnyEvent


@dataclass(frozen=True)
class Appended:
    events: list[AnyEvent]
    position: int
    """The log position of the last event appended (the head after this command)."""


class LogBehind(Exception):
    """An append found no row, or another row, at the position it builds on: the store's log is
    behind what this ledger folded (a failover to a standby that never got the last commits,
    whose rows the old primary had shown to every session: atk51-ha F2). Nothing was written;
    the ledger reads its state back from the log (`Ledger._insert`)."""
