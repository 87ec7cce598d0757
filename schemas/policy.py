"""Policy configs: the settings of every registered scheduling policy version, as typed values.

One frozen Struct per policy version, tagged by the version string (`version` on the wire), so a
config names the code that reads it: `FairShareConfig` is "fairshare-1", `FifoConfig` "fifo-1",
`SlurmConfig` "slurm-1", `LegacyConfig` "legacy-1", `FairShare2Config` "fairshare-2",
`FairShare3Config` "fairshare-3", `FairShare4Config` "fairshare-4", `FairShare5Config`
"fairshare-5", and the current versions `FairShare6Config` "fairshare-6", `Slurm2Config`
"slurm-2", `SlurmLab2Config` "slurm-lab-2" (Slurm as a lab configures it; `SlurmLabConfig`
"slurm-lab-1" before its runs ended at their time limits), `Legacy2Config` "legacy-2".
`AnyPolicyConfig` is their union: decode one with
`msgspec.json.decode(data, type=AnyPolicyConfig)`. A policy whose behaviour changes gets a new
version and a new Struct here; an old one stays as long as its decisions must replay.

`ledger.dispatch.registry` builds the policy of a config (`build`). Decision records before
`cycle.decided.v3` wrote a config as strings (`settings`); `schemas.codec` reads them back as typed
configs once (`from_settings`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

import msgspec

from schemas.bounds import INT32_MAX, TEN_YEARS_S, Name, TeamDepth
from schemas.errors import InvalidCommand, UnknownEntity

WEEK_S = 7 * 24 * 3600.0
NO_BOUND = 1e9
"""The largest `NonNegative` setting: as a time, ~31.7 years (for ever); as a share, no bound."""

NonNegative = Annotated[float, msgspec.Meta(ge=0, le=1e9)]
Searches = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
AtLeastOne = Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)]
Factor = Annotated[float, msgspec.Meta(ge=1, le=1e9)]
Span = Annotated[float, msgspec.Meta(gt=0, le=float(TEN_YEARS_S))]
Caps = Annotated[
    dict[Name, Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]], msgspec.Meta(max_length=100_000)
]


class PolicyConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="version"
):
    """The root of the policy configs; `version` is the tag."""

    @property
    def version(self) -> str:
        """The policy version this config is for (its tag)."""
        tag = type(self).__struct_config__.tag
        assert isinstance(tag, str)
        return tag


class FairShareConfig(PolicyConfig, frozen=True, kw_only=True, tag="fairshare-1"):
    """Hierarchical fair share with contracts, a preemption margin, squatting and a debug lane
    (ranks people: a leaf outranking another by the margin may preempt it)."""

    margin: NonNegative = 0.1
    """Hysteresis: a fair-share preemption needs the waiting side's level fair share to exceed
    the victim side's by the factor 1 + margin."""
    min_rank_gap: AtLeastOne = 1
    """The rank difference needed when level fair shares are missing."""
    squat_after_s: NonNegative = 3600.0
    """A job past its contract with low utilisation for this long is squatting."""
    squat_util_pct: Annotated[float, msgspec.Meta(ge=0, le=100)] = 10.0
    """The utilisation below which a job counts as low."""
    debug_lane: bool = True
    """Funded debug-class jobs may preempt any job past its contract, whatever the ranks."""
    search_budget: Searches = 32
    """At most this many victim searches per cycle."""


class FifoConfig(PolicyConfig, frozen=True, kw_only=True, tag="fifo-1"):
    """First come, first served; never preempts."""


class SlurmConfig(PolicyConfig, frozen=True, kw_only=True, tag="slurm-1"):
    """Slurm-like multifactor priority over half-life-decayed Fair Tree ranks; preemption by
    partition tier only (funded over unfunded)."""

    weight_fairshare: NonNegative = 10_000.0
    weight_age: NonNegative = 1_000.0
    max_age_s: Span = WEEK_S
    half_life_s: Span = WEEK_S
    """PriorityDecayHalfLife: the rank source decays usage with it."""
    search_budget: Searches = 32


class LegacyConfig(PolicyConfig, frozen=True, kw_only=True, tag="legacy-1"):
    """Static priority levels, per-team caps on non-preemptible GPUs, preemptible overflow."""

    caps: Caps = msgspec.field(default_factory=dict)
    """Team path -> GPUs it may hold non-preemptibly."""
    team_depth: TeamDepth = 2
    search_budget: Searches = 32


class FairShare2Config(PolicyConfig, frozen=True, kw_only=True, tag="fairshare-2"):
    """Fair share between teams without churn (see `ledger.dispatch.fairshare2` for the cost
    model): fairness preemption only between teams, victims by least GPU-seconds lost, a debug
    lane ahead of the fair-share order with its own searches, and reserved debug capacity."""

    team_depth: TeamDepth = 2
    """The tree level whose accounts are teams (2: program/project)."""
    margin: NonNegative = 0.1
    """Hysteresis: the waiting team's level fair share must exceed the victim team's by the
    factor 1 + margin."""
    min_rank_gap: AtLeastOne = 1
    """The team rank difference needed when level fair shares are missing."""
    gain_horizon_s: Span = 3600.0
    """What a fairness preemption gains: the waiting job's GPUs x this many seconds of work its
    team gets now rather than later. A plan whose funded work lost (GPU-seconds) exceeds it is
    not taken."""
    spare_ratio: Factor = 5.0
    """The wide margin: a funded non-resumable job past its contract is preempted for fairness
    only when the waiting team's level fair share is at least this many times the victim
    team's."""
    squat_after_s: NonNegative = 3600.0
    """A job past its contract with low utilisation for this long is squatting."""
    squat_util_pct: Annotated[float, msgspec.Meta(ge=0, le=100)] = 10.0
    """The utilisation below which a job counts as low."""
    search_budget: Searches = 32
    """Victim searches per cycle for non-debug jobs."""
    debug_lane: bool = True
    """Debug-class jobs come first, with their own searches, and may preempt unfunded or
    resumable jobs past their contracts, of any team."""
    debug_search_budget: Searches = 32
    """Victim searches per cycle for debug-class jobs."""
    debug_victim_ratio: Factor = 2.0
    """A debug job never preempts a job holding more than this many times its GPUs."""
    debug_reserve_per: Searches = 128
    """Keep one node in this many of each pool (at least one) for debug jobs: funded non-debug
    jobs are not placed there; unfunded jobs borrow it while it is idle. 0: no reserve."""


class FairShare3Config(FairShare2Config, frozen=True, kw_only=True, tag="fairshare-3"):
    """`fairshare-2`'s settings, for the version that settles fairness by each team's share of
    the whole tree (not Fair Tree's level fair shares where two teams part): a team that uses no
    more than its share is never a fairness victim; gang plans of least GPU-seconds lost;
    debug-lane jobs of one size share their victim searches."""

    margin: NonNegative = 0.1
    """Hysteresis: the waiting team's share of the whole tree must exceed the victim team's by
    the factor 1 + margin (Fair Tree's level fair shares where a share is unknown)."""
    spare_ratio: Factor = 5.0
    """The wide margin: a funded non-resumable job past its contract is preempted for fairness
    only when the waiting team's share of the whole tree is at least this many times the victim
    team's."""
    debug_search_budget: Searches = 8
    """Victim searches per cycle for debug-class jobs (the reserved node places most of them
    without a search)."""


class FairShare4Config(FairShare3Config, frozen=True, kw_only=True, tag="fairshare-4"):
    """`fairshare-3`'s code with half its credited gain: a fairness preemption may cost at most
    the waiting job's GPUs x 30 minutes of funded work (funded GPU-hours lost to preemption on
    the synthetic workload at 1,024 GPUs: 2.74% with 1 h, 0.83% with 30 min, owed unchanged)."""

    gain_horizon_s: Span = 1800.0
    """What a fairness preemption gains: the waiting job's GPUs x this many seconds of work its
    team gets now rather than later. A plan whose funded work lost (GPU-seconds) exceeds it is
    not taken."""


class FairShare5Config(FairShare4Config, frozen=True, kw_only=True, tag="fairshare-5"):
    """`fairshare-4`'s settings, for the version that orders unfunded work so that jobs that
    never ran go before jobs that ran and were preempted (every unfunded job gets a turn before
    any gets a second one)."""


class FairShare6Config(FairShare5Config, frozen=True, kw_only=True, tag="fairshare-6"):
    """`fairshare-5`'s code with a larger debug reserve: one node in 16 of each pool (lent to
    unfunded work while no debug job needs it). On the synthetic workload's 7-day burst at 1,024
    GPUs it takes the overall wait p90 from 11.0 h to 2.4 h (under `slurm`'s 2.7 h) with owed
    100% by period and funded loss 0.84%."""

    debug_reserve_per: Searches = 16
    """Keep one node in this many of each pool (at least one) for debug jobs: funded non-debug
    jobs are not placed there; unfunded jobs borrow it while it is idle. 0: no reserve."""


class FairShare7Config(FairShare6Config, frozen=True, kw_only=True, tag="fairshare-7"):
    """`fairshare-6` measured by every wait and a fixed yardstick, on workloads it was not tuned
    on (docs/simulation.md): debug jobs preempt unfunded work of any size (the free tier is
    preemptible by contract); a plan's price counts a restart overhead per funded victim; the
    top funded job asking at least `hold_share` of its pool gets a reservation that drains
    toward it as contracts end; the debug reserve is `debug_reserve_per` (0: none)."""

    debug_reserve_per: Searches = 0
    requeued_last: bool = True
    """`fairshare-5`'s step: unfunded jobs that ran and were preempted go after those that
    never ran."""
    relaunch_cost_s: NonNegative = 300.0
    """The restart overhead a preemption costs a funded victim (GPUs x this), added to the work
    it loses when a plan is weighed against its gain."""
    hold_share: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.125
    """A funded job asking at least this share of its pool's GPUs, left waiting, gets a
    reservation (0: none): the nodes it can have soonest as contracts end; unfunded jobs and
    jobs whose time limit ends before it backfill them."""
    hold_expect_s: NonNegative = 0.0
    """For a reservation's time, a running job that declared no time limit and that the
    reserving job may not preempt is expected to end this long after its contract (0: never,
    so its nodes are not held)."""
    gain_aging: NonNegative = 0.0
    """Seconds added to the gain horizon per second the waiting job has waited since it was
    submitted: a plan's credited gain grows with the wait it ends."""


class FairShare8Config(FairShare7Config, frozen=True, kw_only=True, tag="fairshare-8"):
    """`fairshare-7` whose reservation stays with one large job until it starts: the oldest
    funded job asking at least `hold_share` of its pool (Slurm backfill's top job, lifted by
    age), considered first among funded jobs (docs/simulation.md, Policy v3)."""

    hold_pick: Literal["first", "oldest"] = "oldest"
    """Which large funded job gets the reservation: "oldest" (submitted first, then the lowest
    id; the same job every cycle until it starts) or "first" (the first in the team order,
    `fairshare-7`'s rule)."""
    hold_lift: bool = True
    """The reserved job goes first among funded non-debug jobs (a sort key part of its own)."""
    hold_lift_after_s: NonNegative = 0.0
    """With `hold_lift`, the reserved job goes first only once it has waited this long since
    it was submitted (by the snapshot's time): Slurm's age factor, which lifts a job as it
    ages."""
    hold_lift_fs: NonNegative = 0.0
    """With `hold_lift`, the reserved job goes first only while its team's share of the whole
    tree (share over usage, `team_fs`) is at least this (1: a team using no more than its
    share; 0: always)."""
    hold_early: bool = False
    """The reservation is made before any job is considered, so jobs ahead of the reserved one
    in the order respect it too (only backfill goes there); else when the cycle reaches it."""


class FairShare9Config(FairShare7Config, frozen=True, kw_only=True, tag="fairshare-9"):
    """`fairshare-7` under which no job holds the cluster forever (atk33-26 F3): a funded job
    that has waited `starve_after_s` since it was submitted (and never ran) is no longer
    refused a plan for the work its victims would lose (a non-resumable victim with no time
    limit loses more the longer it runs, so no gain ever outweighed it); until then the jobs
    refused that way wait with the refusal and the time it ends as their reason."""

    starve_after_s: NonNegative = 86_400.0
    """A funded job that never ran and has waited this long (a day) takes a plan whatever its
    victims lose (0: never; the victims are still only those `fairshare-7` offers it: past
    their contracts, of a team it outranks by the margin, a non-resumable one by
    `spare_ratio`)."""


class FairShare10Config(FairShare9Config, frozen=True, kw_only=True, tag="fairshare-10"):
    """`fairshare-9`'s code whose order moves inside one cycle: every funded job the cycle places
    charges its team (and so the team's ancestors) with the usage it commits to, its GPUs x
    `charge_s` (0: its contract, `min_runtime_s`), before the next job is ranked, so teams
    tied at zero usage share an idle cluster by their shares in the first cycle instead of the
    first team taking it all (Kueue's and Slurm Fair Tree's behaviour; docs/dispatch.md)."""

    charge_s: NonNegative = 0.0
    """The seconds of usage a placement charges per GPU inside the cycle; 0: the job's
    contract (`min_runtime_s`, the usage the placement certainly adds)."""
    starve_after_s: NonNegative = 0.0
    """`fairshare-9`'s rule, off by default (0): it is not the default policy's
    (docs/dispatch.md: a chain of kills where nobody tuned it), so `fairshare-10` against the
    default (`fairshare-7`) differs by the charge alone; `--set starve_after_s=86400` is
    `fairshare-9`'s day."""


class FairShare11Config(FairShare8Config, frozen=True, kw_only=True, tag="fairshare-11"):
    """`fairshare-8`'s reservation for the oldest large funded job, binding every job (only jobs
    that end before it starts, and unfunded ones, use its nodes) but only once its nodes all
    free within `hold_window_s` (Slurm's `bf_window`), and not lifted ahead of the team order
    (docs/dispatch.md, docs/simulation.md)."""

    hold_lift: bool = False
    hold_early: bool = True
    hold_window_s: NonNegative = 3_600.0
    """The oldest large job's reservation binds the jobs ahead of it in the order only when its
    nodes all free within this long from now (0: whenever they free in finite time, as
    `fairshare-8`'s `hold_early`); else it holds nodes only when the cycle reaches it."""
    hold_early_after_s: NonNegative = 86_400.0
    """The binding reservation is made only for a job that has waited this long since it was
    submitted (a day; 0: at once)."""


class FairShare12Config(FairShare11Config, frozen=True, kw_only=True, tag="fairshare-12"):
    """A reservation for a large funded job of a team under its share, made at once and binding
    every job (only unfunded jobs and jobs whose declared limit ends before it starts use its
    nodes), on the nodes that free soonest when unfunded and resumable jobs of any team end
    their contracts; when every job left there is past its contract, the reserved job preempts
    them and starts (docs/dispatch.md, docs/simulation.md)."""

    hold_window_s: NonNegative = 0.0
    hold_early_after_s: NonNegative = 0.0
    hold_team_fs: NonNegative = 0.0
    """Only a job of a team whose share of the whole tree (share over usage, `team_fs`) is at
    least this gets the early reservation (1: a team using no more than its share; 0: any
    team); with none, `fairshare-7`'s reservation (the first large job in the order)."""
    hold_by: Literal["oldest", "share"] = "oldest"
    """Which of those jobs: the oldest (submitted first, then the lowest id) or the one of the
    team with the highest share of the whole tree (then the oldest)."""
    hold_start: bool = True
    """When every job on the reserved nodes is past its contract, the reserved job preempts
    them and starts there (no cost-model refusal); off: it waits for them to end or for a
    fairness plan, as `fairshare-11`."""
    hold_binds: bool = True
    """The reservation binds every other job (only unfunded jobs and jobs whose declared limit
    ends before it starts use its nodes); off: it binds none and only names the nodes the job
    starts on once every job there is past its contract (`hold_start`)."""
    hold_victim_fs: NonNegative = 1.0
    """Only funded jobs of a team whose share of the whole tree is below this are counted free
    for the reservation at their contracts' ends (and preempted to start it): 1 spares every
    team using no more than its share; 0: any team."""


class FairShare13Config(FairShare12Config, frozen=True, kw_only=True, tag="fairshare-13"):
    """`fairshare-12`'s reservation, drained only of unfunded work and the reserved job's own
    team's resumable work (other teams' funded work frees its nodes at its declared limit only),
    with debug-lane jobs let onto the held nodes (docs/dispatch.md, docs/simulation.md)."""

    hold_drain: Literal["over", "own", "fair"] = "own"
    """Which running jobs free the reservation's nodes at their contracts' ends (and are
    preempted to start it): "own", unfunded jobs and resumable jobs of the reserved job's own
    team; "fair", those and the jobs fair share offers the reserved job as victims (teams it
    outranks by the margin); "over", `fairshare-12`'s (resumable jobs of teams below
    `hold_victim_fs`)."""
    hold_debug: bool = True
    """Debug-lane jobs may be placed on the held nodes (and preempt there as their lane
    allows): they end within 15 minutes."""


class FairShare14Config(FairShare13Config, frozen=True, kw_only=True, tag="fairshare-14"):
    """`fairshare-13` with a moment's victim-search budget carried into one cycle: when the
    cycle's `search_budget` runs out after it placed or preempted, it goes on with the next
    one (at most `search_rounds` in all) instead of asking for another cycle at once
    (docs/dispatch.md, docs/simulation.md)."""

    search_rounds: AtLeastOne = 4
    """Budgets a cycle may draw on, one after the other (each renewed only after a placement or
    preemption since the last); the simulator then cycles again at once no more (it did up to 4
    times, each cycle with one budget)."""


class FairShare16Config(FairShare7Config, frozen=True, kw_only=True, tag="fairshare-16"):
    """`fairshare-7` with the free tier's takebacks priced and bounded (docs/dispatch.md,
    docs/simulation.md "fairshare-16"; `fairshare-15` was an unmerged branch's, skipped)."""

    takeback_price_s: NonNegative = 3600.0
    """An unfunded victim costs, beside the work it loses, its GPUs x this for every time it was
    taken back before: among the free tier, plans take the jobs taken back fewest times first."""
    takeback_limit: Searches = 0
    """An unfunded job taken back this many times is no victim of funded non-debug work (0: no
    bound)."""
    takeback_grace_s: NonNegative = 0.0
    """An unfunded job placed less than this long ago is no victim of funded non-debug work."""
    funded_takeback_price_s: NonNegative = 1800.0
    """A funded fairness victim costs, when a plan is weighed against its gain, its GPUs x this
    for every time it was taken back before (beside its lost work and restart overhead)."""
    takeback_spread: bool = True
    """On: the free tier's jobs taken back fewest times are taken first (the takebacks spread
    over many jobs); off: those taken back most (up to 16), so the takebacks stay with few jobs
    and the rest run undisturbed."""
    requeued_first: bool = False
    """Unfunded jobs that ran and were preempted go before those that never ran (`requeued_last`
    turned round; off: `fairshare-7`'s order)."""


class FairShare17Config(FairShare16Config, frozen=True, kw_only=True, tag="fairshare-17"):
    """`fairshare-16` with its prices off by default, the free tier oldest first and taken back
    from its newest arrivals, and a node kept for a waiting debug job (docs/dispatch.md,
    docs/simulation.md "fairshare-17")."""

    takeback_price_s: NonNegative = 0.0
    funded_takeback_price_s: NonNegative = 0.0
    takeback_limit: Searches = 3
    """An unfunded job that another team's funded non-debug work took back this many times is no
    victim of funded non-debug work (0: no bound), within `takeback_keep_s` and
    `takeback_keep_share`."""
    takeback_keep_s: NonNegative = NO_BOUND
    """`takeback_limit` keeps a run this long after it was placed, then it is a victim again.
    A policy built today gets 72 h (`BUILT_WITH`; s54-fs17fix's 6 h before s55: a log records
    its value, so its decisions replay as made); this default, for ever, is what a record
    without the setting was written with (fairshare-17 as first merged, s54's d46c2db)."""
    takeback_keep_share: NonNegative = NO_BOUND
    """The runs `takeback_limit` keeps hold at most this share of the cluster's active GPUs
    (oldest submission first). A policy built today gets 0.0625 (`BUILT_WITH`; 0.125 before
    s55); this default, no bound, is what a record without the setting was written with."""
    takeback_keep_wait_s: NonNegative = 0.0
    """A funded non-debug job that has waited this long since it was submitted takes back the
    runs `takeback_limit` keeps like any other unfunded run (0: never; s55 candidate, atk55-26
    F1: one kept 8-GPU run held a 32-GPU gang out for 71 h)."""
    takeback_keep_yield_share: NonNegative = 0.0
    """The runs `takeback_limit` keeps are victims like any other unfunded run of a funded
    non-debug job asking at least this share of its pool's active GPUs (0: of none; s56,
    atk55-26 F1: one kept 8-GPU run held a 32-GPU gang out for 71 h). A policy built today gets
    0.125, `hold_share`'s default (`BUILT_WITH`); this default, 0, is what a record without the
    setting was written with (the s55 keep and older)."""
    takeback_keep_need_s: NonNegative = 0.0
    """The runs `takeback_limit` keeps are victims of a funded non-debug job that has waited
    this long since it was submitted, offered after every other unfunded run and squatter and
    before funded work (a plan takes one only when no plan of cheaper victims places the job:
    it needs its GPUs); 0: never (s56-keep2, atk56-26 F1: a 28-GPU gang of 256 GPUs, under the
    yield share, waited 71 h). A policy built today gets `BUILT_WITH`'s; this default, 0, is
    what a record without the setting was written with."""
    takeback_keep_per_pool: bool = False
    """`takeback_keep_share` bounds the kept runs of each pool (GPU type and cluster) by that
    share of the pool's active GPUs, not of the cluster's (atk56-26 F2: a small pool could be
    kept whole). A policy built today gets True (`BUILT_WITH`); a record without it, False."""
    takeback_keep_owed_fs: NonNegative = 0.0
    """The runs `takeback_limit` keeps are victims (after every other unfunded run and
    squatter, as `takeback_keep_need_s`'s) of a funded non-debug job whose team holds no GPU now
    (no funded job of it runs) and whose share of the
    whole tree (allocated over decayed use) is at least this: a team that has used at most
    1/this of its share is owed them at once (s58, atk56-26 F1: the 2 h need bound still left
    W28's team at 52.5%); 0: never, what a record without the setting was written with."""
    takeback_keep_need_fs: NonNegative = 0.0
    """`takeback_keep_need_s` offers the kept runs only to a job whose team's share of the whole
    tree (allocated over decayed use) is at least this: a team over its share waits by
    fairness, not by the keep (s60-policy: on Philly seed 2 the heaviest team's jobs took 91 of
    the 130 kept runs the need rule took back); 0: every team, what a record without the
    setting was written with."""
    takeback_keep_need_by_share: bool = False
    """`takeback_keep_need_s` is, for a job of a team over its share of the whole tree, that
    bound over the team's share (a team using k times its share waits k times as long), at most
    `takeback_keep_s` (s60-policy); False: the same bound for every team, what a record without
    the setting was written with."""
    free_order: Literal["oldest", "smallest", "team", "waited", "user_share", "team_share"] = (
        "oldest"
    )
    """"oldest": unfunded jobs go by submit time alone after every funded job (a requeue keeps
    its submit time); "smallest": by GPUs asked (fewest first), then by submit time; "team":
    `fairshare-7`'s order (team, priority, user, `requeued_last`); "waited": by the time queued
    so far, every wait counted (submit time plus the seconds its runs held GPUs), longest first
    (s63-policy); "user_share": `slurm-lab-2`'s scavenger order, the user's Fair Tree factor
    weighted 10,000 against age's 1,000 (age capped at 7 days), then submit time; "team_share":
    the same with the team's place by its share of the whole tree (s63-policy2)."""
    free_age_price: NonNegative = 1.0
    """An unfunded victim costs, beside the work it loses, its GPUs x this x the seconds since it
    was submitted: funded work takes back the free tier's newest arrivals first (0: off)."""
    free_age_queued: bool = False
    """`free_age_price` counts the seconds the victim queued before its run (every wait) instead
    of the seconds since it was submitted: funded work takes back the free tier's runs that
    waited least first (s63-policy); False: since submission, what a record without the setting
    was written with."""
    funded_queued_bound_s: NonNegative = 0.0
    """A funded run whose job queued at least this long before it (every wait counted) is no
    fairness victim: a takeback of a team's funded work is refused once its waits reach this
    (s63-policy, issue 26: on Philly seed 2 the over-share team's funded jobs above the all-waits
    p90 line were mostly taken back, one 36 times; `slurm-lab-2` takes none back); 0: no bound,
    what a record without the setting was written with."""
    free_victims_by_share: bool = False
    """An unfunded victim's age price counts, instead of its age, its place in the free tier's
    order by share (`free_order` "user_share" / "team_share"'s priority read as seconds of age):
    funded work takes back the heaviest user's (team's) newest run first (s63-policy2); False:
    by age, what a record without the setting was written with."""
    free_share_large: NonNegative = 0.0
    """With `free_order` "user_share" / "team_share", an unfunded job asking at least this share
    of its pool's active GPUs (the large jobs: 0.125) takes the best place's fair-share factor,
    so the free tier's gangs go by age ahead of its small jobs, as under "oldest" they go by age
    among them (s63-policy3: on the large-mix corner the large-job wait p90 is the free tier's
    32- and 64-GPU gangs', and the share order left a heavy user's gang unplaced for 103 h);
    0: none, what a record without the setting was written with."""
    free_share_large_head: bool = False
    """`free_share_large` gives the best place to the free tier's oldest such job alone, not to
    every one (s63-policy3); False: to every one, what a record without the setting was written
    with."""
    debug_hold: bool = True
    """A debug-lane job that cannot be placed reserves the node it can have soonest (a job it
    may preempt frees at its contract's end, any other at its declared limit's end, never
    without one); no funded non-debug job is placed on its free GPUs meanwhile."""
    debug_hold_window_s: NonNegative = 3_600.0
    """No such reservation when that node frees later than this from now (0: any time)."""
    free_drain_gpus: Searches = 0
    """The free tier's first waiting single-node job asking at least this many GPUs holds the
    node closest to free (the most GPUs free now): no later unfunded job is placed on it while
    it waits, so the node drains toward it as its runs end (s60-policy2, issue 26: on Philly
    the free tier's 8-GPU jobs waited behind its later 4-GPU jobs taking the half-free nodes);
    0: none, what a record without the setting was written with."""
    free_drain_takes: bool = False
    """Instead, that job takes back the free tier's runs submitted after it on the node where
    that loses the least work (each on that node alone; none of an older job, none of funded
    work) and is placed there; when no node allows it, nothing (s60-policy2). False: it holds
    the node, what a record without the setting was written with."""
    plans_tried: Searches = 1
    """How many least-loss victim plans a search weighs: when `weigh` refuses one (it loses
    more funded work than it gains), the next cheapest on none of the nodes the refused plan's
    dearest victim holds, up to this many in all, each a search of the job's budget (s58,
    atk56-26: one refused plan left a job waiting while another plan would have been taken).
    A policy built today gets `BUILT_WITH`'s; this default, 1, is what a record without the
    setting was written with."""


class Slurm2Config(PolicyConfig, frozen=True, kw_only=True, tag="slurm-2"):
    """Slurm's multifactor priority as configured by default: no preemption unless
    `preempt_unfunded` (PreemptType=preempt/partition_prio with a scavenger partition)."""

    weight_fairshare: NonNegative = 10_000.0
    weight_age: NonNegative = 1_000.0
    max_age_s: Span = WEEK_S
    half_life_s: Span = WEEK_S
    """PriorityDecayHalfLife: the rank source decays usage with it."""
    preempt_unfunded: bool = False
    """Funded jobs may preempt unfunded ones (a lower partition tier)."""
    search_budget: Searches = 32


class SlurmLabConfig(PolicyConfig, frozen=True, kw_only=True, tag="slurm-lab-1"):
    """Slurm as a lab configures it (docs/simulation.md cites Slurm's documentation for each
    setting): multifactor priority with Fair Tree fair share on the budget tree (usage decayed
    with PriorityDecayHalfLife), age and QOS factors; a debug QOS on top with a small debug
    partition of its own; the free tier (unfunded jobs) in a scavenger QOS that funded and
    debug jobs preempt (PreemptType=preempt/qos, PreemptMode=REQUEUE); and backfill with a
    reservation for the top waiting job (sched/backfill)."""

    weight_fairshare: NonNegative = 10_000.0
    """PriorityWeightFairshare."""
    weight_age: NonNegative = 1_000.0
    """PriorityWeightAge."""
    max_age_s: Span = WEEK_S
    """PriorityMaxAge: the age factor is 1 from this age on."""
    half_life_s: Span = WEEK_S
    """PriorityDecayHalfLife: the rank source decays usage with it."""
    debug_nodes_per: Searches = 32
    """The debug partition: one node in this many of each pool (at least one) runs only debug
    jobs (and scavenger jobs, which they preempt). 0: no debug partition."""
    preempt_unfunded: bool = True
    """Funded and debug jobs preempt scavenger (unfunded) jobs, which are requeued."""
    backfill: bool = True
    """sched/backfill: the top waiting job gets a reservation; later jobs use its nodes only
    when their time limits end before it starts."""
    default_time_limit_s: Span = 3 * 86_400.0
    """The partition's DefaultTime: the time limit backfill assumes for a job that declared
    none."""
    overdue_s: Span = 3_600.0
    """When a job runs past the time limit backfill assumed (Slurm would have ended it; here it
    runs on), backfill expects it to end this long after now."""
    search_budget: Searches = 32


class SlurmLab2Config(SlurmLabConfig, frozen=True, kw_only=True, tag="slurm-lab-2"):
    """`slurm-lab-1` whose runs end at their time limits, as slurmctld ends them (job state
    TIMEOUT): a job that declared none gets the partition's DefaultTime (`default_time_limit_s`)
    as its limit when submitted, so no run outlives the limit backfill assumes (slurm-lab-1's
    ran on past it, and its reservations waited `overdue_s` at a time for ends that did not
    come: atk52-26 F3)."""

    limit_runs: bool = True
    """Jobs that declared no time limit get `default_time_limit_s`, and every run ends at its
    limit (the simulator resubmits what is left: docs/simulation.md)."""


class Legacy2Config(PolicyConfig, frozen=True, kw_only=True, tag="legacy-2"):
    """Static priority levels and per-team caps, with one victim search per team and cycle and
    none by jobs beyond their team's cap."""

    caps: Caps = msgspec.field(default_factory=dict)
    """Team path -> GPUs it may hold non-preemptibly."""
    team_depth: TeamDepth = 2
    search_budget: Searches = 32


AnyPolicyConfig = (
    FairShare17Config
    | FairShare16Config
    | FairShare14Config
    | FairShare13Config
    | FairShare12Config
    | FairShare11Config
    | FairShare10Config
    | FairShare9Config
    | FairShare8Config
    | FairShare7Config
    | FairShare6Config
    | FairShare5Config
    | FairShare4Config
    | FairShare3Config
    | FairShare2Config
    | FairShareConfig
    | FifoConfig
    | SlurmLab2Config
    | SlurmLabConfig
    | Slurm2Config
    | SlurmConfig
    | Legacy2Config
    | LegacyConfig
)
"""Any registered policy version's config (tagged by `version`)."""

POLICY_CONFIG_TYPES: tuple[type[PolicyConfig], ...] = (
    FairShare17Config,
    FairShare16Config,
    FairShare14Config,
    FairShare13Config,
    FairShare12Config,
    FairShare11Config,
    FairShare10Config,
    FairShare9Config,
    FairShare8Config,
    FairShare7Config,
    FairShare6Config,
    FairShare5Config,
    FairShare4Config,
    FairShare3Config,
    FairShare2Config,
    FairShareConfig,
    FifoConfig,
    SlurmLab2Config,
    SlurmLabConfig,
    Slurm2Config,
    SlurmConfig,
    Legacy2Config,
    LegacyConfig,
)


BUILT_WITH: dict[str, dict[str, float | bool | str]] = {
    "fairshare-17": {
        "takeback_keep_s": 259_200.0,
        "takeback_keep_share": 0.0625,
        "takeback_keep_yield_share": 0.125,
        "takeback_keep_need_s": 7_200.0,
        "takeback_keep_per_pool": True,
        "plans_tried": 4,
        # s63-policy3: the free tier by its users' fair share (s63-policy2's UN) with its
        # oldest gang first (docs/simulation.md, "s63-policy3")
        "free_order": "user_share",
        "takeback_keep_need_fs": 1.0,
        "free_share_large": 0.125,
        "free_share_large_head": True,
    },
}
"""Version -> the settings a policy built today gets (`ledger.dispatch.registry.default_config`)
that differ from its config's defaults. A setting added to a version after logs of it were
written defaults to what the code that wrote them did (a record without it decodes to that,
so those logs replay as made: a versioned field); the value chosen for new policies is here."""


# --- the string settings of v1 and v2 decision records --------------------------------------------

_TYPES: dict[str, type[PolicyConfig]] = {
    t.__struct_config__.tag: t  # type: ignore[misc]
    for t in POLICY_CONFIG_TYPES
}
USAGE_SETTINGS = ("window_s",)
"""Strings a v1 or v2 record wrote beside the policy's settings that said how usage was counted
(the what-if's window), not how the policy decides."""


def family(version: str) -> str:
    """Pure: the policy name a version belongs to (`fairshare-6` -> `fairshare`)."""
    return version.rsplit("-", 1)[0]


def settings(config: AnyPolicyConfig) -> dict[str, str]:
    """Pure: a config as the strings v1 and v2 decision records wrote it (`config`): the policy's
    name and each setting (floats as `repr`, booleans in lower case, legacy caps as
    `team=gpus,...`). New records carry the typed config only."""
    out = {"policy": family(config.version)}
    for name in type(config).__struct_fields__:
        value = getattr(config, name)
        if isinstance(value, bool):
            out[name] = str(value).lower()
        elif isinstance(value, dict):
            out[name] = ",".join(f"{team}={gpus}" for team, gpus in sorted(value.items()))
        else:
            out[name] = repr(value) if isinstance(value, float) else str(value)
    return out


def from_settings(version: str, recorded: Mapping[str, str]) -> AnyPolicyConfig:
    """Pure: the typed config of a v1 or v2 decision recorded as `version` and its string
    settings (what `settings` writes; `USAGE_SETTINGS` are left out), so that records that said
    it in strings are read as typed configs once, by `schemas.codec`.

    A version no config type here has raises `UnknownEntity` naming it; settings that are not
    exactly those the version writes (the same keys, the same values: "3600" and "3600.0" are
    the same) raise `InvalidCommand` naming what differs."""
    kind = _TYPES.get(version)
    if kind is None:
        raise unknown_version(version)
    own = {k: v for k, v in recorded.items() if k not in USAGE_SETTINGS}
    fields = kind.__struct_fields__
    raw: dict[str, object] = {k: own[k] for k in fields if k in own}
    try:
        missing = [k for k in fields if k not in own]
        if missing:
            raise KeyError(missing[0])
        if "caps" in raw:
            raw["caps"] = _caps(own["caps"])
        config: AnyPolicyConfig = msgspec.convert(raw, kind, strict=False)  # type: ignore[assignment]
    except (KeyError, ValueError, msgspec.ValidationError) as err:
        raise InvalidCommand(
            f"the recorded config of policy {version!r} is not one its code wrote: bad or "
            f"missing setting {err}",
            hint="the decision's config was edited, or written by other code under this version",
            version=version,
        ) from err
    written = settings(config)
    differ = sorted(k for k in set(written) | set(own) if not _same(written.get(k), own.get(k)))
    if differ:
        raise InvalidCommand(
            f"the recorded config of policy {version!r} does not match what its code records "
            f"(differs in {', '.join(differ)})",
            hint="the decision's config was edited, or written by other code under this version",
            version=version,
        )
    return config


def known_version(version: str) -> bool:
    """Pure: whether this build has the code of policy `version` (its decisions replay)."""
    return version in _TYPES


def unknown_version(version: str) -> UnknownEntity:
    """Pure: the error for a decision that needs a policy version this build has no code for."""
    return UnknownEntity(
        f"this decision needs policy version {version!r}, whose code this build of "
        f"gpu-ledger does not have (it has {', '.join(sorted(_TYPES))})",
        hint=f"replay it with a gpu-ledger release that still ships {version!r}",
        version=version,
    )


def _caps(text: str) -> dict[str, int]:
    """`team=gpus,...` as `settings` writes legacy caps."""
    caps = {}
    for item in filter(None, text.split(",")):
        team, _, gpus = item.rpartition("=")
        caps[team] = int(gpus)
    return caps


def _same(a: str | None, b: str | None) -> bool:
    """Two recorded settings are the same value ("3600" and "3600.0" are)."""
    if a == b:
        return True
    if a is None or b is None:
        return False
    try:
        return float(a) == float(b)
    except ValueError:
        return False
