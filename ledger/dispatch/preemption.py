"""Victims: which running jobs to preempt so a waiting job fits, and the preemption margin.

Pure: functions of the snapshot, the free-capacity index and `now`.

A policy says which running jobs are *eligible* victims for a waiting job, in its victim order
(`Victim.cost`, the policy's `victim_key`); this module finds a set of them that makes the job fit
by the placement rules (one node, or whole nodes of one pool for a gang job). The engine offers
only jobs past their contract, so no plan ever ends a contract early.

The fair-share victim order (`victim_cost`), compared left to right (lower is preempted first):

1. class: 0 unfunded, 1 squatting (low utilisation for `squat_after_s`, past contract),
   2 resumable, 3 not resumable (its whole run is lost);
2. low utilisation first among equals;
3. work lost: seconds since the last checkpoint (resumable) or since placement (not resumable);
4. job id.

Plans take victims in that order and stop at the first node (or, for a gang job, the first set of
whole nodes) where the job fits: the most expensive victim of the plan is as cheap as it can be,
so a plan needs a non-resumable victim only when nothing else frees the space. The search reads
only the prefix of the victim list it needs. The estimate behind `WAIT_CONTRACT` offers victims
by when their contracts end instead, so its plan's `until` is the earliest time room appears.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import NamedTuple

import msgspec

from ledger.dispatch.placement import FreeIndex, Pool, PoolKey
from ledger.dispatch.snapshot import UNRANKED, RunningJob, fs_text
from schemas.events import PreemptReason

CLASS_UNFUNDED = 0
CLASS_SQUATTING = 1
CLASS_RESUMABLE = 2
CLASS_NOT_RESUMABLE = 3


class Victim(msgspec.Struct, frozen=True):
    """A running job a policy would preempt for a waiting job, why, and at what cost."""

    job: RunningJob
    reason: PreemptReason
    cost: tuple[float, ...]
    """The policy's `victim_key`: victims are taken in this order."""
    note: str = ""


def victim_cost(job: RunningJob, klass: int, now: float) -> tuple[int, int, float, int]:
    """Pure: the sort key of a victim (see the module docstring)."""
    since = job.checkpoint_at if job.resumable and job.checkpoint_at is not None else job.placed_at
    lost = now - since
    return (
        klass,
        0 if job.low_util_since is not None else 1,
        lost if lost > 0 else 0.0,
        job.job_id,
    )


def divergence(a: str, b: str) -> tuple[str, str] | None:
    """Pure: the sibling accounts where the paths `a` and `b` part, or None when one contains
    the other (the same account, or an ancestor)."""
    pa, pb = a.split("/"), b.split("/")
    i = 0
    while i < len(pa) and i < len(pb) and pa[i] == pb[i]:
        i += 1
    if i == len(pa) or i == len(pb):
        return None
    return "/".join(pa[: i + 1]), "/".join(pb[: i + 1])


def outranks(
    waiting: str,
    victim: str,
    ranks: Mapping[str, int],
    level_fs: Mapping[str, float],
    margin: float,
    min_rank_gap: int,
) -> tuple[bool, str]:
    """Pure: whether account `waiting` may preempt account `victim` for fair share, and why.

    The waiting account must rank better, and by a margin (hysteresis, after Kueue's
    LessThanOrEqualToFinalShare): where the two paths part in the tree, the waiting side's level
    fair share must exceed the victim side's by the factor `1 + margin`. Without level fair
    shares for both sides the ranks must differ by at least `min_rank_gap`. Two accounts whose
    shares are within the margin never preempt each other, so they cannot ping-pong.
    """
    rw, rv = ranks.get(waiting, UNRANKED), ranks.get(victim, UNRANKED)
    if rw >= rv:
        return False, f"{victim} ranks {rv}, not below {waiting} ({rw})"
    parted = divergence(waiting, victim)
    if parted is not None and parted[0] in level_fs and parted[1] in level_fs:
        fw, fv = level_fs[parted[0]], level_fs[parted[1]]
        factor = 1.0 + margin
        ok = fw > fv * factor if not math.isinf(fv) else False
        op = ">" if ok else "<="
        left, right = f"{parted[0]} {fs_text(fw)}", f"{parted[1]} {fs_text(fv)}"
        return ok, f"level fair share {left} {op} {right} x {factor:g}"
    ok = rv - rw >= min_rank_gap
    return ok, f"rank {waiting} {rw} vs {victim} {rv} (gap {rv - rw}, needed {min_rank_gap})"


@dataclass(frozen=True)
class Plan:
    """Victims whose GPUs, with the free ones, fit the waiting job on `nodes`."""

    victims: tuple[Victim, ...]
    nodes: tuple[str, ...]
    until: float
    """When the last victim's contract ends (the plan's time for an estimate; else now)."""


def ready_key(job: RunningJob, now: float) -> float:
    """When a running job's contract lets it go (now, if it has ended)."""
    end = job.placed_at + job.min_runtime_s
    return end if end > now else now


def _until(victims: Iterable[Victim], now: float) -> float:
    """When the last of `victims` leaves its contract (`now` if all have)."""
    return max((ready_key(v.job, now) for v in victims), default=now)


class Ask(NamedTuple):
    """What a plan is for: a job of `gpus` GPUs on one of `pools` (in `capacity`), at `now`."""

    gpus: int
    pools: Sequence[Pool]
    capacity: FreeIndex
    now: float


class _Taken:
    """Per node, as victims are taken one by one: the victims taken there and the GPUs free
    once they are gone (`room`)."""

    __slots__ = ("free", "held", "on", "room")

    def __init__(self, free: Mapping[str, Sequence[int]]) -> None:
        self.free = free
        self.on: dict[str, list[Victim]] = {}
        self.room: dict[str, int] = {}
        self.held: dict[tuple[int, str], int] = {}
        """(victim job id, node) -> the GPUs it holds there, counted once per search
        (`held_on`: a gang victim holds GPUs on many nodes, and `_trim` asks often)."""

    def take(self, v: Victim, node: str, gpus: int) -> int:
        """Take victim `v`, which holds `gpus` GPUs on `node`: the node's room after."""
        have = self.room.get(node)
        if have is None:
            have = len(self.free[node])
            self.on[node] = []
        self.on[node].append(v)
        have += gpus
        self.room[node] = have
        return have

    def held_on(self, v: Victim, node: str) -> int:
        """The GPUs victim `v` holds on `node`."""
        slots = v.job.slots
        if len(slots) == 1:  # most jobs: one node
            return len(slots[0].gpu_indices) if slots[0].node == node else 0
        job_id = v.job.job_id
        found = self.held.get((job_id, node))
        if found is None:  # every node of the victim at once, each counted as its slots there
            held = self.held
            if (job_id, slots[0].node) not in held:
                for sl in slots:
                    key = (job_id, sl.node)
                    held[key] = held.get(key, 0) + len(sl.gpu_indices)
            found = held.get((job_id, node), 0)
        return found


def plan_single(ask: Ask, victims: Iterable[Victim]) -> Plan | None:
    """Pure: the first node where a one-node job fits when `victims` (in victim order) are
    taken one by one, with the victims it takes, or None.
    """
    gpus, pools, index, now = ask
    keys = {p.key for p in pools}
    free, pool_of, size = index.free, index.pool_of, index.size
    taken = _Taken(free)
    for v in victims:
        for sl in v.job.slots:
            node = sl.node
            if node not in free or pool_of[node] not in keys or size[node] < gpus:
                continue
            if taken.take(v, node, len(sl.gpu_indices)) >= gpus:
                on = taken.on[node]
                return Plan(victims=tuple(on), nodes=(node,), until=_until(on, now))
    return None


def plan_single_least(
    ask: Ask, victims: Iterable[Victim], skip: AbstractSet[str] = frozenset()
) -> Plan | None:
    """Pure: the one-node plan of least cost for the job (on no node of `skip`), or None.

    `victims` come in victim order, `cost = (class, GPU-seconds lost, ...)`; a plan's cost is
    (its highest class, the GPU-seconds its victims lose in all). On each node the victims are
    taken cheapest first until the job fits, then any whose GPUs are not needed are put back
    (most expensive first); the node whose plan costs least wins (ties: the plan found first).
    The victims are read only as long as one could still be part of a cheaper plan: reading
    stops at the first whose own cost is not below the best plan's.
    """
    gpus, pools, index, now = ask
    keys = {p.key for p in pools}
    free, pool_of, size = index.free, index.pool_of, index.size
    taken = _Taken(free)
    done: set[str] = set()
    best: tuple[float, float] | None = None
    best_plan: tuple[str, list[Victim]] | None = None
    for v in victims:
        klass, lost = v.cost[0], v.cost[1]
        if best is not None and (klass > best[0] or (klass == best[0] and lost >= best[1])):
            break
        for sl in v.job.slots:
            node = sl.node
            if node in done or node not in free or pool_of[node] not in keys or size[node] < gpus:
                continue
            if skip and node in skip:
                continue
            have = taken.take(v, node, len(sl.gpu_indices))
            if have < gpus:
                continue
            done.add(node)
            on = _trim(taken.on[node], node, have, gpus, taken)
            if len(on) == 1:
                cost = (on[0].cost[0], on[0].cost[1])
            else:
                cost = (max(x.cost[0] for x in on), sum(x.cost[1] for x in on))
            if best is None or cost < best:
                best, best_plan = cost, (node, on)
    if best_plan is None:
        return None
    node, on = best_plan
    return Plan(victims=tuple(on), nodes=(node,), until=_until(on, now))


def _trim(on: list[Victim], node: str, have: int, gpus: int, taken: _Taken) -> list[Victim]:
    """The victims of `on` still needed for `gpus` GPUs on `node` (`have` free with all of them
    taken), putting back the most expensive unneeded ones first."""
    keep = list(on)
    for v in sorted(on, key=lambda x: x.cost, reverse=True) if len(on) > 1 else on:
        held = taken.held_on(v, node)
        if have - held >= gpus:
            have -= held
            keep.remove(v)
    return keep


def plan_gang(ask: Ask, victims: Iterable[Victim]) -> Plan | None:
    """Pure: whole nodes of one pool for a gang job: its whole free nodes (largest first, then
    by name) and then nodes cleared of victims, in the order `victims` (in victim order)
    clear them, until the job fits; or None.

    A partly held node is cleared when every GPU on it is free or held by a victim taken.
    """
    gpus, pools, index, now = ask
    keys = {p.key: p for p in pools}
    free, pool_of, size = index.free, index.pool_of, index.size
    got = {p.key: p.whole_gpus for p in pools}
    cleared: dict[PoolKey, list[str]] = {p.key: [] for p in pools}
    taken = _Taken(free)
    on = taken.on
    seen: dict[int, int] = {}
    for v in victims:
        seen[v.job.job_id] = len(seen)
        for sl in v.job.slots:
            node = sl.node
            if node not in free or pool_of[node] not in keys:
                continue
            have = taken.take(v, node, len(sl.gpu_indices))
            if have < size[node]:
                continue
            key = pool_of[node]
            cleared[key].append(node)
            got[key] += have
            if got[key] < gpus:
                continue
            pool = keys[key]
            nodes = sorted(pool.whole, key=lambda n: (-size[n], n)) + cleared[key]
            total = 0
            chosen: dict[int, Victim] = {}
            for i, n in enumerate(nodes):
                total += size[n]
                for x in on.get(n, ()):
                    chosen.setdefault(x.job.job_id, x)
                if total >= gpus:
                    picked = tuple(sorted(chosen.values(), key=lambda x: seen[x.job.job_id]))
                    return Plan(
                        victims=picked, nodes=tuple(nodes[: i + 1]), until=_until(picked, now)
                    )
    return None


def plan_gang_least(
    ask: Ask, victims: Iterable[Victim], skip: AbstractSet[str] = frozenset()
) -> Plan | None:
    """Pure: whole nodes of one pool for a gang job, clearing the nodes that lose least (none of
    `skip`); or None.

    `victims` come in victim order, `cost = (class, GPU-seconds lost, ...)`. A node can be
    cleared when every GPU on it is free or held by a victim; clearing it costs (the highest
    class of its victims, the GPU-seconds they lose in all). A plan takes the pool's whole free
    nodes (largest first, then by name) and then the cleared nodes that make the job fit at the
    least cost: the lowest highest class that suffices, and among the nodes of at most that class
    the fewest GPU-seconds (by node, then name); a plan's cost counts a victim on several of its
    nodes once. The plans of all pools are compared by that cost; ties: the plan found first.

    Bounded: victims are read only while one could still clear a node cheaper than the dearest
    node of the best plan (a node not yet cleared needs a victim not yet read, which costs at
    least as much as the last one read), and, once a plan is found, for at most as many victims
    again as it took to find the first (`GANG_READ_FACTOR`). Nodes of different sizes in one
    pool make the choice a knapsack; the search then takes the cheapest nodes until the job
    fits, not the optimum.
    """
    gpus, pools, index, now = ask
    keys = {p.key: p for p in pools}
    free, pool_of, size = index.free, index.pool_of, index.size
    taken = _Taken(free)
    on, room = taken.on, taken.room
    cost_of: dict[str, tuple[float, float]] = {}
    """Per node: (the highest class, the GPU-seconds) of its victims read so far."""
    cleared: dict[PoolKey, _Cleared] = {p.key: _Cleared() for p in pools}
    have_gpus = {p.key: p.whole_gpus for p in pools}
    """Per pool: GPUs on its whole free nodes and on the nodes cleared so far."""
    seen: dict[int, int] = {}
    best: tuple[float, float] | None = None
    top: tuple[float, float] = (math.inf, math.inf)
    """The best plan's highest class, and the most GPU-seconds one of its cleared nodes loses:
    a node of that class losing as much or more, or of a higher class, cannot improve it."""
    best_plan: Plan | None = None
    whole = {key: sorted(p.whole, key=lambda n: (-size[n], n)) for key, p in keys.items()}
    read = 0
    until = math.inf
    for v in victims:
        klass, lost = v.cost[0], v.cost[1]
        if klass > top[0] or (klass == top[0] and lost >= top[1]) or read >= until:
            break
        read += 1
        seen.setdefault(v.job.job_id, len(seen))
        changed: list[PoolKey] = []
        for sl in v.job.slots:
            node = sl.node
            if node not in free or (skip and node in skip):
                continue
            key = pool_of[node]
            if key not in keys:
                continue
            have = room.get(node)  # `taken.take`, inline: the hot loop of a gang search
            if have is None:
                have = len(free[node])
                on[node] = [v]
            else:
                on[node].append(v)
            have += len(sl.gpu_indices)
            room[node] = have
            was = cost_of.get(node)
            if was is None:
                cost = cost_of[node] = (klass, lost)
            else:
                cost = cost_of[node] = (klass if klass > was[0] else was[0], was[1] + lost)
            if have < size[node]:
                continue
            if cost[0] > top[0] or (cost[0] == top[0] and cost[1] >= top[1]):
                continue  # cannot improve the best plan
            cleared[key].add(cost, node, size[node])
            have_gpus[key] += size[node]
            if have_gpus[key] >= gpus and key not in changed:
                changed.append(key)
        for key in changed:
            found = _cheapest_nodes(whole[key], cleared[key], gpus, size)
            if found is None:
                continue
            nodes, bound = found
            chosen: dict[int, Victim] = {}
            for n in nodes:
                for x in on.get(n, ()):
                    chosen.setdefault(x.job.job_id, x)
            picked = tuple(sorted(chosen.values(), key=lambda x: seen[x.job.job_id]))
            cost = (max((x.cost[0] for x in picked), default=0), sum(x.cost[1] for x in picked))
            if best is None:
                until = GANG_READ_FACTOR * read
            if best is None or cost < best:
                best, top = cost, bound
                best_plan = Plan(victims=picked, nodes=nodes, until=_until(picked, now))
    return best_plan


GANG_READ_FACTOR = 2
"""A gang search reads at most this many times the victims it read to find its first plan."""


def dearest_nodes(plan: Plan) -> frozenset[str]:
    """Pure: the nodes of `plan` its dearest victim (by cost) holds: where the next plan, once
    this one is refused, must not clear (`Policy.plans_tried`)."""
    dearest = max(plan.victims, key=lambda v: v.cost)
    return frozenset(sl.node for sl in dearest.job.slots) & frozenset(plan.nodes)


class _Cleared:
    """The nodes a gang search has cleared in one pool, kept sorted both ways the plan reads
    them: by cost ((highest class, GPU-seconds), name) and by GPU-seconds (then name)."""

    __slots__ = ("by_cost", "by_lost", "gpus")

    def __init__(self) -> None:
        self.by_cost: list[tuple[tuple[float, float], str, int]] = []
        self.by_lost: list[tuple[float, str, float, int]] = []
        self.gpus = 0

    def add(self, cost: tuple[float, float], node: str, gpus: int) -> None:
        bisect.insort(self.by_cost, (cost, node, gpus))
        bisect.insort(self.by_lost, (cost[1], node, cost[0], gpus))
        self.gpus += gpus


def _cheapest_nodes(
    whole: list[str],
    cleared: _Cleared,
    gpus: int,
    size: Mapping[str, int],
) -> tuple[tuple[str, ...], tuple[float, float]] | None:
    """The pool's `whole` free nodes (in the order to take them) and the cheapest `cleared`
    nodes that hold `gpus` GPUs, with (the highest class, the most GPU-seconds) of the cleared
    nodes taken; None if they cannot."""
    need = gpus - sum(size[n] for n in whole)
    if need > cleared.gpus:
        return None
    # the lowest highest class that suffices ...
    top_class = 0.0
    got = 0
    for (klass, _), _, g in cleared.by_cost:
        if got >= need:
            break
        got += g
        top_class = klass
    # ... and, of the nodes of at most that class, the fewest GPU-seconds
    taken: list[str] = []
    most = 0.0
    got = 0
    for lost, n, klass, g in cleared.by_lost:
        if got >= need:
            break
        if klass > top_class:
            continue
        taken.append(n)
        got += g
        most = max(most, lost)
    if got < need:
        return None
    # only as many whole free nodes as the job needs beside the cleared ones
    nodes: list[str] = []
    total = got
    for n in whole:
        if total >= gpus:
            break
        nodes.append(n)
        total += size[n]
    return (*nodes, *taken), (top_class, most)


class Replay:
    """An iterator read lazily once and replayed from memory after: a group's victims are
    computed only as far as some search of the cycle needed them."""

    def __init__(self, source: Iterator[Victim]) -> None:
        self.source = source
        self.seen: list[Victim] = []

    def __iter__(self) -> Iterator[Victim]:
        return self.live(None)

    def live(self, live: Mapping[int, object] | None) -> Iterator[Victim]:
        """The victims whose job is in `live` (all when None), in order."""
        seen = self.seen
        if live is None:  # every victim: no check per victim
            yield from seen
            for v in self.source:
                seen.append(v)
                yield v
            return
        for v in seen:
            if v.job.job_id in live:
                yield v
        for v in self.source:
            seen.append(v)
            if v.job.job_id in live:
                yield v
