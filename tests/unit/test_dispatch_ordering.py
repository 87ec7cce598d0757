"""Pending-job order: the fair-share ladder and the fifo baseline."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.dispatch import (
    FairShare,
    Fifo,
    PendingJob,
    Snapshot,
    complete_ranks,
    decide,
    fairshare_key,
)
from ledger.dispatch.snapshot import UNRANKED


def job(
    job_id: int,
    account: str = "lab/a",
    user: str = "u",
    *,
    funded: bool = True,
    priority: int = 0,
    at: float = 0.0,
) -> PendingJob:
    return PendingJob(
        job_id=job_id,
        account=account,
        user=user,
        gpus=1,
        min_runtime_s=600 if funded else 0,
        priority=priority,
        submitted_at=at,
    )


LEAF_RANKS = {"lab/a/u": 0, "lab/a/v": 1, "lab/b/u": 2, "lab/b/v": 3}


@dataclass(frozen=True)
class OrderCase:
    name: str
    jobs: list[PendingJob]
    want_order: list[int]
    ranks: dict[str, int] = field(default_factory=lambda: dict(LEAF_RANKS))


ORDER_CASES = [
    OrderCase(
        "funded work comes before unfunded work whatever the ranks",
        [job(1, "lab/a", funded=False), job(2, "lab/b", "v")],
        want_order=[2, 1],
    ),
    OrderCase(
        "a better-ranked team comes first",
        [job(1, "lab/b"), job(2, "lab/a")],
        want_order=[2, 1],
    ),
    OrderCase(
        "priority orders jobs inside one team",
        [job(1, "lab/a", "u", priority=0), job(2, "lab/a", "v", priority=5)],
        want_order=[2, 1],
    ),
    OrderCase(
        "priority never lets a team overtake a better-ranked one",
        [job(1, "lab/b", priority=100), job(2, "lab/a", priority=0)],
        want_order=[2, 1],
    ),
    OrderCase(
        "inside a team with equal priority the better-ranked user leaf comes first",
        [job(1, "lab/a", "v"), job(2, "lab/a", "u")],
        want_order=[2, 1],
    ),
    OrderCase(
        "then the earlier submission",
        [job(1, at=20.0), job(2, at=10.0)],
        want_order=[2, 1],
    ),
    OrderCase(
        "then the job id",
        [job(2), job(1)],
        want_order=[1, 2],
    ),
    OrderCase(
        "an account the fair-share reader does not know comes last",
        [job(1, "lab/new"), job(2, "lab/b", "v")],
        want_order=[2, 1],
    ),
    OrderCase(
        "a user without a leaf rank takes the project's rank",
        [job(1, "lab/b", "zed"), job(2, "lab/b", "v")],
        want_order=[1, 2],
    ),
    OrderCase(
        "unfunded work is ordered by fair share too",
        [job(1, "lab/b", funded=False), job(2, "lab/a", funded=False)],
        want_order=[2, 1],
    ),
]


@pytest.mark.parametrize("case", ORDER_CASES, ids=lambda c: c.name)
def test_fairshare_order(case: OrderCase) -> None:
    snap = Snapshot(position=1, pending=tuple(case.jobs), ranks=complete_ranks(case.ranks))
    got = [j.job_id for _, j in FairShare().order(snap)]
    assert got == case.want_order


def test_sort_key_is_a_tuple_of_primitives_in_the_documented_ladder() -> None:
    ranks = complete_ranks(LEAF_RANKS)
    key = fairshare_key(job(7, "lab/b", "v", priority=3, at=12.5), ranks)
    assert key == (0, 2, -3, 3, 12.5, 7)
    assert all(isinstance(x, int | float | str) for x in key)


def test_complete_ranks_ranks_interior_accounts_as_their_best_leaf() -> None:
    assert complete_ranks(LEAF_RANKS) == {**LEAF_RANKS, "lab": 0, "lab/a": 0, "lab/b": 2}
    assert complete_ranks({"lab/a": 5, "lab/a/u": 1}) == {"lab/a": 5, "lab/a/u": 1, "lab": 1}


def test_unranked_sentinel_sorts_after_any_real_rank() -> None:
    assert UNRANKED > 10**8


def test_fifo_orders_by_submit_time_then_id_only() -> None:
    jobs = (job(3, "lab/a", at=5.0), job(1, "lab/b", funded=False, at=1.0), job(2, at=5.0))
    snap = Snapshot(position=1, pending=jobs, ranks=complete_ranks(LEAF_RANKS))
    assert [(k, j.job_id) for k, j in Fifo().order(snap)] == [
        ((1.0, 1), 1),
        ((5.0, 2), 2),
        ((5.0, 3), 3),
    ]


accounts = st.sampled_from(["lab/a", "lab/b", "lab/c", "other/x"])
users = st.sampled_from(["u", "v", "w"])
pending_jobs = st.lists(
    st.builds(
        lambda i, a, u, f, p, t: job(i, a, u, funded=f, priority=p, at=t),
        st.integers(1, 10_000),
        accounts,
        users,
        st.booleans(),
        st.integers(-3, 3),
        st.sampled_from([0.0, 1.0, 2.5, 100.0]),
    ),
    max_size=40,
    unique_by=lambda j: j.job_id,
)
rank_maps = st.dictionaries(
    st.sampled_from([f"{a}/{u}" for a in ("lab/a", "lab/b", "lab/c", "other/x") for u in "uvw"]),
    st.integers(0, 20),
)


@given(pending_jobs, rank_maps, st.randoms(use_true_random=False))
def test_order_is_total_and_deterministic(
    jobs: list[PendingJob], leaf_ranks: dict[str, int], rnd: random.Random
) -> None:
    ranks = complete_ranks(leaf_ranks)
    shuffled = list(jobs)
    rnd.shuffle(shuffled)
    first = FairShare().order(Snapshot(position=1, pending=tuple(jobs), ranks=ranks))
    again = FairShare().order(Snapshot(position=1, pending=tuple(shuffled), ranks=ranks))
    assert first == again
    keys = [k for k, _ in first]
    assert len(set(keys)) == len(keys), "two jobs share a sort key"
    assert keys == sorted(keys)
    # funded work strictly before unfunded work
    funded = [j.min_runtime_s > 0 for _, j in first]
    assert funded == sorted(funded, reverse=True)


def test_leaf_ranks_alone_still_give_a_fair_share_order() -> None:
    jobs = (job(1, "lab/b", priority=9), job(2, "lab/a", "v"), job(3, "lab/a", "u"))
    snap = Snapshot(position=1, pending=jobs, ranks=dict(LEAF_RANKS))  # not completed
    assert [j.job_id for _, j in FairShare().order(snap)] == [3, 2, 1]


def test_decide_completes_leaf_ranks_so_priority_orders_the_whole_team() -> None:
    jobs = (job(1, "lab/a", "v", priority=5), job(2, "lab/a", "u"), job(3, "lab/b", priority=9))
    snap = Snapshot(position=1, pending=jobs, ranks=dict(LEAF_RANKS))  # leaves only
    fair = decide(snap, FairShare(), 0.0).considered()
    assert [c.job_id for c in fair] == [1, 2, 3]
    assert fair[0].sort_key == (0, 0, -5, 1, 0.0, 1)
