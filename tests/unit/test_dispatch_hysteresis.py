"""No preemption ping-pong: two teams contending for one node, over many cycles.

A tiny fake world: one 8-GPU node, two teams with equal shares and one resumable 8-GPU job
each. Every cycle (60 s) the running team's usage grows by 8 GPUs x 60 s; level fair share is
share / share-of-usage, ranks follow it. The contract is one cycle long, so only the margin
stands between the teams and a swap every other cycle.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from ledger.dispatch import (
    FairShare,
    NodeView,
    PendingJob,
    RunningJob,
    Snapshot,
    complete_ranks,
    decide,
)
from schemas.events import GpuSlot

T0 = 1_000_000.0
DT = 60.0
CONTRACT = 60
TEAMS = ("lab/a", "lab/b")
JOB_OF = {"lab/a": 1, "lab/b": 2}
TEAM_OF = {1: "lab/a", 2: "lab/b"}


@dataclass(frozen=True)
class Swap:
    at: float
    victim: str
    winner: str
    ratio: float
    """The winner's level fair share over the victim's when it preempted."""


def simulate(
    margin: float,
    cycles: int,
    usage: dict[str, float] | None = None,
    running_first: str | None = None,
    usage_moves: bool = True,
) -> list[Swap]:
    used = dict(usage or {t: 8 * 3600 * 10.0 for t in TEAMS})
    running: dict[str, float] = {}  # team -> placed_at
    if running_first:
        running[running_first] = T0 - 3600
    swaps: list[Swap] = []
    for c in range(cycles):
        now = T0 + c * DT
        total = sum(used.values())
        fs = {t: 0.5 / (used[t] / total) for t in TEAMS}
        order = sorted(TEAMS, key=lambda t: (-fs[t], t))
        ranks = complete_ranks({f"{t}/u": i for i, t in enumerate(order)})
        level_fs = {**fs, **{f"{t}/u": 1.0 for t in TEAMS}}
        held = tuple(
            RunningJob(
                job_id=JOB_OF[t],
                account=t,
                user="u",
                gpus=8,
                slots=(GpuSlot(node="n1", gpu_indices=tuple(range(8))),),
                placed_at=at,
                min_runtime_s=CONTRACT,
                resumable=True,
                checkpoint_at=at,
            )
            for t, at in running.items()
        )
        waiting = tuple(
            PendingJob(
                job_id=JOB_OF[t],
                account=t,
                user="u",
                gpus=8,
                min_runtime_s=CONTRACT,
                resumable=True,
                submitted_at=T0,
            )
            for t in TEAMS
            if t not in running
        )
        free = () if running else tuple(range(8))
        snap = Snapshot(
            position=c,
            nodes=(NodeView(name="n1", cluster="c1", gpu_type="h100", gpus=8, free=free),),
            running=held,
            pending=waiting,
            ranks=ranks,
            level_fs=level_fs,
        )
        d = decide(snap, FairShare(margin=margin), now)
        for p in d.preemptions:
            assert p.for_job is not None
            victim, winner = TEAM_OF[p.job_id], TEAM_OF[p.for_job]
            swaps.append(Swap(now, victim, winner, fs[winner] / fs[victim]))
            del running[victim]
        for pl in d.placements:
            running[TEAM_OF[pl.job_id]] = now
        if usage_moves:
            for t in running:
                used[t] += 8 * DT
    return swaps


def test_without_a_margin_the_teams_ping_pong() -> None:
    swaps = simulate(margin=0.0, cycles=24 * 60)
    assert len(swaps) > 500  # a swap every other cycle: the failure the margin prevents


@pytest.mark.parametrize("margin", [0.05, 0.1, 0.2])
def test_with_a_margin_swaps_are_rare_and_each_earned(margin: float) -> None:
    swaps = simulate(margin=margin, cycles=24 * 60)
    assert swaps, "the teams should still share the node over a day"
    assert all(s.ratio > 1 + margin for s in swaps)
    gaps = [b.at - a.at for a, b in itertools.pairwise(swaps)]
    # the usage gap must move by the margin before the loser can win back: about
    # margin x (usage 2 x 80 GPU-h) / (8 GPUs) seconds, far more than a cycle
    assert min(gaps) >= margin * 36_000
    assert len(swaps) <= 24 * 3600 / (margin * 36_000) + 1


def test_equal_fair_shares_never_preempt() -> None:
    assert simulate(margin=0.1, cycles=300, usage_moves=False) == []


def test_one_earned_preemption_is_never_undone_while_usage_stands_still() -> None:
    swaps = simulate(
        margin=0.1,
        cycles=300,
        usage={"lab/a": 2.0, "lab/b": 1.0},
        running_first="lab/a",
        usage_moves=False,
    )
    assert [(s.victim, s.winner) for s in swaps] == [("lab/a", "lab/b")]
