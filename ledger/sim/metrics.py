"""Metrics of a simulation run: the one module that computes every figure, the same way for
every policy: a fold over the ledger's events, the projection's team hours, and what each cycle
left idle.

Pure: `JobFold.apply` folds events in log order; `compute` turns the fold, the owed/delivered
team hours (from the projection) and the cycles' idle samples into one `Metrics` value. No
clock, no I/O.

Definitions (each metric says which one it is):

- *owed*, two yardsticks, each with two measures:
  - Ai2's (`owed_*`): a team's allocated fraction of the capacity, capped hour by hour at its
    demand (GPUs of its funded jobs pending or running *under the policy that ran*, so a policy
    that leaves work waiting is owed more); delivered: funded GPU-hours its jobs got;
  - the fixed yardstick (`fixed_*`, `ledger.sim.yardstick`): what a partition of the team's
    allocated size would have run of its submitted funded jobs, from the submitted demand
    alone, the same for every policy;
  - **by period** = sum delivered / sum owed over the span, capped at 1 per team; **hour by
    hour** = sum over hours of min(delivered, owed) / sum owed; **by day** the same over days.
  - the *worst team* on the fixed yardstick is given by period and, so that a lock-out cannot
    read as 100% (a team shut out for days and paid back later meets its period's volume),
    hour by hour and by day (`fixed_worst_hourly`, `fixed_worst_daily`): each team's own
    measure, the lowest of them.
- *occupancy*: GPU-hours held by any job (funded or not) / GPU-hours of capacity (nodes active or
  draining).
- *waits*, every one: from submission, and from each requeue, to the next placement; a job
  preempted without being resumable and resubmitted by its user waits again, and that wait is
  its original job's. `wait` is the distribution of every wait; `queued` gives each original
  job's total time waiting (the sum of its waits; `queued_funded` of funded jobs, debug jobs
  included; `queued_funded_nondebug` of funded jobs that are not debug jobs, so that many short
  debug jobs cannot hide a long funded wait); `wait_first` the first waits alone (what
  earlier reports called the wait). A wait still open at the end counts with its length so far
  (a lower bound), and jobs never placed are counted apart (`never_started`). A job killed by a
  preemption and not resubmitted (`--no-resubmit`) waits from its kill to the end: its work is
  still owed.
- *job completion time* (JCT): from an original job's submission to the end of its last run
  that completed it; *slowdown*: JCT / its work, the work at least 10 s (bounded slowdown). Jobs
  not done at the end count with their time so far (a lower bound; `censored`). `jct_funded`
  counts funded jobs, debug jobs included; `jct_funded_nondebug` funded jobs that are not debug
  jobs (atk54-26 F4: 40% debug jobs under 15 min read the same p90 for every policy).
- *large jobs*: those asking at least 1/8 of the GPUs of their pool (the nodes of their GPU type,
  or the cluster); their queued time (every wait) is `queued_large`.
- *longest wait under share*: the longest single wait of a funded job whose team, when the wait
  began, had been delivered less than its allocated fraction of the capacity over the trailing
  7 days (the fair-share window); at the run's first instant (no window yet), held less than it
  at that instant.
- *preemption loss*: per preemption, GPUs x the work since the last checkpoint (resumable jobs:
  the last `CheckpointReported` or placement) or since placement (others; at most the grace for
  jobs that checkpoint on SIGTERM); and per relaunch (a placement of a job that was preempted,
  or of the resubmission of one) the restart overhead (`relaunch_s`, GPUs x that long, at most
  the time it held the GPUs; a run still going at the end pays what it has by then): kind
  `relaunch`.
- *idle while funded work waited*: GPU-hours free on delivering nodes while at least one funded
  job was pending (from events: capacity less the GPUs held), and where, from what each cycle
  left free (`IdleSample`): on nodes kept for debug work (`reserve`), on nodes held for a
  reservation (`held`), free GPUs no waiting job could use (`fragmented`), and the rest.
- *fragmentation*: free GPUs the waiting jobs cannot use (`placement.fragmentation`), averaged
  over time between cycles, as a share of capacity.
- *convergence*: per day, the total-variation distance between the teams' shares of funded
  GPU-hours delivered so far and their shares of GPU-hours owed so far (0: delivered exactly in
  the owed proportions).
- *Jain's index* over teams of by-period delivered/owed (capped at 1): 1 when every team gets
  the same fraction of what it is owed.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from ledger.sim import yardstick
from ledger.sim.fold import LOSS_KINDS, IdleSample, JobFold, JobRow
from projections import fairshare as fs

DAY_S = 86_400.0
WINDOW_S = 7 * DAY_S
"""The trailing window of "under its share" (the fair-share window)."""
LARGE_FRACTION = 1 / 8
"""A job asking at least this fraction of its pool's GPUs is a large job."""
SLOWDOWN_FLOOR_S = 10.0
"""Bounded slowdown: work shorter than this counts as this long."""


class Quantiles(msgspec.Struct, frozen=True):
    count: int
    never_started: int
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    mean_s: float | None
    max_s: float | None = None


class TeamMetrics(msgspec.Struct, frozen=True):
    team: str
    allocation: float
    owed_gpu_h: float
    delivered_gpu_h: float
    by_period: float | None
    hour_by_hour: float | None
    demand_gpu_h: float
    fixed_owed_gpu_h: float = 0.0
    """Owed on the fixed yardstick (from the submitted demand alone)."""
    fixed_by_period: float | None = None
    fixed_hour_by_hour: float | None = None


class Idle(msgspec.Struct, frozen=True):
    """GPU-hours free on delivering nodes while funded work waited, and where."""

    gpu_h: float
    share: float
    """Of the capacity GPU-hours."""
    reserve_gpu_h: float
    held_gpu_h: float
    fragmented_gpu_h: float
    other_gpu_h: float
    funded_waiting_share: float
    """The share of the span during which some funded job was pending."""


class Metrics(msgspec.Struct, frozen=True, kw_only=True):
    """One run's numbers (see the module docstring for every definition)."""

    policy: str
    start: float
    end: float
    days: float
    capacity_gpus: int
    jobs_submitted: int
    jobs_completed: int
    owed_by_period: float | None
    owed_hour_by_hour: float | None
    teams: int
    teams_at_95: int
    worst_team: str | None
    worst_by_period: float | None
    fixed_by_period: float | None = None
    """Owed by period on the fixed yardstick (`ledger.sim.yardstick`)."""
    fixed_hour_by_hour: float | None = None
    fixed_teams_at_95: int = 0
    fixed_worst_team: str | None = None
    fixed_worst_by_period: float | None = None
    fixed_worst_hourly: float | None = None
    """The lowest team's fixed hour by hour (what a lock-out shows; atk55-26/atk56-26 F5)."""
    fixed_worst_hourly_team: str | None = None
    fixed_worst_daily: float | None = None
    """The lowest team's fixed owed met day by day (sum over days of min(delivered, owed) /
    sum owed)."""
    fixed_worst_daily_team: str | None = None
    jain: float | None
    occupancy: float
    funded_occupancy: float
    unfunded_share: float
    """Unfunded GPU-hours / all GPU-hours delivered."""
    demand_ratio: float
    """Mean funded demand (GPUs pending or running) / capacity, over the span."""
    wait: Quantiles
    """Every wait (first and after each requeue or resubmission), one sample each."""
    wait_debug: Quantiles
    wait_funded: Quantiles
    wait_unfunded: Quantiles | None = None
    wait_first: Quantiles | None = None
    """The first wait of each original job (submission to first placement)."""
    queued: Quantiles | None = None
    """Per original job: the sum of its waits."""
    queued_funded: Quantiles | None = None
    """Per funded original job (debug jobs included): the sum of its waits."""
    queued_funded_nondebug: Quantiles | None = None
    """Per funded original job that is not a debug job: the sum of its waits."""
    queued_large: Quantiles | None = None
    """Per original job asking >= 1/8 of its pool: the sum of its waits."""
    large_jobs: int = 0
    jct_funded: Quantiles | None = None
    """Completion time of funded original jobs, debug jobs included (lower bounds for those not
    done: `censored`)."""
    jct_funded_nondebug: Quantiles | None = None
    """Completion time of funded original jobs that are not debug jobs (the same lower bounds)."""
    jct: Quantiles | None = None
    slowdown_funded: Quantiles | None = None
    """Bounded slowdown (JCT / max(work, 10 s)) of funded original jobs, as a plain number in
    the `*_s` fields."""
    censored: int = 0
    """Original jobs not done at the end (their JCT so far counts, a lower bound)."""
    ended_at_limit: int = 0
    """Original jobs whose last run ended at its time limit with work left and that were not
    resubmitted (a trace job whose `time_limit_s` is shorter than its work): not done, so
    counted in `censored` too (atk55-26 F5: such a job read `completed`)."""
    longest_under_share_s: float | None = None
    """The longest wait of a funded job whose team was under its share when it began."""
    longest_under_share_team: str | None = None
    preemptions: int
    preemptions_per_job: float
    preempted_jobs: int
    lost_gpu_h: float
    lost_share: float
    """GPU-hours lost to preemption and relaunches / GPU-hours delivered (all)."""
    lost_funded_gpu_h: float
    """Of `lost_gpu_h`, work of funded jobs (the rest: unfunded jobs)."""
    lost_funded_share: float = 0.0
    """Funded GPU-hours lost / GPU-hours delivered (all): the loss target's measure, restart
    overheads included."""
    lost_by_kind: dict[str, float] = msgspec.field(default_factory=dict)
    """GPU-hours lost by kind (`LOSS_KINDS`): unfunded; funded non-resumable; funded resumable
    with periodic checkpoints only; funded resumable that checkpoint on SIGTERM (at most the
    grace period each); restart overheads of relaunches (all jobs)."""
    relaunch_s: float = 0.0
    idle: Idle | None = None
    preemptions_by_reason: dict[str, int]
    fragmentation_gpus: float
    fragmentation_share: float
    convergence: list[tuple[float, float]]
    """(day, total-variation distance between delivered and owed shares so far)."""
    team_rows: list[TeamMetrics]
    team_series: dict[str, list[tuple[float, float, float]]]
    """Team -> per day (day, owed GPU-h so far, delivered GPU-h so far)."""
    wall_s: float = 0.0
    cpu_s: float = 0.0
    events: int = 0
    cycles: int = 0


def quantile(values: Sequence[float], q: float) -> float | None:
    """Pure: the q-quantile by linear interpolation between order statistics (numpy's default);
    None for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def quantiles(waits: Sequence[float], never: int) -> Quantiles:
    s = sorted(waits)
    return Quantiles(
        count=len(s),
        never_started=never,
        p50_s=quantile(s, 0.5),
        p90_s=quantile(s, 0.9),
        p99_s=quantile(s, 0.99),
        mean_s=sum(s) / len(s) if s else None,
        max_s=s[-1] if s else None,
    )


def jain(values: Sequence[float]) -> float | None:
    """Pure: Jain's fairness index (sum x)^2 / (n sum x^2); None for no values or all zero."""
    sq = sum(x * x for x in values)
    if not values or sq == 0:
        return None
    return sum(values) ** 2 / (len(values) * sq)


def _clip(s: float, t: float, lo: float, hi: float) -> float:
    return max(0.0, min(t, hi) - max(s, lo))


def capacity_gpu_s(fold: JobFold, start: float, end: float) -> float:
    """Pure: GPU-seconds of delivering capacity in [start, end)."""
    total = 0.0
    last: dict[str, tuple[float, int, bool]] = {}
    for at, node, gpus, on in fold.capacity:
        prev = last.get(node)
        if prev is not None and prev[2]:
            total += prev[1] * _clip(prev[0], at, start, end)
        last[node] = (at, gpus, on)
    for at, gpus, on in last.values():
        if on:
            total += gpus * _clip(at, end, start, end)
    return total


@dataclass
class _Chain:
    """An original job and its resubmissions (after non-resumable preemptions)."""

    root: JobRow
    rows: list[JobRow]

    def waits(self, end: float) -> list[tuple[float, float]]:
        """Every wait of the chain, open ones up to `end`; a chain whose last job was killed by
        a preemption and not resubmitted (`--no-resubmit`) waits from the kill to `end`: its
        work is still owed (atk53-26 F2: killing jobs ended their queued time and flattered the
        policy that killed them)."""
        out = []
        for j in self.rows:
            out += j.waits
            if j.queued_since is not None and j.queued_since < end:
                out.append((j.queued_since, end - j.queued_since))
        last = self.rows[-1]
        if last.outcome == "preempted" and last.finished_at is not None and last.finished_at < end:
            out.append((last.finished_at, end - last.finished_at))
        return out

    def done_at(self) -> float | None:
        last = self.rows[-1]
        return last.finished_at if last.outcome == "completed" else None


def _chains(fold: JobFold, end: float) -> list[_Chain]:
    """The original jobs submitted before `end`, each with its resubmissions in order."""
    root_of: dict[int, int] = {}
    chains: dict[int, _Chain] = {}
    for j in sorted(fold.jobs.values(), key=lambda j: j.job_id):
        if j.resubmit_of is None or j.resubmit_of not in root_of:
            if j.submitted_at >= end:
                continue
            root_of[j.job_id] = j.job_id
            chains[j.job_id] = _Chain(j, [j])
        else:
            root = root_of[j.resubmit_of]
            root_of[j.job_id] = root
            chains[root].rows.append(j)
    return list(chains.values())


def _pool_gpus(fold: JobFold, gpu_type: str | None) -> int:
    return sum(g for n, g in fold.node_gpus.items() if gpu_type in (None, fold.node_type.get(n)))


def _waits(chains: Sequence[_Chain], fold: JobFold, end: float) -> dict[str, Quantiles]:
    """Every wait, first waits and per-job queued time, by kind of job."""
    every: dict[str, list[float]] = {"all": [], "debug": [], "funded": [], "unfunded": []}
    first: list[float] = []
    queued: dict[str, list[float]] = {"all": [], "funded": [], "funded_nondebug": [], "large": []}
    never = dict.fromkeys(("all", "debug", "funded", "unfunded", "funded_nondebug", "large"), 0)
    pools: dict[str | None, int] = {}
    for ch in chains:
        j = ch.root
        ws = [w for _, w in ch.waits(end)]
        started = j.first_placed_at is not None
        pool = pools.get(j.gpu_type)
        if pool is None:
            pool = pools[j.gpu_type] = _pool_gpus(fold, j.gpu_type)
        large = pool > 0 and j.gpus >= pool * LARGE_FRACTION
        kinds = ("all", True), ("debug", j.debug), ("funded", j.funded), ("unfunded", not j.funded)
        for k, on in kinds:
            if on:
                every[k] += ws
                never[k] += not started
        placed = j.first_placed_at
        first.append((placed if placed is not None else end) - j.submitted_at)
        total = sum(ws)
        queued["all"].append(total)
        if j.funded:
            queued["funded"].append(total)
            if not j.debug:
                queued["funded_nondebug"].append(total)
                never["funded_nondebug"] += not started
        if large:
            queued["large"].append(total)
            never["large"] += not started
    out = {f"wait_{k}": quantiles(v, never[k]) for k, v in every.items()}
    out["wait_first"] = quantiles(first, never["all"])
    out["queued"] = quantiles(queued["all"], never["all"])
    out["queued_funded"] = quantiles(queued["funded"], never["funded"])
    out["queued_funded_nondebug"] = quantiles(queued["funded_nondebug"], never["funded_nondebug"])
    out["queued_large"] = quantiles(queued["large"], never["large"])
    return out


def _completion(
    chains: Sequence[_Chain], end: float
) -> tuple[Quantiles, Quantiles, Quantiles, Quantiles, int]:
    """JCT of all, of funded and of funded non-debug original jobs, funded bounded slowdown, and
    how many are not done (their JCT so far counts)."""
    jct: list[float] = []
    jct_f: list[float] = []
    jct_fn: list[float] = []
    slow_f: list[float] = []
    censored = 0
    for ch in chains:
        j = ch.root
        done = ch.done_at()
        if done is None:
            censored += 1
        t = (done if done is not None else end) - j.submitted_at
        jct.append(t)
        if j.funded:
            jct_f.append(t)
            if not j.debug:
                jct_fn.append(t)
            work = j.work_s if j.work_s is not None else t
            slow_f.append(t / max(work, SLOWDOWN_FLOOR_S))
    return (
        quantiles(jct, censored),
        quantiles(jct_f, 0),
        quantiles(jct_fn, 0),
        quantiles(slow_f, 0),
        censored,
    )


def _team(account: str, depth: int = 2) -> str:
    return "/".join(account.split("/")[:depth])


def _under_share(
    chains: Sequence[_Chain],
    fold: JobFold,
    allocation: Mapping[str, float],
    capacity_gpus: int,
    end: float,
) -> tuple[float | None, str | None]:
    """The longest wait of a funded job whose team was under its share when the wait began:
    its funded GPU-seconds over the trailing `WINDOW_S` below allocation x capacity x window
    (the part of the window inside the run)."""
    holds: dict[str, list[tuple[float, float, int]]] = {}
    for s, t, g, funded, account in fold.held:
        if funded:
            holds.setdefault(_team(account), []).append((s, t, g))
    for j in fold.jobs.values():
        if j.placed_at is not None and j.funded:
            holds.setdefault(_team(j.account), []).append((j.placed_at, end, j.gpus))
    used = {team: _Cumulative(hs) for team, hs in holds.items()}
    first = min((j.submitted_at for j in fold.jobs.values()), default=0.0)
    best: tuple[float, str] | None = None
    for ch in chains:
        if not ch.root.funded:
            continue
        team = _team(ch.root.account)
        share = allocation.get(team, 0.0) * capacity_gpus
        cum = used.get(team)
        for began, w in ch.waits(end):
            lo = max(first, began - WINDOW_S)
            got = cum.between(lo, began) if cum is not None else 0.0
            holds_now = cum.rate(began) if cum is not None else 0
            if _under(got, share, began - lo, holds_now) and (best is None or w > best[0]):
                best = (w, team)
    return (best[0], best[1]) if best else (None, None)


def _under(got: float, share: float, span: float, holding: float) -> bool:
    """Pure: a team delivered `got` GPU-seconds over `span` seconds is under its share of
    `share` GPUs; at the run's first instant (no span yet) it is under when what it holds at
    that instant (`holding` GPUs) is below its share (atk52-26 F5: `0 < 0` left out every wait
    that began then; atk53-26 F3: a team holding the whole cluster then is not under)."""
    return got < share * span if span > 0 else holding < share


class _Cumulative:
    """GPU-seconds a team held up to a time: piecewise linear, from its holds."""

    def __init__(self, holds: Iterable[tuple[float, float, int]]) -> None:
        deltas: dict[float, int] = {}
        for s, t, g in holds:
            deltas[s] = deltas.get(s, 0) + g
            deltas[t] = deltas.get(t, 0) - g
        self.times = sorted(deltas)
        self.totals: list[float] = []
        self.rates: list[int] = []
        total, rate, prev = 0.0, 0, None
        for t in self.times:
            if prev is not None:
                total += rate * (t - prev)
            rate += deltas[t]
            self.totals.append(total)
            self.rates.append(rate)
            prev = t

    def at(self, t: float) -> float:
        k = bisect.bisect_right(self.times, t) - 1
        if k < 0:
            return 0.0
        return self.totals[k] + self.rates[k] * (t - self.times[k])

    def rate(self, t: float) -> int:
        """The GPUs held at `t` (holds beginning at `t` included)."""
        k = bisect.bisect_right(self.times, t) - 1
        return self.rates[k] if k >= 0 else 0

    def between(self, a: float, b: float) -> float:
        return self.at(b) - self.at(a)


def _spans(samples: Sequence[IdleSample], end: float) -> list[tuple[IdleSample, float]]:
    """Each sample with the time it lasts until (the next sample, or `end`)."""
    return [(s, samples[i + 1].at if i + 1 < len(samples) else end) for i, s in enumerate(samples)]


def _idle(
    fold: JobFold, samples: Sequence[IdleSample], start: float, end: float, cap_s: float
) -> Idle:
    """Idle GPU-hours while funded work waited (from events), and where (from the samples of
    the cycles that left a funded job waiting); what the samples do not place is `other`."""
    parts = [0.0, 0.0, 0.0]
    for s, until in _spans(samples, end):
        if not s.funded_waiting:
            continue
        d = _clip(s.at, until, start, end)
        parts[0] += s.reserve * d
        parts[1] += s.held * d
        parts[2] += s.fragmented * d
    total = fold.idle_waiting_gpu_s
    span = end - start
    h = 3600.0
    return Idle(
        gpu_h=total / h,
        share=total / cap_s if cap_s else 0.0,
        reserve_gpu_h=parts[0] / h,
        held_gpu_h=parts[1] / h,
        fragmented_gpu_h=parts[2] / h,
        other_gpu_h=max(0.0, total - sum(parts)) / h,
        funded_waiting_share=fold.funded_waiting_s / span if span > 0 else 0.0,
    )


def compute(
    policy: str,
    fold: JobFold,
    team_hours: Sequence[fs.TeamHour],
    samples: Sequence[IdleSample],
    *,
    start: float,
    end: float,
    capacity_gpus: int,
) -> Metrics:
    """Pure: the metrics of a run over [start, end) (see the module docstring)."""
    fold.advance(end)
    span = end - start
    # 1. owed vs delivered, Ai2's yardstick (projection team hours) and the fixed one
    report = fs.summarise(team_hours, start, end)
    alloc: dict[str, float] = {}
    demand: dict[str, float] = {}
    for r in team_hours:
        alloc.setdefault(r.team, r.allocation)
        demand[r.team] = demand.get(r.team, 0.0) + r.demand_gpu_h
    chains = _chains(fold, end)
    fixed_owed = yardstick.owed_hours(
        (
            yardstick.Demand(_team(c.root.account), c.root.submitted_at, c.root.gpus,
                             c.root.work_s or 0.0)
            for c in chains
            if c.root.funded
        ),
        alloc,
        capacity_gpus,
        start,
        end,
    )  # fmt: skip
    fixed_rows = yardstick.team_hours(fixed_owed, team_hours, alloc, capacity_gpus, start)
    fixed = fs.summarise(fixed_rows, start, end)
    hourly_team, hourly = _lowest(fixed)
    daily_team, daily = _lowest(fs.summarise(_rebinned(fixed_rows, start, DAY_S), start, end))
    fixed_by = {t.team: t for t in fixed.teams}
    teams = [
        TeamMetrics(
            team=t.team,
            allocation=alloc.get(t.team, 0.0),
            owed_gpu_h=t.owed_gpu_h,
            delivered_gpu_h=t.delivered_gpu_h,
            by_period=t.by_period,
            hour_by_hour=t.hour_by_hour,
            demand_gpu_h=demand.get(t.team, 0.0),
            fixed_owed_gpu_h=fixed_by[t.team].owed_gpu_h if t.team in fixed_by else 0.0,
            fixed_by_period=fixed_by[t.team].by_period if t.team in fixed_by else None,
            fixed_hour_by_hour=fixed_by[t.team].hour_by_hour if t.team in fixed_by else None,
        )
        for t in report.teams
    ]
    ratios = [t.by_period for t in teams if t.by_period is not None]
    series, convergence = _series(team_hours, start, end)
    # 2. occupancy and the unfunded share
    cap_s = capacity_gpu_s(fold, start, end)
    held = [(s, t, g, f) for s, t, g, f, _ in fold.held]
    for j in fold.jobs.values():
        if j.placed_at is not None:
            held.append((j.placed_at, end, j.gpus, j.funded))
    all_s = sum(g * _clip(s, t, start, end) for s, t, g, _ in held)
    funded_s = sum(g * _clip(s, t, start, end) for s, t, g, f in held if f)
    # 3. waits (every one), queued time, completion
    waits = _waits(chains, fold, end)
    jct, jct_funded, jct_funded_nondebug, slowdown, censored = _completion(chains, end)
    longest, longest_team = _under_share(chains, fold, alloc, capacity_gpus, end)
    # 4. preemptions and relaunches
    losses = [x for x in fold.losses if start <= x.at < end] + fold.running_losses(end)
    pre = [x for x in losses if x.kind != "relaunch"]
    lost_s = sum(x.gpus * x.lost_s for x in losses)
    lost_funded_s = sum(x.gpus * x.lost_s for x in losses if x.funded)
    # 5. fragmentation, time-weighted between cycles
    frag = 0.0
    for s, until in _spans(samples, end):
        frag += s.fragmented * _clip(s.at, until, start, end)
    frag_mean = frag / span if span > 0 else 0.0
    demand_mean = sum(r.demand_gpu_h for r in team_hours) / (span / 3600.0) if span else 0.0
    return Metrics(
        policy=policy,
        start=start,
        end=end,
        days=span / DAY_S,
        capacity_gpus=capacity_gpus,
        jobs_submitted=len(chains),
        jobs_completed=sum(1 for c in chains if c.done_at() is not None),
        owed_by_period=report.by_period,
        owed_hour_by_hour=report.hour_by_hour,
        teams=report.teams_owed,
        teams_at_95=report.teams_at_95,
        worst_team=report.worst_team,
        worst_by_period=report.worst,
        fixed_by_period=fixed.by_period,
        fixed_hour_by_hour=fixed.hour_by_hour,
        fixed_teams_at_95=fixed.teams_at_95,
        fixed_worst_team=fixed.worst_team,
        fixed_worst_by_period=fixed.worst,
        fixed_worst_hourly=hourly,
        fixed_worst_hourly_team=hourly_team,
        fixed_worst_daily=daily,
        fixed_worst_daily_team=daily_team,
        jain=jain(ratios),
        occupancy=all_s / cap_s if cap_s else 0.0,
        funded_occupancy=funded_s / cap_s if cap_s else 0.0,
        unfunded_share=(all_s - funded_s) / all_s if all_s else 0.0,
        demand_ratio=demand_mean / capacity_gpus if capacity_gpus else 0.0,
        wait=waits["wait_all"],
        wait_debug=waits["wait_debug"],
        wait_funded=waits["wait_funded"],
        wait_unfunded=waits["wait_unfunded"],
        wait_first=waits["wait_first"],
        queued=waits["queued"],
        queued_funded=waits["queued_funded"],
        queued_funded_nondebug=waits["queued_funded_nondebug"],
        queued_large=waits["queued_large"],
        large_jobs=waits["queued_large"].count,
        jct=jct,
        jct_funded=jct_funded,
        jct_funded_nondebug=jct_funded_nondebug,
        slowdown_funded=slowdown,
        censored=censored,
        ended_at_limit=sum(1 for c in chains if c.rows[-1].end_reason == "time_limit"),
        longest_under_share_s=longest,
        longest_under_share_team=longest_team,
        preemptions=len(pre),
        preemptions_per_job=len(pre) / len(chains) if chains else 0.0,
        preempted_jobs=len({x.job_id for x in pre}),
        lost_gpu_h=lost_s / 3600.0,
        lost_share=lost_s / all_s if all_s else 0.0,
        lost_funded_share=lost_funded_s / all_s if all_s else 0.0,
        lost_funded_gpu_h=lost_funded_s / 3600.0,
        lost_by_kind={
            k: sum(x.gpus * x.lost_s for x in losses if x.kind == k) / 3600.0 for k in LOSS_KINDS
        },
        relaunch_s=fold.relaunch_s,
        idle=_idle(fold, samples, start, end, cap_s),
        preemptions_by_reason={
            r: sum(1 for x in pre if x.reason == r) for r in sorted({x.reason for x in pre})
        },
        fragmentation_gpus=frag_mean,
        fragmentation_share=frag_mean / capacity_gpus if capacity_gpus else 0.0,
        convergence=convergence,
        team_rows=teams,
        team_series=series,
    )


def _lowest(report: fs.DeliveredReport) -> tuple[str | None, float | None]:
    """Pure: the team whose owed is met least hour by hour (per row of `report`'s rows:
    hours, or the periods they were summed over), and that share."""
    owed = [t for t in report.teams if t.hour_by_hour is not None]
    if not owed:
        return None, None
    worst = min(owed, key=lambda t: (t.hour_by_hour or 0.0, t.team))
    return worst.team, worst.hour_by_hour


def _rebinned(rows: Iterable[fs.TeamHour], start: float, period_s: float) -> list[fs.TeamHour]:
    """Pure: team hours summed into periods of `period_s` from `start` (owed and delivered
    per team and period), so that `fs.summarise`'s hour by hour reads period by period."""
    acc: dict[tuple[str, int], list[float]] = {}
    first: dict[str, fs.TeamHour] = {}
    for r in rows:
        k = int((r.hour - start) // period_s)
        a = acc.setdefault((r.team, k), [0.0, 0.0, 0.0])
        a[0] += r.demand_gpu_h
        a[1] += r.owed_gpu_h
        a[2] += r.delivered_gpu_h
        first.setdefault(r.team, r)
    return [
        fs.TeamHour(
            team=team, hour=start + k * period_s, capacity_gpu_h=first[team].capacity_gpu_h,
            allocation=first[team].allocation, demand_gpu_h=d, owed_gpu_h=o, delivered_gpu_h=g,
        )
        for (team, k), (d, o, g) in sorted(acc.items())
    ]  # fmt: skip


def _series(
    team_hours: Iterable[fs.TeamHour], start: float, end: float
) -> tuple[dict[str, list[tuple[float, float, float]]], list[tuple[float, float]]]:
    """Per team and day: cumulative owed and delivered; and the convergence distance per day."""
    days = max(1, math.ceil((end - start) / DAY_S))
    owed: dict[str, list[float]] = {}
    got: dict[str, list[float]] = {}
    for r in team_hours:
        d = min(days - 1, max(0, int((r.hour - start) // DAY_S)))
        owed.setdefault(r.team, [0.0] * days)[d] += r.owed_gpu_h
        got.setdefault(r.team, [0.0] * days)[d] += r.delivered_gpu_h
    series: dict[str, list[tuple[float, float, float]]] = {}
    cum_o = dict.fromkeys(owed, 0.0)
    cum_d = dict.fromkeys(owed, 0.0)
    convergence = []
    for d in range(days):
        for t in sorted(owed):
            cum_o[t] += owed[t][d]
            cum_d[t] += got[t][d]
            series.setdefault(t, []).append((d + 1.0, cum_o[t], cum_d[t]))
        to, td = sum(cum_o.values()), sum(cum_d.values())
        if to > 0 and td > 0:
            dist = 0.5 * sum(abs(cum_d[t] / td - cum_o[t] / to) for t in cum_o)
            convergence.append((d + 1.0, dist))
    return series, convergence
