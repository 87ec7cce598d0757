"""Commands run through the pure domain core on a `State`, for unit tests of what reads it."""

from __future__ import annotations

import itertools

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from schemas import commands as c
from schemas import events as e


def run(state: State, at: float, *cmds: c.AnyCommand) -> list[e.AnyEvent]:
    """Decide and evolve `cmds` in order at `at` (ids `x<at>-<n>`): the events recorded."""
    ids = (lambda n: lambda: f"x{at}-{next(n)}")(itertools.count())
    out = []
    for cmd in cmds:
        for ev in decide(state, cmd, at, ids):
            evolve(state, ev)
            out.append(ev)
    return out
