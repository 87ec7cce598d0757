"""Measures that cannot hide what happened (atk55-26 / atk56-26 F5): a lock-out paid back later
reads 100% on the fixed yardstick by period, so every report gives the worst team's fixed owed
hour by hour and day by day too; and a trace job whose time limit is shorter than its work ends
there as a time-limit end, not `completed`."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.sim import report
from ledger.sim.runner import START_AT, Cluster, SimConfig, simulate
from ledger.sim.workload import SimJob, Workload
from projections import fairshare as fs
from schemas import events as e
from tests.unit.test_sim_metrics import finished, node, placed, run, submitted
from tests.unit.test_sim_time_limits import events_of, one_team

H = 3600.0
D = 86_400.0


def test_a_lock_out_paid_back_later_reads_100_by_period_but_not_hour_by_hour_or_day_by_day() -> (
    None
):
    """Two teams of 4 GPUs each on one 8-GPU node, 4 days. Team a's 4-GPU job of 2 days is
    locked out for 2 days while team b's runs, then runs days 2-4; team b's, submitted with it,
    runs at once. By period both teams got all they were owed on the fixed yardstick (a's late);
    hour by hour and day by day team a got none of it when it was owed."""
    evs = [
        node(),
        submitted(1, 0, 4, account="lab/a", work_s=2 * D),
        submitted(2, 0, 4, account="lab/b", work_s=2 * D),
        placed(2, 0, 4),
        finished(2, 2 * D),
        placed(1, 2 * D, 4),
        finished(1, 4 * D),
    ]
    hours = range(96)
    rows = [fs.TeamHour("lab/a", h * H, 8, 0.5, 4, 4, 4 if h >= 48 else 0) for h in hours] + [
        fs.TeamHour("lab/b", h * H, 8, 0.5, 4 if h < 48 else 0, 4 if h < 48 else 0,
                    4 if h < 48 else 0) for h in hours
    ]  # fmt: skip
    m = run(evs, rows, end=4 * D)
    assert m.fixed_worst_by_period == 1.0 and m.fixed_teams_at_95 == 2  # what hid the lock-out
    assert (m.fixed_worst_hourly_team, m.fixed_worst_hourly) == ("lab/a", 0.0)
    assert (m.fixed_worst_daily_team, m.fixed_worst_daily) == ("lab/a", 0.0)
    by_team = {t.team: t.fixed_hour_by_hour for t in m.team_rows}
    assert by_team == {"lab/a": 0.0, "lab/b": 1.0}
    # every report's table shows it, for every policy the same way
    assert "worst_fixed" in dict(report.COLUMNS)
    assert report._worst_fixed(m) == "0.0% / 0.0%"


def test_day_by_day_forgives_an_hour_late_but_not_a_day_late() -> None:
    """One team, one 8-GPU job of 2 h placed 1 h late: hour by hour it met half of what was
    owed; day by day all of it (the same day)."""
    evs = [node(), submitted(1, 0, 8, work_s=2 * H), placed(1, H, 8), finished(1, 3 * H)]
    rows = [fs.TeamHour("lab/a", h * H, 8, 1.0, 8, 8, 8 if h >= 1 else 0) for h in range(3)]
    m = run(evs, rows, end=D)
    assert m.fixed_worst_hourly == pytest.approx(0.5)
    assert m.fixed_worst_daily == pytest.approx(1.0)


def short_limit_job() -> SimJob:
    """2 h of work on one 8-GPU node under a declared limit of 1 h (funded, not resumable)."""
    return SimJob(
        key="x1", account="lab/a", user="alice", submit_s=0, duration_s=int(2 * H), gpus=8,
        min_runtime_s=int(H), resumable=False, time_limit_s=int(H),
    )  # fmt: skip


@pytest.mark.parametrize("policy", ["fairshare-7", "fairshare-17", "slurm-lab-2", "legacy-2"])
def test_a_trace_job_whose_limit_is_shorter_than_its_work_ends_at_its_limit_not_completed(
    tmp_path: Path, policy: str
) -> None:
    """It runs to its limit (1 h) and ends there, `time_limit` with its work unfinished, under
    every policy; its user does not resubmit it (the limit is its own, not one the engine
    gave); it is not done (`censored`) and counted apart (`ended_at_limit`). The fixed
    yardstick owes it its limit's work alone (no policy can run more of it)."""
    work = Workload(name="hand", jobs=(short_limit_job(),), budget=one_team())
    cfg = SimConfig(policy=policy, cluster=Cluster(nodes=1), days=0.5)
    m = simulate(work, cfg, tmp_path / "h").metrics
    evs = events_of(tmp_path / "h")
    ends = [(ev.at - START_AT, ev.outcome, ev.reason) for ev in evs
            if isinstance(ev, e.JobFinished)]  # fmt: skip
    assert ends == [(H, "failed", "time_limit")]
    assert [ev.duration_s for ev in evs if isinstance(ev, e.JobSubmitted)] == [2 * H]
    assert (m.jobs_submitted, m.jobs_completed, m.censored, m.ended_at_limit) == (1, 0, 1, 1)
    assert m.team_rows[0].fixed_owed_gpu_h == pytest.approx(8.0)
    assert m.fixed_by_period == pytest.approx(1.0)
