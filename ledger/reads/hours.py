"""The teams page's team hours (`gpuledger report delivered` with a series): the whole period's
ended hours kept between reads (`PastHours`: an ended hour never changes, so a server reads
each once and sums it once) and the owed-against-delivered series in buckets
(`delivered_series`), from the projection's `team_hours` as `delivered` reads them."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

from ledger.reads.layer import delivered_view
from schemas import views as v
from schemas.bounds import TeamDepth, check
from schemas.errors import InvalidCommand

if TYPE_CHECKING:
    from projections.fairshare import TeamHour
    from projections.store import Store

F = TypeVar("F")


class PastHours:
    """Team hours of whole hours already over, kept between reads (a server keeps one): an hour
    that has ended never changes (events are appended at their own time, and each hour's owed
    and delivered depend on that hour alone), so only the hours since the last read are read."""

    def __init__(self) -> None:
        self.key: tuple[float, int] | None = None
        self.until = 0.0
        self.hours: list[TeamHour] = []
        self._folds: dict[Hashable, tuple[int, Any]] = {}
        """What `fold` made of the first n kept hours, by its key."""

    def _reset(self, start: float, team_depth: int) -> None:
        self.key, self.until, self.hours, self._folds = (start, team_depth), start, [], {}

    def fold(
        self,
        key: Hashable,
        hours: list[TeamHour],
        new: Callable[[], F],
        step: Callable[[F, TeamHour], None],
        copy: Callable[[F], F],
    ) -> F:
        """`step` folded over `hours` into `new()`, in order. When `hours` begins with the kept
        hours (what `read` gives for the span kept), their part is folded once and kept under
        `key` (an ended hour never changes), and each read folds only the hours since and the
        partial last hour: the same sums, in the same order, as folding them all."""
        kept, n = self.hours, len(self.hours)
        if not (n and len(hours) >= n and hours[0] is kept[0] and hours[n - 1] is kept[n - 1]):
            out = new()
            for h in hours:
                step(out, h)
            return out
        done, state = self._folds.get(key, (0, None))
        if state is None or done > n:
            done, state = 0, new()
        for h in kept[done:n]:
            step(state, h)
        self._folds[key] = (n, state)
        out = copy(state)
        for h in hours[n:]:
            step(out, h)
        return out

    def advance(
        self, store: Store, start: float, end: float, team_depth: int, step_s: float
    ) -> bool:
        """Read at most `step_s` more of the ended hours of [start, end) ahead of `read`, so a
        long history is read in short steps (a server's idle moments after it starts); True
        while some remain."""
        if not self.behind(start, end, team_depth):
            return False
        cut = math.floor(end / 3600) * 3600
        if self.key != (start, team_depth) or self.until > cut:
            self._reset(start, team_depth)
        if self.until < cut:
            from projections import queries

            to = min(cut, self.until + max(3600.0, math.floor(step_s / 3600) * 3600))
            self.hours += queries.team_hours(store, self.until, to, team_depth=team_depth)
            self.until = to
        return self.until < cut

    def unread_s(self, start: float, end: float, team_depth: int) -> float:
        """How much of the ended hours of [start, end) `read` would read now (0: none)."""
        cut = math.floor(end / 3600) * 3600
        if start % 3600 or cut <= start:
            return 0.0
        if self.key != (start, team_depth) or self.until > cut:
            return cut - start
        return cut - self.until

    def behind(self, start: float, end: float, team_depth: int) -> bool:
        """Whether some ended hour of [start, end) is not read yet (without reading)."""
        cut = math.floor(end / 3600) * 3600
        if start % 3600 or cut <= start:
            return False
        return self.key != (start, team_depth) or self.until != cut

    def read(self, store: Store, start: float, end: float, team_depth: int) -> list[TeamHour]:
        """The team hours of [start, end), as `queries.team_hours` gives them."""
        from projections import queries

        cut = math.floor(end / 3600) * 3600
        if start % 3600 or cut <= start:
            return queries.team_hours(store, start, end, team_depth=team_depth)
        if self.key != (start, team_depth) or self.until > cut:
            self._reset(start, team_depth)
        if self.until < cut:
            self.hours += queries.team_hours(store, self.until, cut, team_depth=team_depth)
            self.until = cut
        tail = queries.team_hours(store, cut, end, team_depth=team_depth) if end > cut else []
        return self.hours + tail


def bucketed_series(
    store: Store, start: float, end: float, team_depth: int, bucket_s: float
) -> tuple[v.DeliveredView, v.DeliveredSeriesView]:
    """`delivered_series` summed by the engine (`queries.team_buckets`): one row per team and
    bucket, however many hours the window holds (the teams page's whole period before its
    ended hours are kept). The same figures but for the order of the sums (the last bits)."""
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise InvalidCommand("the series needs a positive, finite window", start=start, end=end)
    if bucket_s < 3600 or bucket_s % 3600:
        raise InvalidCommand("the bucket is a whole number of hours", bucket_s=bucket_s)
    from projections import queries
    from projections.fairshare import summarise

    team_depth = check(team_depth, TeamDepth, "team depth")
    rows = queries.team_buckets(store, start, end, bucket_s, team_depth=team_depth)
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
    store: Store,
    start: float,
    end: float,
    team_depth: int,
    bucket_s: float,
    past: PastHours | None = None,
) -> tuple[v.DeliveredView, v.DeliveredSeriesView]:
    """Owed against delivered over [start, end) as `delivered` gives it, and per team in
    buckets of `bucket_s` (a whole number of hours), from one reading of the team hours (whole
    past hours from `past` when given)."""
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise InvalidCommand("the series needs a positive, finite window", start=start, end=end)
    if bucket_s < 3600 or bucket_s % 3600:
        raise InvalidCommand("the bucket is a whole number of hours", bucket_s=bucket_s)
    from projections import queries
    from projections.fairshare import summarise, tally

    team_depth = check(team_depth, TeamDepth, "team depth")
    if past is None:
        past = PastHours()  # keeps nothing: `fold` folds every hour
        hours = queries.team_hours(store, start, end, team_depth=team_depth)
    else:
        hours = past.read(store, start, end, team_depth)

    def bucket(sums: dict[str, dict[float, list[float]]], th: TeamHour) -> None:
        # the hour the window starts in (before `start`) is part of its first bucket
        at = start + max(0.0, (th.hour - start) // bucket_s) * bucket_s
        cell = sums.setdefault(th.team, {}).setdefault(at, [0.0, 0.0])
        cell[0] += th.owed_gpu_h
        cell[1] += th.delivered_gpu_h

    # the whole period's past hours are summed once (a long history holds ~10^5 team-hours)
    sums = past.fold(
        ("series", start, bucket_s), hours, dict, bucket,
        lambda x: {t: {at: list(c) for at, c in cells.items()} for t, cells in x.items()},
    )  # fmt: skip
    acc = past.fold(
        ("tally", start), hours, dict, tally, lambda x: {t: list(a) for t, a in x.items()}
    )
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
