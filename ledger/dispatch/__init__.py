"""The dispatcher's pure core: `decide(snapshot, policy, now) -> Decision`.

Imports only `schemas` and the standard library (plus msgspec): no clock, no I/O, no store. The
cycle edge (the snapshot, append, executors) lives elsewhere.
"""

from ledger.dispatch.decision import Decision
from ledger.dispatch.engine import Unplaceable, WaitCode, decide
from ledger.dispatch.ordering import SortKey, fairshare_key, fifo_key
from ledger.dispatch.policy import FairShare, Fifo, Policy
from ledger.dispatch.preemption import Victim
from ledger.dispatch.snapshot import (
    NodeView,
    PendingJob,
    RunningJob,
    Snapshot,
    complete_ranks,
)

__all__ = [
    "Decision",
    "FairShare",
    "Fifo",
    "NodeView",
    "PendingJob",
    "Policy",
    "RunningJob",
    "Snapshot",
    "SortKey",
    "Unplaceable",
    "Victim",
    "WaitCode",
    "complete_ranks",
    "decide",
    "fairshare_key",
    "fifo_key",
]
