"""Workloads: the trace reader and writer, what traces lack, the synthetic generator, the RNG."""

from __future__ import annotations

import gzip
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.core.budget import BudgetAccount, BudgetFile, parse
from ledger.sim.rng import Rng
from ledger.sim.workload import (
    Assumptions,
    SimJob,
    Synthetic,
    Trace,
    TraceJob,
    budget_toml,
    dump_trace,
    generated_tree,
    parse_distribution,
    parse_trace,
    resolve,
    synthetic,
    team_fractions,
)
from schemas.bounds import TEN_YEARS_S
from schemas.errors import InvalidCommand

HEADER = "job_id,user,group,submit_time_s,duration_s,gpus,status"


def test_rng_is_seeded_and_stable() -> None:
    a, b = Rng(42), Rng(42)
    assert [a.next64() for _ in range(3)] == [b.next64() for _ in range(3)]
    # splitmix64's published first output for seed 0
    assert Rng(0).next64() == 0xE220A8397B1DCDAF
    r = Rng(1)
    xs = [r.random() for _ in range(10_000)]
    assert min(xs) >= 0.0 and max(xs) < 1.0
    assert abs(sum(xs) / len(xs) - 0.5) < 0.02
    assert Rng(1).fork("a").next64() != Rng(1).fork("b").next64()


def test_trace_without_optional_columns() -> None:
    text = f"{HEADER}\n7,,,0,600,4,unknown\n8,u1,vc2,30,7200,8,completed\n"
    trace = parse_trace(text.encode())
    assert trace.columns == frozenset()
    assert trace.jobs == (
        TraceJob(job_id="7", user="", group="", submit_time_s=0, duration_s=600, gpus=4),
        TraceJob(
            job_id="8", user="u1", group="vc2", submit_time_s=30, duration_s=7200, gpus=8,
            status="completed",
        ),
    )  # fmt: skip


def test_a_duration_of_decades_runs_ten_years() -> None:
    """atk33-26: a job the trace says ran 1e9 s (one still running when the trace was cut)
    refused the whole simulation; it now runs ten years, past the end of any simulation."""
    trace = parse_trace(f"{HEADER}\n7,,,0,1000000000,4,unknown\n".encode())
    assert trace.jobs[0].duration_s == TEN_YEARS_S


def test_trace_gzip_and_optional_columns_as_given() -> None:
    text = (
        f"{HEADER},min_runtime_s,resumable,priority\n"
        "1,alice,lab/a,5,100,2,completed,0,true,3\n"
        "2,bob,lab/b,6,100,2,completed,3600,false,-1\n"
        "3,carol,lab/b,7,100,2,completed,3600,false,HIGH\n"
        "4,dave,lab/b,8,100,2,completed,3600,false,low\n"
        "5,erin,lab/b,9,100,2,completed,3600,false,Normal\n"
    )
    trace = parse_trace(gzip.compress(text.encode()))
    assert trace.columns == frozenset({"min_runtime_s", "resumable", "priority"})
    wl = resolve(trace, Assumptions())
    assert [(j.account, j.user, j.min_runtime_s, j.resumable, j.priority) for j in wl.jobs] == [
        ("lab/a", "alice", 0, True, 3),
        ("lab/b", "bob", 3600, False, -1),
        ("lab/b", "carol", 3600, False, 1),
        ("lab/b", "dave", 3600, False, -1),
        ("lab/b", "erin", 3600, False, 0),
    ]
    assert wl.budget.accounts["lab"].kind == "program"
    assert wl.budget.accounts["lab/a"].members == ["alice"]


@pytest.mark.parametrize(
    ("case", "text", "want"),
    [
        ("missing column", "job_id,user\n1,a\n", "missing columns group, submit_time_s"),
        (
            "not a number",
            f"{HEADER}\n1,,,x,1,1,unknown\n",
            "line 2: submit_time_s must be a finite number",
        ),
        (  # atk33-26: an internal OverflowError before
            "infinite duration",
            f"{HEADER}\n1,,,0,1e400,1,unknown\n",
            "line 2: duration_s must be a finite number, got '1e400'",
        ),
        ("zero gpus", f"{HEADER}\n1,,,0,1,0,unknown\n", "line 2: gpus >= 1"),
        ("bad resumable", f"{HEADER},resumable\n1,,,0,1,1,unknown,maybe\n", "resumable must be"),
        (  # atk53-26 F6: refused only when the simulated clock reached it, with no line
            "zero time limit",
            f"{HEADER},time_limit_s\n1,,,0,1,1,unknown,60\n2,,,80000,1,1,unknown,0\n",
            "line 3: time_limit_s must be 1 to 315360000 seconds (or empty: no limit), got 0",
        ),
        (
            "negative contract",
            f"{HEADER},min_runtime_s\n1,,,0,1,1,unknown,-5\n",
            "line 2: min_runtime_s must be >= 0, got -5",
        ),
        (
            "bad priority",
            f"{HEADER},priority\n1,,,0,1,1,unknown,urgent\n",
            "priority must be a number or HIGH, NORMAL or LOW, got 'urgent'",
        ),
    ],
)
def test_trace_errors_name_the_line(case: str, text: str, want: str) -> None:
    with pytest.raises(InvalidCommand) as err:
        parse_trace(text.encode(), "t.csv")
    assert want in err.value.message, case


jobs_st = st.lists(
    st.builds(
        SimJob,
        key=st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True),
        account=st.sampled_from(["p/a", "p/b", "q/c/d"]),
        user=st.sampled_from(["u1", "u2"]),
        submit_s=st.integers(0, 10**7),
        duration_s=st.integers(0, 10**6),
        gpus=st.integers(1, 64),
        min_runtime_s=st.integers(0, 8 * 3600),
        resumable=st.booleans(),
        priority=st.integers(-5, 5),
        time_limit_s=st.none() | st.integers(1, 10**5),
        status=st.sampled_from(["unknown", "completed", "failed"]),
    ),
    max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(jobs=jobs_st, gz=st.booleans())
def test_dump_then_read_gives_the_same_jobs(jobs: list[SimJob], gz: bool) -> None:
    data = dump_trace(jobs, gzipped=gz)
    assert data == dump_trace(jobs, gzipped=gz)  # no timestamp in the gzip header
    trace = parse_trace(data)
    back = resolve(trace, Assumptions(seed=99))
    assert sorted(back.jobs, key=repr) == sorted(jobs, key=repr)


def trace_of(n: int, **kw: object) -> Trace:
    base = {"user": "", "group": "", "duration_s": 3600, "gpus": 8}
    return Trace(
        jobs=tuple(
            TraceJob(job_id=str(i), submit_time_s=i, **{**base, **kw})  # type: ignore[arg-type]
            for i in range(n)
        )
    )


def test_trace_without_groups_gets_a_generated_tree_seeded() -> None:
    a = resolve(trace_of(300), Assumptions(seed=3))
    b = resolve(trace_of(300), Assumptions(seed=3))
    c = resolve(trace_of(300), Assumptions(seed=4))
    assert a.jobs == b.jobs and a.jobs != c.jobs
    assert len([p for p, x in a.budget.accounts.items() if x.kind == "project"]) == 15
    assert len({j.account for j in a.jobs}) >= 10
    for j in a.jobs:
        assert j.user in (a.budget.accounts[j.account].members or [])
    assert any("budget tree generated" in n for n in a.notes)


def test_contracts_from_the_stated_distribution() -> None:
    how = Assumptions(min_runtime=parse_distribution("0:1,2h:3"), resumable_p=0.25)
    wl = resolve(trace_of(4000), how)
    counts = Counter(j.min_runtime_s for j in wl.jobs)
    assert set(counts) == {0, 7200}
    assert counts[0] / 4000 == pytest.approx(0.25, abs=0.03)
    assert sum(j.resumable for j in wl.jobs) / 4000 == pytest.approx(0.25, abs=0.03)


@pytest.mark.parametrize(
    ("case", "debug_limit", "duration", "want_limit", "want_min_runtime"),
    [
        ("short job declares 15 min, signs it", True, 600, 900, 900),
        ("long job declares nothing", True, 901, None, 3600),
        ("switched off", False, 600, None, 3600),
    ],
)
def test_time_limit_when_the_trace_has_none(
    case: str, debug_limit: bool, duration: int, want_limit: int | None, want_min_runtime: int
) -> None:
    how = Assumptions(min_runtime=parse_distribution("1h:1"), debug_time_limit=debug_limit)
    (j,) = resolve(trace_of(1, duration_s=duration), how).jobs
    assert (j.time_limit_s, j.min_runtime_s) == (want_limit, want_min_runtime), case


def test_plain_group_becomes_a_trace_project_and_users_join_it() -> None:
    wl = resolve(trace_of(2, group="vc 7", user="x@y"), Assumptions())
    assert {j.account for j in wl.jobs} == {"trace/vc-7"}
    assert wl.budget.accounts["trace/vc-7"].members == ["x-y"]


def test_budget_file_projects_are_the_teams() -> None:
    budget = parse(
        b'[accounts."org"]\nkind = "program"\n'
        b'[accounts."org/big"]\nkind = "project"\nshares = 3\nmembers = ["a", "b"]\n'
        b'[accounts."org/small"]\nkind = "project"\nshares = 1\nmembers = ["c"]\n'
    )
    assert team_fractions(budget) == {"org/big": 0.75, "org/small": 0.25}
    wl = resolve(trace_of(400), Assumptions(team_skew=0.0), budget)
    share = sum(j.account == "org/big" for j in wl.jobs) / 400
    assert share == pytest.approx(0.75, abs=0.06)
    assert {j.user for j in wl.jobs} == {"a", "b", "c"}


def test_distribution_errors() -> None:
    with pytest.raises(InvalidCommand):
        parse_distribution("4h")
    with pytest.raises(InvalidCommand):
        parse_distribution("0:0")
    assert parse_distribution("0:0.5, 15m:0.5") == ((0, 0.5), (900, 0.5))


def test_synthetic_is_ai2_shaped_and_seeded() -> None:
    g = Synthetic(seed=1, days=14, capacity_gpus=256)
    wl = synthetic(g)
    assert wl.jobs == synthetic(g).jobs
    teams = [p for p, a in wl.budget.accounts.items() if a.kind == "project"]
    assert len(teams) == 15
    assert sum(len(wl.budget.accounts[t].members or []) for t in teams) == 150
    debug = [j for j in wl.jobs if j.time_limit_s is not None]
    assert debug and all(j.time_limit_s <= 900 and j.duration_s <= 900 for j in debug)  # type: ignore[operator]
    assert all(j.gpus <= 8 for j in debug)
    multi = [j for j in wl.jobs if j.gpus > 8]
    assert multi and all(j.gpus % 8 == 0 for j in multi)
    unfunded = sum(j.gpus * j.duration_s for j in wl.jobs if not j.funded)
    total = sum(j.gpus * j.duration_s for j in wl.jobs)
    assert 0.08 < unfunded / total < 0.35
    load = wl.offered_gpu_h() / (256 * 14 * 24)
    assert 0.7 < load < 1.5
    assert [j.key for j in wl.jobs] == [f"s{i + 1:06d}" for i in range(len(wl.jobs))]
    # seasonal team demand: every team has a quiet week and a busy one
    week = 7 * 86_400
    for t in teams:
        w1 = sum(j.gpus * j.duration_s for j in wl.jobs if j.account == t and j.submit_s < week)
        w2 = sum(j.gpus * j.duration_s for j in wl.jobs if j.account == t and j.submit_s >= week)
        assert w1 != w2


def test_budget_toml_round_trips() -> None:
    tree = generated_tree(2, 4, 8)
    assert parse(budget_toml(tree).encode()) == tree
    assert tree.accounts["prog1/team01"] == BudgetAccount(
        kind="project", shares=1, members=["u001", "u005"]
    )
    assert isinstance(tree, BudgetFile)
