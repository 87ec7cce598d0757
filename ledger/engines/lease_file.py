"""The node's lease as one part's supervisor or watchdog sees it (`supervise.wait_leader`,
`supervise.watch_lease`; written by its agent: `ledger.agent.lease`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

UNSEEN_LEASE_S = 357.0
"""A part that never read its node's lease and finds none counts it run out this long after it
found it missing: the server's default node-lost timeout (60 s) + fence (5 min), less the
agent's margin (`ledger.agent.lease.LEASE_MARGIN_S`)."""


class NodeLease:
    """The node's lease (`{"until": T}`, written by its agent at each contact with the server) as
    one part's supervisor or watchdog sees it: `passed` says whether it has run out (past T the
    server may have called the node lost and its fence passed).

    A missing or unreadable file is not "no fence": a part runs out at the last `until` it read,
    or, having read none, `UNSEEN_LEASE_S` after it first found the file missing. A state
    directory removed while its jobs ran took the lease with it, and the parts then never
    fenced themselves while the server called their node lost, its fence passed, and another
    agent launched the next job on their GPUs (atk39-23 F7). A `until` that is not a finite
    number (the agent never writes one) has run out: no file turns the fence off; an agent whose
    server has no fence writes a lease far in the future (`ledger.agent.lease.NO_FENCE_UNTIL`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.known: float | None = None
        """The last `until` read."""
        self.missing_since: float | None = None
        """When the file was first found missing while no `until` was known."""

    def passed(self, now: float) -> bool:
        try:
            until = float(json.loads(Path(self.path).read_bytes())["until"])
        except (OSError, ValueError, KeyError, TypeError):
            if self.known is not None:
                return now > self.known
            if self.missing_since is None:
                self.missing_since = now
            return now > self.missing_since + UNSEEN_LEASE_S
        if not math.isfinite(until):
            return True
        self.known = until
        return now > until
