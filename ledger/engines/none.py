"""`serve --executor none`: placements are only recorded; nothing runs in this process. An edge.

A placement counts as started once it is handed over (`carry_out` says it began at once); what
runs it, if anything, reports for itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ledger.cycle.executor import Exit, Observed, Orders, Start

if TYPE_CHECKING:
    from ledger.core.state import Node


class NoExecutor:
    engine = ""
    relaunch_placed = False

    def observe(self, now: float, nodes: Mapping[str, Node]) -> Observed:
        return Observed()

    def carry_out(self, orders: Orders, now: float) -> tuple[Start, ...]:
        return tuple(Start(job_id=job.job_id) for job in orders.launches)

    def adopt(self, runs: Mapping[int, int], now: float) -> set[int]:
        """Nothing runs here, so nothing is missing: the ledger is left as it is."""
        return set(runs)

    def shutdown(self, now: float) -> list[Exit]:
        return []

    def heard_from(self) -> Mapping[str, float]:
        return {}

    def next_event_at(self) -> float | None:
        return None
