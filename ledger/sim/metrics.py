"""Metrics of a simulation run: a fold over the ledger's events plus the projection's team hours.

Pure: `JobFold.apply` folds events in log order; `compute` turns the fold, the owed/delivered
team hours (from the projection) and the fragmentation samples of the cycles into one `Metrics`
value. No clock, no I/O.

Definitions (each metric says which one it is):

- *owed* (Ai2): a team's allocated fraction of the capacity, capped hour by hour at its demand
  (GPUs of its funded jobs pending or running). Delivered: funded GPU-hours its jobs got.
  Two measures, always labelled: **by period** = sum delivered / sum owed over the span, capped
  at 1 per team; **hour by hour** = sum over hours of min(delivered, owed) / sum owed.
- *occupancy*: GPU-hours held by any job (funded or not) / GPU-hours of capacity (nodes active or
  draining).
- *wait*: from submission to first placement. Jobs never placed count with their wait so far
  (a lower bound) and are counted apart (`never_started`). Debug class: jobs flagged `debug`.
- *preemption loss*: per preemption, GPUs x the work since the last checkpoint (resumable jobs:
  the last `CheckpointReported` or placement) or since placement (others).
- *fragmentation*: free GPUs the waiting jobs cannot use (`placement.fragmentation`), averaged
  over time between cycles, as a share of capacity.
- *convergence*: per day, the total-variation distance between the teams' shares of funded
  GPU-hours delivered so far and their shares of GPU-hours owed so far (0: delivered exactly in
  the owed proportions).
- *Jain's index* over teams of by-period delivered/owed (capped at 1): 1 when every team gets
  the same fraction of what it is owed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from projections import fairshare as fs
from schemas import events as e

DAY_S = 86_400.0


@dataclass
class JobRow:
    job_id: int
    account: str
    user: str
    gpus: int
    funded: bool
    debug: bool
    resumable: bool
    submitted_at: float
    first_placed_at: float | None = None
    placed_at: float | None = None
    checkpoint_at: float | None = None
    finished_at: float | None = None
    outcome: str | None = None
    preemptions: int = 0
    resubmit_of: int | None = None


LOSS_KINDS = ("unfunded", "non-resumable", "periodic checkpoints", "checkpoints on SIGTERM")


@dataclass
class JobFold:
    """Jobs, held GPU-time and preemptions folded from the event log."""

    jobs: dict[int, JobRow] = field(default_factory=dict)
    held: list[tuple[float, float, int, bool]] = field(default_factory=list)
    """Closed holds: (start, end, gpus, funded)."""
    preemptions: list[tuple[float, int, int, float, str, bool, str]] = field(default_factory=list)
    """(at, job id, gpus, seconds of work lost, reason, funded, kind: `LOSS_KINDS`)."""
    on_sigterm: set[int] = field(default_factory=set)
    """Resumable jobs that checkpoint on SIGTERM: a preemption loses them at most `grace_s`."""
    grace_s: float = 30.0
    capacity: list[tuple[float, str, int, bool]] = field(default_factory=list)
    """Node capacity changes: (at, node, gpus, delivering)."""
    node_gpus: dict[str, int] = field(default_factory=dict)

    def apply(self, ev: e.AnyEvent) -> None:
        match ev:
            case e.NodeRegistered():
                self.node_gpus[ev.node] = ev.gpus
                self.capacity.append((ev.at, ev.node, ev.gpus, True))
            case e.NodeDrained() | e.NodeRemoved() | e.NodeLost():
                self.capacity.append((ev.at, ev.node, self.node_gpus.get(ev.node, 0), False))
            case e.NodeReturned():
                self.capacity.append((ev.at, ev.node, self.node_gpus.get(ev.node, 0), True))
            case e.JobSubmitted():
                of = ev.labels.get("resubmit_of")
                self.jobs[ev.job_id] = JobRow(
                    job_id=ev.job_id,
                    account=ev.account,
                    user=ev.user,
                    gpus=ev.gpus,
                    funded=ev.min_runtime_s > 0,
                    debug=ev.debug,
                    resumable=ev.resumable,
                    submitted_at=ev.at,
                    resubmit_of=int(of) if of else None,
                )
            case e.JobPlaced():
                j = self.jobs[ev.job_id]
                if j.first_placed_at is None:
                    j.first_placed_at = ev.at
                j.placed_at = j.checkpoint_at = ev.at
            case e.CheckpointReported():
                self.jobs[ev.job_id].checkpoint_at = ev.at
            case e.JobPreempted():
                j = self.jobs[ev.job_id]
                if j.placed_at is not None:
                    since = j.checkpoint_at if j.resumable and j.checkpoint_at else j.placed_at
                    lost = max(0.0, ev.at - since)
                    if not j.funded:
                        kind = "unfunded"
                    elif not j.resumable:
                        kind = "non-resumable"
                    elif j.job_id in self.on_sigterm:
                        kind, lost = "checkpoints on SIGTERM", min(lost, self.grace_s)
                    else:
                        kind = "periodic checkpoints"
                    self.preemptions.append(
                        (ev.at, j.job_id, j.gpus, lost, ev.reason, j.funded, kind)
                    )
                    self.held.append((j.placed_at, ev.at, j.gpus, j.funded))
                j.preemptions += 1
                j.placed_at = j.checkpoint_at = None
            case e.JobFinished():
                j = self.jobs[ev.job_id]
                if j.placed_at is not None:
                    self.held.append((j.placed_at, ev.at, j.gpus, j.funded))
                j.placed_at = None
                j.finished_at, j.outcome = ev.at, ev.outcome
            case _:
                pass


class Quantiles(msgspec.Struct, frozen=True):
    count: int
    never_started: int
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    mean_s: float | None


class TeamMetrics(msgspec.Struct, frozen=True):
    team: str
    allocation: float
    owed_gpu_h: float
    delivered_gpu_h: float
    by_period: float | None
    hour_by_hour: float | None
    demand_gpu_h: float


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
    jain: float | None
    occupancy: float
    funded_occupancy: float
    unfunded_share: float
    """Unfunded GPU-hours / all GPU-hours delivered."""
    demand_ratio: float
    """Mean funded demand (GPUs pending or running) / capacity, over the span."""
    wait: Quantiles
    wait_debug: Quantiles
    wait_funded: Quantiles
    wait_unfunded: Quantiles | None = None
    """Waits of unfunded jobs (min runtime 0), apart from the funded ones' (None: a report
    written before it was measured)."""
    preemptions: int
    preemptions_per_job: float
    preempted_jobs: int
    lost_gpu_h: float
    lost_share: float
    """GPU-hours lost to preemption / GPU-hours delivered (all)."""
    lost_funded_gpu_h: float
    """Of `lost_gpu_h`, work of funded jobs (the rest: unfunded jobs)."""
    lost_funded_share: float = 0.0
    """Funded GPU-hours lost / GPU-hours delivered (all): the loss target's measure."""
    lost_by_kind: dict[str, float] = msgspec.field(default_factory=dict)
    """GPU-hours lost by kind of job (`LOSS_KINDS`): unfunded; funded non-resumable; funded
    resumable with periodic checkpoints only; funded resumable that checkpoint on SIGTERM
    (losing at most the grace period)."""
    preemptions_by_reason: dict[str, int]
    fragmentation_gpus: float
    fragmentation_share: float
    convergence: list[tuple[float, float]]
    """(day, total-variation distance between delivered and owed shares so far)."""
    team_rows: list[TeamMetrics]
    team_series: dict[str, list[tuple[float, float, float]]]
    """Team -> per day (day, owed GPU-h so far, delivered GPU-h so far)."""
    wall_s: float = 0.0
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
    return Quantiles(
        count=len(waits),
        never_started=never,
        p50_s=quantile(waits, 0.5),
        p90_s=quantile(waits, 0.9),
        p99_s=quantile(waits, 0.99),
        mean_s=sum(waits) / len(waits) if waits else None,
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


def compute(
    policy: str,
    fold: JobFold,
    team_hours: Sequence[fs.TeamHour],
    fragmentation: Sequence[tuple[float, int]],
    *,
    start: float,
    end: float,
    capacity_gpus: int,
) -> Metrics:
    """Pure: the metrics of a run over [start, end) (see the module docstring)."""
    span = end - start
    # 1. owed vs delivered (projection team hours), both measures
    report = fs.summarise(team_hours, start, end)
    alloc: dict[str, float] = {}
    demand: dict[str, float] = {}
    for r in team_hours:
        alloc.setdefault(r.team, r.allocation)
        demand[r.team] = demand.get(r.team, 0.0) + r.demand_gpu_h
    teams = [
        TeamMetrics(
            team=t.team,
            allocation=alloc.get(t.team, 0.0),
            owed_gpu_h=t.owed_gpu_h,
            delivered_gpu_h=t.delivered_gpu_h,
            by_period=t.by_period,
            hour_by_hour=t.hour_by_hour,
            demand_gpu_h=demand.get(t.team, 0.0),
        )
        for t in report.teams
    ]
    ratios = [t.by_period for t in teams if t.by_period is not None]
    series, convergence = _series(team_hours, start, end)
    # 2. occupancy and the unfunded share
    cap_s = capacity_gpu_s(fold, start, end)
    held = list(fold.held)
    for j in fold.jobs.values():
        if j.placed_at is not None:
            held.append((j.placed_at, end, j.gpus, j.funded))
    all_s = sum(g * _clip(s, t, start, end) for s, t, g, _ in held)
    funded_s = sum(g * _clip(s, t, start, end) for s, t, g, f in held if f)
    # 3. waits (first placement)
    waits: dict[str, list[float]] = {"all": [], "debug": [], "funded": [], "unfunded": []}
    never: dict[str, int] = {"all": 0, "debug": 0, "funded": 0, "unfunded": 0}
    for j in fold.jobs.values():
        if j.resubmit_of is not None or j.submitted_at >= end:
            continue
        w = (j.first_placed_at if j.first_placed_at is not None else end) - j.submitted_at
        kinds = ("all", True), ("debug", j.debug), ("funded", j.funded), ("unfunded", not j.funded)
        for k, on in kinds:
            if on:
                waits[k].append(w)
                never[k] += j.first_placed_at is None
    # 4. preemptions
    pre = [p for p in fold.preemptions if start <= p[0] < end]
    lost_s = sum(p[2] * p[3] for p in pre)
    originals = [j for j in fold.jobs.values() if j.resubmit_of is None]
    # 5. fragmentation, time-weighted between cycles
    frag = 0.0
    for (at, gpus), nxt in zip(fragmentation, [*fragmentation[1:], (end, 0)], strict=True):
        frag += gpus * _clip(at, nxt[0], start, end)
    frag_mean = frag / span if span > 0 else 0.0
    demand_mean = sum(r.demand_gpu_h for r in team_hours) / (span / 3600.0) if span else 0.0
    return Metrics(
        policy=policy,
        start=start,
        end=end,
        days=span / DAY_S,
        capacity_gpus=capacity_gpus,
        jobs_submitted=len(originals),
        jobs_completed=sum(1 for j in fold.jobs.values() if j.outcome == "completed"),
        owed_by_period=report.by_period,
        owed_hour_by_hour=report.hour_by_hour,
        teams=report.teams_owed,
        teams_at_95=report.teams_at_95,
        worst_team=report.worst_team,
        worst_by_period=report.worst,
        jain=jain(ratios),
        occupancy=all_s / cap_s if cap_s else 0.0,
        funded_occupancy=funded_s / cap_s if cap_s else 0.0,
        unfunded_share=(all_s - funded_s) / all_s if all_s else 0.0,
        demand_ratio=demand_mean / capacity_gpus if capacity_gpus else 0.0,
        wait=quantiles(waits["all"], never["all"]),
        wait_debug=quantiles(waits["debug"], never["debug"]),
        wait_funded=quantiles(waits["funded"], never["funded"]),
        wait_unfunded=quantiles(waits["unfunded"], never["unfunded"]),
        preemptions=len(pre),
        preemptions_per_job=len(pre) / len(originals) if originals else 0.0,
        preempted_jobs=len({p[1] for p in pre}),
        lost_gpu_h=lost_s / 3600.0,
        lost_share=lost_s / all_s if all_s else 0.0,
        lost_funded_share=sum(p[2] * p[3] for p in pre if p[5]) / all_s if all_s else 0.0,
        lost_funded_gpu_h=sum(p[2] * p[3] for p in pre if p[5]) / 3600.0,
        lost_by_kind={k: sum(p[2] * p[3] for p in pre if p[6] == k) / 3600.0 for k in LOSS_KINDS},
        preemptions_by_reason={
            r: sum(1 for p in pre if p[4] == r) for r in sorted({p[4] for p in pre})
        },
        fragmentation_gpus=frag_mean,
        fragmentation_share=frag_mean / capacity_gpus if capacity_gpus else 0.0,
        convergence=convergence,
        team_rows=teams,
        team_series=series,
    )


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
