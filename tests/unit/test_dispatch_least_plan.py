"""`plan_single_least` keeps a victim's GPUs per node once per search (`_Taken.held_on`): its
plans equal those of counting them again at every trim (the code before), on seeded random
clusters whose victims include gang jobs holding GPUs on many nodes."""

from __future__ import annotations

import random

import pytest

from ledger.dispatch.placement import FreeIndex
from ledger.dispatch.preemption import Ask, Plan, Victim, _until, plan_single_least
from ledger.dispatch.snapshot import NodeView, RunningJob
from schemas.events import GpuSlot


def _trim_counting(on: list[Victim], node: str, have: int, gpus: int) -> list[Victim]:
    keep = list(on)
    for v in sorted(on, key=lambda x: x.cost, reverse=True) if len(on) > 1 else on:
        held = sum(len(sl.gpu_indices) for sl in v.job.slots if sl.node == node)
        if have - held >= gpus:
            have -= held
            keep.remove(v)
    return keep


def _least_counting(ask: Ask, victims: list[Victim]) -> Plan | None:
    """The one-node plan of least cost, as the code before `held_on` found it."""
    gpus, pools, index, now = ask
    keys = {p.key for p in pools}
    room: dict[str, int] = {}
    on: dict[str, list[Victim]] = {}
    done: set[str] = set()
    best = best_plan = None
    for v in victims:
        klass, lost = v.cost[0], v.cost[1]
        if best is not None and (klass > best[0] or (klass == best[0] and lost >= best[1])):
            break
        for sl in v.job.slots:
            node = sl.node
            if node in done or node not in index.free or index.pool_of[node] not in keys:
                continue
            if index.size[node] < gpus:
                continue
            room[node] = room.get(node, len(index.free[node])) + len(sl.gpu_indices)
            on.setdefault(node, []).append(v)
            if room[node] < gpus:
                continue
            done.add(node)
            kept = _trim_counting(on[node], node, room[node], gpus)
            cost = (max(x.cost[0] for x in kept), sum(x.cost[1] for x in kept))
            if best is None or cost < best:
                best, best_plan = cost, (node, kept)
    if best_plan is None:
        return None
    node, kept = best_plan
    return Plan(victims=tuple(kept), nodes=(node,), until=_until(kept, now))


def _cluster(rng: random.Random) -> tuple[list[NodeView], list[Victim]]:
    names = [f"n{i:02d}" for i in range(12)]
    free = {n: list(range(8)) for n in names}
    victims = []
    for job_id in range(1, 40):
        if rng.random() < 0.2:  # a gang job: whole nodes
            whole = [n for n in names if len(free[n]) == 8]
            if len(whole) < 2:
                continue
            nodes = rng.sample(whole, rng.randint(2, min(4, len(whole))))
            slots = tuple(GpuSlot(node=n, gpu_indices=tuple(range(8))) for n in nodes)
        else:
            fits = [n for n in names if free[n]]
            if not fits:
                break
            n = rng.choice(fits)
            k = rng.randint(1, len(free[n]))
            slots = (GpuSlot(node=n, gpu_indices=tuple(free[n][:k])),)
        for sl in slots:
            free[sl.node] = [i for i in free[sl.node] if i not in sl.gpu_indices]
        gpus = sum(len(sl.gpu_indices) for sl in slots)
        job = RunningJob(job_id=job_id, account="p/t", user="u", gpus=gpus, slots=slots,
                         placed_at=0.0, min_runtime_s=60)  # fmt: skip
        cost = (float(rng.randint(0, 3)), float(rng.randint(0, 5) * gpus))
        victims.append(Victim(job, "fairness", cost))
    victims.sort(key=lambda v: (v.cost, v.job.job_id))
    nodes = [NodeView(name=n, cluster="c", gpu_type="h100", gpus=8, free=tuple(free[n]))
             for n in names]  # fmt: skip
    return nodes, victims


@pytest.mark.parametrize("seed", range(40))
def test_least_plan_with_gang_victims_as_counting_at_every_trim(seed: int) -> None:
    rng = random.Random(seed)
    nodes, victims = _cluster(rng)
    index = FreeIndex(nodes)
    for gpus in (1, 3, 5, 8):
        ask = Ask(gpus, index.pools_for(None, None), index, 1000.0)
        assert plan_single_least(ask, iter(victims)) == _least_counting(ask, victims), seed
