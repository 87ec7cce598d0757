"""Hypothesis: invariants of every decision over random consistent worlds."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.dispatch import (
    Decision,
    FairShare,
    Fifo,
    NodeView,
    PendingJob,
    Policy,
    RunningJob,
    Snapshot,
    complete_ranks,
    decide,
)
from ledger.dispatch.fairshare2 import FairShare2
from ledger.dispatch.ordering import enc_hook
from ledger.dispatch.snapshot import NodeState
from schemas.events import GpuSlot

NOW = 50_000.0
LEAVES = ("lab/a/u", "lab/a/v", "lab/b/u", "lab/c/u", "ops/x/u")


@st.composite
def worlds(draw: st.DrawFn, uniform: bool = False) -> Snapshot:
    """A consistent snapshot: running jobs hold exactly the GPUs that are not free.

    `uniform`: one pool of 8-GPU nodes and larger jobs, so gang jobs get placed and preempt.
    """
    n_nodes = draw(st.integers(1, 6))
    states: list[NodeState] = ["active", "active", "active", "active", "draining", "drained"]
    nodes = []
    for i in range(n_nodes):
        nodes.append(
            NodeView(
                name=f"n{i}",
                cluster="c1" if uniform else draw(st.sampled_from(["c1", "c1", "c1", "c2"])),
                gpu_type="h100" if uniform else draw(st.sampled_from(["h100", "h100", "a100"])),
                gpus=8 if uniform else draw(st.sampled_from([8, 8, 4, 2])),
                state=draw(st.sampled_from(states)),
            )
        )
    job_id = 100
    running: list[RunningJob] = []
    free: dict[str, list[int]] = {n.name: list(range(n.gpus)) for n in nodes}

    def new_running(slots: tuple[GpuSlot, ...]) -> RunningJob:
        nonlocal job_id
        job_id += 1
        account, user = draw(st.sampled_from(LEAVES)).rsplit("/", 1)
        placed = NOW - draw(st.sampled_from([9000.0, 4000.0, 600.0, 30.0, 0.0]))
        resumable = draw(st.booleans())
        return RunningJob(
            job_id=job_id,
            account=account,
            user=user,
            gpus=sum(len(s.gpu_indices) for s in slots),
            slots=slots,
            placed_at=placed,
            min_runtime_s=draw(st.sampled_from([600, 0, 3600, 7200])),
            resumable=resumable,
            checkpoint_at=placed + draw(st.sampled_from([0.0, 10.0])) if resumable else placed,
            low_util_since=draw(st.sampled_from([None, None, NOW - 100.0, NOW - 5000.0])),
        )

    # a gang job over the first two whole nodes, sometimes
    busy = [n for n in nodes if n.state != "drained"]
    if len(busy) >= 2 and draw(st.booleans()):
        pair = busy[:2]
        running.append(
            new_running(tuple(GpuSlot(node=n.name, gpu_indices=tuple(free[n.name])) for n in pair))
        )
        for n in pair:
            free[n.name] = []
    for n in busy:
        if not draw(st.sampled_from([True, True, False])):
            continue  # leave this node as it is (often whole and free)
        while free[n.name] and draw(st.sampled_from([True, True, True, False])):
            k = draw(st.integers(1, len(free[n.name])))
            idx, free[n.name] = tuple(free[n.name][:k]), free[n.name][k:]
            running.append(new_running((GpuSlot(node=n.name, gpu_indices=idx),)))
    views = tuple(msgspec.structs.replace(n, free=tuple(free[n.name])) for n in nodes)
    pending = []
    for _ in range(draw(st.integers(0, 10))):
        job_id += 1
        account, user = draw(st.sampled_from(LEAVES)).rsplit("/", 1)
        sizes = [16, 8, 24, 4, 12, 2] if uniform else [2, 1, 4, 3, 8, 6, 12, 16]
        gpus = draw(st.sampled_from(sizes))
        funded = draw(st.sampled_from([True, True, False]))
        debug = funded and gpus <= 8 and draw(st.sampled_from([False, False, True]))
        pending.append(
            PendingJob(
                job_id=job_id,
                account=account,
                user=user,
                gpus=gpus,
                gpu_type=draw(st.sampled_from([None, None, None, "h100", "a100"])),
                cluster=draw(st.sampled_from([None, None, None, "c1"])),
                min_runtime_s=(600 if debug else 3600) if funded else 0,
                resumable=draw(st.booleans()),
                priority=draw(st.integers(0, 2)),
                submitted_at=draw(st.sampled_from([0.0, 10.0, 20.0])),
                debug=debug,
                time_limit_s=600 if debug else None,
            )
        )
    fs_values = st.sampled_from([0.1, 0.5, 1.0, 1.05, 2.0, 4.0, math.inf])
    level_fs = {path: draw(fs_values) for path in complete_ranks(dict.fromkeys(LEAVES, 0))}
    return Snapshot(
        position=draw(st.integers(0, 10**6)),
        nodes=views,
        running=tuple(running),
        pending=tuple(pending),
        ranks=complete_ranks(depth_first(level_fs)),
        level_fs=level_fs,
    )


def depth_first(level_fs: dict[str, float]) -> dict[str, int]:
    """Leaf ranks as the fair-share projection gives them: siblings by level fair share, best
    first (ties by name), leaves ranked depth-first."""
    children: dict[str, list[str]] = {}
    for path in level_fs:
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        children.setdefault(parent, []).append(path)
    order: list[str] = []

    def walk(parent: str) -> None:
        for child in sorted(children.get(parent, []), key=lambda p: (-level_fs[p], p)):
            if child in LEAVES:
                order.append(child)
            else:
                walk(child)

    walk("")
    return {leaf: i for i, leaf in enumerate(order)}


fairshare = st.builds(
    FairShare,
    margin=st.sampled_from([0.1, 0.0, 0.5]),
    debug_lane=st.sampled_from([True, False]),
    search_budget=st.sampled_from([32, 1, 0]),
)
fairshare2 = st.builds(
    FairShare2,
    margin=st.sampled_from([0.1, 0.0]),
    debug_lane=st.sampled_from([True, False]),
    search_budget=st.sampled_from([32, 1, 0]),
    debug_reserve_per=st.sampled_from([128, 2, 0]),
    gain_horizon_s=st.sampled_from([3600.0, 1e9]),
    spare_ratio=st.sampled_from([5.0, 1.0]),
)
policies = st.one_of(st.just(FairShare()), fairshare, st.just(Fifo()), fairshare2)


def gpus_of(slots: Iterable[GpuSlot]) -> set[tuple[str, int]]:
    return {(s.node, i) for s in slots for i in s.gpu_indices}


def check(snap: Snapshot, d: Decision, policy: Policy) -> None:
    nodes = {n.name: n for n in snap.nodes}
    running = {r.job_id: r for r in snap.running}
    pending = {j.job_id: j for j in snap.pending}
    draining = {n for n, v in nodes.items() if v.state == "draining"}

    # preemptions: unique, running, never inside a contract; maintenance only on draining nodes
    victims = [p.job_id for p in d.preemptions]
    assert len(set(victims)) == len(victims)
    for p in d.preemptions:
        r = running[p.job_id]
        assert r.placed_at + r.min_runtime_s <= NOW, f"job {r.job_id} preempted in contract"
        if p.reason == "maintenance":
            assert {s.node for s in r.slots} & draining
            assert p.for_job is None
        else:
            assert isinstance(policy, FairShare | FairShare2)
            assert p.for_job in {pl.job_id for pl in d.placements}, "preempted for nothing"
            if p.reason == "debug":
                assert pending[p.for_job].debug

    # fairshare-2: funded non-debug work never goes to (nor preempts on) the debug reserve
    if isinstance(policy, FairShare2):
        reserved = policy.reserved(snap)
        for pl in d.placements:
            job = pending[pl.job_id]
            if job.min_runtime_s > 0 and not job.debug:
                assert not {s.node for s in pl.slots} & reserved, "funded job on the reserve"

    # placements: GPUs that were free or freed, each once, on active nodes, matching the job
    usable = {(n.name, i) for n in snap.nodes for i in n.free}
    usable |= gpus_of(s for v in victims for s in running[v].slots)
    used: set[tuple[str, int]] = set()
    for pl in d.placements:
        job = pending[pl.job_id]
        got = gpus_of(pl.slots)
        assert sum(len(s.gpu_indices) for s in pl.slots) == len(got) == job.gpus
        assert got <= usable, "placement takes GPUs nobody freed"
        assert not got & used, "two placements share a GPU"
        used |= got
        kinds = set()
        for s in pl.slots:
            n = nodes[s.node]
            assert n.state == "active"
            assert job.gpu_type in (None, n.gpu_type)
            assert job.cluster in (None, n.cluster)
            kinds.add((n.cluster, n.gpu_type))
        largest = max(
            (
                n.gpus
                for n in snap.nodes
                if job.gpu_type in (None, n.gpu_type) and job.cluster in (None, n.cluster)
            ),
        )
        if job.gpus <= largest:
            assert len(pl.slots) == 1, "a one-node job was split"
        else:
            assert len(kinds) == 1, "a gang job mixes pools"
            partial = [s for s in pl.slots if len(s.gpu_indices) < nodes[s.node].gpus]
            assert len(partial) <= 1, "a gang job shares more than its last node"

    # every pending job considered once, in sort-key order; reasons exactly for the unplaced
    placed = {pl.job_id for pl in d.placements}
    assert sorted(c.job_id for c in d.considered()) == sorted(pending)
    keys = [c.sort_key for c in d.considered()]
    assert keys == sorted(keys)
    assert set(d.waiting) == set(pending) - placed
    for c in d.considered():
        assert (c.reason is None) == (c.job_id in placed)
    # one run per stretch of the order waiting for one reason: never two touching runs alike
    for r, nxt in zip(d.runs, d.runs[1:], strict=False):
        assert r.start < r.stop <= nxt.start and (r.stop < nxt.start or r.wait != nxt.wait)
    assert len(d.waiting) == sum(r.stop - r.start for r in d.runs) == len(pending) - len(placed)
    assert d.wake_at is None or d.wake_at > NOW
    assert d.fragmentation_gpus >= 0
    assert d.based_on == snap.position


@settings(max_examples=300, deadline=None)
@given(worlds(), policies)
def test_every_decision_keeps_the_invariants(snap: Snapshot, policy: Policy) -> None:
    check(snap, decide(snap, policy, NOW), policy)


@settings(max_examples=200, deadline=None)
@given(worlds(uniform=True), policies)
def test_gang_heavy_decisions_keep_the_invariants(snap: Snapshot, policy: Policy) -> None:
    check(snap, decide(snap, policy, NOW), policy)


@settings(max_examples=100, deadline=None)
@given(worlds(), policies, st.randoms(use_true_random=False))
def test_decisions_are_deterministic_whatever_the_input_order(
    snap: Snapshot, policy: Policy, rnd: random.Random
) -> None:
    first = decide(snap, policy, NOW)
    shuffled = msgspec.structs.replace(
        snap,
        nodes=tuple(rnd.sample(snap.nodes, len(snap.nodes))),
        running=tuple(rnd.sample(snap.running, len(snap.running))),
        pending=tuple(rnd.sample(snap.pending, len(snap.pending))),
    )
    again = decide(shuffled, policy, NOW)
    assert msgspec.json.encode(again, enc_hook=enc_hook) == msgspec.json.encode(
        first, enc_hook=enc_hook
    )
    assert decide(snap, policy, NOW) == first
