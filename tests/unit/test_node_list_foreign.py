"""`node list` counts GPUs that work outside the ledger holds (foreign Slurm jobs, as the service
last observed them) as not free, and names them."""

from __future__ import annotations

from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.reads.layer import node_list
from schemas import events as e


def test_gpus_held_outside_the_ledger_are_not_free_and_are_named() -> None:
    state = State()
    evolve(state, e.NodeRegistered(at=1.0, actor="root", event_id="e1", cluster="c", node="vm",
                                   gpu_type="fake", gpus=4))  # fmt: skip
    (plain,) = node_list(state)
    assert (plain.free_gpus, plain.foreign_gpus) == (4, [])
    (row,) = node_list(state, {"vm": frozenset({2, 0}), "elsewhere": frozenset({1})})
    assert (row.free_gpus, row.foreign_gpus) == (2, [0, 2])


def test_gpus_of_a_stopped_run_in_its_grace_are_held_not_free() -> None:
    """A cancelled run's GPUs showed free while its processes had their grace (the engine
    starts nothing on them until they are gone): `stopping`, not free."""
    state = State()
    evolve(state, e.NodeRegistered(at=1.0, actor="root", event_id="e1", cluster="c", node="vm",
                                   gpu_type="fake", gpus=4))  # fmt: skip
    (row,) = node_list(state, {"vm": frozenset({3})}, {"vm": frozenset({1, 0})})
    assert (row.free_gpus, row.foreign_gpus, row.stopping_gpus) == (1, [3], [0, 1])
