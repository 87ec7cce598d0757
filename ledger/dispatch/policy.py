"""Policies: the pluggable part of a cycle (job order and victim choice).

Pure: a policy is a config value; its methods are functions of their arguments.

`decide()` owns what every policy shares: the placement rules, contracts (no policy can preempt a
job inside its contract: the engine never offers one), maintenance drains and the decision record.
A policy owns the order of pending jobs and which running jobs are eligible victims for a waiting
job. `FairShare` is the scheme this project implements; `Fifo` is the simplest baseline (submit
order, no preemption). Other baselines (Slurm-like, legacy caps) plug in the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Protocol

import msgspec

from ledger.dispatch.ordering import SortKey, fairshare_order, fifo_key, ordered
from ledger.dispatch.preemption import (
    CLASS_NOT_RESUMABLE,
    CLASS_RESUMABLE,
    CLASS_SQUATTING,
    CLASS_UNFUNDED,
    Victim,
    outranks,
    victim_cost,
)
from ledger.dispatch.snapshot import PendingJob, RunningJob, Snapshot
from schemas.events import PreemptReason


class Policy(Protocol):
    """What `decide()` asks of a scheduling policy."""

    @property
    def version(self) -> str:
        """Recorded in every decision (`policy_version`)."""
        ...

    @property
    def search_budget(self) -> int:
        """At most this many victim searches per cycle (each costs O(running jobs))."""
        ...

    def order(self, snapshot: Snapshot) -> Sequence[tuple[SortKey, PendingJob]]:
        """Every pending job with its sort key, in the order the cycle considers them (a list,
        or an `ordering.Ordered` whose keys are built when read)."""
        ...

    def may_preempt(self, job: PendingJob) -> bool:
        """Whether `job` may ever cause a preemption (saves searching for those that may not)."""
        ...

    def victim_group(self, job: PendingJob, snapshot: Snapshot) -> Hashable:
        """Jobs of one group get the same victims from the same candidates: `decide()` asks
        `victims` once per group and constraint set in a cycle, and reuses the answer."""
        ...

    def victim_key(self, job: RunningJob, now: float) -> tuple[float, ...]:
        """Where a running job stands in the victim order, cheapest first, whoever waits:
        `decide()` sorts the candidates by it once per cycle."""
        ...

    def victims(
        self, job: PendingJob, candidates: Iterable[RunningJob], snapshot: Snapshot, now: float
    ) -> Iterator[Victim]:
        """Lazily, in the order of `candidates` (by `victim_key`), those `job` may preempt, with
        reason, note and `cost = victim_key(...)`. `decide()` reads only as far as it needs.
        Contracts are not the policy's concern: `decide()` offers only jobs past their contract
        (and asks about jobs inside it only to estimate when a waiting job could get room).
        A filter of the candidates one by one: whether a candidate is offered, and as what,
        depends on it alone, not on the others (a reservation asks only about the jobs that
        would keep its nodes for ever: `engine._Cycle._whole_ever`)."""
        ...

    @property
    def least_loss(self) -> bool:
        """One-node victim plans: False takes the first node where the job fits, victims in
        victim order; True the node whose plan costs least (`preemption.plan_single_least`:
        `victim_key` must then start with (class, GPU-seconds lost))."""
        ...

    @property
    def least_loss_gangs(self) -> bool:
        """Gang victim plans (with `least_loss`): False clears the first whole nodes cheapest
        victim first; True searches the set of least cost (`preemption.plan_gang_least`)."""
        ...

    def budget_of(self, job: PendingJob) -> tuple[str, int]:
        """The victim-search budget `job` draws on: (its name, searches per cycle)."""
        ...

    def reserved(self, snapshot: Snapshot) -> frozenset[str]:
        """Nodes kept for debug jobs: `decide()` places no funded non-debug job there (and the
        policy offers no victim there to one)."""
        ...

    def weigh(
        self, job: PendingJob, victims: Sequence[Victim], snapshot: Snapshot, now: float
    ) -> str | None:
        """None to take the plan `victims` for `job`; else why not (the job waits with it)."""
        ...

    def holds_for(self, job: PendingJob, snapshot: Snapshot) -> bool:
        """Whether `job`, left waiting, gets a reservation: `decide()` holds for it the nodes
        whose GPUs it can have soonest (at most one reservation per cycle), and places on them
        only jobs that `may_backfill`."""
        ...

    def expected_end(self, job: RunningJob, now: float) -> float:
        """When a running job is expected to give its GPUs back (inf: unknown), for a
        reservation's time; jobs the reserving job may preempt give them back at their
        contract's end instead."""
        ...

    def may_backfill(self, job: PendingJob, until: float, now: float) -> bool:
        """Whether `job` may use the GPUs held for a reservation until `until`."""
        ...


RESERVE_MIN_NODES = 8
"""Pools smaller than this keep no nodes for debug work."""


def debug_nodes(snapshot: Snapshot, per: int, min_nodes: int = RESERVE_MIN_NODES) -> frozenset[str]:
    """Pure: the nodes kept for debug work: in every pool (cluster, GPU type) of at least
    `min_nodes` active nodes, the last `ceil(nodes / per)` active nodes by name; none when
    `per` is 0."""
    if per <= 0:
        return frozenset()
    key = ("debug_nodes", per, min_nodes)
    last: frozenset[str] | None = snapshot.memo.get(key)  # a cycle asks once per victim group
    if last is not None:
        return last
    pools: dict[tuple[str, str], list[str]] = {}
    for n in snapshot.nodes:
        if n.state == "active":
            pools.setdefault((n.cluster, n.gpu_type), []).append(n.name)
    keep: list[str] = []
    for names in pools.values():
        if len(names) >= min_nodes:
            names.sort()
            keep += names[-math.ceil(len(names) / per) :]
    found = frozenset(keep)
    snapshot.memo[key] = found
    return found


def declared_end(job: RunningJob, now: float) -> float:
    """Pure: when a running job ends by its declared time limit (inf: it declared none)."""
    if job.time_limit_s is None:
        return math.inf
    return max(now, job.placed_at + job.time_limit_s)


def ends_before(job: PendingJob, until: float, now: float) -> bool:
    """Pure: whether a pending job placed now ends by `until` by its declared time limit."""
    return job.time_limit_s is not None and now + job.time_limit_s <= until


class Simple:
    """The defaults of the later `Policy` hooks, for policies that predate them: first-fit
    plans, one search budget, no reserve, every plan taken, no reservations."""

    search_budget: int

    @property
    def least_loss(self) -> bool:
        return False

    @property
    def least_loss_gangs(self) -> bool:
        return False

    def budget_of(self, job: PendingJob) -> tuple[str, int]:
        return ("all", self.search_budget)

    def reserved(self, snapshot: Snapshot) -> frozenset[str]:
        return frozenset()

    def weigh(
        self, job: PendingJob, victims: Sequence[Victim], snapshot: Snapshot, now: float
    ) -> str | None:
        return None

    def holds_for(self, job: PendingJob, snapshot: Snapshot) -> bool:
        return False

    def expected_end(self, job: RunningJob, now: float) -> float:
        return declared_end(job, now)

    def may_backfill(self, job: PendingJob, until: float, now: float) -> bool:
        return ends_before(job, until, now)


class FairShare(Simple, msgspec.Struct, frozen=True, kw_only=True):
    """Hierarchical fair share with contracts, a preemption margin, squatting and a debug lane."""

    version: str = "fairshare-1"
    margin: float = 0.1
    """Hysteresis: a fair-share preemption needs the waiting side's level fair share to exceed
    the victim side's by the factor 1 + margin (see `preemption.outranks`)."""
    min_rank_gap: int = 1
    """The rank difference needed when level fair shares are missing."""
    squat_after_s: float = 3600.0
    """A job past its contract with low utilisation for this long is squatting."""
    squat_util_pct: float = 10.0
    """The utilisation below which a job counts as low; applied by the snapshot reader when it
    computes `low_util_since`, recorded here so decisions can be replayed."""
    debug_lane: bool = True
    """Funded debug-class jobs may preempt any job past its contract, whatever the ranks."""
    search_budget: int = 32

    def order(self, snapshot: Snapshot) -> list[tuple[SortKey, PendingJob]]:
        return fairshare_order(snapshot.pending, snapshot.ranks)

    def may_preempt(self, job: PendingJob) -> bool:
        return job.min_runtime_s > 0

    def victim_group(self, job: PendingJob, snapshot: Snapshot) -> Hashable:
        return (snapshot.rank_key(job.account, job.user), self.debug_lane and job.debug)

    def victim_key(self, job: RunningJob, now: float) -> tuple[float, ...]:
        """`preemption.victim_cost` with this policy's classes: unfunded, squatting (low
        utilisation for `squat_after_s`), resumable, not resumable."""
        low = job.low_util_since
        if job.min_runtime_s <= 0:
            klass = CLASS_UNFUNDED
        elif low is not None and now - low >= self.squat_after_s:
            klass = CLASS_SQUATTING
        else:
            klass = CLASS_RESUMABLE if job.resumable else CLASS_NOT_RESUMABLE
        return victim_cost(job, klass, now)

    def victims(
        self, job: PendingJob, candidates: Iterable[RunningJob], snapshot: Snapshot, now: float
    ) -> Iterator[Victim]:
        """Eligible for a funded job: unfunded jobs, squatters, jobs of accounts it outranks
        by the margin, and (for a debug-class job, when the lane is on) any job."""
        if job.min_runtime_s <= 0:
            return
        lane = self.debug_lane and job.debug
        waiting = snapshot.rank_key(job.account, job.user)
        verdicts: dict[tuple[str, str], tuple[bool, str]] = {}
        reason: PreemptReason
        for r in candidates:
            cost = self.victim_key(r, now)
            klass = cost[0]
            if klass == CLASS_UNFUNDED:
                reason, note = "fairness", "unfunded"
                low = r.low_util_since
                if low is not None and now - low >= self.squat_after_s:
                    reason = "squatting"
            elif klass == CLASS_SQUATTING:
                reason, note = "squatting", f"low utilisation since t={r.low_util_since:g}"
            else:
                pair = (r.account, r.user)
                verdict = verdicts.get(pair)
                if verdict is None:
                    verdict = verdicts[pair] = outranks(
                        waiting,
                        snapshot.rank_key(*pair),
                        snapshot.ranks,
                        snapshot.level_fs,
                        self.margin,
                        self.min_rank_gap,
                    )
                ok, note = verdict
                if ok:
                    reason = "fairness"
                elif lane:
                    reason, note = "debug", "debug lane"
                else:
                    continue
            yield Victim(r, reason, cost, note)


class Fifo(Simple, msgspec.Struct, frozen=True, kw_only=True):
    """First come, first served; never preempts. A baseline, and proof of the seam."""

    version: str = "fifo-1"
    search_budget: int = 0

    def order(self, snapshot: Snapshot) -> list[tuple[SortKey, PendingJob]]:
        return ordered(snapshot.pending, fifo_key)

    def may_preempt(self, job: PendingJob) -> bool:
        return False

    def victim_group(self, job: PendingJob, snapshot: Snapshot) -> Hashable:
        return None

    def victim_key(self, job: RunningJob, now: float) -> tuple[float, ...]:
        return (job.job_id,)

    def victims(
        self, job: PendingJob, candidates: Iterable[RunningJob], snapshot: Snapshot, now: float
    ) -> Iterator[Victim]:
        return iter(())


def victim_key_of(
    policy: Policy, snapshot: Snapshot
) -> Callable[[RunningJob, float], tuple[float, ...]]:
    """The policy's victim key in this snapshot (`decide()`'s candidate order): its
    `victim_key_in(snapshot)` when it has one (costs that read the snapshot: `fairshare-17`'s
    `free_victims_by_share`, by the users' fair share), else its `victim_key`."""
    key_in = getattr(policy, "victim_key_in", None)
    return key_in(snapshot) if key_in is not None else policy.victim_key
