"""fairshare-10: each placement inside one `decide()` charges its team (GPUs x its contract)
before the next job is ranked, so teams tied at zero usage share an idle cluster by their shares
in the first cycle (an outside attacker's finding: under fairshare-9 the first team's job array
took the whole cluster); fairshare-9 decides as before; the order stays total and replayable."""

from __future__ import annotations

import collections
import math

import msgspec
import pytest

from ledger.dispatch import decide
from ledger.dispatch.fairshare9 import FairShare9
from ledger.dispatch.fairshare10 import FairShare10, allocated
from ledger.dispatch.registry import config_of, default_config, policy_from_config
from ledger.dispatch.snapshot import NodeView, PendingJob, Snapshot
from ledger.reads.preview import key_parts

NOW = 100_000.0
ARRAY = 64


def array(team: str, first_id: int, n: int = ARRAY, min_runtime_s: int = 3600) -> list[PendingJob]:
    """A job array: `n` 1-GPU funded jobs of `team`, submitted together."""
    return [
        PendingJob(
            job_id=first_id + i,
            account=team,
            user="u",
            gpus=1,
            min_runtime_s=min_runtime_s,
            submitted_at=NOW - 60.0,
        )
        for i in range(n)
    ]


def idle_cluster(
    teams: dict[str, float], usage: dict[str, float] | None = None, nodes: int = 4
) -> Snapshot:
    """An idle cluster of `nodes` x 8 GPUs; every team of `lab` (its share) submits a 64-job
    array of 1-GPU jobs; usage zero unless given (ranks and level fair shares as the
    projection gives them at zero usage: every level `inf`, leaves ranked by name)."""
    views = tuple(
        NodeView(name=f"n{i}", cluster="c1", gpu_type="h100", gpus=8, free=tuple(range(8)))
        for i in range(nodes)
    )
    used = usage or {}
    total_shares = sum(teams.values())
    pending: list[PendingJob] = []
    for k, team in enumerate(sorted(teams)):
        pending += array(f"lab/{team}", 1000 * (k + 1))
    paths = ["lab", *(f"lab/{t}" for t in sorted(teams)), *(f"lab/{t}/u" for t in sorted(teams))]
    account_usage = {p: 0.0 for p in paths}
    for team, u in used.items():
        for p in (f"lab/{team}", f"lab/{team}/u"):
            account_usage[p] = u
    account_usage["lab"] = sum(used.values())
    shares = {"lab": 1.0, **{f"lab/{t}": s / total_shares for t, s in teams.items()}}
    shares.update({f"lab/{t}/u": 1.0 for t in teams})
    level_fs = {p: math.inf for p in paths}
    order = sorted(teams, key=lambda t: (used.get(t, 0.0) / shares[f"lab/{t}"], t))
    if used:
        everyone = sum(used.values())
        for t in teams:
            u = used.get(t, 0.0)
            level_fs[f"lab/{t}"] = math.inf if u <= 0 else shares[f"lab/{t}"] / (u / everyone)
    return Snapshot(
        position=9,
        taken_at=NOW,
        nodes=views,
        pending=tuple(pending),
        ranks={f"lab/{t}/u": i for i, t in enumerate(order)},
        level_fs=level_fs,
        usage=account_usage,
        shares=shares,
    )


def placed_by_team(snap: Snapshot, policy: object) -> dict[str, int]:
    d = decide(snap, policy, NOW)  # type: ignore[arg-type]
    team = {j.job_id: j.account for j in snap.pending}
    return dict(collections.Counter(team[p.job_id] for p in d.placements))


@pytest.mark.parametrize(
    ("teams", "want"),
    [
        ({"a": 1, "b": 1}, {"lab/a": 16, "lab/b": 16}),
        ({"a": 1, "b": 1, "c": 1}, {"lab/a": 32 / 3, "lab/b": 32 / 3, "lab/c": 32 / 3}),
        ({"a": 2, "b": 1}, {"lab/a": 64 / 3, "lab/b": 32 / 3}),
        ({"a": 1, "b": 1, "c": 2}, {"lab/a": 8, "lab/b": 8, "lab/c": 16}),
    ],
    ids=["two equal teams", "three equal teams", "shares 2:1", "shares 1:1:2"],
)
def test_the_first_cycle_on_an_idle_cluster_splits_it_by_share(
    teams: dict[str, float], want: dict[str, float]
) -> None:
    snap = idle_cluster(teams)
    got = placed_by_team(snap, FairShare10())
    assert sum(got.values()) == 32
    assert all(abs(got.get(t, 0) - w) <= 1 for t, w in want.items()), got
    # fairshare-9 (ranks fixed for the whole cycle): the first team takes every GPU
    assert placed_by_team(snap, FairShare9()) == {"lab/a": 32}


def test_usage_before_the_cycle_counts_with_the_charges() -> None:
    """b used 8 GPU-h this week, a nothing: a's first 8 one-hour jobs catch it up, then the
    two teams alternate (each placement charges 1 GPU-h)."""
    snap = idle_cluster({"a": 1, "b": 1}, usage={"b": 8 * 3600.0})
    got = placed_by_team(snap, FairShare10())
    assert got == {"lab/a": 20, "lab/b": 12}


def test_a_fixed_horizon_charges_every_job_alike() -> None:
    """b's jobs declare 4 h contracts, a's 1 h: by contract a gets 4 GPUs per b's one; with
    `charge_s` one horizon for all, they split evenly."""
    snap = idle_cluster({"a": 1, "b": 1})
    long_b = tuple(
        msgspec.structs.replace(j, min_runtime_s=4 * 3600) if j.account == "lab/b" else j
        for j in snap.pending
    )
    snap = msgspec.structs.replace(snap, pending=long_b)
    by_contract = placed_by_team(snap, FairShare10())
    assert abs(by_contract["lab/a"] - 32 * 4 / 5) <= 1 and abs(by_contract["lab/b"] - 32 / 5) <= 1
    assert placed_by_team(snap, FairShare10(charge_s=3600.0)) == {"lab/a": 16, "lab/b": 16}


def test_without_usage_in_the_snapshot_it_orders_as_fairshare_9() -> None:
    snap = msgspec.structs.replace(idle_cluster({"a": 1, "b": 1}), usage={}, shares={})
    ten, nine = decide(snap, FairShare10(), NOW), decide(snap, FairShare9(), NOW)
    assert ten.placements == nine.placements
    assert [j.job_id for _, j in ten.order] == [j.job_id for _, j in nine.order]


def test_the_recorded_order_is_the_order_walked_and_total() -> None:
    snap = idle_cluster({"a": 1, "b": 1})
    d = decide(snap, FairShare10(), NOW)
    keys = [k for k, _ in d.order]
    assert len(d.order) == 2 * ARRAY and keys == sorted(keys)
    assert [k[3] for k in keys] == list(range(2 * ARRAY))  # the turn
    first = [d.order[i][1].account for i in range(4)]
    assert first == ["lab/a", "lab/b", "lab/a", "lab/b"]  # interleaved from the first turn
    placed = {p.job_id for p in d.placements}
    assert {j.job_id for _, j in d.order[:32]} == placed  # the placed, then those that wait
    assert len(d.waiting) == 2 * ARRAY - 32
    assert [p.name for p in key_parts("fairshare-10", keys[0])][3] == "turn"
    # the same snapshot decides the same, byte for byte (replay)
    again = decide(snap, FairShare10(), NOW)
    assert msgspec.json.encode(again.to_command("d", "c")) == msgspec.json.encode(
        d.to_command("d", "c")
    )


def test_read_without_a_cycle_the_order_walks_with_nothing_placed() -> None:
    snap = idle_cluster({"a": 1, "b": 1})
    keyed = FairShare10().order(snap)
    assert len(keyed) == 2 * ARRAY
    assert [j.account for _, j in keyed][:3] == ["lab/a", "lab/a", "lab/a"]  # nothing charged


def test_allocated_is_the_product_of_the_shares_on_the_path() -> None:
    shares = {"p": 0.5, "p/t": 0.25}
    assert allocated("p/t", shares) == 0.125
    assert allocated("q/t", shares) == 0.0


def test_fairshare_10_is_registered_and_round_trips() -> None:
    ten = policy_from_config(default_config("fairshare-10"))
    assert type(ten) is FairShare10 and ten.charge_s == 0.0 and ten.starve_after_s == 0.0
    assert policy_from_config(config_of(FairShare10(charge_s=60.0))) == FairShare10(charge_s=60.0)
