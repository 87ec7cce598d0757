"""Baseline policies to compare fair share against: `SlurmMultifactor` and `LegacyCaps`.

Pure: policies are config values; their methods are functions of their arguments. They plug into
`decide()` through the `Policy` protocol like `FairShare` and `Fifo`, so the ledger, placement
rules and contracts are shared: a baseline never preempts a job inside its contract either.

`SlurmMultifactor` (Slurm's priority/multifactor with Fair Tree and preempt/partition_prio):

- order: funded jobs (the normal partition tier) before unfunded ones (a scavenger tier); inside
  a tier by the multifactor priority `w_fs * F + w_age * A`, highest first, then declared
  priority, submit time and job id. F is the Fair Tree factor of the job's user leaf,
  `(N - rank) / N` with 0-based ranks over N ranked leaves, computed by the rank source from
  usage decayed with `PriorityDecayHalfLife` (7 days); A is `min(1, age / max_age)`.
- preemption by tier only: a funded job may preempt unfunded jobs, never another funded job,
  whatever the fair share. Victims cheapest first (least work lost).

`LegacyCaps` (Ai2's scheme before budgets):

- order: static priority levels: funded before unfunded (the preemptible level), then declared
  priority (higher first), submit time and job id; no fair share.
- per-team caps on non-preemptible GPUs (`caps`: team -> GPUs, from the budget fraction of the
  cluster): a team's running funded jobs, in placement order, are *in cap* up to its cap; the
  rest are *overflow*, running preemptibly on GPUs that were idle.
- a funded job that fits inside its team's cap may preempt overflow jobs of other teams and
  unfunded jobs; a job beyond its team's cap preempts nothing and runs only on idle GPUs.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping

import msgspec

from ledger.dispatch.ordering import SortKey
from ledger.dispatch.policy import Simple, debug_nodes
from ledger.dispatch.preemption import (
    CLASS_NOT_RESUMABLE,
    CLASS_RESUMABLE,
    CLASS_UNFUNDED,
    Victim,
    victim_cost,
)
from ledger.dispatch.snapshot import UNRANKED, PendingJob, RunningJob, Snapshot

WEEK_S = 7 * 24 * 3600.0


def _class(job: RunningJob) -> int:
    if job.min_runtime_s <= 0:
        return CLASS_UNFUNDED
    return CLASS_RESUMABLE if job.resumable else CLASS_NOT_RESUMABLE


class _Tiers(Simple):
    """Both baselines' tiers: only funded jobs preempt, and victims go unfunded first, then by
    the work they lose (`victim_cost`)."""

    def may_preempt(self, job: PendingJob) -> bool:
        return job.min_runtime_s > 0

    def victim_key(self, job: RunningJob, now: float) -> tuple[float, ...]:
        return victim_cost(job, _class(job), now)


class SlurmMultifactor(_Tiers, msgspec.Struct, frozen=True, kw_only=True):
    """Slurm-like multifactor priority over half-life-decayed Fair Tree ranks; preemption by
    partition tier only (funded over unfunded)."""

    version: str = "slurm-1"
    weight_fairshare: float = 10_000.0
    weight_age: float = 1_000.0
    max_age_s: float = WEEK_S
    half_life_s: float = WEEK_S
    """PriorityDecayHalfLife: recorded here; the rank source decays usage with it."""
    search_budget: int = 32

    def priority(self, job: PendingJob, ranks: Mapping[str, int], users: int, now: float) -> float:
        """Pure: the multifactor priority of `job` at `now` (higher runs first)."""
        rank = ranks.get(job.leaf, ranks.get(job.account, UNRANKED))
        factor = max(0.0, (users - rank) / users) if users else 0.0
        age = min(1.0, max(0.0, now - job.submitted_at) / self.max_age_s)
        return self.weight_fairshare * factor + self.weight_age * age

    def order(self, snapshot: Snapshot) -> list[tuple[SortKey, PendingJob]]:
        ranks = snapshot.ranks
        users = max(ranks.values()) + 1 if ranks else 0
        now = snapshot.taken_at
        keyed: list[tuple[SortKey, PendingJob]] = [
            (
                (
                    0 if j.min_runtime_s > 0 else 1,
                    -round(self.priority(j, ranks, users, now), 6),
                    -j.priority,
                    j.submitted_at,
                    j.job_id,
                ),
                j,
            )
            for j in snapshot.pending
        ]
        keyed.sort(key=lambda kj: kj[0])
        return keyed

    def victim_group(self, job: PendingJob, snapshot: Snapshot) -> Hashable:
        return "funded"

    def victims(
        self, job: PendingJob, candidates: Iterable[RunningJob], snapshot: Snapshot, now: float
    ) -> Iterator[Victim]:
        if job.min_runtime_s <= 0:
            return
        for r in candidates:
            if r.min_runtime_s <= 0:
                yield Victim(r, "fairness", self.victim_key(r, now), "lower partition tier")


def team_of(account: str, depth: int = 2) -> str:
    """Pure: the team (the account at `depth`, or the account itself when shallower)."""
    parts = account.split("/")
    return "/".join(parts[:depth])


def in_cap_usage(
    running: Iterable[RunningJob], caps: Mapping[str, int], depth: int = 2
) -> tuple[dict[str, int], set[int]]:
    """Pure: GPUs each team holds inside its cap, and the ids of overflow jobs.

    A team's running funded jobs count in placement order (then job id); a job that would take
    the team past its cap is overflow (it and later ones may still fit if smaller). Unfunded jobs
    are neither: they are always preemptible.
    """
    by_team: dict[str, list[RunningJob]] = {}
    for r in running:
        if r.min_runtime_s > 0:
            by_team.setdefault(team_of(r.account, depth), []).append(r)
    used: dict[str, int] = {}
    overflow: set[int] = set()
    for team in sorted(by_team):
        cap = caps.get(team, 0)
        held = 0
        for r in sorted(by_team[team], key=lambda r: (r.placed_at, r.job_id)):
            if held + r.gpus <= cap:
                held += r.gpus
            else:
                overflow.add(r.job_id)
        used[team] = held
    return used, overflow


class LegacyCaps(_Tiers, msgspec.Struct, frozen=True, kw_only=True):
    """Static priority levels, per-team caps on non-preemptible GPUs, preemptible overflow on idle
    GPUs (see the module docstring)."""

    version: str = "legacy-1"
    caps: dict[str, int] = msgspec.field(default_factory=dict)
    """Team path -> GPUs it may hold non-preemptibly."""
    team_depth: int = 2
    search_budget: int = 32

    def order(self, snapshot: Snapshot) -> list[tuple[SortKey, PendingJob]]:
        keyed: list[tuple[SortKey, PendingJob]] = [
            ((0 if j.min_runtime_s > 0 else 1, -j.priority, j.submitted_at, j.job_id), j)
            for j in snapshot.pending
        ]
        keyed.sort(key=lambda kj: kj[0])
        return keyed

    def victim_group(self, job: PendingJob, snapshot: Snapshot) -> Hashable:
        """One search per job: whether a job fits inside its team's cap depends on its size."""
        return job.job_id

    def victims(
        self, job: PendingJob, candidates: Iterable[RunningJob], snapshot: Snapshot, now: float
    ) -> Iterator[Victim]:
        if job.min_runtime_s <= 0:
            return
        team = team_of(job.account, self.team_depth)
        used, overflow = in_cap_usage(snapshot.running, self.caps, self.team_depth)
        if used.get(team, 0) + job.gpus > self.caps.get(team, 0):
            return  # beyond its cap: it may only use idle GPUs
        yield from self._victims_of(team, overflow, candidates, now)

    def _victims_of(
        self, team: str, overflow: set[int], candidates: Iterable[RunningJob], now: float
    ) -> Iterator[Victim]:
        """What a funded job of `team` inside its cap may preempt: unfunded jobs, and other
        teams' jobs in `overflow`."""
        for r in candidates:
            if r.min_runtime_s <= 0:
                yield Victim(r, "fairness", self.victim_key(r, now), "preemptible level")
            elif r.job_id in overflow and team_of(r.account, self.team_depth) != team:
                yield Victim(r, "fairness", self.victim_key(r, now), "overflow beyond team cap")


class SlurmMultifactor2(SlurmMultifactor, frozen=True, kw_only=True):
    """`SlurmMultifactor` as Slurm runs by default (PreemptType=none): no preemption, unless
    `preempt_unfunded` (funded jobs preempt unfunded ones, a scavenger partition tier)."""

    version: str = "slurm-2"
    preempt_unfunded: bool = False

    def may_preempt(self, job: PendingJob) -> bool:
        return self.preempt_unfunded and job.min_runtime_s > 0


class LegacyCaps2(LegacyCaps, frozen=True, kw_only=True):
    """`LegacyCaps` with one victim search per team and cycle (in-cap jobs of a team share
    their victims: other teams' overflow and unfunded jobs) and none by jobs beyond their
    team's cap, which only ever use idle GPUs."""

    version: str = "legacy-2"

    def _usage(self, snapshot: Snapshot) -> tuple[dict[str, int], set[int]]:
        """`in_cap_usage` of `snapshot` (its cycle asks once per job: kept with it)."""
        key = ("in_cap_usage", self.team_depth, tuple(sorted(self.caps.items())))
        found: tuple[dict[str, int], set[int]] | None = snapshot.memo.get(key)
        if found is None:
            found = snapshot.memo[key] = in_cap_usage(snapshot.running, self.caps, self.team_depth)
        return found

    def victim_group(self, job: PendingJob, snapshot: Snapshot) -> Hashable:
        """The team, for a job that fits inside its team's cap; None (no search) for others."""
        team = team_of(job.account, self.team_depth)
        used, _ = self._usage(snapshot)
        if used.get(team, 0) + job.gpus > self.caps.get(team, 0):
            return None
        return team

    def victims(
        self, job: PendingJob, candidates: Iterable[RunningJob], snapshot: Snapshot, now: float
    ) -> Iterator[Victim]:
        if job.min_runtime_s <= 0:
            return
        _, overflow = self._usage(snapshot)
        yield from self._victims_of(
            team_of(job.account, self.team_depth), overflow, candidates, now
        )


class SlurmLab(SlurmMultifactor, frozen=True, kw_only=True):
    """Slurm as a lab configures it (`schemas.policy.SlurmLabConfig`; docs/simulation.md cites
    Slurm's documentation for each setting):

    - order (the scheduler's: QOS tier, then multifactor priority): the debug QOS (funded
      debug-class jobs), then funded jobs (normal QOS), then unfunded ones (scavenger QOS);
      inside a tier `w_fs * F + w_age * A` as `SlurmMultifactor`, then submit time, job id;
    - a debug partition: one node in `debug_nodes_per` of each pool runs only debug jobs (and
      scavenger jobs, which overlap every node and which debug jobs preempt);
    - preemption by QOS (preempt/qos, PreemptMode=REQUEUE): debug and funded jobs preempt
      scavenger jobs, never each other;
    - backfill (sched/backfill) with a reservation for the top waiting job: the nodes whose
      GPUs it can have soonest, when running jobs end by their time limits (the partition's
      DefaultTime when they declared none; scavenger jobs it may preempt count as gone); later
      jobs run there only when their own time limit ends before the reservation starts.
    """

    version: str = "slurm-lab-1"
    debug_nodes_per: int = 32
    preempt_unfunded: bool = True
    backfill: bool = True
    default_time_limit_s: float = 3 * 86_400.0
    overdue_s: float = 3_600.0

    def order(self, snapshot: Snapshot) -> list[tuple[SortKey, PendingJob]]:
        ranks = snapshot.ranks
        users = max(ranks.values()) + 1 if ranks else 0
        now = snapshot.taken_at
        keyed: list[tuple[SortKey, PendingJob]] = [
            (
                (
                    _qos(j),
                    -round(self.priority(j, ranks, users, now), 6),
                    -j.priority,
                    j.submitted_at,
                    j.job_id,
                ),
                j,
            )
            for j in snapshot.pending
        ]
        keyed.sort(key=lambda kj: kj[0])
        return keyed

    def may_preempt(self, job: PendingJob) -> bool:
        return self.preempt_unfunded and job.min_runtime_s > 0

    def victim_group(self, job: PendingJob, snapshot: Snapshot) -> Hashable:
        return "debug" if _qos(job) == QOS_DEBUG else "funded"

    def reserved(self, snapshot: Snapshot) -> frozenset[str]:
        return debug_nodes(snapshot, self.debug_nodes_per)

    def holds_for(self, job: PendingJob, snapshot: Snapshot) -> bool:
        return self.backfill

    def _limit(self, time_limit_s: int | None) -> float:
        return float(time_limit_s) if time_limit_s is not None else self.default_time_limit_s

    def expected_end(self, job: RunningJob, now: float) -> float:
        end = job.placed_at + self._limit(job.time_limit_s)
        return end if end > now else now + self.overdue_s

    def may_backfill(self, job: PendingJob, until: float, now: float) -> bool:
        return now + self._limit(job.time_limit_s) <= until


class SlurmLab2(SlurmLab, frozen=True, kw_only=True):
    """`SlurmLab` whose runs end at their time limits (`schemas.policy.SlurmLab2Config`): a job
    that declared none is given the partition's DefaultTime when submitted (`job_time_limit_s`),
    as slurmctld does, and ends there (TIMEOUT). It decides as `SlurmLab`: its backfill's
    expected ends are now every run's real latest end."""

    version: str = "slurm-lab-2"
    limit_runs: bool = True

    def job_time_limit_s(self, declared: int | None) -> int | None:
        """The time limit a job runs under: its own, else DefaultTime (None: no limit)."""
        if declared is not None or not self.limit_runs:
            return declared
        return int(self.default_time_limit_s)


QOS_DEBUG, QOS_NORMAL, QOS_SCAVENGER = 0, 1, 2


def _qos(job: PendingJob) -> int:
    """The QOS tier of a job: debug (funded debug-class jobs), normal (funded), scavenger."""
    if job.min_runtime_s <= 0:
        return QOS_SCAVENGER
    return QOS_DEBUG if job.debug else QOS_NORMAL
