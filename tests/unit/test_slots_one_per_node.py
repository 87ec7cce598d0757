"""A placement the ledger takes may name one node in two slots (`(n1, (0,)), (n1, (1,))`). The
dispatcher's searches counted such a victim once per slot: a one-node plan took it twice and
`_preempt` failed with `KeyError` (s52: found by hypothesis in test_order_kept_properties). The
running job's view names each node once, so a cycle preempts it once and decides as for the same
GPUs in one slot."""

from __future__ import annotations

import msgspec
import pytest

from ledger.core.decide import decide as apply
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.cycle.inputs import one_slot_per_node, snapshot_from_state
from ledger.dispatch import decide
from ledger.dispatch.registry import default_config, policy_from_config
from schemas import commands as c
from schemas.errors import InvalidCommand
from schemas.events import GpuSlot, JobPlaced
from tests.unit.test_domain_properties import T0, _ids, seed_org


def _run(state: State, cmd: c.AnyCommand, now: float, ids: object) -> None:
    for ev in apply(state, cmd, now, ids):
        evolve(state, ev)


def _two_slots_on_n1(slots: tuple[GpuSlot, ...]) -> State:
    """carol's unfunded 4-GPU job holds n1 in `slots`; alice's funded 4-GPU job on h100 waits
    and n2 is full of bob's job in its contract."""
    state, _ = seed_org()
    ids = _ids()
    _run(state, c.SubmitJob(actor="carol", account="ai2/tulu", gpus=4, min_runtime_s=0), T0, ids)
    _run(state, c.SubmitJob(actor="bob", account="ai2/olmo", gpus=4, min_runtime_s=3600), T0, ids)
    whole = (GpuSlot(node="n1", gpu_indices=(0, 1, 2, 3)),)
    placements = (
        c.Placement(job_id=1, slots=whole),
        c.Placement(job_id=2, slots=(GpuSlot(node="n2", gpu_indices=(0, 1, 2, 3)),)),
    )
    body = c.DecisionBody(cycle_id="c1", based_on=state.events, policy_version="test",
                          placements=placements, preemptions=())  # fmt: skip
    cmd = c.ApplyDecision(actor="@dispatcher", decision=body)
    for ev in apply(state, cmd, T0 + 1, ids):  # as a log recorded before the ledger refused
        if isinstance(ev, JobPlaced) and ev.job_id == 1:  # a placement naming n1 twice holds it
            ev = msgspec.structs.replace(ev, slots=slots)
        evolve(state, ev)
    _run(state, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=4, min_runtime_s=3600,
                            gpu_type="h100"), T0 + 2, ids)  # fmt: skip
    return state


def test_a_job_holding_one_node_in_two_slots_is_preempted_once() -> None:
    split = (GpuSlot(node="n1", gpu_indices=(0, 1)), GpuSlot(node="n1", gpu_indices=(2, 3)))
    whole = (GpuSlot(node="n1", gpu_indices=(0, 1, 2, 3)),)
    for version in ("fairshare-7", "fairshare-14"):
        policy = policy_from_config(default_config(version))
        got = [
            decide(snapshot_from_state(_two_slots_on_n1(s), {}, T0 + 60), policy, T0 + 60)
            for s in (split, whole)
        ]
        assert [p.job_id for p in got[0].preemptions] == [1], (version, got[0])
        assert got[0] == got[1], version


def test_the_ledger_refuses_a_placement_naming_one_node_in_two_slots() -> None:
    state, _ = seed_org()
    ids = _ids()
    _run(state, c.SubmitJob(actor="carol", account="ai2/tulu", gpus=4, min_runtime_s=0), T0, ids)
    split = (GpuSlot(node="n1", gpu_indices=(0, 1)), GpuSlot(node="n1", gpu_indices=(2, 3)))
    body = c.DecisionBody(cycle_id="c1", based_on=state.events, policy_version="test",
                          placements=(c.Placement(job_id=1, slots=split),))  # fmt: skip
    with pytest.raises(InvalidCommand, match="names node 'n1' in two slots"):
        apply(state, c.ApplyDecision(actor="@dispatcher", decision=body), T0 + 1, ids)


def test_one_slot_per_node_joins_a_nodes_gpus_in_first_seen_order() -> None:
    slots = (
        GpuSlot(node="n2", gpu_indices=(3,)),
        GpuSlot(node="n1", gpu_indices=(0,)),
        GpuSlot(node="n2", gpu_indices=(1,)),
    )
    assert one_slot_per_node(slots) == (
        GpuSlot(node="n2", gpu_indices=(3, 1)),
        GpuSlot(node="n1", gpu_indices=(0,)),
    )
    single = (GpuSlot(node="n1", gpu_indices=(0, 1)),)
    assert one_slot_per_node(single) is single
