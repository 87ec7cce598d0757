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
