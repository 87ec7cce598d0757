"""`FairShare17` ("fairshare-17"): the free tier's hours shared oldest first, and a debug job
that waits keeps the next node it can have.

Pure: a policy is a config value (`schemas.policy.FairShare17Config` plus its version); its
methods are functions of their arguments. Everything not named here is `FairShare16`'s
(ledger/dispatch/fairshare16.py), whose prices are off by default here (both 0: `fairshare-7`'s
victim costs); `fairshare-16` and older keep their code exactly (replay).

Why: judged by the time queued per job, `fairshare-7` misses the wait target on held-out Philly
assignments because of the free tier (unfunded jobs queue ~19 d at p90 on seed 2): its jobs go
by team and with `requeued_last` a job taken back waits behind every later arrival, and funded
work takes back the cheapest unfunded run, which is the one placed last, so the oldest free-tier
jobs are restarted again and again while new ones overtake them (docs/simulation.md,
"fairshare-17").

What changes, each a setting of its own so the tables can turn it off:

- **The free tier goes oldest first** (`free_order` "oldest"; "team": `fairshare-7`'s order;
  "smallest": by GPUs asked, fewest first, then oldest): after every funded job, unfunded jobs
  go by submit time and id alone (a requeue keeps the submit time, so a job taken back goes
  before the free tier's later arrivals).
- **Takebacks come from the free tier's newest arrivals** (`free_age_price`, 1.0): an unfunded
  victim costs, beside the GPU-seconds of work it loses, its GPUs x `free_age_price` x the
  seconds since it was submitted, so the plans of least cost take back the jobs submitted last
  (the tail of the free tier's order), and the oldest run on. (Unfunded victims cost nothing when
  a plan is weighed against its gain, as before: the price only orders them.)
- **A bound on a free-tier job's takebacks** (`takeback_limit`, 3 here; 0: none): an unfunded
  job that funded non-debug work of *another* team took back this many times keeps its GPUs
  against funded non-debug work, within two bounds so that no tenant can lock funded work out
  (atk54-26 F1: counted per preemption of any kind, and for ever, 32 jobs of one user held the
  whole cluster for 20 days). Only takebacks for another team's funded job count (`Job.takebacks`;
  not its own team's, not a debug job's: a tenant cannot earn it with its own waves). It lapses:
  a run is kept for `takeback_keep_s` (72 h) after it was placed, then it is a victim like any
  other (and kept again for as long after its next placement). And the kept runs hold at most
  `takeback_keep_share` (0.0625, one GPU in 16) of the cluster's GPUs: the free tier's oldest
  submissions first (then job id), the rest are victims like any other. (s54-fs17fix's 6 h and
  0.125 kept funded work from being locked out but lost the wait target on Philly: a Philly
  free-tier job runs for days, so a 6-hour keep lapsed long before it finished and it was taken
  back again; the share bound alone is what keeps a tenant from holding the cluster. 72 h and
  0.0625 were chosen among ten candidates on the tuning workload and Philly seed 2, where they
  meet the wait target; on held-out Philly seeds 3 and 7 they still miss it: s55-policy,
  docs/simulation.md "fairshare-17's keep".) The share bounds how many GPUs are kept, not which
  jobs they block (atk55-26 F1: one kept 8-GPU run held a 32-GPU gang out for 71 h), so a kept
  run yields to a funded non-debug job asking at least `takeback_keep_yield_share` (0.125) of
  its pool (`keep_yields_to`, s56). But a gang just under that (28 GPUs of 256) or an 8-GPU
  job on a node two kept 4-GPU runs share still waited 71 h (atk56-26 F1), so a funded
  non-debug job that has waited `takeback_keep_need_s` is offered the kept runs too
  (`keep_needed_by`), after every other unfunded run and squatter (`CLASS_KEPT`): it takes one
  only when nothing cheaper places it. With `takeback_keep_per_pool` the share is of each
  pool's GPUs (atk56-26 F2: else a small pool could be kept whole). `takeback_keep_wait_s`
  (0, off): a funded non-debug job that has waited that long takes kept runs back in the usual
  order (s55's candidate, not chosen). `takeback_keep_owed_fs` (0, off; s58's candidate, not
  chosen: it loses Philly's wait): a job whose team holds no GPU and has used at most 1/X of its
  share is offered the kept runs at once (`keep_owed_to`), as the need rule's.
  `takeback_keep_need_fs` (0, off; s60's candidate): the need rule serves only a job whose
  team's share of the whole tree is at least that (`within_share`): a team over its share waits
  by fairness, not by the keep. `takeback_keep_need_by_share` (False, off; s60's other
  candidate): the need bound of a team over its share is the bound over its share
  (`need_bound`: k times its share, k times the wait), at most `takeback_keep_s`.
- **The next plans** (`plans_tried`, 4 built today; 1 in older records): when `weigh` refuses a
  least-loss plan, the search weighs the next on none of the nodes of the refused plan's dearest
  victim, up to `plans_tried` plans (`engine._next_plans`).
- **The free tier's head drains a node** (`free_drain_gpus`, 0: off; s60-policy2's
  candidate): the first unfunded job left waiting that asks at least that many GPUs on one
  node holds the node closest to free (most GPUs free now) for the cycle: the free tier's later
  jobs are not placed there, so it drains toward the job as its runs end (Slurm's reservation
  for the top job, by node, not by time: the free tier's runs declare no end). On Philly the
  free tier's 8-GPU jobs waited 9.9 d on average behind its later 4-GPU jobs taking the
  half-free nodes (`drains_for`, `engine._drain_for`). `free_drain_takes` (False, off): the
  head takes back instead the free tier's runs submitted after it on the node where that loses
  least (each on that node alone; never an older run, never funded work) and is placed there
  (`reservation.newer_runs_node`): the free tier oldest first by preemption too.
- **The time queued so far, every wait counted** (s63-policy, each off): `free_order` "waited"
  orders the free tier by submit time plus the seconds its earlier runs held GPUs
  (`RunningJob.ran_s`, `waited_key`): the job that has queued longest goes first, where
  "oldest" puts a job that ran for days and was taken back ahead of one that only waited.
  `free_age_queued`: the age price counts the victim's time queued before its run, not its
  age since submission. `funded_queued_bound_s` (0, off): a funded run whose job queued that
  long already is no fairness victim (`spares_waited`): on Philly seed 2 the over-share team's
  funded jobs over the all-waits p90 line were mostly ones taken back (s60-policy), and
  `slurm-lab-2` takes none back.
- **The free tier by its users' (teams') fair share, as `slurm-lab-2`** (s63-policy2, off):
  `free_order` "user_share" orders the free tier by `slurm-lab-2`'s scavenger priority, the
  user leaf's Fair Tree factor weighted 10,000 against age's 1,000 (`share_key`); "team_share"
  by the team's place by its share of the whole tree instead. On Philly seed 2 the free tier
  gets the same share under every variant and `slurm-lab-2` (8.0-8.2%): which of its jobs
  wait sets the all-waits p90. `free_victims_by_share` (False, off): funded work takes back
  the free tier's runs in the same order read backwards, the heaviest user's (team's) newest
  run first (`victim_key_in`, `share_age`). `free_share_large` (0, off; s63-policy3): a free-tier
  job asking at least that share of its pool takes the best place (`gang_place`): the tier's
  gangs go by age ahead of its small jobs (on the large-mix corner the large-job wait p90 is
  the free tier's gangs', and the share order left one unplaced for 103 h);
  `free_share_large_head` (False): the tier's oldest such job alone takes it.
- **A waiting debug job keeps a node** (`debug_hold`, on): a debug-lane job that cannot be placed
  (nor by preempting what its lane may) gets the cycle's reservation: the node it can have
  soonest, a running job freeing there at its contract's end when the debug job may preempt it,
  else at its declared limit's end, never without one (atk54-26 F2: counting every running job
  as freeing at its contract's end, a node of funded non-resumable jobs with no limit was kept
  for their whole life, 7 GPUs idle for 30 h); none when that node frees later than
  `debug_hold_window_s` (1 h) from now. It preempts nothing there that its lane may not: while
  the reservation lasts no funded non-debug job is placed on that node's free GPUs (only
  unfunded jobs, which it may preempt, and jobs whose declared limit ends before the node
  frees), so the GPUs a funded job frees there are kept for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Literal

import msgspec

from ledger.dispatch.fairshare2 import FREE_HEAD, team_fs, team_of, team_places
from ledger.dispatch.fairshare7 import FairShare7, pool_gpus
from ledger.dispatch.fairshare16 import FairShare16
from ledger.dispatch.ordering import KeptClasses, Ordered, SortKey
from ledger.dispatch.preemption import CLASS_RESUMABLE, CLASS_SQUATTING, CLASS_UNFUNDED, Victim
from ledger.dispatch.snapshot import UNRANKED, PendingJob, RunningJob, Snapshot

FreeOrder = Literal["oldest", "smallest", "team", "waited", "user_share", "team_share"]

SLURM_FS_WEIGHT, SLURM_AGE_WEIGHT, SLURM_MAX_AGE_S = 10_000.0, 1_000.0, 7 * 86_400.0
"""`slurm-lab-2`'s PriorityWeightFairshare, PriorityWeightAge and PriorityMaxAge
(`baselines.SlurmMultifactor`): the weights `free_order` "user_share" and "team_share" use."""

CLASS_KEPT = (CLASS_SQUATTING + CLASS_RESUMABLE) / 2
"""The victim class of a kept run offered to a job that needs it (`takeback_keep_need_s`):
after every other unfunded run and every squatter, before funded work (a plan of funded victims
may be refused by `weigh`, and before `plans_tried` the planners offered no second plan:
atk56-26's K16 waited on one), so a plan takes it only when no plan of cheaper victims places
the job."""


def waited_key(job: PendingJob) -> tuple[float, int]:
    """Pure: `free_order` "waited"'s key: submit time plus the seconds its earlier runs held
    GPUs (then job id), so the job that has queued longest so far, every wait counted, sorts
    first (at one time `now`, `now - key` is its time queued)."""
    return (job.submitted_at + job.ran_s, job.job_id)


def share_key(job: PendingJob, place: int, places: int, now: float) -> tuple[float, ...]:
    """Pure: `free_order` "user_share" / "team_share"'s key, `slurm-lab-2`'s scavenger order:
    the multifactor priority `10,000 * F + 1,000 * A`, highest first (F = (N - place) / N, the
    fair-share factor of the job's user leaf or team at `place` of N, 0 best; A = its age over
    7 days, at most 1), then declared priority, submit time and job id. With these weights a
    user (team) one place in ten ahead goes first whatever the ages, so the free tier's long
    waits fall on its heaviest users' (teams') jobs, oldest first inside each."""
    factor = max(0.0, (places - place) / places) if places else 0.0
    age = min(1.0, max(0.0, now - job.submitted_at) / SLURM_MAX_AGE_S)
    priority = SLURM_FS_WEIGHT * factor + SLURM_AGE_WEIGHT * age
    return (-round(priority, 6), -job.priority, job.submitted_at, job.job_id)


def gang_place(job: PendingJob, place: int, pool: int, large: float) -> int:
    """Pure: the place `share_key` reads for `job` (`free_share_large`): 0, the best, when it
    asks at least `large` of its pool's `pool` GPUs (a gang goes by age ahead of the free
    tier's small jobs, whoever its user), else its own `place`."""
    return 0 if large > 0 and pool > 0 and job.gpus >= large * pool else place


def share_age(job: RunningJob, place: int, places: int, now: float) -> float:
    """Pure: `share_key`'s priority of the unfunded run `job` as seconds of age (priority /
    `SLURM_AGE_WEIGHT` x `SLURM_MAX_AGE_S`: a user ahead by the whole fair-share factor counts
    ten weeks older): the lower, the sooner funded work takes the run back."""
    factor = max(0.0, (places - place) / places) if places else 0.0
    age = min(1.0, max(0.0, now - job.submitted_at) / SLURM_MAX_AGE_S)
    return SLURM_MAX_AGE_S * (SLURM_FS_WEIGHT / SLURM_AGE_WEIGHT * factor + age)


class FairShare17(FairShare16, frozen=True, kw_only=True):
    """`fairshare-16` (prices off) with the changes of the module docstring."""

    version: str = "fairshare-17"
    takeback_price_s: float = 0.0
    funded_takeback_price_s: float = 0.0
    takeback_limit: int = 3
    free_order: FreeOrder = "oldest"
    free_age_price: float = 1.0
    debug_hold: bool = True
    takeback_keep_s: float = 259_200.0
    takeback_keep_share: float = 0.0625
    takeback_keep_wait_s: float = 0.0
    takeback_keep_yield_share: float = 0.125
    takeback_keep_need_s: float = 0.0
    takeback_keep_per_pool: bool = False
    takeback_keep_owed_fs: float = 0.0
    takeback_keep_need_fs: float = 0.0
    takeback_keep_need_by_share: bool = False
    debug_hold_window_s: float = 3_600.0
    plans_tried: int = 1
    free_drain_gpus: int = 0
    free_drain_takes: bool = False
    free_age_queued: bool = False
    funded_queued_bound_s: float = 0.0
    free_victims_by_share: bool = False
    free_share_large: float = 0.0
    free_share_large_head: bool = False

    @property
    def free_oldest(self) -> bool:
        return self.free_order != "team"

    def order(self, snapshot: Snapshot) -> Sequence[tuple[SortKey, PendingJob]]:
        return self.order_kept(snapshot, None)[0]

    def order_kept(
        self, snapshot: Snapshot, kept: KeptClasses | None
    ) -> tuple[Sequence[tuple[SortKey, PendingJob]], KeptClasses | None]:
        """`fairshare-7`'s order (kept between cycles as it is) with the free tier as
        `free_order` says: "smallest" splits its one group by GPUs asked (fewest first),
        "waited" sorts it by `waited_key`, "user_share" / "team_share" by `share_key`, each
        made afresh each cycle."""
        if self.free_order not in ("smallest", "waited", "user_share", "team_share"):
            return self._ordered(snapshot, kept)
        ordered = self._ordered(snapshot, None)[0]
        groups: list[tuple[tuple[int, ...], Sequence[PendingJob]]] = []
        for head, members in ordered.groups:
            if head != FREE_HEAD:
                groups.append((head, members))
                continue
            if self.free_order == "waited":
                groups.append((head, sorted(members, key=waited_key)))
                continue
            if self.free_order in ("user_share", "team_share"):
                groups.append((head, self.by_share(members, snapshot)))
                continue
            by: dict[int, list[PendingJob]] = {}
            for j in members:  # in (submit time, job id) order: kept inside each size
                by.setdefault(j.gpus, []).append(j)
            groups += [((*FREE_HEAD, g), by[g]) for g in sorted(by)]
        return Ordered(groups), None

    def share_places(self, snapshot: Snapshot) -> tuple[Callable[[str, str], int], int]:
        """The place (0 best) of a job's account and user among N, and N, for `share_key`:
        "user_share" (and any other order) places the user leaf by its Fair Tree rank (then its
        project's, as `slurm-lab-2`'s factor), "team_share" the team by its share of the whole
        tree (`team_places`; by the team's rank when unknown)."""
        ranks = snapshot.ranks
        users = max(ranks.values()) + 1 if ranks else 0
        depth = self.team_depth
        if self.free_order != "team_share":
            return lambda a, u: ranks.get(f"{a}/{u}", ranks.get(a, UNRANKED)), users
        places = team_places(snapshot, depth)
        if places:
            return lambda a, u: places.get(team_of(a, depth), len(places)), len(places)
        return lambda a, u: ranks.get(team_of(a, depth), UNRANKED), users

    def by_share(self, members: Sequence[PendingJob], snapshot: Snapshot) -> list[PendingJob]:
        """The free tier's jobs by `share_key` at the snapshot's time (`share_places`); with
        `free_share_large` its gangs (`free_share_large_head`: its oldest gang alone) at the
        best place (`gang_place`)."""
        place, places = self.share_places(snapshot)
        now = snapshot.taken_at
        large = self.free_share_large
        gangs = [j for j in members if gang_place(j, 1, pool_gpus(snapshot, j), large) == 0]
        if self.free_share_large_head:  # only the free tier's oldest gang
            gangs = [min(gangs, key=lambda j: (j.submitted_at, j.job_id))] if gangs else []
        first = {j.job_id for j in gangs}

        def key(j: PendingJob) -> tuple[float, ...]:
            at = 0 if j.job_id in first else place(j.account, j.user)
            return share_key(j, at, places, now)

        return sorted(members, key=key)

    def victim_key_in(self, snapshot: Snapshot) -> Callable[[RunningJob, float], tuple[float, ...]]:
        """The victim key of this snapshot (the engine's candidate order, and the costs
        `victims` gives): `victim_key`, but with `free_victims_by_share` an unfunded run's age
        price counts, instead of its age, `share_age`: the free tier's order by share
        (`share_key`) read back as seconds of age, so funded work takes back the run the free
        tier's order puts last, the heaviest user's (team's) newest run first."""
        if not self.free_victims_by_share:
            return self.victim_key
        place, places = self.share_places(snapshot)
        price = self.free_age_price
        base = super().victim_key

        def key(job: RunningJob, now: float) -> tuple[float, ...]:
            klass, lost = base(job, now)
            if klass == CLASS_UNFUNDED and price > 0:
                lost += job.gpus * price * share_age(job, place(job.account, job.user), places, now)
            return (klass, lost)

        return key

    def victim_key(self, job: RunningJob, now: float) -> tuple[float, ...]:
        """(class, GPU-seconds lost, plus for the free tier its GPUs x `free_age_price` x its
        age since submission: the newest arrivals are the cheapest victims)."""
        klass, lost = super().victim_key(job, now)
        if klass == CLASS_UNFUNDED and self.free_age_price > 0:
            age = job.queued_s if self.free_age_queued else max(0.0, now - job.submitted_at)
            lost += job.gpus * self.free_age_price * age
        return (klass, lost)

    def spares_waited(self, run: RunningJob) -> bool:
        """Whether `run`, a funded run, is no fairness victim because its job queued
        `funded_queued_bound_s` or longer before it, every wait counted (0: none is spared): a
        takeback would add a requeue wait to a job that has waited that long already."""
        bound = self.funded_queued_bound_s
        return bound > 0 and run.min_runtime_s > 0 and run.queued_s >= bound

    def taken_back(self, job: RunningJob) -> int:
        """How many times funded non-debug work of another team took `job` back."""
        team = team_of(job.account, self.team_depth)
        return sum(1 for by, _ in job.takebacks if team_of(by, self.team_depth) != team)

    def kept_runs(self, snapshot: Snapshot, now: float) -> frozenset[int]:
        """The unfunded runs `takeback_limit` keeps from funded non-debug work now: taken back
        `takeback_limit` times by another team's funded work, placed less than
        `takeback_keep_s` ago, oldest submission first (then job id) while their GPUs stay
        within `takeback_keep_share` of the cluster's active GPUs (of their pool's with
        `takeback_keep_per_pool`)."""
        memo = snapshot.memo
        limit = self.takeback_limit
        per_pool = self.takeback_keep_per_pool
        key = ("fairshare-17 kept", now, limit, self.takeback_keep_s, self.takeback_keep_share,
               self.team_depth, per_pool)  # fmt: skip
        found: frozenset[int] | None = memo.get(key)
        if found is not None:
            return found
        share = self.takeback_keep_share
        pool_of = {n.name: (n.gpu_type, n.cluster) if per_pool else None for n in snapshot.nodes}
        rooms: dict[Hashable, float] = {}
        for n in snapshot.nodes:
            if n.state == "active":
                at = pool_of[n.name]
                rooms[at] = rooms.get(at, 0.0) + share * n.gpus
        out: set[int] = set()
        if limit > 0:
            due = sorted(
                (
                    r.submitted_at,
                    r.job_id,
                    r.gpus,
                    pool_of.get(r.slots[0].node) if r.slots else None,
                )
                for r in snapshot.running
                if r.min_runtime_s <= 0
                and now - r.placed_at < self.takeback_keep_s
                and len(r.takebacks) >= limit
                and self.taken_back(r) >= limit
            )
            full: set[Hashable] = set()  # a pool's first run over its room ends its keeps
            for _, job_id, gpus, at in due:
                room = rooms.get(at, 0.0)
                if at in full or gpus > room:
                    full.add(at)
                    continue
                rooms[at] = room - gpus
                out.add(job_id)
        memo[key] = kept = frozenset(out)
        return kept

    def keep_lapsed_for(self, job: PendingJob, now: float) -> bool:
        """Whether the keep no longer holds against `job`, a funded non-debug job: it has waited
        `takeback_keep_wait_s` since it was submitted (0: never)."""
        wait = self.takeback_keep_wait_s
        return wait > 0 and now - job.submitted_at >= wait

    def keep_needed_by(self, job: PendingJob, snapshot: Snapshot) -> bool:
        """Whether the kept runs are victims of `job`, a funded non-debug job, after all its
        other victims: it has waited `takeback_keep_need_s` since it was submitted (0: never).
        Offered last (`CLASS_KEPT`), a kept run is taken only when no plan without it places
        the job, now or in its reservation: the job needs its GPUs (atk56-26 F1: gangs under
        the yield share and single-node jobs on a kept node waited 71 h)."""
        need = self.need_bound(job, snapshot)  # the snapshot's time, as `victim_group` knows it
        if (
            need > 0
            and snapshot.taken_at - job.submitted_at >= need
            and self.within_share(job, snapshot)
        ):
            return True
        return self.keep_owed_to(job, snapshot)

    def need_bound(self, job: PendingJob, snapshot: Snapshot) -> float:
        """How long `job` waits before the need rule offers it the kept runs:
        `takeback_keep_need_s`, and with `takeback_keep_need_by_share` that over its team's
        share of the whole tree (`team_fs`) when the team uses more than its share (a team
        using k times its share waits k times as long), at most `takeback_keep_s` (the keep's
        own lapse). A team that gets nothing has a share above 1: its bound stays the same."""
        need = self.takeback_keep_need_s
        if need <= 0 or not self.takeback_keep_need_by_share:
            return need
        share = team_fs(team_of(job.account, self.team_depth), snapshot.level_fs)
        if share is None or share >= 1.0:
            return need
        return min(self.takeback_keep_s, need / share) if share > 0 else self.takeback_keep_s

    def within_share(self, job: PendingJob, snapshot: Snapshot) -> bool:
        """Whether `job`'s team may claim the kept runs by the need rule
        (`takeback_keep_need_fs`, 0: every team): its share of the whole tree (`team_fs`:
        allocated over used, decayed) is at least that, or unknown. A team over its share waits
        by fairness, not by the keep: on Philly seed 2, 91 of the 130 kept runs the need rule
        took back went to the one team asking 7.3 times its share, whose jobs waited because
        it had had its share (s60-policy)."""
        floor = self.takeback_keep_need_fs
        if floor <= 0:
            return True
        share = team_fs(team_of(job.account, self.team_depth), snapshot.level_fs)
        return share is None or share >= floor

    def keep_owed_to(self, job: PendingJob, snapshot: Snapshot) -> bool:
        """Whether `job`'s team is owed the kept runs at once (`takeback_keep_owed_fs`, 0:
        never): no funded job of its team holds a GPU now and its share of the whole tree
        (`team_fs`: allocated over used, decayed) is at least that (it has used at most 1/that
        of its share). A keep held against a team that gets nothing is a lock-out however long
        or short the job's wait (atk56-26 F1); one held against a team that runs work, or has
        had its share, is the free tier's protection."""
        owed = self.takeback_keep_owed_fs
        if owed <= 0:
            return False
        team = team_of(job.account, self.team_depth)
        if team in self._holding(snapshot):
            return False
        share = team_fs(team, snapshot.level_fs)
        return share is not None and share >= owed

    def _holding(self, snapshot: Snapshot) -> frozenset[str]:
        """The teams whose funded work holds GPUs now (once per snapshot)."""
        key = ("fairshare-17 holding", self.team_depth)
        found: frozenset[str] | None = snapshot.memo.get(key)
        if found is None:
            found = snapshot.memo[key] = frozenset(
                team_of(r.account, self.team_depth) for r in snapshot.running
                if r.min_runtime_s > 0
            )  # fmt: skip
        return found

    @property
    def _keep_needs(self) -> bool:
        """Whether `keep_needed_by` can be true (a setting of it is on)."""
        return self.takeback_keep_need_s > 0 or self.takeback_keep_owed_fs > 0

    def keep_yields_to(self, job: PendingJob, snapshot: Snapshot) -> bool:
        """Whether the kept runs are victims like any other of `job`, a funded non-debug job:
        it asks at least `takeback_keep_yield_share` of its pool's active GPUs (0: never). A
        gang that large needs nodes whole, and the free tier's other runs may not free enough
        of them: one kept 8-GPU run held a 32-GPU gang out for 71 h (atk55-26 F1)."""
        share = self.takeback_keep_yield_share
        return share > 0 and job.gpus >= share * pool_gpus(snapshot, job)

    def job_traits(self, job: PendingJob, snapshot: Snapshot) -> Hashable:
        """The traits before, with `keep_needed_by` when it is on: `victim_group` reads it, so
        a job that has waited the bound is not answered as a newer one of its team and shape
        (`decide()` asks once per traits in a cycle)."""
        traits = super().job_traits(job, snapshot)
        if not self._keep_needs or self.lane(job):
            return traits
        return (traits, self.keep_needed_by(job, snapshot))

    def victim_group(self, job: PendingJob, snapshot: Snapshot) -> Hashable:
        """`fairshare-7`'s groups, split by `keep_yields_to` when it is on: the kept runs are
        victims of a large job, not of a small one of the same team."""
        group = super().victim_group(job, snapshot)
        if self.takeback_keep_yield_share <= 0 or self.lane(job):
            if not self._keep_needs or self.lane(job):
                return group
            return (group, "keep needed", self.keep_needed_by(job, snapshot))
        group = (group, "keep yields", self.keep_yields_to(job, snapshot))
        if not self._keep_needs:
            return group
        return (group, "keep needed", self.keep_needed_by(job, snapshot))

    def victims(
        self, job: PendingJob, candidates: Iterable[RunningJob], snapshot: Snapshot, now: float
    ) -> Iterator[Victim]:
        """`fairshare-7`'s victims, but for funded non-debug work the runs `kept_runs` keeps
        (unless `keep_lapsed_for` the job or it is one `keep_yields_to`) and
        `takeback_grace_s`'s, as `fairshare-16`."""
        found = FairShare7.victims(self, job, candidates, snapshot, now)
        if self.free_victims_by_share:
            found = self._costed_by_share(found, snapshot, now)
        if self.funded_queued_bound_s > 0 and not self.lane(job):
            found = (v for v in found if v.reason != "fairness" or not self.spares_waited(v.job))
        grace = self.takeback_grace_s
        if self.lane(job) or (self.takeback_limit <= 0 and grace <= 0):
            yield from found
            return
        kept = self.kept_runs(snapshot, now)
        if kept and (self.keep_lapsed_for(job, now) or self.keep_yields_to(job, snapshot)):
            kept = frozenset()
        last: list[Victim] | None = [] if kept and self.keep_needed_by(job, snapshot) else None
        for v in found:
            r = v.job
            if last and v.cost[0] > CLASS_KEPT:  # in the victims' order (by class, then cost)
                yield from last
                last = []
            if r.min_runtime_s <= 0 and (r.job_id in kept or now - r.placed_at < grace):
                if last is not None and r.job_id in kept and now - r.placed_at >= grace:
                    cost = (CLASS_KEPT, *v.cost[1:])
                    last.append(msgspec.structs.replace(v, cost=cost, note="kept run, needed"))
                continue
            yield v
        if last:
            yield from last

    def _costed_by_share(
        self, found: Iterable[Victim], snapshot: Snapshot, now: float
    ) -> Iterator[Victim]:
        """`found` with each unfunded victim's cost by `victim_key_in` (the candidates come in
        its order, so the victims stay in cost order)."""
        key = self.victim_key_in(snapshot)
        for v in found:
            if v.cost[0] == CLASS_UNFUNDED:
                v = msgspec.structs.replace(v, cost=key(v.job, now))
            yield v

    def drains_for(self, job: PendingJob, snapshot: Snapshot) -> bool:
        """Whether `job`, left waiting, drains a node for itself (`free_drain_gpus`, 0: no
        job): an unfunded job asking at least that many GPUs. The engine asks it of the free
        tier's jobs in order and the first one that does holds the node closest to free for
        the cycle (`engine._drain_for`): the free tier's later jobs are not placed there."""
        floor = self.free_drain_gpus
        return floor > 0 and job.min_runtime_s <= 0 and job.gpus >= floor

    def hold_window_for(self, job: PendingJob) -> float:
        """How far ahead `job`'s reservation may free (`engine._hold_for`'s window; inf: any
        time): `debug_hold_window_s` for a debug-lane job's."""
        if self.debug_hold and self.lane(job) and self.debug_hold_window_s > 0:
            return self.debug_hold_window_s
        return math.inf

    def holds_for(self, job: PendingJob, snapshot: Snapshot) -> bool:
        if self.debug_hold and self.lane(job):
            return True
        return super().holds_for(job, snapshot)

    def hold_takes(self, job: PendingJob, running: RunningJob, snapshot: Snapshot) -> bool | None:
        """For a debug-lane job's reservation: None, the engine's rule (a job it may preempt
        frees at its contract's end, any other at its declared limit's end, never without one);
        None for any other job's too (`fairshare-7`'s rule)."""
        return None
