"""The teams' ended hours kept in the projection (`team_hours_kept`, `team_hours_span` in
schema.sql), so that a whole-period read of owed against delivered sums a few rows per team
instead of reading every span of history (issue 29: the teams page's whole period, seconds at
1M events on a first read).

Kept as maximal runs: one row per team and stretch of consecutive hours with the same owed and
delivered GPU-hours (and something owed or delivered), [from_at, until_at). A busy history is
about a row per team and hour; a quiet one, or a job holding its GPUs for centuries, a few rows
(one per team and hour made a history reaching the schema's year-3000 bound 8.8M rows a team,
ten minutes to project: `tests/integration/test_extremes.py`).

Written by the projector inside each batch's transaction (`advance`): the hours from the kept
span's end to the hour of the latest event are read with `fairshare.sql`'s `team_runs` (the
body `team_hours` reads too, read only where a figure may change) and kept; a batch whose
earliest time (an event's `at`, a run's real start or end) falls in a hour already kept reads
again from that hour (a run across it is cut there). Where a reading begins, a team's run
ending there and its run starting there are made one when their figures are the same
(`_join`). `team_runs` gives an hour the same figures whatever window it is read in (its parts
are summed exactly), and maximal runs of those figures are one set of rows: the kept rows are a
function of the log, whatever its batches; a rebuild keeps the same rows byte for byte (a test
checks batches of 29 against one batch, and both against `team_hours` read whole).

Read by `buckets`: the hours before the first event (a window reaching back before the log),
the kept runs' hours counted per team and bucket in the engine (an hour in the bucket
`queries.team_buckets` puts it in), and the hours since the latest event:
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
        con.execute("DELETE FROM team_hours_kept WHERE from_at >= ?", [back]).fetchall()
        con.execute(  # a run across it keeps its hours before it
            "UPDATE team_hours_kept SET until_at = ? WHERE until_at > ?", [back, back]
        ).fetchall()
        until = back
    if cut > until:
        con.execute(
            "INSERT INTO team_hours_kept SELECT team, from_at, until_at, owed_gpu_h, "
            f"delivered_gpu_h FROM (\n{_sql('team_runs')}\n) "
            "WHERE owed_gpu_h <> 0 OR delivered_gpu_h <> 0",
            {"start": float(until), "end": float(cut), "team_depth": DEPTH, "under": None},
        ).fetchall()
        _join(con, until)
        until = cut
    if (from_at, until) != was:
        con.execute(
            "INSERT OR REPLACE INTO team_hours_span VALUES (?, ?, ?)", [DEPTH, from_at, until]
        ).fetchall()


def _join(con: Any, at: float) -> None:
    """Make one run of a team's run ending at `at` and its run starting there when their
    figures are the same: the runs stay maximal (the rows a function of the log) wherever a
    batch's reading began."""
    con.execute(
        "UPDATE team_hours_kept AS a SET until_at = b.until_at FROM team_hours_kept AS b "
        "WHERE a.until_at = $at AND b.from_at = $at AND a.team = b.team "
        "AND a.owed_gpu_h = b.owed_gpu_h AND a.delivered_gpu_h = b.delivered_gpu_h",
        {"at": at},
    ).fetchall()
    con.execute(
        "DELETE FROM team_hours_kept AS b WHERE from_at = $at AND EXISTS (SELECT 1 FROM "
        "team_hours_kept AS a WHERE a.team = b.team AND a.from_at < $at "
        "AND a.until_at = b.until_at)",
        {"at": at},
    ).fetchall()


def buckets(
    store: Any, start: float, end: float, bucket_s: float, origin: float | None = None
) -> list[Row]:
    """`queries.team_buckets(store, start, end, bucket_s, team_depth=2, origin=origin)` read
    from the kept runs: every team (opened before `end`) and bucket, by team then bucket; the
    same figures but for the order of the sums (the last bits). `origin` (<= `start`, default
    `start`): where the buckets start."""
    from projections import queries

    origin = start if origin is None else origin

    got = store.con.execute(
        "SELECT from_at, until_at FROM team_hours_span WHERE depth = ?", [DEPTH]
    ).fetchall()
    span = got[0] if got else None
    k0 = max(span[0], math.ceil(start / HOUR) * HOUR) if span else end
    k1 = min(span[1], math.floor(end / HOUR) * HOUR) if span else end
    if k1 <= k0:  # nothing kept inside the window
        return queries.team_buckets(store, start, end, bucket_s, team_depth=DEPTH, origin=origin)
    cells: dict[tuple[str, float], list[float]] = {}

    def add(rows: Iterable[Row], times: float = 1.0) -> None:
        for team, at, owed, delivered, met in rows:
            cell = cells.setdefault((team, at), [0.0, 0.0, 0.0])
            cell[0] += owed * times
            cell[1] += delivered * times
            cell[2] += met * times

    if start < k0:  # the hours before the first event's
        add(queries.team_buckets(store, start, k0, bucket_s, team_depth=DEPTH, origin=origin))
    ats, los, his = _bucket_hours(k0, k1, origin, bucket_s)
    add(
        (r[0], float(r[1]), float(r[2]), float(r[3]), float(r[4]))
        for r in store.con.execute(
            "SELECT team, bucket_at, sum(owed_gpu_h * n), sum(delivered_gpu_h * n), "
            "sum(least(owed_gpu_h, delivered_gpu_h) * n) FROM ("
            "SELECT r.team, r.owed_gpu_h, r.delivered_gpu_h, b.bucket_at, "
            "(least(r.until_at, b.hi) - greatest(r.from_at, b.lo)) / 3600 AS n "
            "FROM team_hours_kept r JOIN (SELECT unnest($ats::DOUBLE[]) AS bucket_at, "
            "unnest($los::DOUBLE[]) AS lo, unnest($his::DOUBLE[]) AS hi) b "
            "ON r.from_at < b.hi AND r.until_at > b.lo) GROUP BY ALL",
            {"ats": ats, "los": los, "his": his},
        ).fetchall()
    )
    if k1 < end:
        _since(store, k1, end, origin, bucket_s, add)
    teams = [
        t
        for (t,) in store.con.execute(
            "SELECT DISTINCT account FROM account_history WHERE changed_at < ? "
            "AND len(str_split(account, '/')) = ? ORDER BY account",
            [float(end), DEPTH],
        ).fetchall()
    ]
    last_hour = math.ceil(end / HOUR) * HOUR - HOUR
    n = int(max(0.0, (last_hour - origin) // bucket_s)) + 1
    grid = [origin + i * bucket_s for i in range(n)]
    return [(t, at, *cells.get((t, at), (0.0, 0.0, 0.0))) for t in teams for at in grid]


def _bucket_hours(
    k0: float, k1: float, origin: float, bucket_s: float
) -> tuple[list[float], list[float], list[float]]:
    """The buckets the hours of [k0, k1) fall in (each hour in the bucket
    `queries.team_buckets` gives it: its start's, the hour the window starts in joining the
    first): each bucket's start and its hours [lo, hi), hours of a bucket being consecutive."""

    def index(hour: float) -> int:
        return max(0, math.floor((hour - origin) / bucket_s))

    ats, los = [], []
    for i in range(index(k0), index(k1 - HOUR) + 1):
        lo = max(k0, math.ceil((origin + i * bucket_s) / HOUR) * HOUR)
        while index(lo) < i:  # the division's rounding, either way
            lo += HOUR
        while lo - HOUR >= k0 and index(lo - HOUR) >= i:
            lo -= HOUR
        if lo < k1 and index(lo) == i:  # (a bucket shorter than an hour may have none)
            ats.append(origin + i * bucket_s)
            los.append(float(lo))
    return ats, los, [*los[1:], float(k1)]


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
