"""The fixed yardstick: what each team is owed from the submitted demand alone.

Pure: a function of the submitted jobs, the teams' allocations and the capacity; no clock, no
I/O, nothing the policy did.

Ai2's owed (the projection's `team_hours`) caps a team's allocation hour by hour at its demand:
the GPUs of its funded jobs pending or running *under the policy that ran*. A policy that leaves
a team's work waiting is therefore owed more for longer, and one that finishes work early is
owed less: the yardstick moves with the policy. This one does not. Each team gets its own
partition of `allocation x capacity` GPUs and runs its funded jobs there, as a fluid: every
job it submitted and has not finished holds at most its GPUs, and when they ask more than the
partition has, they share it in proportion to their GPUs (processor sharing, weighted by size).
What the partition delivers hour by hour is what the team is owed; it depends only on what the
team submitted (submit time, GPUs, work), its allocation and the capacity.

It is computed with a virtual clock (`V`, seconds of work a 1-GPU share of every job has done):
while the jobs ask `G` GPUs of an `A`-GPU partition, `V` runs at `min(1, A / G)`, and a job of
`d` seconds of work submitted at virtual time `v` finishes when `V` reaches `v + d`; the team
is delivered `min(G, A)` GPUs meanwhile.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from projections import fairshare as fs

HOUR_S = 3600.0


@dataclass(frozen=True)
class Demand:
    """One funded job as submitted: its team, when, how many GPUs, how much work (seconds)."""

    team: str
    at: float
    gpus: int
    work_s: float


def owed_hours(
    jobs: Iterable[Demand],
    allocation: Mapping[str, float],
    capacity_gpus: float,
    start: float,
    end: float,
) -> dict[str, list[float]]:
    """Pure: per team, the GPU-hours its partition delivers in each clock hour of
    [start, end) (hour `k` starts at `start + k * 3600`; `start` is hour-aligned in a run)."""
    by_team: dict[str, list[Demand]] = {}
    for j in jobs:
        if j.gpus > 0 and j.work_s > 0:
            by_team.setdefault(j.team, []).append(j)
    hours = max(1, math.ceil((end - start) / HOUR_S))
    out: dict[str, list[float]] = {}
    for team in sorted(set(allocation) | set(by_team)):
        size = allocation.get(team, 0.0) * capacity_gpus
        arrivals = sorted(by_team.get(team, []), key=lambda d: (d.at, d.gpus, d.work_s))
        out[team] = _partition(arrivals, size, start, end, hours)
    return out


def _partition(
    arrivals: list[Demand], size: float, start: float, end: float, hours: int
) -> list[float]:
    """GPU-hours per hour of one team's fluid partition of `size` GPUs."""
    bins = [0.0] * hours
    if size <= 0 or not arrivals:
        return bins
    t = min(start, arrivals[0].at)
    v = 0.0  # the virtual clock
    asking = 0  # GPUs the unfinished jobs ask
    done: list[tuple[float, int]] = []  # (virtual finish, GPUs)
    i = 0
    while t < end:
        rate = min(1.0, size / asking) if asking else 0.0
        nxt = arrivals[i].at if i < len(arrivals) else math.inf
        finish = t + (done[0][0] - v) / rate if done and rate > 0 else math.inf
        step = min(nxt, finish, end)
        if asking and step > t:
            _add(bins, start, t, step, min(asking, size))
            v += (step - t) * rate
        if finish <= step:  # (exactly, or within a tick of the clock: no time is left to run)
            v = max(v, done[0][0])
        t = max(t, step)
        while done and done[0][0] <= v:
            asking -= heapq.heappop(done)[1]
        while i < len(arrivals) and arrivals[i].at <= t:
            d = arrivals[i]
            heapq.heappush(done, (v + d.work_s, d.gpus))
            asking += d.gpus
            i += 1
        if not done and i >= len(arrivals):
            break
    return bins


def _add(bins: list[float], start: float, a: float, b: float, gpus: float) -> None:
    """Add `gpus` held over [a, b) to the hourly bins (GPU-hours)."""
    a, b = max(a, start), min(b, start + len(bins) * HOUR_S)
    while a < b:
        k = int((a - start) // HOUR_S)
        edge = min(b, start + (k + 1) * HOUR_S)
        bins[k] += gpus * (edge - a) / HOUR_S
        a = edge


def team_hours(
    owed: Mapping[str, list[float]],
    delivered: Iterable[fs.TeamHour],
    allocation: Mapping[str, float],
    capacity_gpus: float,
    start: float,
) -> list[fs.TeamHour]:
    """Pure: the fixed yardstick's owed beside the delivered GPU-hours of the run's team hours,
    as `fs.TeamHour` rows (`fs.summarise` then gives both measures on this yardstick)."""
    got: dict[tuple[str, int], float] = {}
    for r in delivered:
        k = int((r.hour - start) // HOUR_S)
        got[(r.team, k)] = got.get((r.team, k), 0.0) + r.delivered_gpu_h
    rows = []
    for team in sorted(set(owed) | {t for t, _ in got}):
        bins = owed.get(team, [])
        hours = max(len(bins), 1 + max((k for t, k in got if t == team), default=-1))
        for k in range(hours):
            o = bins[k] if k < len(bins) else 0.0
            d = got.get((team, k), 0.0)
            if o <= 0 and d <= 0:
                continue
            rows.append(
                fs.TeamHour(
                    team=team,
                    hour=start + k * HOUR_S,
                    capacity_gpu_h=capacity_gpus,
                    allocation=allocation.get(team, 0.0),
                    demand_gpu_h=o,
                    owed_gpu_h=o,
                    delivered_gpu_h=d,
                )
            )
    return rows
