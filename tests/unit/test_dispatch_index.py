"""`FreeIndex.of`: an index made from the last one when only free GPUs moved answers every
question as an index built afresh (`FreeIndex(nodes)`), over seeded random sequences of nodes
whose GPUs are taken and given back, drained and resized."""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec
import pytest

from ledger.dispatch.placement import FreeIndex, fragmentation_split
from ledger.dispatch.snapshot import NodeView, PendingJob

SHAPES = [(g, t) for g in (1, 2, 3, 4, 8, 12, 16, 24, 40) for t in (None, "h100", "a100")]


def _job(i: int, gpus: int, gpu_type: str | None) -> PendingJob:
    return PendingJob(
        job_id=i, account="lab/t", user="u", gpus=gpus, min_runtime_s=60, submitted_at=0.0,
        gpu_type=gpu_type)  # fmt: skip


def answers(index: FreeIndex, seed: int) -> list[object]:
    """What a cycle would read: the start capacity, then a seeded run of placements and
    releases, every answer recorded (slots taken, fits, shortfalls)."""
    rng = random.Random(seed)
    out: list[object] = [sorted(index.free.items()), sorted(index.start.items())]
    held = []
    for i in range(60):
        gpus, gpu_type = rng.choice(SHAPES)
        job = _job(i, gpus, gpu_type)
        gang = index.is_gang(job)
        out.append((index.fitted_at_start(job, gang), index.shortfall(job, gang)))
        slots = index.place(job, gang)
        out.append(slots)
        if slots is not None:
            held.append(slots)
        if held and rng.random() < 0.3:
            index.release(held.pop(rng.randrange(len(held))))
    out.append(sorted(index.free.items()))
    return out


def _step(rng: random.Random, nodes: list[NodeView]) -> list[NodeView]:
    """Change a few nodes: free GPUs mostly, now and then a state or a size."""
    out = list(nodes)
    for _ in range(rng.randint(0, 6)):
        i = rng.randrange(len(out))
        n = out[i]
        roll = rng.random()
        if roll < 0.05:
            n = msgspec.structs.replace(n, state=rng.choice(["active", "draining", "drained"]))
        elif roll < 0.07:
            n = msgspec.structs.replace(n, gpus=rng.choice([4, 8]), free=())
        else:
            n = msgspec.structs.replace(
                n, free=tuple(sorted(rng.sample(range(n.gpus), rng.randint(0, n.gpus))))
            )
        out[i] = n
    return out


def _nodes(rng: random.Random, count: int, free: Callable[[], tuple[int, ...]]) -> list[NodeView]:
    """`count` 8-GPU nodes of one cluster, each of a random type, its free GPUs `free()`."""
    return [
        NodeView(
            name=f"n{i:02d}",
            cluster="c",
            gpu_type=rng.choice(["h100", "a100"]),
            gpus=8,
            free=free(),
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("seed", range(12))
def test_index_made_from_the_last_answers_as_one_made_afresh(seed: int) -> None:
    rng = random.Random(seed)
    nodes = _nodes(rng, 24, lambda: tuple(range(8)))
    last = None
    for step in range(150):
        nodes = _step(rng, nodes)
        kept, last = FreeIndex.of(nodes, last)
        fresh = FreeIndex(nodes)
        assert answers(kept, step) == answers(fresh, step), f"seed {seed} step {step}"


def test_the_index_handed_out_is_scratch_the_kept_one_does_not_change() -> None:
    nodes = [NodeView(name=f"n{i}", cluster="c", gpu_type="h100", gpus=8, free=tuple(range(8)))
             for i in range(6)]  # fmt: skip
    first, last = FreeIndex.of(nodes)
    first.place(_job(1, 8, None), False)
    first.place(_job(2, 3, None), False)
    again, _ = FreeIndex.of(nodes, last)
    assert answers(again, 1) == answers(FreeIndex(nodes), 1)


def _fragmentation_one_pass_per_skip(index: FreeIndex, smallest: dict, skip: set[str]) -> int:
    """The definition, node by node (the code before `fragmentation_split`)."""
    fewest: dict = {}
    gang: set = set()
    wanted: set = set()
    for (gpu_type, cluster, is_gang), gpus in smallest.items():
        for p in index.pools_for(gpu_type, cluster):
            wanted.add(p.key)
            if is_gang:
                gang.add(p.key)
            elif gpus < fewest.get(p.key, gpus + 1):
                fewest[p.key] = gpus
    total = 0
    for name, free in index.free.items():
        key, k = index.pool_of[name], len(free)
        if not k or key not in wanted or name in skip:
            continue
        whole = k == index.size[name]
        if not ((key in fewest and k >= fewest[key]) or (whole and key in gang)):
            total += k
    return total


@pytest.mark.parametrize("seed", range(8))
def test_fragmentation_of_every_node_and_of_the_rest_in_one_pass(seed: int) -> None:
    rng = random.Random(seed)
    nodes = _nodes(rng, 16, lambda: tuple(sorted(rng.sample(range(8), rng.randint(0, 8)))))
    index = FreeIndex(nodes)
    for _ in range(40):
        smallest = {
            (rng.choice([None, "h100", "a100"]), None, rng.random() < 0.3): rng.randint(1, 16)
            for _ in range(rng.randint(0, 3))
        }
        skip = {n.name for n in nodes if rng.random() < 0.3}
        assert fragmentation_split(index, smallest, skip) == (
            _fragmentation_one_pass_per_skip(index, smallest, set()),
            _fragmentation_one_pass_per_skip(index, smallest, skip),
        )
