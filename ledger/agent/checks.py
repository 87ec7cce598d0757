"""The node agent's last check before it starts a launch (`NodeAgent._may_start`): the
server's word, asked just before (`POST /v1/agent/confirm`), that the launch is still its job's
current placement on the node, as Slurm's prolog and job credential check a launch on the node
itself. Pure bookkeeping, and a test seam; the requests are the agent's."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

FRESH_S = 2.0
"""How long a server's word that a launch is current lets it start (`_may_start`)."""
CONFIRM_AGAIN_S = 5.0
"""A refused launch, or one no server confirmed, is asked about again this long after."""
TEST_HOLD_ENV = "GPULEDGER_AGENT_TEST_HOLD"
"""A test seam, for tests only: a file path; while the file exists, the main loop holds each
launch it is about to check and start (and writes `<path>.held` naming the job), so a test can
change the ledger between the poll answer and the launch (`hold_for_test`)."""


def hold_for_test(job_id: int, run: int) -> None:
    """The test seam `TEST_HOLD_ENV` (unset in production: nothing happens)."""
    path = os.environ.get(TEST_HOLD_ENV)
    if not path or not os.path.exists(path):
        return
    Path(path + ".held").write_text(f"{job_id} {run}\n")
    while os.path.exists(path):
        time.sleep(0.05)


@dataclass
class LastChecks:
    """The launches' last checks (`NodeAgent._may_start`), keyed (job, run, job token); the
    caller holds the agent's lock. Times are `time.monotonic()`."""

    ok: dict[tuple[int, int, str], float] = field(default_factory=dict)
    """Confirmed, and when."""
    waits: dict[tuple[int, int, str], float] = field(default_factory=dict)
    """Refused or not answered, and when: not asked again before `CONFIRM_AGAIN_S`."""
    pending: set[tuple[int, int, str]] = field(default_factory=set)
    """To ask, or being asked."""
    unsupported: bool = False
    """The server does not know the route (an older one)."""

    def fresh(self, key: tuple[int, int, str], now: float) -> bool:
        """Confirmed within `FRESH_S`: starts now (the word is used once)."""
        at = self.ok.pop(key, None)
        return at is not None and now - at <= FRESH_S

    def ask(self, key: tuple[int, int, str], now: float) -> bool:
        """Ask about it unless asked already or lately refused; True when newly asked."""
        if key in self.pending or now - self.waits.get(key, -math.inf) < CONFIRM_AGAIN_S:
            return False
        self.pending.add(key)
        return True

    def asking(self) -> list[tuple[int, int, str]]:
        return sorted(self.pending)

    def answered(self, keys: list[tuple[int, int, str]], ok: set[tuple[int, int]],
                 now: float) -> None:  # fmt: skip
        for key in keys:
            self.pending.discard(key)
            if key[:2] in ok:
                self.ok[key] = now
                self.waits.pop(key, None)
            else:
                self.waits[key] = now

    def keep(self, listed: set[tuple[int, int, str]]) -> None:
        """Forget what the node's list no longer names (what is being asked is answered: the
        refusal of a launch the list dropped meanwhile is said in the agent's log)."""
        for d in (self.ok, self.waits):
            for key in [k for k in d if k not in listed]:
                del d[key]

    def failed(self, keys: list[tuple[int, int, str]], now: float, *, unsupported: bool) -> None:
        self.unsupported = unsupported
        for key in keys:
            self.pending.discard(key)
            self.waits[key] = now
