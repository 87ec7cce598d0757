"""What the CLI and the dispatcher ask the projection: plain functions returning plain values.

Every function takes an open `Store` (read-only is enough) and explicit times: nothing here reads
the clock. Usage, level fair share and owed/delivered come from the SQL of `fairshare.sql`; ranks
come from `fairshare.fair_tree` fed with the SQL's usage (the same code the reference uses).
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from projections import fairshare as fs
from projections.store import Status, Store, sql_sections
from schemas.codec import gc_paused

__all__ = [
    "UsageRow",
    "delivered_report",
    "ever_placed_on",
    "fair_share",
    "jobs",
    "levels",
    "nodes",
    "shares_table",
    "status",
    "team_hours",
    "usage",
]

_PARAM = re.compile(r"\$(\w+)")


@cache
def _sections() -> dict[str, str]:
    return {name: text for name, _needs, text in sql_sections("fairshare.sql")}


@cache
def _sql(name: str, half_life: bool = False, weights: int = 0, charge: str = fs.CHARGE_RUN) -> str:
    """A query of fairshare.sql with its shared parts filled in for a usage mode: charged from
    the run's start to a stopped run's real end when its engine said it, else to the release
    (`fs.CHARGE_REAL`, fairtree-3); to the earlier of the release and that real end
    (`fs.CHARGE_RUN`, the text fairtree-2 ran; either way a run that ended before it started
    is charged nothing); or from the placement to the release (`fs.CHARGE_PLACEMENT`, the text
    fairtree-1 ran)."""
    raw = _sections()
    weight = ""
    if weights:
        cases = " ".join(f"WHEN $gt{i} THEN $gw{i}::DOUBLE" for i in range(weights))
        weight = f"* (CASE gpu_type {cases} ELSE 1.0 END)"
    run = charge != fs.CHARGE_PLACEMENT
    end = {
        fs.CHARGE_REAL: "coalesce(run_end_at, end_at)",
        fs.CHARGE_RUN: "(CASE WHEN run_end_at < end_at THEN run_end_at ELSE end_at END)",
    }.get(charge, "end_at")
    iu = (
        raw["half_life_usage" if half_life else "window_usage"]
        .replace("{weight}", weight)
        .replace("{start}", "run_start_at" if run else "start_at")
        .replace("{after}", f" AND ({end} IS NULL OR {end} > run_start_at)" if run else "")
        .replace("{end}", end)
    )
    au = raw["account_usage"].replace("{interval_usage}", iu)
    return {
        "leaf_usage": raw["leaf_usage"].replace("{interval_usage}", iu),
        "open_accounts": raw["open_accounts"],
        "user_usage": raw["user_usage"].replace("{interval_usage}", iu),
        "account_usage": au,
        "fair_share": raw["fair_share"].replace("{account_usage}", au),
        "team_hours": raw["team_hours"].replace("{team_segments}", raw["team_segments"]),
        "team_runs": raw["team_runs"].replace("{team_segments}", raw["team_segments"]),
    }[name]


def _run(store: Store, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    used = set(_PARAM.findall(sql))
    return store.con.execute(sql, {k: v for k, v in params.items() if k in used}).fetchall()


def _usage_query(name: str, at: float, policy: fs.UsagePolicy) -> tuple[str, dict[str, Any]]:
    types = sorted(policy.weights)
    params: dict[str, Any] = {"at": float(at), "from": float(at) - policy.window_s}
    if policy.half_life_s is not None:
        params["half_life_s"] = float(policy.half_life_s)
    for i, t in enumerate(types):
        params[f"gt{i}"] = t
        params[f"gw{i}"] = float(policy.weights[t])
    return _sql(name, policy.half_life_s is not None, len(types), policy.charge), params


@dataclass(frozen=True)
class UsageRow:
    """Usage of one account (or user) at a time: weighted GPU-seconds, and the same in hours."""

    name: str
    gpu_seconds: float

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0


def usage(
    store: Store,
    at: float,
    *,
    by: Literal["account", "user"] = "account",
    policy: fs.UsagePolicy | None = None,
) -> list[UsageRow]:
    """Usage at `at` per account (every account with usage, ancestors included) or per user."""
    if by not in ("account", "user"):
        raise ValueError(f"usage by {by!r}: use 'account' or 'user'")
    rows = _run(store, *_usage_query(f"{by}_usage", at, policy or fs.UsagePolicy()))
    return [UsageRow(name=str(n), gpu_seconds=float(u)) for n, u in rows]


@dataclass(frozen=True)
class LevelRow:
    """One open account at a time, as the SQL computes it (before ranking)."""

    path: str
    parent: str | None
    kind: str
    shares: int
    usage: float
    norm_shares: float
    norm_usage: float
    level_fs: float


def levels(store: Store, at: float, policy: fs.UsagePolicy | None = None) -> list[LevelRow]:
    """Open accounts at `at` with usage and level fair share (SQL), ordered by path."""
    rows = _run(store, *_usage_query("fair_share", at, policy or fs.UsagePolicy()))
    rows.sort(key=lambda r: r[0])
    return [
        LevelRow(
            path=r[0],
            parent=r[1],
            kind=r[2],
            shares=int(r[3]),
            usage=float(r[4]),
            norm_shares=float(r[5]),
            norm_usage=float(r[6]),
            level_fs=float(r[7]),
        )
        for r in rows
    ]


HistoryKey = tuple[Any, Any, Any, Any]
"""What `account_history` holds, as `_HISTORY` reads it: (count, max position, sum of positions,
max changed_at); rows are only appended, so equal keys mean the same rows."""


def fair_share(
    store: Store,
    at: float,
    policy: fs.UsagePolicy | None = None,
    *,
    history: HistoryKey | None = None,
) -> fs.FairTree:
    """The Fair Tree at `at`: level fair shares, ranks and factors of every open account.

    For the dispatcher: `fair_share(...).leaf_ranks()` (0 = best) and `.level_fs()`.
    Fast path: SQL sums the intervals per leaf (the heavy part); the roll-up to ancestors and the
    ranking run in Python on ~accounts rows (`fairshare.TreeShape`, the code of
    `fairshare.fair_tree`). The account tree is kept between calls while the account history is
    unchanged (`_shape`). The all-SQL level fair share (`levels`) gives the same numbers; the
    tests check both. `history`: the account history's key when the caller knows it (a replay
    reading as of a position), which spares the query that reads it.
    """
    policy = policy or fs.UsagePolicy()
    by_leaf = dict(_run(store, *_usage_query("leaf_usage", at, policy)))
    shape = _shape(store, float(at), history)
    with gc_paused():  # ~10 objects per account, no cycles: spare the collector's full scans
        return shape.rank(shape.usage_of(by_leaf))


_SHAPES: weakref.WeakKeyDictionary[Store, tuple[tuple[Any, ...], fs.TreeShape]] = (
    weakref.WeakKeyDictionary()
)
"""Per open store: the last account tree built, with the key it was built for."""

_HISTORY = "SELECT count(*), max(position), sum(position), max(changed_at) FROM account_history"


def _shape(store: Store, at: float, history: HistoryKey | None = None) -> fs.TreeShape:
    """The open accounts at `at` as a `TreeShape`, reused while `account_history` is unchanged
    (rows are only ever appended to it: its count and positions tell) and `at` is at or after its
    last change (then the accounts at `at` are the accounts now), or `at` is the same."""
    if history is None:
        history = store.con.execute(_HISTORY).fetchall()[0]
    count, last, total, changed = history
    key = (count, last, total, changed, None if changed is not None and at >= changed else at)
    cached = _SHAPES.get(store)
    if cached is not None and cached[0] == key:
        return cached[1]
    accounts = _run(store, _sql("open_accounts"), {"at": at})
    with gc_paused():
        shape = fs.TreeShape(
            (path, parent, kind, int(shares)) for path, parent, kind, shares in accounts
        )
    _SHAPES[store] = (key, shape)
    return shape


def shares_table(
    store: Store, at: float, policy: fs.UsagePolicy | None = None
) -> list[fs.FairShareRow]:
    """Rows like `sshare -l`: the tree depth first (siblings in rank order) with raw and norm
    shares, usage, norm and effective usage, level fair share, rank and factor."""
    return list(fair_share(store, at, policy).rows)


def team_hours(store: Store, start: float, end: float, *, team_depth: int = 2) -> list[fs.TeamHour]:
    """Owed and delivered GPU-hours per team and clock hour of [start, end) (see fairshare.sql)."""
    if end <= start:
        raise ValueError("the report needs end > start")
    if team_depth < 1:
        raise ValueError("team_depth must be >= 1")
    rows = _run(
        store,
        _sql("team_hours"),
        {"start": float(start), "end": float(end), "team_depth": team_depth, "under": None},
    )
    return [
        fs.TeamHour(
            team=r[0],
            hour=float(r[1]),
            capacity_gpu_h=float(r[2]),
            allocation=float(r[3]),
            demand_gpu_h=float(r[4]),
            owed_gpu_h=float(r[5]),
            delivered_gpu_h=float(r[6]),
        )
        for r in rows
    ]


def team_buckets(
    store: Store,
    start: float,
    end: float,
    bucket_s: float,
    *,
    team_depth: int = 2,
    origin: float | None = None,
    under: str | None = None,
) -> list[tuple[str, float, float, float, float]]:
    """`team_hours` of [start, end) summed in DuckDB per team and bucket of `bucket_s` (the hour
    the window starts in joins the first bucket): (team, bucket start, owed, delivered, met)
    GPU-hours, met being the sum of min(delivered, owed) hour by hour, by team and bucket. A
    whole period's thousands of hours come back as about `(end - start) / bucket_s` rows a
    team, summed by the engine rather than one Python object an hour. The buckets start at
    `origin` (default `start`: a part of a longer window gives its window's start). `under`:
    the teams under that account alone (their figures the same: a team's are its own)."""
    if end <= start:
        raise ValueError("the report needs end > start")
    if team_depth < 1:
        raise ValueError("team_depth must be >= 1")
    if bucket_s <= 0:
        raise ValueError("the bucket must be positive")
    hours = _sql("team_hours")
    sql = (
        "SELECT team, $origin::DOUBLE + greatest(0.0, floor((hour - $origin::DOUBLE) / "
        "$bucket::DOUBLE)) * $bucket::DOUBLE AS bucket_at, sum(owed_gpu_h), sum(delivered_gpu_h), "
        "sum(least(delivered_gpu_h, owed_gpu_h)) "
        f"FROM (\n{hours}\n) GROUP BY ALL ORDER BY team, bucket_at"
    )
    params = {"start": float(start), "end": float(end), "team_depth": team_depth, "under": under}
    at = float(start if origin is None else origin)
    rows = _run(store, sql, {**params, "bucket": float(bucket_s), "origin": at})
    return [(r[0], float(r[1]), float(r[2]), float(r[3]), float(r[4])) for r in rows]


def delivered_report(
    store: Store, start: float, end: float, *, team_depth: int = 2
) -> fs.DeliveredReport:
    """Owed vs delivered per team over [start, end): both measures, labelled (by period:
    sum delivered / sum owed capped at 1; hour by hour: sum min(delivered, owed) / sum owed),
    teams at >= 95% (by period) and the worst team. Teams default to depth 2 (the projects
    directly under programs)."""
    return fs.summarise(team_hours(store, start, end, team_depth=team_depth), start, end)


def jobs(
    store: Store, statuses: tuple[str, ...] = ("pending", "placed", "running")
) -> list[dict[str, Any]]:
    """Jobs in the given states, by job id: every `jobs` column, plus `slots` (the GPUs a placed
    or running job holds, from its open interval; [] otherwise)."""
    cur = store.con.execute(
        "SELECT j.*, coalesce(i.slots, []) AS slots FROM jobs j "
        "LEFT JOIN job_intervals i ON i.job_id = j.job_id AND i.end_position IS NULL "
        "WHERE list_contains($statuses::VARCHAR[], j.status) ORDER BY j.job_id",
        {"statuses": list(statuses)},
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def ever_placed_on(store: Store, job_id: int, node: str) -> bool:
    """Whether any run of `job_id` was ever placed with a part on `node` (its placements, the
    current one included)."""
    rows = store.con.execute(
        "SELECT count(*) FROM job_intervals WHERE job_id = ? "
        "AND list_contains(list_transform(slots, lambda s: s.node), ?)",
        [job_id, node],
    ).fetchall()
    return bool(rows and rows[0][0])


def nodes(store: Store) -> list[dict[str, Any]]:
    """Nodes now, by name: cluster, gpu_type, gpus, state, reason, held_gpus, free_gpus and
    `free` (the indices nobody holds, ascending)."""
    cur = store.con.execute(
        "SELECT *, list_filter(range(gpus), lambda g: NOT list_contains(held_indices, g)) AS free "
        "FROM nodes ORDER BY node"
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def status(store: Store) -> Status:
    """Position, events applied, unknown events (with their tags)."""
    return store.status()
