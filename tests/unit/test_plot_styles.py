"""Simulation plots tell 30 teams apart (a qualitative palette, then line styles) and scale
their axes to every value instead of clipping."""

from __future__ import annotations

from ledger.sim.report import PALETTE, team_styles, y_top


def test_thirty_teams_get_thirty_different_looks() -> None:
    teams = [f"prog{i % 3}/team{i:02d}" for i in range(30)]
    styles = team_styles(teams)
    assert len(set(styles.values())) == 30
    assert {c for c, _ in styles.values()} == set(PALETTE)
    # the same team keeps its look whatever order it comes in
    assert team_styles(list(reversed(teams))) == styles
    assert len(set(team_styles(teams[:15]).values())) == 15


def test_the_axis_shows_every_value() -> None:
    assert y_top([0.2, 0.9]) == 1.05
    assert y_top([0.5, 2.4, 1.7]) == 1.05 * 2.4 > 1.5
    assert y_top([]) == 1.05
    assert y_top([float("inf"), 3.0]) == 1.05 * 3.0
