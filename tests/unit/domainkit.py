"""Commands run through the pure domain core on a `State`, for unit tests of what reads it."""

from __future__ import annotations

import itertools

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from schemas import commands as c
from schemas import events as e
from schemas.policy import FifoConfig

ONE_NODE: tuple[c.AnyCommand, ...] = (
    c.InitLedger(actor="root", admin="root"),
    c.OpenAccount(actor="root", path="p", kind="program"),
    c.OpenAccount(actor="root", path="p/q", kind="project"),
    c.AddMember(actor="root", user="u", project="p/q"),
    c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=4),
    c.ConfigureService(actor="root", policy=FifoConfig(), interval_s=2.0, executor="agents"),
)
"""A ledger of one project `p/q` with member `u` and one node `n1` of 4 GPUs, FIFO on agents."""


def run(state: State, at: float, *cmds: c.AnyCommand) -> list[e.AnyEvent]:
    """Decide and evolve `cmds` in order at `at` (ids `x<at>-<n>`): the events recorded."""
    ids = (lambda n: lambda: f"x{at}-{next(n)}")(itertools.count())
    out = []
    for cmd in cmds:
        for ev in decide(state, cmd, at, ids):
            evolve(state, ev)
            out.append(ev)
    return out
