"""The what-if's report compares the change with the same simulation of no change when it was
run (atk49-29 F1), with what happened otherwise, and says which."""

from __future__ import annotations

from ledger.sim import whatif as wi


def sim(
    metrics: dict[str, wi.TeamMetrics], baseline: dict[str, wi.TeamMetrics] | None
) -> wi.Simulated:
    return wi.Simulated(start=0.0, end=10.0, policy_version="p", config={}, metrics=metrics,
                        submissions=1, carried=0, cycles=3, baseline=baseline)  # fmt: skip


def test_the_report_compares_with_the_baseline_when_there_is_one() -> None:
    a = wi.TeamMetrics(team="t", delivered_gpu_h=1.0)
    w = wi.TeamMetrics(team="t", delivered_gpu_h=2.0)
    only_base = wi.TeamMetrics(team="u", delivered_gpu_h=3.0)
    rep = wi.report(sim({"t": w}, {"t": w, "u": only_base}), {"t": a})
    assert rep.compared == wi.COMPARED_BASELINE
    assert [(d.team, d.actual, d.baseline, d.whatif) for d in rep.teams] == [
        ("t", a, w, w),
        ("u", wi.TeamMetrics(team="u"), only_base, wi.TeamMetrics(team="u")),
    ]


def test_without_a_baseline_the_report_says_it_compares_with_what_happened() -> None:
    w = wi.TeamMetrics(team="t", delivered_gpu_h=2.0)
    rep = wi.report(sim({"t": w}, None), {})
    assert rep.compared == wi.COMPARED_ACTUAL
    assert rep.teams[0].baseline is None
