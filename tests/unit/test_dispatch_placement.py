"""Placement rules (best fit, whole-node gang jobs, constraints, drains), wait reasons and
fragmentation. Fifo orders by job id here and never preempts, so only placement is tested."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
import pytest

from ledger.dispatch import Fifo, NodeView, PendingJob, RunningJob, Snapshot, decide
from ledger.dispatch.snapshot import NodeState
from schemas.events import GpuSlot
from schemas.policy import FifoConfig

NOW = 100_000.0


def node(
    name: str,
    gpus: int = 8,
    *,
    state: NodeState = "active",
    gpu_type: str = "h100",
    cluster: str = "c1",
) -> NodeView:
    return NodeView(name=name, cluster=cluster, gpu_type=gpu_type, gpus=gpus, state=state)


def held(job_id: int, where: Mapping[str, Sequence[int]]) -> RunningJob:
    slots = tuple(GpuSlot(node=n, gpu_indices=tuple(ix)) for n, ix in where.items())
    return RunningJob(
        job_id=job_id,
        account="lab/b",
        user="u",
        gpus=sum(len(s.gpu_indices) for s in slots),
        slots=slots,
        placed_at=NOW - 10,
        min_runtime_s=3600,
    )


def pend(
    job_id: int, gpus: int, *, gpu_type: str | None = None, cluster: str | None = None
) -> PendingJob:
    return PendingJob(
        job_id=job_id,
        account="lab/a",
        user="u",
        gpus=gpus,
        gpu_type=gpu_type,
        cluster=cluster,
        min_runtime_s=600,
        submitted_at=float(job_id),
    )


def world(
    nodes: Sequence[NodeView], running: Sequence[RunningJob], pending: Sequence[PendingJob]
) -> Snapshot:
    """A consistent snapshot: each node's free GPUs are those no running job holds."""
    taken = {(sl.node, i) for r in running for sl in r.slots for i in sl.gpu_indices}
    views = tuple(
        msgspec.structs.replace(n, free=tuple(i for i in range(n.gpus) if (n.name, i) not in taken))
        for n in nodes
    )
    return Snapshot(position=42, nodes=views, running=tuple(running), pending=tuple(pending))


@dataclass(frozen=True)
class PlaceCase:
    name: str
    nodes: list[NodeView]
    pending: list[PendingJob]
    running: list[RunningJob] = field(default_factory=list)
    want_placed: dict[int, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    want_waiting: dict[int, str] = field(default_factory=dict)
    """job id -> `Unplaceable.text()`."""


PLACE_CASES = [
    PlaceCase(
        "best fit takes the node with the fewest free GPUs that still fits",
        nodes=[node("n1"), node("n2"), node("n3")],
        running=[held(90, {"n2": range(5)}), held(91, {"n3": range(6)})],
        pending=[pend(1, 2)],
        want_placed={1: {"n3": (6, 7)}},
    ),
    PlaceCase(
        "a one-node job never splits across nodes",
        nodes=[node("n1"), node("n2")],
        running=[held(90, {"n1": range(4), "n2": range(4)})],
        pending=[pend(1, 6)],
        want_waiting={1: "WAIT_RESOURCES: no node with 6 free GPUs; at most 4 free on one node"},
    ),
    PlaceCase(
        "small jobs fill partly used nodes so whole nodes stay free for large ones",
        nodes=[node("n1"), node("n2")],
        running=[held(90, {"n2": range(4)})],
        pending=[pend(1, 4), pend(2, 8)],
        want_placed={1: {"n2": (4, 5, 6, 7)}, 2: {"n1": tuple(range(8))}},
    ),
    PlaceCase(
        "a gang job takes whole free nodes, largest first then by name",
        nodes=[node("n3"), node("n1"), node("n2"), node("s1", 4)],
        pending=[pend(1, 16)],
        want_placed={1: {"n1": tuple(range(8)), "n2": tuple(range(8))}},
    ),
    PlaceCase(
        "a gang job gets whole nodes or nothing",
        nodes=[node("n1"), node("n2")],
        running=[held(90, {"n2": [0]})],
        pending=[pend(1, 16)],
        want_waiting={
            1: "WAIT_RESOURCES: needs 16 GPUs on whole free nodes of one pool; "
            "8 on whole free nodes"
        },
    ),
    PlaceCase(
        "a gang job of 12 on 8-GPU nodes leaves the last node's other GPUs free",
        nodes=[node("n1"), node("n2")],
        pending=[pend(1, 12), pend(2, 4)],
        want_placed={1: {"n1": tuple(range(8)), "n2": (0, 1, 2, 3)}, 2: {"n2": (4, 5, 6, 7)}},
    ),
    PlaceCase(
        "a job larger than every node of its type is a gang job",
        nodes=[node("m1", 4), node("m2", 4), node("m3", 4)],
        pending=[pend(1, 6)],
        want_placed={1: {"m1": (0, 1, 2, 3), "m2": (0, 1)}},
    ),
    PlaceCase(
        "a gang job never mixes pools",
        nodes=[node("n1", gpu_type="h100"), node("a1", gpu_type="a100")],
        pending=[pend(1, 16)],
        want_waiting={
            1: "WAIT_RESOURCES: needs 16 GPUs on whole free nodes of one pool; "
            "8 on whole free nodes"
        },
    ),
    PlaceCase(
        "the GPU type constraint picks the pool",
        nodes=[node("a1", gpu_type="a100"), node("h1", gpu_type="h100")],
        running=[held(90, {"h1": range(6)})],
        pending=[pend(1, 2, gpu_type="a100"), pend(2, 2, gpu_type="h100")],
        want_placed={1: {"a1": (0, 1)}, 2: {"h1": (6, 7)}},
    ),
    PlaceCase(
        "the cluster constraint picks the pool",
        nodes=[node("n1", cluster="c1"), node("n2", cluster="c2")],
        running=[held(90, {"n1": range(4)})],
        pending=[pend(1, 2, cluster="c2")],
        want_placed={1: {"n2": (0, 1)}},
    ),
    PlaceCase(
        "draining and drained nodes take nothing",
        nodes=[node("n1", state="draining"), node("n2", state="drained"), node("n3")],
        running=[held(90, {"n3": range(7)})],
        pending=[pend(1, 2), pend(2, 1)],
        want_placed={2: {"n3": (7,)}},
        want_waiting={1: "WAIT_RESOURCES: no node with 2 free GPUs; at most 1 free on one node"},
    ),
    PlaceCase(
        "a job that does not fit reserves nothing: a later job that fits runs now",
        nodes=[node("n1")],
        running=[held(90, {"n1": range(4)})],
        pending=[pend(1, 8), pend(2, 4)],
        want_placed={2: {"n1": (4, 5, 6, 7)}},
        want_waiting={1: "WAIT_RESOURCES: no node with 8 free GPUs; at most 4 free on one node"},
    ),
    PlaceCase(
        "a job whose GPUs went to jobs ahead of it waits for priority",
        nodes=[node("n1")],
        running=[held(90, {"n1": range(4)})],
        pending=[pend(1, 4), pend(2, 4)],
        want_placed={1: {"n1": (4, 5, 6, 7)}},
        want_waiting={
            2: "WAIT_PRIORITY: jobs ahead of it in the order took the GPUs free at the start "
            "of the cycle"
        },
    ),
    PlaceCase(
        "the reason names the GPU type and cluster asked for",
        nodes=[node("n1")],
        running=[held(90, {"n1": range(6)})],
        pending=[pend(1, 8, gpu_type="h100", cluster="c1")],
        want_waiting={
            1: "WAIT_RESOURCES: no node with 8 free h100 GPUs in cluster c1; "
            "at most 2 free on one node"
        },
    ),
    PlaceCase(
        "a job with no node of its type says so",
        nodes=[node("n1")],
        pending=[pend(1, 1, gpu_type="b200")],
        want_waiting={1: "WAIT_RESOURCES: no b200 GPUs registered"},
    ),
]


@pytest.mark.parametrize("case", PLACE_CASES, ids=lambda c: c.name)
def test_placement(case: PlaceCase) -> None:
    d = decide(world(case.nodes, case.running, case.pending), Fifo(), NOW)
    placed = {p.job_id: {s.node: s.gpu_indices for s in p.slots} for p in d.placements}
    assert placed == case.want_placed
    assert {j: w.text() for j, w in d.waiting.items()} == case.want_waiting
    assert d.preemptions == ()
    considered = {c.job_id: c.reason for c in d.considered()}
    assert considered == {j.job_id: case.want_waiting.get(j.job_id) for j in case.pending}


@dataclass(frozen=True)
class FragCase:
    name: str
    nodes: list[NodeView]
    running: list[RunningJob]
    pending: list[PendingJob]
    want_fragmentation: int


FRAG_CASES = [
    FragCase(
        "idle GPUs with no job waiting are not fragmented",
        nodes=[node("n1")],
        running=[held(90, {"n1": range(5)})],
        pending=[],
        want_fragmentation=0,
    ),
    FragCase(
        "free GPUs fewer than any waiting job asks for on one node are fragmented",
        nodes=[node("n1"), node("n2")],
        running=[held(90, {"n1": range(5), "n2": range(6)})],
        pending=[pend(1, 4)],
        want_fragmentation=5,
    ),
    FragCase(
        "free GPUs a waiting job could use are not fragmented",
        nodes=[node("n1"), node("n2")],
        running=[held(90, {"n1": range(5), "n2": range(6)})],
        pending=[pend(1, 4), pend(2, 4, gpu_type="h100"), pend(3, 3)],
        want_fragmentation=2,  # job 3 takes n1; n2's 2 free GPUs suit no waiting job
    ),
    FragCase(
        "only pools a waiting job may use count",
        nodes=[node("n1"), node("a1", gpu_type="a100")],
        running=[held(90, {"n1": range(5), "a1": range(5)})],
        pending=[pend(1, 4, gpu_type="h100")],
        want_fragmentation=3,
    ),
    FragCase(
        "a partly used node is fragmented for a waiting gang job, a whole free one is not",
        nodes=[node("n1"), node("n2")],
        running=[held(90, {"n2": range(6)})],
        pending=[pend(1, 24)],
        want_fragmentation=2,
    ),
]


@pytest.mark.parametrize("case", FRAG_CASES, ids=lambda c: c.name)
def test_fragmentation(case: FragCase) -> None:
    d = decide(world(case.nodes, case.running, case.pending), Fifo(), NOW)
    assert d.fragmentation_gpus == case.want_fragmentation


def test_decision_carries_position_policy_and_config() -> None:
    d = decide(world([node("n1")], [], [pend(1, 1)]), Fifo(), NOW)
    assert (d.based_on, d.policy_version) == (42, "fifo-1")
    cmd = d.to_command("@dispatcher", "c7", policy=FifoConfig())
    body = cmd.decision
    assert (cmd.actor, body.cycle_id, body.based_on, cmd.expected_position) == (
        "@dispatcher",
        "c7",
        42,
        42,
    )
    assert body.policy == FifoConfig()
    assert body.placements == d.placements and body.waiting == d.summary()
