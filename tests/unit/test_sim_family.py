"""The workload family: seeded, each knob does what it says, bad settings refused in one line."""

from __future__ import annotations

import pytest

from ledger.sim.family import Family, family, from_spec, parse_mix, parse_spec
from schemas.errors import InvalidCommand

SMALL = Family(gpus=256, days=3, teams=8, seed=3)


def _key(f: Family) -> list[tuple[object, ...]]:
    return [(j.key, j.account, j.user, j.submit_s, j.duration_s, j.gpus) for j in family(f).jobs]


def test_the_same_seed_gives_the_same_workload_and_another_seed_another() -> None:
    assert _key(SMALL) == _key(SMALL)
    other = Family(gpus=256, days=3, teams=8, seed=4)
    assert _key(other) != _key(SMALL)


def test_the_backlog_is_the_demand_beyond_supply_submitted_in_the_first_hour() -> None:
    for demand in (1.5, 4.0):
        w = family(Family(gpus=512, days=2, demand=demand, seed=1))
        first_hour = sum(j.gpus for j in w.jobs if j.submit_s < 3600)
        # the backlog plus the first hour's few arrivals
        assert (demand - 1) * 512 * 0.9 <= first_hour <= (demand - 1) * 512 + 0.2 * 512


def test_teams_sizes_and_kinds_follow_the_settings() -> None:
    f = Family(gpus=1024, days=7, teams=20, seed=2, debug=0.2, unfunded=0.3)
    w = family(f)
    teams = {j.account for j in w.jobs}
    assert len(teams) == 20
    assert all(j.gpus <= 1024 for j in w.jobs)
    large = [j for j in w.jobs if j.gpus >= 1024 // 8]
    assert large and {j.gpus for j in large} <= {128, 256}
    debug = [j for j in w.jobs if j.time_limit_s is not None and j.time_limit_s <= 900]
    assert 0.15 <= len(debug) / len(w.jobs) <= 0.3  # of the arrivals, by count
    assert all(j.duration_s <= (j.time_limit_s or 0) for j in debug)
    other = [j for j in w.jobs if j not in debug]
    unfunded_h = sum(j.gpus * j.duration_s for j in other if j.min_runtime_s == 0)
    share = unfunded_h / sum(j.gpus * j.duration_s for j in other)
    assert 0.15 <= share <= 0.45
    # gangs of whole nodes only
    assert all(j.gpus % 8 == 0 for j in other if j.gpus > 8)


def test_a_mix_of_only_large_jobs_has_only_large_non_debug_jobs() -> None:
    w = family(Family(gpus=2048, days=2, debug=0.0, mix=(("large", 1.0),), seed=5))
    assert {j.gpus for j in w.jobs} <= {256, 512}
    assert 256 in {j.gpus for j in w.jobs}


def test_a_spec_names_settings_and_bad_ones_are_refused() -> None:
    f = from_spec(
        "demand=3 teams=30 mix=small:1,large:1 skew=2", gpus=512, gpus_per_node=8, days=1, seed=9
    )
    assert (f.demand, f.teams, f.mix, f.skew, f.gpus, f.seed) == (
        3.0, 30, (("small", 1.0), ("large", 1.0)), 2.0, 512, 9,
    )  # fmt: skip
    assert from_spec("", gpus=256, gpus_per_node=8, days=1, seed=1, teams=5).teams == 5
    for bad, says in (
        ("demand=lots", "not a number"),
        ("colour=red", "invalid family setting"),
        ("demand", "invalid family setting"),
        ("mix=huge:1", "invalid mix entry"),
    ):
        with pytest.raises(InvalidCommand, match=says):
            parse_spec(bad)
    with pytest.raises(InvalidCommand, match="demand: 1 to 20"):
        from_spec("demand=0.5", gpus=256, gpus_per_node=8, days=1, seed=1)
    with pytest.raises(InvalidCommand, match="gpus: a multiple"):
        Family(gpus=100)
    with pytest.raises(InvalidCommand, match="mix: weights at least 0"):
        Family(mix=(("small", 1.0), ("large", -1.0)))
    with pytest.raises(InvalidCommand, match="debug: a share"):
        Family(debug=1.0)
    assert parse_mix("small:0.5, medium:0.5") == (("small", 0.5), ("medium", 0.5))
