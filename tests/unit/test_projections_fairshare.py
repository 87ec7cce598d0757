"""The pure fair-share math: usage in a window or with a half-life, Fair Tree ranks and ties,
allocations, owed and delivered."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from projections import fairshare as fs

H = 3600.0
DAY = 24 * H
AT = 100 * DAY
WEEK = fs.UsagePolicy()


def iv(
    start: float,
    end: float | None,
    gpus: int = 1,
    *,
    funded: bool = True,
    leaf: str = "p/proj/alice",
    gpu_type: str | None = None,
    began: float | bool | None = True,
) -> fs.Interval:
    """An interval placed at `start`, its run started at `began` (True: at `start` too; None:
    never started)."""
    return fs.Interval(
        leaf=leaf,
        user=leaf.rsplit("/", 1)[-1],
        gpus=gpus,
        funded=funded,
        start_at=start,
        end_at=end,
        gpu_type=gpu_type,
        run_start_at=start if began is True else began or None,
    )


PLACEMENT = fs.UsagePolicy(charge=fs.CHARGE_PLACEMENT)


# --- usage of one interval ------------------------------------------------------------------

USAGE_CASES = [
    ("inside the window", iv(AT - 2 * H, AT - H, 4), WEEK, 4 * H),
    ("running counts up to at", iv(AT - H, None, 2), WEEK, 2 * H),
    ("ended after at counts up to at", iv(AT - H, AT + H, 1), WEEK, H),
    ("clipped at the window start", iv(AT - 8 * DAY, AT - 6 * DAY, 1), WEEK, DAY),
    ("entirely before the window", iv(AT - 9 * DAY, AT - 8 * DAY, 8), WEEK, 0.0),
    ("starts after at", iv(AT + 1, None, 8), WEEK, 0.0),
    ("ending exactly at the window start", iv(AT - 8 * DAY, AT - 7 * DAY, 8), WEEK, 0.0),
    ("unfunded is never charged", iv(AT - H, AT, 8, funded=False), WEEK, 0.0),
    ("a shorter window", iv(AT - 2 * H, AT, 1), fs.UsagePolicy(window_s=H), H),
    (
        "weighted by GPU type",
        iv(AT - H, AT, 2, gpu_type="h100"),
        fs.UsagePolicy(weights={"h100": 2.5}),
        5 * H,
    ),
    (
        "an unlisted GPU type weighs 1",
        iv(AT - H, AT, 2, gpu_type="a100"),
        fs.UsagePolicy(weights={"h100": 2.5}),
        2 * H,
    ),
    ("charged from the run's start", iv(AT - 2 * H, AT - H, 4, began=AT - 1.5 * H), WEEK, 2 * H),
    ("a placement never started is not charged", iv(AT - 2 * H, AT - H, 4, began=None), WEEK, 0.0),
    ("a run still waiting to start is not charged", iv(AT - H, None, 2, began=None), WEEK, 0.0),
    (
        "a run that ended before it started",
        iv(AT - 2 * H, AT - H, 4, began=AT - 0.5 * H),
        WEEK,
        0.0,
    ),
    (
        "fairtree-1 charged from placement",
        iv(AT - 2 * H, AT - H, 4, began=AT - 1.5 * H),
        PLACEMENT,
        4 * H,
    ),
    (
        "fairtree-1 charged a run never started",
        iv(AT - 2 * H, AT - H, 4, began=None),
        PLACEMENT,
        4 * H,
    ),
    (
        "half-life: from the run's start",
        iv(AT - 2 * H, AT - H, 1, began=AT - 1.5 * H),
        fs.UsagePolicy(half_life_s=H),
        H / math.log(2) * (2.0**-1 - 2.0**-1.5),
    ),
]


def test_versions_say_how_usage_was_charged() -> None:
    assert fs.RANKING_VERSION == fs.ranking_version(fs.UsagePolicy()) == "fairtree-3"
    assert fs.ranking_version(PLACEMENT) == "fairtree-1"
    assert fs.ranking_version(fs.UsagePolicy(charge=fs.CHARGE_RUN)) == "fairtree-2"
    assert [fs.charge_of(v) for v in ("fairtree-1", "fairtree-2", "fairtree-3", "", "r")] == [
        "placement", "run", "real", "placement", "placement"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="charged as 'real', 'run' or 'placement'"):
        fs.UsagePolicy(charge="submission")


@pytest.mark.parametrize(
    ("interval", "policy", "want"), [c[1:] for c in USAGE_CASES], ids=[c[0] for c in USAGE_CASES]
)
def test_interval_usage(interval: fs.Interval, policy: fs.UsagePolicy, want: float) -> None:
    assert fs.interval_usage(interval, AT, policy) == want


def test_half_life_counts_a_gpu_second_one_half_life_ago_as_half() -> None:
    policy = fs.UsagePolicy(half_life_s=DAY)
    recent = fs.interval_usage(iv(AT - 1, AT, 1), AT, policy)
    old = fs.interval_usage(iv(AT - DAY - 1, AT - DAY, 1), AT, policy)
    assert recent == pytest.approx(1.0, rel=1e-4)
    assert old == pytest.approx(0.5, rel=1e-4)


def test_half_life_of_a_long_interval_is_the_closed_form_integral() -> None:
    h = 2 * DAY
    policy = fs.UsagePolicy(half_life_s=h)
    got = fs.interval_usage(iv(AT - 10 * DAY, None, 3), AT, policy)
    want = 3 * h / math.log(2) * (1 - 2 ** (-10 * DAY / h))
    assert got == pytest.approx(want)


def test_policy_rejects_non_positive_window_and_half_life() -> None:
    with pytest.raises(ValueError, match="window"):
        fs.UsagePolicy(window_s=0)
    with pytest.raises(ValueError, match="half-life"):
        fs.UsagePolicy(half_life_s=-1)


def test_rollup_charges_every_ancestor() -> None:
    leaves = {"a/p/x": 1.0, "a/p/y": 2.0, "a/q/z": 4.0, "b/r/w": 8.0}
    assert fs.rollup(leaves) == {
        "a": 7.0,
        "a/p": 3.0,
        "a/q": 4.0,
        "a/p/x": 1.0,
        "a/p/y": 2.0,
        "a/q/z": 4.0,
        "b": 8.0,
        "b/r": 8.0,
        "b/r/w": 8.0,
    }


def test_user_usage_sums_a_user_over_projects() -> None:
    ivs = [iv(AT - H, AT, 1, leaf="a/p/alice"), iv(AT - H, AT, 2, leaf="a/q/alice")]
    assert fs.user_usage(ivs, AT, WEEK) == {"alice": 3 * H}


# --- Fair Tree ------------------------------------------------------------------------------


def acct(path: str, shares: int, usage: float, kind: str | None = None) -> fs.AccountUsage:
    parent = path.rsplit("/", 1)[0] if "/" in path else None
    depth = path.count("/")
    return fs.AccountUsage(
        path=path,
        parent=parent,
        kind=kind or ("program", "project", "user")[min(depth, 2)],
        shares=shares,
        usage=usage,
    )


def ranks(tree: fs.FairTree) -> dict[str, int]:
    return {r.path: r.rank for r in tree.rows if r.rank is not None}


def test_level_fair_share_is_norm_shares_over_norm_usage() -> None:
    tree = fs.fair_tree(
        [
            acct("a", 3, 10.0),
            acct("b", 1, 30.0),
            acct("a/p", 1, 10.0),
            acct("a/p/x", 1, 10.0),
            acct("b/q", 1, 30.0),
            acct("b/q/y", 1, 30.0),
        ]
    )
    a, b = tree.row("a"), tree.row("b")
    assert (a.norm_shares, a.norm_usage, a.level_fs) == (0.75, 0.25, 3.0)
    assert (b.norm_shares, b.norm_usage) == (0.25, 0.75)
    assert b.level_fs == pytest.approx(1 / 3)
    assert ranks(tree) == {"a/p/x": 1, "b/q/y": 2}
    assert tree.row("a/p/x").factor == 1.0
    assert tree.row("b/q/y").factor == 0.5
    assert a.effective_usage == 0.25


def test_unused_accounts_have_infinite_level_fair_share_and_rank_first() -> None:
    tree = fs.fair_tree(
        [
            acct("a", 1, 0.0),
            acct("b", 100, 50.0),
            acct("a/p", 1, 0.0),
            acct("a/p/x", 1, 0.0),
            acct("b/q", 1, 50.0),
            acct("b/q/y", 1, 50.0),
        ]
    )
    assert tree.row("a").level_fs == math.inf
    assert ranks(tree) == {"a/p/x": 1, "b/q/y": 2}


def test_zero_shares_rank_after_everyone_even_without_usage() -> None:
    tree = fs.fair_tree(
        [
            acct("a", 0, 0.0),
            acct("b", 1, 99.0),
            acct("a/p", 1, 0.0),
            acct("a/p/x", 1, 0.0),
            acct("b/q", 1, 99.0),
            acct("b/q/y", 1, 99.0),
        ]
    )
    assert tree.row("a").level_fs == 0.0
    assert ranks(tree) == {"b/q/y": 1, "a/p/x": 2}


def test_a_better_account_ranks_all_its_users_above_a_worse_sibling() -> None:
    """Fair Tree's promise: the whole subtree of a higher level-fs sibling comes first."""
    tree = fs.fair_tree(
        [
            acct("a", 1, 10.0),
            acct("b", 1, 90.0),
            acct("a/p", 1, 10.0),
            acct("a/p/heavy", 1, 10.0),
            acct("b/q", 1, 90.0),
            acct("b/q/light", 10, 0.0),
            acct("b/q/heavy", 1, 90.0),
        ]
    )
    assert ranks(tree) == {"a/p/heavy": 1, "b/q/light": 2, "b/q/heavy": 3}


# Slurm's documented tie rules.
def test_tie_rule_1_sibling_users_with_equal_level_fs_share_a_rank() -> None:
    tree = fs.fair_tree(
        [
            acct("a", 1, 30.0),
            acct("a/p", 1, 30.0),
            acct("a/p/x", 1, 10.0),
            acct("a/p/y", 1, 10.0),
            acct("a/p/z", 1, 10.0),
            acct("a/p/w", 2, 0.0),
        ]
    )
    assert ranks(tree) == {"a/p/w": 1, "a/p/x": 2, "a/p/y": 2, "a/p/z": 2}
    assert [tree.row(p).factor for p in ("a/p/w", "a/p/x")] == [1.0, 0.75]


def test_tie_rule_2_tied_sibling_accounts_merge_their_children() -> None:
    """a and b tie, so their users are ranked together: a/p/x, b/q/y, a/p/z by their own level
    fair share, not all of a before all of b."""
    tree = fs.fair_tree(
        [
            acct("a", 1, 10.0),
            acct("b", 1, 10.0),
            acct("c", 1, 80.0),
            acct("a/p", 1, 10.0),
            acct("b/q", 1, 10.0),
            acct("c/r", 1, 80.0),
            acct("a/p/x", 9, 1.0),
            acct("a/p/z", 1, 9.0),
            acct("b/q/y", 1, 10.0),
            acct("c/r/v", 1, 80.0),
        ]
    )
    # a and b tie at level 1 (and a/p, b/q tie at level 2): x (fs 9/0.1), y (fs 1), z (fs 1/9)
    assert ranks(tree) == {"a/p/x": 1, "b/q/y": 2, "a/p/z": 3, "c/r/v": 4}


def test_tie_rule_3_a_user_tied_with_a_sibling_account_shares_its_best_users_rank() -> None:
    tree = fs.fair_tree(
        [
            acct("a", 1, 10.0),
            acct("a/p", 1, 10.0),
            acct("a/p/u", 1, 5.0),
            acct("a/p/sub", 1, 5.0, kind="project"),
            acct("a/p/sub/v", 1, 5.0, kind="user"),
            acct("a/p/sub/w", 1, 0.0, kind="user"),
        ]
    )
    # u and sub tie (1/2 / 1/2); sub's best user (w, unused) takes u's rank
    assert ranks(tree) == {"a/p/u": 1, "a/p/sub/w": 1, "a/p/sub/v": 3}


def test_leaf_ranks_for_the_dispatcher_start_at_zero() -> None:
    tree = fs.fair_tree([acct("a", 1, 1.0), acct("a/p", 1, 1.0), acct("a/p/x", 1, 1.0)])
    assert tree.leaf_ranks() == {"a/p/x": 0}
    assert tree.level_fs()["a/p/x"] == 1.0


def test_rows_are_depth_first_with_siblings_in_rank_order() -> None:
    tree = fs.fair_tree(
        [acct("a", 1, 50.0), acct("b", 1, 10.0), acct("a/p", 1, 50.0), acct("b/q", 1, 10.0)]
    )
    assert [(r.path, r.depth) for r in tree.rows] == [("b", 1), ("b/q", 2), ("a", 1), ("a/p", 2)]


def test_an_empty_tree() -> None:
    tree = fs.fair_tree([])
    assert tree.rows == () and tree.users == 0


paths = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=12
)


@settings(max_examples=200, deadline=None)
@given(
    leaves=paths,
    shares=st.lists(st.integers(0, 4), min_size=40, max_size=40),
    usage=st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, 10.0]), min_size=40, max_size=40),
)
def test_fair_tree_properties(
    leaves: list[tuple[int, int, int]], shares: list[int], usage: list[float]
) -> None:
    """Ranks run 1..N with ties, factors lie in (0, 1], the best user has factor 1, and a sibling
    with a strictly higher level fair share puts all its users strictly before the other's."""
    leaf_paths = sorted({f"g{a}/p{b}/u{c}" for a, b, c in leaves})
    by_leaf = {p: usage[i] for i, p in enumerate(leaf_paths)}
    rolled = fs.rollup(by_leaf)
    paths_all = sorted({q for p in leaf_paths for q in fs.ancestors(p)})
    tree = fs.fair_tree(acct(p, shares[i], rolled.get(p, 0.0)) for i, p in enumerate(paths_all))
    rs = ranks(tree)
    assert tree.users == len(leaf_paths) == len(rs)
    assert min(rs.values()) == 1 and max(rs.values()) <= len(rs)
    for r in tree.rows:
        if r.rank is not None:
            assert r.factor is not None and 0 < r.factor <= 1
            assert r.factor == (tree.users - r.rank + 1) / tree.users
    best = [r for r in tree.rows if r.rank == 1]
    assert all(r.factor == 1.0 for r in best)
    rows = {r.path: r for r in tree.rows}
    for x in rows.values():
        for y in rows.values():
            if x.parent == y.parent and x.path != y.path and x.level_fs > y.level_fs:
                xs = [v for k, v in rs.items() if k == x.path or k.startswith(x.path + "/")]
                ys = [v for k, v in rs.items() if k == y.path or k.startswith(y.path + "/")]
                if xs and ys:
                    assert max(xs) < min(ys)


@settings(max_examples=100, deadline=None)
@given(
    leaves=paths,
    shares=st.lists(st.integers(0, 4), min_size=40, max_size=40),
    usage=st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, 10.0]), min_size=40, max_size=40),
)
def test_ranks_levels_are_the_trees_leaf_ranks_and_level_fair_shares(
    leaves: list[tuple[int, int, int]], shares: list[int], usage: list[float]
) -> None:
    """The dispatcher's shortcut (no rows) gives exactly what the full table gives."""
    leaf_paths = sorted({f"g{a}/p{b}/u{c}" for a, b, c in leaves})
    by_leaf = {p: usage[i] for i, p in enumerate(leaf_paths)}
    rolled = fs.rollup(by_leaf)
    paths_all = sorted({q for p in leaf_paths for q in fs.ancestors(p)})
    accounts = [acct(p, shares[i], rolled.get(p, 0.0)) for i, p in enumerate(paths_all)]
    tree = fs.fair_tree(accounts)
    shape = fs.TreeShape(accounts)
    leaf, level = shape.ranks_levels(shape.usage_of(by_leaf))
    assert leaf == tree.leaf_ranks()
    assert level == tree.level_fs()
    # the usage and norm shares behind them (fairshare-10's `Snapshot.usage`, `shares`)
    assert shape.usage_shares(shape.usage_of(by_leaf)) == tree.usage_shares()


def test_fair_share_of_a_snapshot_ranks_from_intervals() -> None:
    accounts = [
        fs.Account("a", None, "program", 1),
        fs.Account("a/p", "a", "project", 1),
        fs.Account("a/p/x", "a/p", "user", 1),
        fs.Account("a/p/y", "a/p", "user", 1),
    ]
    intervals = [
        iv(AT - H, AT, 2, leaf="a/p/x"),
        iv(AT - H, None, 8, leaf="a/p/y", funded=False),  # free: y has no usage
        iv(AT - 9 * DAY, AT - 8 * DAY, 8, leaf="a/p/y"),  # outside the window
    ]
    tree = fs.fair_share_of(accounts, intervals, AT, WEEK)
    assert tree.leaf_ranks() == {"a/p/y": 0, "a/p/x": 1}
    assert tree.row("a/p").usage == 2 * H
    assert tree.level_fs()["a/p/y"] == math.inf


# --- owed and delivered ---------------------------------------------------------------------


def test_allocations_multiply_norm_shares_down_the_path() -> None:
    accts = [
        fs.AccountShare("a", None, 3),
        fs.AccountShare("b", None, 1),
        fs.AccountShare("a/p", "a", 1),
        fs.AccountShare("a/q", "a", 1),
        fs.AccountShare("b/r", "b", 0),
    ]
    assert fs.allocations(accts, 2) == {"a/p": 0.375, "a/q": 0.375, "b/r": 0.0}
    assert fs.allocations(accts, 1) == {"a": 0.75, "b": 0.25}


def test_hours_are_clock_aligned() -> None:
    assert fs.hours(1800.0, 5400.0) == [0.0, 3600.0]
    assert fs.hours(3600.0, 7200.0) == [3600.0]
    assert fs.hours(10.0, 10.0) == []


def test_team_hours_owed_is_allocation_capped_by_demand() -> None:
    rows = fs.team_hours(
        start=0.0,
        end=2 * H,
        team_depth=2,
        teams=["a/p", "a/q"],
        delivered=[fs.Span("a/p/x", 4, 0.0, H), fs.Span("a/q/y", 4, 0.0, None)],
        demand=[fs.Span("a/p/x", 4, 0.0, H), fs.Span("a/q/y", 8, 0.0, None)],
        capacity=[fs.Span("n1", 8, 0.0, None)],
        allocation_by_hour={0.0: {"a/p": 0.5, "a/q": 0.5}, H: {"a/p": 0.5, "a/q": 0.5}},
    )
    got = {(r.team, r.hour): (r.owed_gpu_h, r.delivered_gpu_h) for r in rows}
    assert got == {
        ("a/p", 0.0): (4.0, 4.0),
        ("a/p", H): (0.0, 0.0),  # no demand in the second hour: nothing owed
        ("a/q", 0.0): (4.0, 4.0),
        ("a/q", H): (4.0, 4.0),
    }


def test_team_hours_clip_partial_hours() -> None:
    rows = fs.team_hours(
        start=0.0,
        end=H,
        team_depth=2,
        teams=["a/p"],
        delivered=[fs.Span("a/p/x", 2, 900.0, 2700.0)],
        demand=[fs.Span("a/p/x", 2, 0.0, None)],
        capacity=[fs.Span("n1", 4, 0.0, None)],
        allocation_by_hour={0.0: {"a/p": 1.0}},
    )
    assert [(r.owed_gpu_h, r.delivered_gpu_h, r.capacity_gpu_h) for r in rows] == [(2.0, 1.0, 4.0)]


def team_hour(team: str, hour: float, owed: float, delivered: float) -> fs.TeamHour:
    return fs.TeamHour(
        team=team,
        hour=hour,
        capacity_gpu_h=10.0,
        allocation=0.5,
        demand_gpu_h=owed,
        owed_gpu_h=owed,
        delivered_gpu_h=delivered,
    )


def test_summarise_labels_both_measures() -> None:
    report = fs.summarise(
        [
            team_hour("a", 0.0, 10.0, 0.0),
            team_hour("a", H, 10.0, 20.0),  # made up later: by period 100%, hour by hour 50%
            team_hour("b", 0.0, 10.0, 9.0),
            team_hour("c", 0.0, 0.0, 5.0),  # owed nothing: not counted
        ],
        0.0,
        2 * H,
    )
    a, b, c = report.teams
    assert (a.by_period, a.hour_by_hour) == (1.0, 0.5)
    assert (b.by_period, b.hour_by_hour) == (0.9, 0.9)
    assert (c.by_period, c.hour_by_hour) == (None, None)
    assert report.by_period == pytest.approx((20 + 9) / 30)
    assert report.hour_by_hour == pytest.approx((10 + 9) / 30)
    assert (report.teams_at_95, report.teams_owed) == (1, 2)
    assert (report.worst_team, report.worst) == ("b", 0.9)


def test_summarise_with_nothing_owed() -> None:
    report = fs.summarise([], 0.0, H)
    assert (report.by_period, report.hour_by_hour, report.worst_team) == (None, None, None)
