"""`State.free_gpus` keeps each node's free GPUs between reads; `evolve` forgets a node's entry
when its GPUs move. Read between events, it always equals `free_indices` computed afresh."""

from __future__ import annotations

import pytest

from ledger.core.evolve import evolve
from ledger.core.state import State
from projections.testing.synthetic import synthetic_events


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_free_gpus_kept_between_events_equal_free_indices(seed: int) -> None:
    state = State()
    placed = released = 0
    for ev in synthetic_events(4_000, seed=seed):
        before = {n: state.free_gpus(n) for n in state.nodes}  # cached now
        evolve(state, ev)
        for n in state.nodes:
            now = state.free_gpus(n)
            assert now == tuple(state.free_indices(n)), (seed, state.events, n)
            if n in before and len(now) < len(before[n]):
                placed += 1
            elif n in before and len(now) > len(before[n]):
                released += 1
    assert placed and released  # the GPUs moved both ways while cached
