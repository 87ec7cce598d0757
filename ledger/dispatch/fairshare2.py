"""`FairShare2` ("fairshare-6" down to "fairshare-2"): fair share between teams without churn.

Pure: a policy is a config value (`schemas.policy.FairShare6Config`, `FairShare5Config`,
`FairShare4Config`, `FairShare3Config` or `FairShare2Config` plus its version); its methods are
functions of their arguments. What follows is "fairshare-3" and "fairshare-4" (the same code;
fairshare-4 credits a fairness preemption with half the gain, `gain_horizon_s` 1800 s against
3600 s); "fairshare-5" is fairshare-4 with one more step in the order (`fresh_first`: an
unfunded job that never ran goes before one that ran and was preempted); "fairshare-6", the
default, is fairshare-5 with a larger debug reserve by default (`debug_reserve_per` 16 against
128); the recorded "fairshare-2" differs where `FairShare2.whole_tree` says (teams by Fair Tree's
level fair shares, first-fit gang plans, debug victims grouped by team), so its decisions replay
exactly.

**Teams.** A team is the account `team_depth` levels down the tree (default 2: the project,
`program/project`). Fairness is settled between teams by their budgets; inside a team jobs go by
declared priority, then the person's fair-share rank, then submit time, and never preempt each
other for fairness. A team's standing is its share of the whole tree (`team_fs`: the product of
the level fair shares on its path, i.e. its allocated fraction of the cluster over its fraction
of the usage; above 1 it uses less than its share). Fair Tree ranks a team behind every team of
a program that uses less than its own program, even while the team itself uses less than its
share; its share of the whole tree does not, and that is what a team is owed.

**Order** (`SortKey`, compared left to right): the debug lane (0: a funded debug-class job, when
the lane is on; 1: any other), funded before unfunded, (fairshare-5) unfunded jobs that never ran
before those that ran and were preempted, the team's place (`team_places`: by its
share of the whole tree, highest first; Fair Tree's team rank when a share is unknown), priority
(higher first), the user leaf's rank, submit time, job id.

**Victims** (`victim_key`): class (unfunded, squatting, resumable, not resumable), then the
GPU-seconds a preemption loses (GPUs x work since the last checkpoint; a non-resumable job's whole
run so far). Plans take the set of least cost (`least_loss`): one-node plans over all nodes
(`preemption.plan_single_least`), gang plans over the whole nodes that can be cleared
(`preemption.plan_gang_least`, a bounded search).

**The cost model** (`weigh`, figures in every note and refusal, so `explain` shows them):

- A funded non-debug job may preempt, for fairness, a job of *another* team that uses more
  than its share of the whole tree (`team_fs` < 1) and that its team outranks by the margin (the
  waiting team's share > the victim team's x (1 + margin); `_fairness`), unfunded jobs, and
  squatters. A team that uses no more than its share is never a fairness victim, however its
  program stands. (Without both shares, e.g. a snapshot that lacks a level: Fair Tree's level
  fair shares where the two teams part, `outranks`.)
- A funded non-resumable job past its contract is offered for fairness only when the waiting
  team's share is at least `spare_ratio` times the victim team's (the wide margin).
- The plan is taken only when its gain outweighs the work lost: the funded GPU-seconds its
  fairness victims lose (squatters and unfunded jobs cost nothing here) must not exceed the gain,
  `job GPUs x gain_horizon_s` (the work the waiting team gets now instead of later).

**The debug lane** (`debug_lane`): funded debug-class jobs come before the fair-share order and
draw on their own search budget (`debug_search_budget`). Their victims are only unfunded or
resumable jobs past their contracts, of any team, never holding more than `debug_victim_ratio`
times the debug job's GPUs; no cost check (a debug job runs at most its time limit).

**The debug reserve** (`debug_reserve_per`): in every pool of at least 8 active nodes, the last
`ceil(nodes / debug_reserve_per)` nodes by name take no funded non-debug job (`reserved`), and are
offered to none as victims. Unfunded jobs borrow them while idle; a debug job preempts them there.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from operator import attrgetter
from typing import cast

import msgspec

from ledger.dispatch.ordering import KeptClasses, Ordered, SortKey, classes_kept
from ledger.dispatch.policy import debug_nodes, declared_end, ends_before
from ledger.dispatch.preemption import (
    CLASS_NOT_RESUMABLE,
    CLASS_RESUMABLE,
    CLASS_SQUATTING,
    CLASS_UNFUNDED,
    Victim,
    divergence,
    outranks,
)
from ledger.dispatch.snapshot import UNRANKED, PendingJob, RunningJob, Snapshot, fs_text
from schemas.events import PreemptReason


@functools.lru_cache(maxsize=4096)
@functools.lru_cache(maxsize=65536)
def team_of(account: str, depth: int) -> str:
    """Pure: the team of an account (its ancestor `depth` levels down, or itself). Memoised:
    a cycle asks once per waiting job, for a few hundred accounts."""
    parts = account.split("/")
    return "/".join(parts[:depth]) if len(parts) > depth else account


def fs_ratio(waiting: str, victim: str, level_fs: Mapping[str, float]) -> float | None:
    """Pure: the waiting side's level fair share over the victim side's, where the two teams
    part in the tree (inf when the victim side is unused and the waiting side is not; None when
    either is unknown or one team contains the other)."""
    parted = divergence(waiting, victim)
    if parted is None or parted[0] not in level_fs or parted[1] not in level_fs:
        return None
    fw, fv = level_fs[parted[0]], level_fs[parted[1]]
    if math.isinf(fv):
        return 0.0
    if fv <= 0:
        return math.inf
    return fw / fv


def team_fs(team: str, level_fs: Mapping[str, float]) -> float | None:
    """Pure: a team's fair share of the whole tree: the product of the level fair shares on its
    path (its allocated fraction of all shares over its fraction of all usage); above 1 it uses
    less than its share. None when a level is unknown; 0 when a level has no shares."""
    out = 1.0
    cut = 0
    while cut >= 0:
        cut = team.find("/", cut + 1)
        level = level_fs.get(team if cut < 0 else team[:cut])
        if level is None:
            return None
        if level <= 0.0:
            return 0.0
        out *= level
    return out


def team_places(snapshot: Snapshot, depth: int) -> dict[str, int]:
    """Pure: the teams (the accounts `depth` levels down) in order of their share of the whole
    tree (`team_fs`, highest first; ties: Fair Tree rank, then name), as places 0, 1, ...;
    empty when a team's share is unknown (the order then falls back to Fair Tree ranks)."""
    key = ("team_places", depth)
    last: dict[str, int] | None = snapshot.memo.get(key)  # a cycle asks once per waiting job
    if last is not None:
        return last
    level_fs, ranks = snapshot.level_fs, snapshot.ranks
    keyed: list[tuple[float, int, str]] = []
    for path in level_fs:
        if path.count("/") != depth - 1:
            continue
        share = team_fs(path, level_fs)
        if share is None:
            keyed = []
            break
        keyed.append((-share, ranks.get(path, UNRANKED), path))
    keyed.sort()
    found = {path: i for i, (_, _, path) in enumerate(keyed)}
    snapshot.memo[key] = found
    return found


_BY_SUBMIT = attrgetter("submitted_at", "job_id")
_JOB_ID = attrgetter("job_id")
_SUBMITTED = attrgetter("submitted_at")
KEEP_FROM = 256
"""Pending jobs from which fair share's order is kept between cycles (`FairShare2.order_kept`):
below it, ordering afresh is cheaper (measured: docs/simulation.md, "Speed, eleventh round")."""


_Class = tuple[str, str, bool, bool, bool, int]
"""(account, user, debug, funded, never ran, priority): a class of `FairShare2.order_kept`."""


def _class_of(job: PendingJob) -> _Class:
    """Everything of a job fair share's order reads before its submit time and id
    (`FairShare2.order_kept`)."""
    return (job.account, job.user, job.debug, job.min_runtime_s > 0, job.runs == 0,
            job.priority)  # fmt: skip


def _gpu_h(gpu_s: float) -> str:
    return f"{gpu_s / 3600:.2f} GPU-h"


FREE_HEAD: tuple[int, ...] = (1, 1)
"""The one key head of every unfunded job when the free tier goes by submit time alone
(`FairShare2.free_oldest`): after every funded job's (their second part is 0), one group."""


class FairShare2(msgspec.Struct, frozen=True, kw_only=True):
    """Fair share between teams without churn (see the module docstring)."""

    version: str = "fairshare-3"
    team_depth: int = 2
    margin: float = 0.1
    min_rank_gap: int = 1
    gain_horizon_s: float = 3600.0
    spare_ratio: float = 5.0
    squat_after_s: float = 3600.0
    squat_util_pct: float = 10.0
    search_budget: int = 32
    debug_lane: bool = True
    debug_search_budget: int = 8
    debug_victim_ratio: float = 2.0
    debug_reserve_per: int = 128

    # --- order ------------------------------------------------------------------------------

    def lane(self, job: PendingJob) -> bool:
        """Whether `job` goes in the debug lane."""
        return self.debug_lane and job.debug and job.min_runtime_s > 0

    def order(self, snapshot: Snapshot) -> Sequence[tuple[SortKey, PendingJob]]:
        """Every pending job with its sort key, sorted. Jobs are grouped by the parts of their
        key before the submit time (a few hundred groups at 50,000 pending), the groups sorted
        by those parts and each group by (submit time, job id): the same order as one sort of
        all the keys, with far fewer comparisons, and the keys themselves built only when a
        reader asks (`ordering.Ordered`; scripts/bench_dispatch.py)."""
        return self._ordered(snapshot, None)[0]

    def order_kept(
        self, snapshot: Snapshot, kept: KeptClasses | None
    ) -> tuple[Sequence[tuple[SortKey, PendingJob]], KeptClasses | None]:
        """`order(snapshot)`, made from what the last cycle's handed on (`kept`, None:
        nothing; `engine.decide_carried` carries it), and what to hand the next. The jobs are
        kept in classes of everything their key's head reads of a job (account, user, debug,
        funded, ever ran, priority), each in (submit time, job id) order, and only the jobs
        that came or went since are classed again (`ordering.classes_kept`); each cycle works
        out one head per class (the ranks and team places move) and merges the classes that
        share one. A version with an order of its own hands nothing on."""
        if type(self).order is not FairShare2.order:
            return self.order(snapshot), None
        return self._ordered(snapshot, kept)

    def _ordered(
        self, snapshot: Snapshot, kept: KeptClasses | None
    ) -> tuple[Ordered, KeptClasses | None]:
        """`order_kept` (what a version that builds on this order reads as `order`); a
        queue shorter than `KEEP_FROM` is ordered afresh and nothing is handed on (keeping
        costs more than it saves there), and so is one with nothing kept (classing every job
        costs more than ordering it once: a cold `decide()` pays nothing for the keeping)."""
        if len(snapshot.pending) < KEEP_FROM:
            return self._afresh(snapshot), None
        if kept is None:  # nothing kept (a `decide()` from nothing): classed from the next one
            return self._afresh(snapshot), KeptClasses({}, {})
        classes = classes_kept(snapshot.pending, _class_of, kept, snapshot.delta)
        ranks, depth, lane = snapshot.ranks, self.team_depth, self.debug_lane
        places = team_places(snapshot, depth) if self.whole_tree else {}
        fresh_first, ran_first, oldest = self.fresh_first, self.ran_first, self.free_oldest
        # a class's head reads the ranks and team places: while they are the same, it is too
        read = (ranks, places, depth, lane, fresh_first, ran_first)
        last = kept.heads
        known: dict[Hashable, tuple[int, ...]] = {}
        if last is not None and last[0] == read:
            known = last[1]
        heads_of: dict[Hashable, tuple[int, ...]] = {}
        cache: dict[tuple[str, str], tuple[int, int]] = {}
        heads: dict[tuple[int, ...], list[list[PendingJob]]] = {}
        for c, members in classes.classes.items():
            was = known.get(c)
            if was is not None:
                heads_of[c] = was
                heads.setdefault(was, []).append(members)
                continue
            account, user, debug, funded, fresh, priority = cast("_Class", c)
            if oldest and not funded:  # the free tier by submit time alone (`fairshare-17`)
                heads_of[c] = FREE_HEAD
                heads.setdefault(FREE_HEAD, []).append(members)
                continue
            who = (account, user)
            pair = cache.get(who)
            if pair is None:
                name = team_of(account, depth)
                rank = ranks.get(name, ranks.get(account, UNRANKED))
                team = places.get(name, len(places) + rank) if places else rank
                leaf = ranks.get(f"{account}/{user}", rank)
                pair = cache[who] = (team, leaf)
            head: tuple[int, ...]
            if fresh_first:  # after funded-before-unfunded: 1 for an unfunded job that ran
                head = (
                    0 if lane and funded and debug else 1,
                    0 if funded else 1,
                    0 if funded or fresh != ran_first else 1,
                    pair[0],
                    -priority,
                    pair[1],
                )
            else:
                head = (0 if lane and funded and debug else 1, 0 if funded else 1, pair[0],
                        -priority, pair[1])  # fmt: skip
            heads_of[c] = head
            heads.setdefault(head, []).append(members)
        out: list[tuple[tuple[int, ...], Sequence[PendingJob]]] = []
        for head in sorted(heads):
            parts = heads[head]
            if len(parts) == 1:
                out.append((head, parts[0]))
            else:  # classes that share a head (two users of a team unranked alike)
                out.append((head, sorted((j for p in parts for j in p), key=_BY_SUBMIT)))
        return Ordered(out), replace(classes, heads=(read, heads_of))

    def _afresh(self, snapshot: Snapshot) -> Ordered:
        """`order` built from every job's key head: jobs grouped by it, the groups sorted, each
        group by (submit time, job id)."""
        ranks, depth, lane = snapshot.ranks, self.team_depth, self.debug_lane
        places = team_places(snapshot, depth) if self.whole_tree else {}
        fresh_first, ran_first, oldest = self.fresh_first, self.ran_first, self.free_oldest
        cache: dict[tuple[str, str], tuple[int, int]] = {}
        groups: dict[tuple[int, ...], list[PendingJob]] = {}
        for j in snapshot.pending:
            funded = j.min_runtime_s > 0
            if oldest and not funded:  # the free tier by submit time alone (`fairshare-17`)
                group = groups.get(FREE_HEAD)
                if group is None:
                    groups[FREE_HEAD] = [j]
                else:
                    group.append(j)
                continue
            who = (j.account, j.user)
            pair = cache.get(who)
            if pair is None:
                name = team_of(j.account, depth)
                rank = ranks.get(name, ranks.get(j.account, UNRANKED))
                team = places.get(name, len(places) + rank) if places else rank
                leaf = ranks.get(f"{j.account}/{j.user}", rank)
                pair = cache[who] = (team, leaf)
            head: tuple[int, ...]
            if fresh_first:  # after funded-before-unfunded: 1 for an unfunded job that ran
                fresh = 0 if funded or (j.runs == 0) != ran_first else 1
                head = (0 if lane and funded and j.debug else 1, 0 if funded else 1, fresh,
                        pair[0], -j.priority, pair[1])  # fmt: skip
            else:
                head = (0 if lane and funded and j.debug else 1, 0 if funded else 1, pair[0],
                        -j.priority, pair[1])  # fmt: skip
            group = groups.get(head)
            if group is None:
                groups[head] = [j]
            else:
                group.append(j)
        out: list[tuple[tuple[int, ...], list[PendingJob]]] = []
        for head in sorted(groups):
            group = groups[head]
            if len(group) > 1:  # by (submit time, job id): two stable sorts, keys read in C
                group.sort(key=_JOB_ID)
                group.sort(key=_SUBMITTED)
            out.append((head, group))
        return Ordered(out)

    @property
    def fresh_first(self) -> bool:
        """Whether unfunded jobs that never ran go before unfunded jobs that ran and were
        preempted (`fairshare-5`)."""
        return self.version not in ("fairshare-2", "fairshare-3", "fairshare-4")

    @property
    def ran_first(self) -> bool:
        """With `fresh_first`, the step turned round (`fairshare-16`'s `requeued_first`): unfunded
        jobs that ran and were preempted go *before* those that never ran."""
        return False

    @property
    def free_oldest(self) -> bool:
        """Whether unfunded jobs go by submit time alone, after every funded job (`fairshare-17`'s
        `free_order` "oldest": no team, priority, user rank or ran-before step among them)."""
        return False

    # --- preemption -------------------------------------------------------------------------

    @property
    def whole_tree(self) -> bool:
        """Whether teams stand by their share of the whole tree (`fairshare-3`); `fairshare-2`
        compares Fair Tree's level fair shares where two teams part, orders teams by Fair Tree
        rank, groups debug victims by team and clears gang nodes first-fit."""
        return self.version != "fairshare-2"

    @property
    def least_loss(self) -> bool:
        return True

    @property
    def least_loss_gangs(self) -> bool:
        return self.whole_tree

    def may_preempt(self, job: PendingJob) -> bool:
        return job.min_runtime_s > 0

    def job_traits(self, job: PendingJob, snapshot: Snapshot) -> Hashable:
        """Everything `may_preempt`, `victim_group`, `budget_of` and `holds_for` read of a job:
        `decide()` asks them once per traits in a cycle (a speed-up; the same answers), and
        tries a reservation once per traits while nothing moves (`hold_takes` reads more of a
        job only for the reserved one, which later versions' traits tell apart)."""
        return (job.account, job.debug, job.min_runtime_s > 0, job.gpus, job.gpu_type, job.cluster)

    @property
    def traits_shaped(self) -> bool:
        """`job_traits` hold the job's shape (GPUs, GPU type, cluster), so `decide()` keys what
        it remembers of a job by its traits alone (subclasses keep them in theirs)."""
        return True

    def budget_of(self, job: PendingJob) -> tuple[str, int]:
        if self.lane(job):
            return ("debug", self.debug_search_budget)
        return ("all", self.search_budget)

    def reserved(self, snapshot: Snapshot) -> frozenset[str]:
        if not self.debug_lane:
            return frozenset()
        return debug_nodes(snapshot, self.debug_reserve_per)

    def victim_group(self, job: PendingJob, snapshot: Snapshot) -> Hashable:
        """A team's jobs share their victims; debug-lane jobs of one size share theirs whatever
        the team (`_debug_victims` reads only the size)."""
        if not self.whole_tree:
            return (team_of(job.account, self.team_depth), self.lane(job))
        if self.lane(job):
            return ("debug lane", job.gpus)
        return team_of(job.account, self.team_depth)

    def _class(self, job: RunningJob, now: float) -> int:
        low = job.low_util_since
        if job.min_runtime_s <= 0:
            return CLASS_UNFUNDED
        if low is not None and now - low >= self.squat_after_s:
            return CLASS_SQUATTING
        return CLASS_RESUMABLE if job.resumable else CLASS_NOT_RESUMABLE

    def victim_key(self, job: RunningJob, now: float) -> tuple[float, ...]:
        """(class, GPU-seconds lost): cheapest first."""
        return (self._class(job, now), job.gpus * job.work_lost_s(now))

    def victims(
        self, job: PendingJob, candidates: Iterable[RunningJob], snapshot: Snapshot, now: float
    ) -> Iterator[Victim]:
        if job.min_runtime_s <= 0:
            return
        if self.lane(job):
            yield from self._debug_victims(job, candidates, now)
            return
        reserved = self.reserved(snapshot)
        waiting = team_of(job.account, self.team_depth)
        verdicts: dict[str, tuple[bool, str, float | None]] = {}
        reason: PreemptReason
        # the class first and the cost only for a job offered: most candidates are of the
        # waiting team or of a team fairness may not take from (the same victims, in order)
        key = self.victim_key
        klass_of: Callable[[RunningJob, float], float] = self._class
        if type(self).victim_key is not FairShare2.victim_key:
            klass_of = lambda r, now: key(r, now)[0]  # noqa: E731
        for r in candidates:
            if reserved and any(sl.node in reserved for sl in r.slots):
                continue
            klass = klass_of(r, now)
            if klass == CLASS_UNFUNDED:
                low = r.low_util_since
                squat = low is not None and now - low >= self.squat_after_s
                reason, note = ("squatting" if squat else "fairness"), "unfunded"
            elif klass == CLASS_SQUATTING:
                reason, note = "squatting", self.squat_note(r)
            else:
                team = team_of(r.account, self.team_depth)
                if team == waiting:
                    continue  # no fairness preemption inside a team
                verdict = verdicts.get(team)
                if verdict is None:
                    verdict = verdicts[team] = self._fairness(waiting, team, snapshot)
                ok, why, ratio = verdict
                if not ok:
                    continue
                if klass == CLASS_NOT_RESUMABLE:
                    if ratio is None or ratio < self.spare_ratio:
                        continue
                    why += f"; not resumable: ratio {ratio:.3g} >= {self.spare_ratio:g}"
                cost = key(r, now)
                reason, note = "fairness", f"{why}; loses {_gpu_h(cost[1])}"
                yield Victim(r, reason, cost, note)
                continue
            yield Victim(r, reason, key(r, now), note)

    def protected(
        self, job: PendingJob, snapshot: Snapshot, now: float
    ) -> list[tuple[RunningJob, str]]:
        """Pure, for reads only (`explain`, `queue`; no decision calls it): the running jobs past
        their contracts that fairness would offer `job` as victims but that are protected, being
        not resumable while the ratio of the teams' shares is below `spare_ratio` (the rule of
        `victims`), each with why."""
        if job.min_runtime_s <= 0 or self.lane(job):
            return []
        reserved = self.reserved(snapshot)
        waiting = team_of(job.account, self.team_depth)
        verdicts: dict[str, tuple[bool, str, float | None]] = {}
        out: list[tuple[RunningJob, str]] = []
        for r in snapshot.running:
            if r.in_contract(now) or self._class(r, now) != CLASS_NOT_RESUMABLE:
                continue
            team = team_of(r.account, self.team_depth)
            if team == waiting or (reserved and any(sl.node in reserved for sl in r.slots)):
                continue
            verdict = verdicts.get(team)
            if verdict is None:
                verdict = verdicts[team] = self._fairness(waiting, team, snapshot)
            ok, _, ratio = verdict
            if ok and (ratio is None or ratio < self.spare_ratio):
                shown = "unknown" if ratio is None else f"{ratio:.3g}"
                out.append((r, f"not resumable: ratio {shown} < {self.spare_ratio:g}"))
        return out

    def squat_note(self, job: RunningJob) -> str:
        """The note of a squatter's preemption (recorded in its `JobPreempted`)."""
        return f"low utilisation since t={job.low_util_since:g}"

    def _fairness(
        self, waiting: str, team: str, snapshot: Snapshot
    ) -> tuple[bool, str, float | None]:
        """Whether team `waiting` may take GPUs of team `team` for fairness, why, and the ratio
        of their shares. With both teams' shares of the whole tree known (`team_fs`): the
        waiting team's must exceed the other's by the margin, and the other team must use more
        than its share; else Fair Tree's level fair shares where the teams part (`outranks`)."""
        level_fs = snapshot.level_fs
        whole = self.whole_tree
        fw = team_fs(waiting, level_fs) if whole else None
        fv = team_fs(team, level_fs) if whole else None
        if fw is None or fv is None:
            ok, why = outranks(
                waiting, team, snapshot.ranks, level_fs, self.margin, self.min_rank_gap
            )
            return ok, why, fs_ratio(waiting, team, level_fs)
        factor = 1.0 + self.margin
        if fv >= 1.0:
            return False, f"{team} uses no more than its share ({fs_text(fv)})", None
        ok = fw > fv * factor
        op = ">" if ok else "<="
        why = f"team share {waiting} {fs_text(fw)} {op} {team} {fs_text(fv)} x {factor:g}"
        ratio = math.inf if fv <= 0.0 else fw / fv
        return ok, why, ratio

    def _debug_victims(
        self, job: PendingJob, candidates: Iterable[RunningJob], now: float
    ) -> Iterator[Victim]:
        most = self.debug_victim_ratio * job.gpus
        for r in candidates:
            if r.min_runtime_s > 0 and not r.resumable:
                continue
            if r.gpus > most:
                continue
            cost = self.victim_key(r, now)
            kind = "unfunded" if r.min_runtime_s <= 0 else "resumable"
            note = f"debug lane: {kind}, {r.gpus} GPUs, loses {_gpu_h(cost[1])}"
            yield Victim(r, "debug", cost, note)

    def holds_for(self, job: PendingJob, snapshot: Snapshot) -> bool:
        return False

    def expected_end(self, job: RunningJob, now: float) -> float:
        return declared_end(job, now)

    def may_backfill(self, job: PendingJob, until: float, now: float) -> bool:
        return ends_before(job, until, now)

    def weigh(
        self, job: PendingJob, victims: Sequence[Victim], snapshot: Snapshot, now: float
    ) -> str | None:
        if self.lane(job):
            return None
        lost = sum(v.cost[1] for v in victims if v.reason == "fairness" and v.job.min_runtime_s > 0)
        gain = job.gpus * self.gain_horizon_s
        if lost <= gain:
            return None
        ids = ", ".join(str(v.job.job_id) for v in victims)
        return (
            f"preempting jobs {ids} would lose {_gpu_h(lost)} of funded work, more than the "
            f"{_gpu_h(gain)} gained ({job.gpus} GPUs x {self.gain_horizon_s:g} s)"
        )
