"""The fair-share math: window usage, half-life usage, Fair Tree ranks, owed and delivered.

Pure: plain values in, plain values out; no I/O, no clock (`at` is a parameter). The SQL in
`fairshare.sql` computes the same numbers inside DuckDB; `reference.py` feeds these functions from
events folded in Python, and the tests check that both paths agree.

Definitions (the glossary's words):

- *usage* of an interval at time `at` over a window `W`: funded GPU-seconds inside `(at - W, at]`,
  `gpus * weight(gpu_type) * overlap`; a running interval counts up to `at`; unfunded intervals
  (min_runtime 0) are never charged. An account's usage is the sum over the user leaves below it.
- *half-life usage* (Slurm's PriorityDecayHalfLife, continuous): each GPU-second at time `x`
  counts `2 ** (-(at - x) / H)`; integrated over an interval `[s, e]`:
  `gpus * weight * H / ln 2 * (2 ** (-(at - e) / H) - 2 ** (-(at - s) / H))`.
- *norm shares* = shares / sum of the open siblings' shares (0 when that sum is 0);
  *norm usage* = usage / sum of the open siblings' usage (0 when that sum is 0);
  *level fair share* = norm shares / norm usage, `inf` when norm usage is 0, and 0 when norm
  shares is 0 (so zero-share accounts rank after all others, as in Slurm).
- *rank*: Slurm's Fair Tree. Siblings are sorted by level fair share, highest first (users before
  accounts on equal values, then by path); the tree is walked depth-first in that order and user
  leaves are ranked in the order they are met. Ties, as Slurm documents them: (1) sibling users
  with equal level fair share share a rank; (2) sibling accounts with equal level fair share have
  their children merged and sorted together; (3) a user tied with a sibling account gets the rank
  of that account's best user. `rank` 1 is the best; the next distinct rank skips the tied places.
  *factor* = (N - rank + 1) / N for N user leaves: 1.0 for the best, 1/N for the last.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

WEEK_S = 7 * 24 * 3600.0
CHARGE_PLACEMENT = "placement"
"""`UsagePolicy.charge` of `fairtree-1`: an interval is charged from its placement (`JobPlaced`)."""
CHARGE_RUN = "run"
"""`UsagePolicy.charge` of `fairtree-2`: an interval is charged from its run's real start (the
engine's, `JobStarted.started_at`); a placement its engine never started is never charged."""
CHARGE_REAL = "real"
"""`UsagePolicy.charge` of `fairtree-3`: from its run's real start to its run's real end as its
engine reports it, before or after the release: a run the ledger stopped (cancel, preemption,
requeue) keeps its GPUs through its grace (SIGTERM, grace, SIGKILL), and that time is charged
once the engine says when its last process went (`JobRunEnded`); until then, to the release."""
RANKING_VERSIONS = {
    "fairtree-1": CHARGE_PLACEMENT,
    "fairtree-2": CHARGE_RUN,
    "fairtree-3": CHARGE_REAL,
}
"""The versions of the ranking code (usage SQL + Fair Tree) decision records name, with how each
charges usage. A change here that would rank the same log differently is a new version; the old
ones stay so that their decisions replay with the rule in force when they were made."""
OWN_START_KEPT_S = 86_400.0
"""A run the ledger stopped while placed, never `JobStarted`, whose `JobRunEnded` says when it
really started (`started_at`: its command ran, atk44s F3) is charged from then (never before
its placement) when that report is recorded within this long of its placement (`apply.sql`
`intervals_run_ended`; the fold keeps such placements no longer). Under `fairtree-2` and
`fairtree-3` alike: no log written before `job.run_ended.v2` has such a start, so every older
log ranks as it did (not a new ranking version)."""
RANKING_VERSION = "fairtree-3"
"""The version new decisions record (`ranking_version(UsagePolicy())`)."""
HOUR_S = 3600.0


@dataclass(frozen=True)
class UsagePolicy:
    """How usage is counted: a sliding window (default 7 days) or an exponential half-life."""

    window_s: float = WEEK_S
    half_life_s: float | None = None
    """When set, usage decays with this half-life instead of being cut at the window."""
    weights: Mapping[str, float] = field(default_factory=dict)
    """Billing weight per GPU type (default 1.0), e.g. {"h100": 2.0, "a100": 1.0}."""
    charge: str = CHARGE_REAL
    """From when to when an interval is charged: its run's real start to its run's real end
    (`CHARGE_REAL`, `fairtree-3`); its run's real start to its release, or to a stopped run's
    real end when that came first (`CHARGE_RUN`, `fairtree-2`); or its placement to its release
    (`CHARGE_PLACEMENT`, `fairtree-1`, what decisions recorded before them used, and the
    simulator's kernel, which starts every launch at its placement). The release is
    `JobPreempted`, or `JobFinished` at the run's real end when the engine says."""

    def __post_init__(self) -> None:
        if self.charge not in RANKING_VERSIONS.values():
            raise ValueError(
                f"usage is charged as 'real', 'run' or 'placement', not {self.charge!r}"
            )
        if self.window_s <= 0:
            raise ValueError("the usage window must be positive")
        if self.half_life_s is not None and self.half_life_s <= 0:
            raise ValueError("the half-life must be positive")

    def weight(self, gpu_type: str | None) -> float:
        return float(self.weights.get(gpu_type, 1.0)) if gpu_type is not None else 1.0


@dataclass(frozen=True)
class Interval:
    """A job's hold on GPUs, charged to a user leaf."""

    leaf: str
    user: str
    gpus: int
    funded: bool
    start_at: float
    end_at: float | None
    """None while the job still holds its GPUs."""
    gpu_type: str | None = None
    run_start_at: float | None = None
    """When its run really started (the engine's word); None while (or if never) started."""
    run_end_at: float | None = None
    """When a run the ledger stopped really ended (its engine's word, `JobRunEnded`), when
    known: under `CHARGE_REAL` its charge ends there (before or after `end_at`); under
    `CHARGE_RUN` only if that is before `end_at`."""


def ranking_version(policy: UsagePolicy) -> str:
    """Pure: the ranking version whose usage rule `policy` follows (`RANKING_VERSIONS`)."""
    return next(v for v, charge in RANKING_VERSIONS.items() if charge == policy.charge)


def charge_of(version: str) -> str:
    """Pure: how a recorded ranking version charged usage ("" and unknown versions, written
    before versions said so: from placement)."""
    return RANKING_VERSIONS.get(version, CHARGE_PLACEMENT)


def charged_from(iv: Interval, policy: UsagePolicy) -> float | None:
    """Pure: when `policy` charges the interval from (None: not charged, never started)."""
    return iv.start_at if policy.charge == CHARGE_PLACEMENT else iv.run_start_at


def charged_to(iv: Interval, policy: UsagePolicy, at: float) -> float:
    """Pure: until when `policy` charges the interval, as known at `at` (`at` while it holds
    its GPUs): its release (`end_at`), or its stopped run's real end (`run_end_at`): under
    `CHARGE_REAL` whenever known, under `CHARGE_RUN` when it came before the release."""
    end = iv.end_at if iv.end_at is not None else at
    if iv.run_end_at is None or policy.charge == CHARGE_PLACEMENT:
        return end
    return iv.run_end_at if policy.charge == CHARGE_REAL else min(end, iv.run_end_at)


def interval_usage(iv: Interval, at: float, policy: UsagePolicy) -> float:
    """Pure: the usage of one interval at time `at` (0 for unfunded intervals, and for a run not
    started when usage is charged from the run's start)."""
    start = charged_from(iv, policy)
    if not iv.funded or start is None or start >= at:
        return 0.0
    end = min(charged_to(iv, policy, at), at)
    if end <= start:
        return 0.0
    wg = iv.gpus * policy.weight(iv.gpu_type)
    h = policy.half_life_s
    if h is None:
        return wg * max(0.0, end - max(start, at - policy.window_s))
    decay: float = 2.0 ** (-(at - end) / h) - 2.0 ** (-(at - start) / h)
    return wg * h / math.log(2) * decay


def leaf_usage(intervals: Iterable[Interval], at: float, policy: UsagePolicy) -> dict[str, float]:
    """Pure: usage per user leaf (leaves with no usage are left out)."""
    return _usage_by(intervals, at, policy, lambda iv: iv.leaf)


def user_usage(intervals: Iterable[Interval], at: float, policy: UsagePolicy) -> dict[str, float]:
    """Pure: usage per user name, over every project they ran in."""
    return _usage_by(intervals, at, policy, lambda iv: iv.user)


def _usage_by(
    intervals: Iterable[Interval], at: float, policy: UsagePolicy, key: Callable[[Interval], str]
) -> dict[str, float]:
    """Usage summed per `key` of the interval (keys with no usage are left out)."""
    out: dict[str, float] = defaultdict(float)
    for iv in intervals:
        u = interval_usage(iv, at, policy)
        if u > 0.0:
            out[key(iv)] += u
    return dict(out)


def ancestors(path: str) -> list[str]:
    """Pure: `a/b/c` -> [`a`, `a/b`, `a/b/c`]."""
    parts = path.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def rollup(by_leaf: Mapping[str, float]) -> dict[str, float]:
    """Pure: usage of every account: the sum over the leaves at or below it."""
    out: dict[str, float] = defaultdict(float)
    for leaf, u in by_leaf.items():
        path = leaf
        while True:
            out[path] += u
            cut = path.rfind("/")
            if cut < 0:
                break
            path = path[:cut]
    return dict(out)


# --- Fair Tree --------------------------------------------------------------------------------


class AccountUsage(NamedTuple):
    """One open account of the budget tree with its usage (the input of `fair_tree`)."""

    path: str
    parent: str | None
    kind: str
    """program | project | user; only `user` accounts are ranked."""
    shares: int
    usage: float


class FairShareRow(NamedTuple):
    """One account of a fair-share table (sshare -l)."""

    path: str
    parent: str | None
    kind: str
    depth: int
    shares: int
    norm_shares: float
    usage: float
    """Raw usage: GPU-seconds (weighted) in the window, or decayed GPU-seconds."""
    norm_usage: float
    effective_usage: float
    """The account's part of all usage in the tree (usage / total usage)."""
    level_fs: float
    rank: int | None
    """User leaves only: 1 is the best."""
    factor: float | None
    """User leaves only: (N - rank + 1) / N."""


@dataclass(frozen=True)
class FairTree:
    """A fair-share ranking: rows in display order (depth first, siblings in rank order)."""

    rows: tuple[FairShareRow, ...]
    users: int
    """N, the number of ranked user leaves."""

    def leaf_ranks(self) -> dict[str, int]:
        """User leaf -> rank with 0 as the best (the dispatcher's `Snapshot.ranks`)."""
        return {r.path: r.rank - 1 for r in self.rows if r.rank is not None}

    def level_fs(self) -> dict[str, float]:
        return {r.path: r.level_fs for r in self.rows}

    def usage_shares(self) -> tuple[dict[str, float], dict[str, float]]:
        """(account -> usage, account -> norm share): what the dispatcher's `Snapshot.usage` and
        `Snapshot.shares` hold (`TreeShape.usage_shares`, the same numbers)."""
        return {r.path: r.usage for r in self.rows}, {r.path: r.norm_shares for r in self.rows}

    def row(self, path: str) -> FairShareRow:
        for r in self.rows:
            if r.path == path:
                return r
        raise KeyError(path)


class TreeShape:
    """The budget tree of a set of open accounts, without usage: children lists, sibling groups
    and norm shares, computed once and reused for every ranking of the same accounts.

    Pure. Accounts are numbered in the order given (a path given twice keeps its first place and
    its last values); an account whose parent is not among them sits at the top level.
    """

    __slots__ = (
        "_chains",
        "children",
        "groups",
        "index",
        "kinds",
        "norm_shares",
        "not_user",
        "parents",
        "paths",
        "shares",
        "tops",
        "users",
    )

    def __init__(self, accounts: Iterable[tuple[str, str | None, str, int] | AccountUsage]) -> None:
        """`accounts`: (path, parent, kind, shares) tuples (an `AccountUsage` will do)."""
        latest = {a[0]: a for a in accounts}
        self.paths: list[str] = list(latest)
        self.index: dict[str, int] = {p: i for i, p in enumerate(self.paths)}
        rows = list(latest.values())
        self.parents: list[str | None] = [a[1] for a in rows]
        self.kinds: list[str] = [a[2] for a in rows]
        self.shares: list[int] = [a[3] for a in rows]
        self.not_user: list[bool] = [k != "user" for k in self.kinds]
        self.users = len(rows) - sum(self.not_user)
        index = self.index
        self.children: list[list[int]] = [[] for _ in rows]
        self.tops: list[int] = []
        for i, parent in enumerate(self.parents):
            p = index.get(parent) if parent is not None else None
            (self.children[p] if p is not None else self.tops).append(i)
        self.groups: list[list[int]] = [self.tops, *(c for c in self.children if c)]
        """Sibling groups in the order given (sums over siblings are taken in this order)."""
        norm = [0.0] * len(rows)
        shares = self.shares
        for group in self.groups:
            total = sum([shares[i] for i in group])
            for i in group:
                norm[i] = shares[i] / total if total else 0.0
        self.norm_shares = norm
        self._chains: dict[str, tuple[int, ...]] = {}

    def chain(self, leaf: str) -> tuple[int, ...]:
        """The accounts at or above `leaf` (by number), leaf first; cached."""
        ids = self._chains.get(leaf)
        if ids is None:
            found = []
            path = leaf
            while True:
                i = self.index.get(path)
                if i is not None:
                    found.append(i)
                cut = path.rfind("/")
                if cut < 0:
                    break
                path = path[:cut]
            ids = self._chains[leaf] = tuple(found)
        return ids

    def usage_of(self, by_leaf: Mapping[str, float]) -> list[float]:
        """Pure: the usage of every account (by number), summed over the leaves at or below it
        in the order of `by_leaf` (the same sums as `rollup`)."""
        usage = [0.0] * len(self.paths)
        chain = self.chain
        for leaf, u in by_leaf.items():
            for i in chain(leaf):
                usage[i] += u
        return usage

    def rank(self, usage: list[float]) -> FairTree:
        """Pure: the Fair Tree of these accounts with `usage` (by number)."""
        return _fair_tree(self, usage)

    def ranks_levels(self, usage: list[float]) -> tuple[dict[str, int], dict[str, float]]:
        """Pure: what a dispatcher reads of `rank(usage)`, without building its rows: user
        leaf -> rank (0 the best; `FairTree.leaf_ranks`) and account -> level fair share
        (`FairTree.level_fs`)."""
        level, _, ranks, _, _ = _solve(self, usage)
        paths = self.paths
        leaf = {paths[i]: r - 1 for i, r in enumerate(ranks) if r is not None}
        return leaf, dict(zip(paths, level, strict=True))

    def usage_shares(self, usage: list[float]) -> tuple[dict[str, float], dict[str, float]]:
        """Pure: (account -> usage, account -> norm share) for `usage` (by number): what
        `FairTree.usage_shares` gives for `rank(usage)`, without building its rows."""
        paths = self.paths
        return dict(zip(paths, usage, strict=True)), dict(zip(paths, self.norm_shares, strict=True))


def fair_tree(accounts: Iterable[AccountUsage]) -> FairTree:
    """Pure: level fair shares, ranks and factors of the open accounts given (Slurm Fair Tree).

    An account whose parent is not among those given sits at the top level.
    """
    latest = {a.path: a for a in accounts}
    shape = TreeShape(latest.values())
    return _fair_tree(shape, [a.usage for a in latest.values()])


def _fair_tree(shape: TreeShape, usage: list[float]) -> FairTree:
    level, norm_usage, ranks, tops, children = _solve(shape, usage)
    total = sum([usage[i] for i in tops])
    return FairTree(
        rows=_emit(shape, tops, children, usage, norm_usage, level, ranks, total),
        users=shape.users,
    )


def _solve(
    shape: TreeShape, usage: list[float]
) -> tuple[list[float], list[float], list[int | None], list[int], list[list[int]]]:
    """Level fair shares, norm usage, ranks, and the top accounts and children in rank order."""
    n = len(shape.paths)
    norm_shares = shape.norm_shares
    norm_usage = [0.0] * n
    level = [0.0] * n
    inf = math.inf
    for group in shape.groups:  # norm usage and level fair share among siblings
        total = sum([usage[i] for i in group])
        for i in group:
            ns = norm_shares[i]
            nu = norm_usage[i] = usage[i] / total if total else 0.0
            level[i] = 0.0 if ns == 0.0 else (inf if nu == 0.0 else ns / nu)
    # rank order: highest level fair share first; users before accounts on ties; path
    key = list(zip([-x for x in level], shape.not_user, shape.paths, strict=True)).__getitem__
    children = [sorted(c, key=key) if c else c for c in shape.children]
    tops = sorted(shape.tops, key=key)
    users = shape.users
    ranks = _rank(tops, children, level, shape.not_user, key, users)
    return level, norm_usage, ranks, tops, children


def _rank(
    tops: list[int],
    children: list[list[int]],
    level: list[float],
    not_user: list[bool],
    key: Callable[[int], tuple[float, bool, str]],
    users: int,
) -> list[int | None]:
    """Slurm's _calc_tree_fs: walk depth first in rank order, counting ranks down from N."""
    ranks: list[int | None] = [None] * len(level)
    state = [users, users]  # [rank, rank if no ties]

    def visit(order: list[int], account_tied: bool) -> None:
        prev: float | None = None
        i = 0
        size = len(order)
        while i < size:
            node = order[i]
            lf = level[node]
            tied = account_tied if i == 0 else prev == lf
            if not not_user[node]:
                if not tied:
                    state[0] = state[1]
                ranks[node] = users - state[0] + 1
                state[1] -= 1
            else:
                j = i + 1
                while j < size and not_user[order[j]] and level[order[j]] == lf:
                    j += 1
                if j == i + 1:
                    visit(children[node], tied)
                else:  # tied sibling accounts: their children are ranked together
                    merged = [c for k in order[i:j] for c in children[k]]
                    visit(sorted(merged, key=key), tied)
                i = j - 1
            prev = lf
            i += 1

    visit(tops, False)
    return ranks


def _emit(
    shape: TreeShape,
    tops: list[int],
    children: list[list[int]],
    usage: list[float],
    norm_usage: list[float],
    level: list[float],
    ranks: list[int | None],
    total: float,
) -> tuple[FairShareRow, ...]:
    """The rows depth first, siblings in rank order."""
    order: list[int] = []
    depths: list[int] = []
    stack = [(i, 1) for i in reversed(tops)]
    while stack:
        i, depth = stack.pop()
        order.append(i)
        depths.append(depth)
        below = children[i]
        if below:
            stack.extend([(c, depth + 1) for c in reversed(below)])
    users = shape.users
    u = [usage[i] for i in order]
    r = [ranks[i] for i in order]
    columns = (
        [shape.paths[i] for i in order],
        [shape.parents[i] for i in order],
        [shape.kinds[i] for i in order],
        depths,
        [shape.shares[i] for i in order],
        [shape.norm_shares[i] for i in order],
        u,
        [norm_usage[i] for i in order],
        [x / total for x in u] if total else [0.0] * len(order),
        [level[i] for i in order],
        r,
        [(users - k + 1) / users if k is not None else None for k in r],
    )
    return tuple(map(partial(tuple.__new__, FairShareRow), zip(*columns, strict=True)))


class Account(NamedTuple):
    """An open account as a snapshot holds it (no usage yet)."""

    path: str
    parent: str | None
    kind: str
    shares: int


def fair_share_of(
    accounts: Iterable[Account], intervals: Iterable[Interval], at: float, policy: UsagePolicy
) -> FairTree:
    """Pure: the Fair Tree of a snapshot, from the open accounts and the job intervals (a
    dispatcher, a replay or a test can rank without a database). The same numbers as
    `queries.fair_share` on a projection holding the same accounts and intervals."""
    usage = rollup(leaf_usage(intervals, at, policy))
    return fair_tree(
        AccountUsage(a.path, a.parent, a.kind, a.shares, usage.get(a.path, 0.0)) for a in accounts
    )


# --- owed and delivered -----------------------------------------------------------------------


@dataclass(frozen=True)
class TeamHour:
    """One team in one hour: GPU-hours owed and delivered."""

    team: str
    hour: float
    """Start of the hour (seconds since the epoch, a multiple of 3600)."""
    capacity_gpu_h: float
    allocation: float
    """The team's fraction of the cluster: the product of its and its ancestors' norm shares."""
    demand_gpu_h: float
    owed_gpu_h: float
    """min(allocation * capacity, demand)."""
    delivered_gpu_h: float
    """Funded GPU-hours its jobs got."""


@dataclass(frozen=True)
class TeamDelivery:
    team: str
    owed_gpu_h: float
    delivered_gpu_h: float
    met_gpu_h: float
    """Sum over hours of min(delivered, owed)."""
    by_period: float | None
    """min(1, delivered / owed) over the whole span; None when nothing was owed."""
    hour_by_hour: float | None
    """met / owed; None when nothing was owed."""


@dataclass(frozen=True)
class DeliveredReport:
    """Owed against delivered GPU-hours per team over a span of hours."""

    start: float
    end: float
    teams: tuple[TeamDelivery, ...]
    by_period: float | None
    """Sum over teams of min(delivered, owed) / sum of owed."""
    hour_by_hour: float | None
    """Sum over teams and hours of min(delivered, owed) / sum of owed."""
    teams_at_95: int
    """Teams whose by-period measure is >= 95%."""
    teams_owed: int
    """Teams that were owed anything (the denominator of `teams_at_95`)."""
    worst_team: str | None
    worst: float | None


def overlap(s: float, e: float, lo: float, hi: float) -> float:
    """Pure: the length of [s, e) inside [lo, hi)."""
    return max(0.0, min(e, hi) - max(s, lo))


def hours(start: float, end: float) -> list[float]:
    """Pure: the starts of the hours touching [start, end), aligned to multiples of 3600 s."""
    if end <= start:
        return []
    first = math.floor(start / HOUR_S) * HOUR_S
    return [first + i * HOUR_S for i in range(max(0, math.ceil((end - first) / HOUR_S)))]


def team_of(path: str, team_depth: int) -> str | None:
    """Pure: the account at `team_depth` above `path` (None if `path` is shallower)."""
    parts = path.split("/")
    return "/".join(parts[:team_depth]) if len(parts) >= team_depth else None


Tally = dict[str, list[float]]
"""Per team: owed, delivered and met GPU-hours summed so far (`tally`)."""


def tally(acc: Tally, r: TeamHour) -> None:
    """Pure: add one team-hour to the sums `summarise` reports (in place)."""
    a = acc.get(r.team)
    if a is None:
        a = acc[r.team] = [0.0, 0.0, 0.0]
    a[0] += r.owed_gpu_h
    a[1] += r.delivered_gpu_h
    a[2] += min(r.delivered_gpu_h, r.owed_gpu_h)


def summarise(
    rows: Iterable[TeamHour], start: float, end: float, acc: Tally | None = None
) -> DeliveredReport:
    """Pure: per-team and overall measures from team-hours (both measures, labelled); `acc`:
    the rows tallied already (`tally`), `rows` then being none or the ones after them."""
    acc = {} if acc is None else acc
    for r in rows:
        tally(acc, r)
    teams = []
    for team in sorted(acc):
        owed, delivered, met = acc[team]
        teams.append(
            TeamDelivery(
                team=team,
                owed_gpu_h=owed,
                delivered_gpu_h=delivered,
                met_gpu_h=met,
                by_period=min(1.0, delivered / owed) if owed > 0 else None,
                hour_by_hour=met / owed if owed > 0 else None,
            )
        )
    owed_all = sum(t.owed_gpu_h for t in teams)
    owed_teams = [t for t in teams if t.by_period is not None]
    worst = min(owed_teams, key=lambda t: (t.by_period, t.team)) if owed_teams else None
    return DeliveredReport(
        start=start,
        end=end,
        teams=tuple(teams),
        by_period=(
            sum(min(t.delivered_gpu_h, t.owed_gpu_h) for t in teams) / owed_all
            if owed_all > 0
            else None
        ),
        hour_by_hour=sum(t.met_gpu_h for t in teams) / owed_all if owed_all > 0 else None,
        teams_at_95=sum(1 for t in owed_teams if (t.by_period or 0.0) >= 0.95),
        teams_owed=len(owed_teams),
        worst_team=worst.team if worst else None,
        worst=worst.by_period if worst else None,
    )


@dataclass(frozen=True)
class AccountShare:
    """An open account's shares at one moment (the input of `allocations`)."""

    path: str
    parent: str | None
    shares: int


def allocations(accounts: Iterable[AccountShare], team_depth: int) -> dict[str, float]:
    """Pure: each team's fraction of the cluster: the product of the norm shares of the team and
    its ancestors, among open siblings. Teams are the accounts at depth `team_depth`."""
    accts = list(accounts)
    sibling_shares: dict[str | None, int] = defaultdict(int)
    for a in accts:
        sibling_shares[a.parent] += a.shares
    norm = {
        a.path: (a.shares / sibling_shares[a.parent] if sibling_shares[a.parent] else 0.0)
        for a in accts
    }
    out = {}
    for a in accts:
        chain = ancestors(a.path)
        if len(chain) != team_depth:
            continue
        frac = 1.0
        for p in chain:
            frac *= norm.get(p, 0.0)
        out[a.path] = frac
    return out


@dataclass(frozen=True)
class Span:
    """Something that lasts from `start_at` to `end_at` (None: still going) with a GPU count."""

    key: str
    """The leaf (intervals, jobs) or node (capacity) it belongs to."""
    gpus: int
    start_at: float
    end_at: float | None


def team_hours(
    *,
    start: float,
    end: float,
    team_depth: int,
    teams: Iterable[str],
    delivered: Iterable[Span],
    demand: Iterable[Span],
    capacity: Iterable[Span],
    allocation_by_hour: Mapping[float, Mapping[str, float]],
) -> list[TeamHour]:
    """Pure: owed and delivered GPU-hours for every team and every hour of [start, end).

    `delivered`: funded intervals by leaf; `demand`: funded jobs alive (pending or running) by
    leaf; `capacity`: nodes while they can run work (active or draining); spans still going count
    up to `end`. Hours are whole clock hours; the first and last are clipped to [start, end).
    """
    grid = hours(start, end)
    team_list = sorted(set(teams))
    cap = dict.fromkeys(grid, 0.0)
    got: dict[tuple[str, float], float] = defaultdict(float)
    want: dict[tuple[str, float], float] = defaultdict(float)
    for s in capacity:
        for h, gpu_h in _spread(s, start, end):
            cap[h] += gpu_h
    for target, spans in ((got, delivered), (want, demand)):
        for s in spans:
            team = team_of(s.key, team_depth)
            if team is None:
                continue
            for h, gpu_h in _spread(s, start, end):
                target[(team, h)] += gpu_h
    out = []
    for team in team_list:
        for h in grid:
            alloc = allocation_by_hour.get(h, {}).get(team, 0.0)
            demand_h = want.get((team, h), 0.0)
            out.append(
                TeamHour(
                    team=team,
                    hour=h,
                    capacity_gpu_h=cap[h],
                    allocation=alloc,
                    demand_gpu_h=demand_h,
                    owed_gpu_h=min(alloc * cap[h], demand_h),
                    delivered_gpu_h=got.get((team, h), 0.0),
                )
            )
    return out


def _spread(s: Span, start: float, end: float) -> list[tuple[float, float]]:
    """A span's GPU-hours in each hour of [start, end) it overlaps."""
    lo = max(s.start_at, start)
    hi = min(s.end_at if s.end_at is not None else end, end)
    if hi <= lo:
        return []
    out = []
    for h in hours(lo, hi):
        secs = overlap(lo, hi, h, h + HOUR_S)
        if secs > 0:
            out.append((h, s.gpus * secs / HOUR_S))
    return out
