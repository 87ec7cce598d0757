"""The teams page's team hours (`gpuledger report delivered` with a series): the owed-against-
delivered series in buckets, summed by the engine (`bucketed_series`; the whole period from the
ended hours the projection keeps, `projections.kept`) or hour by hour in the server
(`delivered_series`, the reference), from the projection's `team_hours` as `delivered` reads
them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ledger.reads.layer import delivered_view
from schemas import views as v
from schemas.bounds import TeamDepth, check
from schemas.errors import InvalidCommand

if TYPE_CHECKING:
    from projections.store import Store


def bucketed_series(
    store: Store,
    start: float,
    end: float,
    team_depth: int,
    bucket_s: float,
    *,
    kept: bool = False,
    under: str | None = None,
    origin: float | None = None,
) -> tuple[v.DeliveredView, v.DeliveredSeriesView]:
    """`delivered_series` summed by the engine (`queries.team_buckets`): one row per team and
    bucket, however many hours the window holds. `kept`: from the ended hours the projection
    keeps at team depth 2 (`projections.kept`: the teams page's whole period, a sum over one
    row per team and hour, only the hours since the latest event read from the spans). The
    same figures but for the order of the sums (the last bits). `under`: the teams under that
    account alone (the Budget review's children), their figures the same. `origin` (at most
    `start`, within a bucket of it): where the buckets start (default `start`); the teams page
    gives `start`'s hour, so that every bucket but the first and last holds whole hours and
    none holds more than `bucket_s` (from `start`, the first held the clipped hour `start` is
    in plus whole ones: atk50-29 F6)."""
    if origin is not None and not (start - bucket_s < origin <= start):
        raise InvalidCommand("the buckets start within a bucket before the window", origin=origin)
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise InvalidCommand("the series needs a positive, finite window", start=start, end=end)
    if bucket_s < 3600 or bucket_s % 3600:
        raise InvalidCommand("the bucket is a whole number of hours", bucket_s=bucket_s)
    from projections import kept as kept_hours
    from projections import queries
    from projections.fairshare import summarise

    team_depth = check(team_depth, TeamDepth, "team depth")
    if kept and team_depth == kept_hours.DEPTH and under is None:
        rows = kept_hours.buckets(store, start, end, bucket_s, origin)
    else:
        rows = queries.team_buckets(
            store, start, end, bucket_s, team_depth=team_depth, under=under, origin=origin
        )
    acc: dict[str, list[float]] = {}
    teams: dict[str, list[v.TeamPoint]] = {}
    for team, at, owed, delivered, met in rows:  # by team, then bucket
        a = acc.setdefault(team, [0.0, 0.0, 0.0])
        a[0], a[1], a[2] = a[0] + owed, a[1] + delivered, a[2] + met
        point = v.TeamPoint(at=at, owed_gpu_hours=owed, delivered_gpu_hours=delivered)
        teams.setdefault(team, []).append(point)
    series = v.DeliveredSeriesView(
        start_at=start,
        end_at=end,
        bucket_s=bucket_s,
        teams=[v.TeamSeries(team=t, points=p) for t, p in sorted(teams.items())],
    )
    return delivered_view(summarise((), start, end, acc), team_depth), series


def delivered_series(
    store: Store, start: float, end: float, team_depth: int, bucket_s: float
) -> tuple[v.DeliveredView, v.DeliveredSeriesView]:
    """Owed against delivered over [start, end) as `delivered` gives it, and per team in
    buckets of `bucket_s` (a whole number of hours), from one reading of the team hours, every
    hour summed in the server (what `bucketed_series` gives but for the order of its sums)."""
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise InvalidCommand("the series needs a positive, finite window", start=start, end=end)
    if bucket_s < 3600 or bucket_s % 3600:
        raise InvalidCommand("the bucket is a whole number of hours", bucket_s=bucket_s)
    from projections import queries
    from projections.fairshare import summarise, tally

    team_depth = check(team_depth, TeamDepth, "team depth")
    hours = queries.team_hours(store, start, end, team_depth=team_depth)
    sums: dict[str, dict[float, list[float]]] = {}
    acc: dict[str, list[float]] = {}
    for th in hours:
        # the hour the window starts in (before `start`) is part of its first bucket
        at = start + max(0.0, (th.hour - start) // bucket_s) * bucket_s
        cell = sums.setdefault(th.team, {}).setdefault(at, [0.0, 0.0])
        cell[0] += th.owed_gpu_h
        cell[1] += th.delivered_gpu_h
        tally(acc, th)
    series = v.DeliveredSeriesView(
        start_at=start,
        end_at=end,
        bucket_s=bucket_s,
        teams=[
            v.TeamSeries(
                team=team,
                points=[
                    v.TeamPoint(at=at, owed_gpu_hours=o, delivered_gpu_hours=d)
                    for at, (o, d) in sorted(cells.items())
                ],
            )
            for team, cells in sorted(sums.items())
        ],
    )
    return delivered_view(summarise((), start, end, acc), team_depth), series
