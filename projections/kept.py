"""The teams' ended hours kept in the projection (`team_hours_kept`, `team_hours_span` in
schema.sql), so that a whole-period read of owed against delivered sums one row per team and
hour of history instead of reading every span of it (issue 29: the teams page's whole period,
seconds at 1M events on a first read).

Written by the projector inside each batch's transaction (`advance`): the hours from the kept
span's end to the hour of the latest event are read with `fairshare.sql`'s `team_hours` and
kept; a batch whose earliest time (an event's `at`, a run's real start or end) falls in a hour
already kept reads again from that hour. `team_hours` gives an hour the same figures whatever
window it is read in (its parts are summed exactly), so the kept rows are a function of the log,
whatever its batches: a rebuild keeps the same rows byte for byte (a test checks batch size 1
against one batch, and against `team_hours` read whole).

Read by `buckets`: the hours before the first event (a window reaching back before the log),
the kept hours summed per team and bucket in the engine, and the hours since the latest event:
the hour it falls in, then quiet hours (no event in them, so each is the same as the first: a
quiet stretch of months is one hour read and multiplied), the partial hour of `end` included.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

DEPTH = 2
"""The team depth of the kept hours: the teams page's (projects directly under programs)."""

HOUR = 3600.0

Row = tuple[str, float, float, float, float]
"""(team, bucket start, owed, delivered, met) GPU-hours, as `queries.team_buckets` gives them."""


def advance(con: Any, first: int, last: int) -> None:
    """Keep the ended hours of a batch of positions [first, last] just applied (in its open
    transaction): read again from the batch's earliest time when it falls in a kept hour, then
    the hours up to the latest event's. One query a batch when no hour ends in it."""
    from projections.queries import _sql

    row = con.execute(
        "SELECT least(min(occurred_at), (SELECT min(ended_at) FROM b_finished), "
        "(SELECT min(started_at) FROM b_started), (SELECT min(ended_at) FROM b_run_ended)), "
        "max(occurred_at), (SELECT from_at FROM team_hours_span WHERE depth = $depth), "
        "(SELECT until_at FROM team_hours_span WHERE depth = $depth) "
        "FROM events WHERE position BETWEEN $first AND $last",
        {"first": first, "last": last, "depth": DEPTH},
    ).fetchall()  # whole: a result left open stops the batch's next `register`
    if not row or row[0][0] is None or row[0][1] is None:
        return
    lo, hi, from_at, until = row[0]
    back = math.floor(lo / HOUR) * HOUR
    was = (from_at, until)
    # the kept span ends at the latest event's hour (until_at, between batches)
    cut = (
        math.floor(hi / HOUR) * HOUR if until is None else max(until, math.floor(hi / HOUR) * HOUR)
    )
    if from_at is None:
        from_at = until = back
    elif back < from_at:  # a time before the first event's hour: everything again
        con.execute("DELETE FROM team_hours_kept")
        from_at = until = back
    elif back < until:  # a run's real start or end in a kept hour: again from it
        con.execute("DELETE FROM team_hours_kept WHERE hour >= ?", [back]).fetchall()
        until = back
    if cut > until:
        con.execute(
            "INSERT INTO team_hours_kept SELECT team, hour, owed_gpu_h, delivered_gpu_h "
            f"FROM (\n{_sql('team_hours')}\n) WHERE owed_gpu_h <> 0 OR delivered_gpu_h <> 0",
            {"start": float(until), "end": float(cut), "team_depth": DEPTH},
        ).fetchall()
        until = cut
    if (from_at, until) != was:
        con.execute(
            "INSERT OR REPLACE INTO team_hours_span VALUES (?, ?, ?)", [DEPTH, from_at, until]
        ).fetchall()


def buckets(store: Any, start: float, end: float, bucket_s: float) -> list[Row]:
    """`queries.team_buckets(store, start, end, bucket_s, team_depth=2)` read from the kept
    hours: every team (opened before `end`) and bucket, by team then bucket; the same figures
    but for the order of the sums (the last bits)."""
    from projections import queries

    got = store.con.execute(
        "SELECT from_at, until_at FROM team_hours_span WHERE depth = ?", [DEPTH]
    ).fetchall()
    span = got[0] if got else None
    k0 = max(span[0], math.ceil(start / HOUR) * HOUR) if span else end
    k1 = min(span[1], math.floor(end / HOUR) * HOUR) if span else end
    if k1 <= k0:  # nothing kept inside the window
        return queries.team_buckets(store, start, end, bucket_s, team_depth=DEPTH)
    cells: dict[tuple[str, float], list[float]] = {}

    def add(rows: Iterable[Row], times: float = 1.0) -> None:
        for team, at, owed, delivered, met in rows:
            cell = cells.setdefault((team, at), [0.0, 0.0, 0.0])
            cell[0] += owed * times
            cell[1] += delivered * times
            cell[2] += met * times

    if start < k0:  # the hours before the first event's
        add(queries.team_buckets(store, start, k0, bucket_s, team_depth=DEPTH, origin=start))
    add(
        (r[0], float(r[1]), float(r[2]), float(r[3]), float(r[4]))
        for r in store.con.execute(
            "SELECT team, $origin + greatest(0.0, floor((hour - $origin) / $bucket)) * $bucket, "
            "sum(owed_gpu_h), sum(delivered_gpu_h), sum(least(owed_gpu_h, delivered_gpu_h)) "
            "FROM team_hours_kept WHERE hour >= $k0 AND hour < $k1 GROUP BY ALL",
            {"origin": float(start), "bucket": float(bucket_s), "k0": k0, "k1": k1},
        ).fetchall()
    )
    if k1 < end:
        _since(store, k1, end, start, bucket_s, add)
    teams = [
        t
        for (t,) in store.con.execute(
            "SELECT DISTINCT account FROM account_history WHERE changed_at < ? "
            "AND len(str_split(account, '/')) = ? ORDER BY account",
            [float(end), DEPTH],
        ).fetchall()
    ]
    last_hour = math.ceil(end / HOUR) * HOUR - HOUR
    n = int(max(0.0, (last_hour - start) // bucket_s)) + 1
    grid = [start + i * bucket_s for i in range(n)]
    return [(t, at, *cells.get((t, at), (0.0, 0.0, 0.0))) for t in teams for at in grid]


def _since(store: Any, k1: float, end: float, origin: float, bucket_s: float, add: Any) -> None:
    """The hours of [k1, end) after the kept ones: the latest event's hour, then the quiet hours
    (no event: each the same as the first of them) counted per bucket, and `end`'s partial
    hour (quiet: the first quiet hour's figures times its part of an hour, every span in it
    counting up to `end`). One reading of `team_hours`, of two hours."""
    from projections import queries

    def bucket_of(hour: float) -> float:
        return origin + max(0.0, (hour - origin) // bucket_s) * bucket_s

    [(until,)] = store.con.execute(
        "SELECT until_at FROM team_hours_span WHERE depth = ?", [DEPTH]
    ).fetchall()
    quiet = until + HOUR  # the first hour with no event in it (until: the latest event's)
    whole = math.floor(end / HOUR) * HOUR
    if quiet < k1 or whole - quiet < 3 * HOUR:  # a few hours: read them as they are
        add(queries.team_buckets(store, k1, end, bucket_s, team_depth=DEPTH, origin=origin))
        return
    counts: dict[float, int] = {}  # the quiet hours [quiet, whole) per bucket
    at = quiet
    while at < whole:
        b = bucket_of(at)
        hours = math.ceil((min(whole, b + bucket_s) - at) / HOUR)
        counts[b] = counts.get(b, 0) + hours
        at += hours * HOUR
    for h in queries.team_hours(store, k1, quiet + HOUR, team_depth=DEPTH):
        met = min(h.owed_gpu_h, h.delivered_gpu_h)
        if h.hour < quiet:
            add([(h.team, bucket_of(h.hour), h.owed_gpu_h, h.delivered_gpu_h, met)])
            continue
        for b, count in counts.items():
            add([(h.team, b, h.owed_gpu_h, h.delivered_gpu_h, met)], float(count))
        if end > whole:  # quiet too: the same spans, each counted up to `end`
            part = (end - whole) / HOUR
            add([(h.team, bucket_of(whole), h.owed_gpu_h, h.delivered_gpu_h, met)], part)
