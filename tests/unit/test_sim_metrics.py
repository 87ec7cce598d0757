"""Run metrics on hand-made event histories: every wait, completion, loss to preemption and
relaunch, idle time, occupancy, and owed on both yardsticks, each worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.core.budget import BudgetFile
from ledger.sim import report, yardstick
from ledger.sim.fold import IdleSample, JobFold
from ledger.sim.metrics import Metrics, capacity_gpu_s, compute, jain, quantile
from ledger.sim.runner import RunResult, SimConfig
from ledger.sim.workload import Workload
from projections import fairshare as fs
from schemas import events as e
from schemas.events import GpuSlot

T0 = 0.0
H = 3600.0


def kw(at: float) -> dict[str, object]:
    return {"event_id": f"e{at}", "at": at, "actor": "@t"}


def submitted(job_id: int, at: float, gpus: int, *, funded: bool = True, resumable: bool = False,
              debug: bool = False, account: str = "lab/a", work_s: float | None = None,
              resubmit_of: int | None = None) -> e.JobSubmitted:  # fmt: skip
    return e.JobSubmitted(
        **kw(at),  # type: ignore[arg-type]
        job_id=job_id,
        account=account,
        user="u",
        gpus=gpus,
        min_runtime_s=3600 if funded else 0,
        resumable=resumable,
        debug=debug,
        duration_s=work_s,
        labels={"resubmit_of": str(resubmit_of)} if resubmit_of else {},
    )


def node(at: float = 0, name: str = "n1", gpus: int = 8) -> e.NodeRegistered:
    return e.NodeRegistered(**kw(at), cluster="c", node=name, gpu_type="h100", gpus=gpus)  # type: ignore[arg-type]


def placed(job_id: int, at: float, gpus: int) -> e.JobPlaced:
    slot = GpuSlot(node="n1", gpu_indices=tuple(range(gpus)))
    return e.JobPlaced(**kw(at), job_id=job_id, slots=(slot,), cycle_id="c", based_on=0)  # type: ignore[arg-type]


def preempted(job_id: int, at: float, reason: str = "fairness") -> e.JobPreempted:
    return e.JobPreempted(**kw(at), job_id=job_id, reason=reason)  # type: ignore[arg-type]


def requeued(job_id: int, at: float) -> e.JobRequeued:
    return e.JobRequeued(**kw(at), job_id=job_id)  # type: ignore[arg-type]


def finished(job_id: int, at: float, outcome: str = "completed") -> e.JobFinished:
    return e.JobFinished(**kw(at), job_id=job_id, outcome=outcome, exit_code=0, reason=outcome)  # type: ignore[arg-type]


def history() -> list[e.AnyEvent]:
    """One 8-GPU node for 10 h. Job 1 (resumable, 8 GPUs) runs 0-4 h, checkpoints at 3 h and is
    preempted at 4 h for job 2 (debug, submitted at 4 h, runs 4-5 h); job 1 runs again 5-10 h.
    Job 3 (unfunded) waits the whole time."""
    return [
        node(),
        submitted(1, 0, 8, resumable=True, work_s=12 * H),
        placed(1, 0, 8),
        e.CheckpointReported(**kw(3 * H), job_id=1),  # type: ignore[arg-type]
        submitted(3, 3.5 * H, 8, funded=False),
        submitted(2, 4 * H, 8, debug=True, account="lab/b", work_s=H),
        preempted(1, 4 * H, "debug"),
        requeued(1, 4 * H),
        placed(2, 4 * H, 8),
        finished(2, 5 * H),
        placed(1, 5 * H, 8),
    ]


def rows_of_history() -> list[fs.TeamHour]:
    return [
        fs.TeamHour("lab/a", h * H, 8, 0.5, 8, 4, 8 if h not in (4,) else 0)
        for h in range(10)
    ] + [fs.TeamHour("lab/b", h * H, 8, 0.5, 8 if h == 4 else 0, 4 if h == 4 else 0,
                     8 if h == 4 else 0) for h in range(10)]  # fmt: skip


def run(events: list[e.AnyEvent], rows: list[fs.TeamHour] | None = None,
        samples: list[IdleSample] | None = None, end: float = 10 * H,
        relaunch_s: float = 0.0, capacity: int = 8) -> Metrics:  # fmt: skip
    fold = JobFold(relaunch_s=relaunch_s)
    for ev in events:
        fold.apply(ev)
    return compute("t", fold, rows or [], samples or [], start=0, end=end, capacity_gpus=capacity)


def test_fold_and_metrics_by_hand() -> None:
    fold = JobFold()
    for ev in history():
        fold.apply(ev)
    assert fold.preemptions == [(4 * H, 1, 8, 1 * H, "debug", True, "periodic checkpoints")]
    sigterm = JobFold(on_sigterm={1}, grace_s=30.0)
    for ev in history():
        sigterm.apply(ev)
    assert sigterm.preemptions == [(4 * H, 1, 8, 30.0, "debug", True, "checkpoints on SIGTERM")]
    assert capacity_gpu_s(fold, 0, 10 * H) == 8 * 10 * H
    samples = [IdleSample(0, 0, 0, 0, False), IdleSample(5 * H, 0, 0, 8, False)]
    m = compute("t", fold, rows_of_history(), samples, start=0, end=10 * H, capacity_gpus=8)
    assert m.occupancy == 1.0
    assert m.unfunded_share == 0.0
    assert m.lost_gpu_h == 8.0  # one hour since the checkpoint, on 8 GPUs
    assert m.lost_share == pytest.approx(8 / 80)
    assert m.lost_funded_gpu_h == 8.0 and m.lost_funded_share == pytest.approx(8 / 80)
    assert m.lost_by_kind == {
        "unfunded": 0.0, "non-resumable": 0.0, "periodic checkpoints": 8.0,
        "checkpoints on SIGTERM": 0.0, "relaunch": 0.0,
    }  # fmt: skip
    assert m.preemptions == 1 and m.preempted_jobs == 1
    assert m.preemptions_by_reason == {"debug": 1}
    assert (m.wait_debug.count, m.wait_debug.p90_s) == (1, 0.0)
    # every wait: job 1 at 0 h (0 s) and after its requeue (4-5 h: 1 h); job 2 (0 s); job 3
    # never started: it counts with its wait so far (6.5 h) and as never started
    assert m.wait.count == 4 and m.wait.never_started == 1
    assert sorted([m.wait.p50_s or 0.0, m.wait.max_s or 0.0]) == [0.5 * H, 6.5 * H]
    assert m.wait_funded.count == 3 and m.wait_funded.max_s == H
    assert m.wait_first is not None and m.wait_first.count == 3 and m.wait_first.p50_s == 0.0
    assert m.queued is not None and m.queued.count == 3
    assert m.queued_funded is not None and m.queued_funded.max_s == H  # job 1's requeue wait
    assert m.wait_unfunded is not None and m.wait_unfunded.count == 1
    assert (m.wait_unfunded.never_started, m.wait_unfunded.p90_s) == (1, 6.5 * H)  # job 3
    assert m.fragmentation_gpus == pytest.approx(8 * 5 / 10)
    assert m.owed_by_period == 1.0  # a delivered 72 of 36 owed, b 8 of 4
    assert m.teams_at_95 == 2 and m.jain == 1.0
    assert m.convergence[-1][0] == 1.0
    # completion: job 2 done at 5 h (1 h after submission, 1 h of work); job 1 and 3 not done
    assert m.jct_funded is not None and m.jct_funded.count == 2
    assert m.censored == 2 and m.jobs_completed == 1
    assert m.slowdown_funded is not None and m.slowdown_funded.p50_s == pytest.approx(
        (1.0 + 10 / 12) / 2
    )


def test_a_resubmission_waits_for_its_original_and_completes_it() -> None:
    """Job 1 (not resumable) runs 0-2 h, is preempted at 2 h and resubmitted as job 2, which
    waits 2-3 h and runs 3-6 h: one original job, two waits (0 s, 1 h), done at 6 h."""
    events = [
        node(),
        submitted(1, 0, 4, work_s=3 * H),
        placed(1, 0, 4),
        preempted(1, 2 * H),
        finished(1, 2 * H, "preempted"),
        submitted(2, 2 * H, 4, work_s=3 * H, resubmit_of=1),
        placed(2, 3 * H, 4),
        finished(2, 6 * H),
    ]
    m = run(events, relaunch_s=600.0)
    assert m.jobs_submitted == 1 and m.jobs_completed == 1 and m.censored == 0
    assert m.wait.count == 2 and m.wait.max_s == H
    assert m.wait_first is not None and m.wait_first.max_s == 0.0  # what earlier reports showed
    assert m.queued is not None and m.queued.max_s == H
    assert m.jct_funded is not None and m.jct_funded.max_s == 6 * H
    # the whole first run is lost (4 GPUs x 2 h), and the resubmission's restart (4 x 10 min)
    assert m.lost_by_kind["non-resumable"] == 8.0
    assert m.lost_by_kind["relaunch"] == pytest.approx(4 * 600 / H)
    assert m.lost_funded_gpu_h == pytest.approx(8.0 + 4 * 600 / H)


def test_a_relaunch_overhead_is_lost_once_and_never_more_than_the_hold() -> None:
    """Job 1 (resumable) preempted at 1 h, requeued, placed again at 2 h; preempted again at
    2 h 03 (before its 5-minute restart is over), placed at 3 h, runs to 5 h."""
    events = [
        node(),
        submitted(1, 0, 2, resumable=True, work_s=4 * H),
        placed(1, 0, 2),
        preempted(1, H),
        requeued(1, H),
        placed(1, 2 * H, 2),
        preempted(1, 2 * H + 180),
        requeued(1, 2 * H + 180),
        placed(1, 3 * H, 2),
        finished(1, 5 * H),
    ]
    m = run(events, relaunch_s=300.0)
    # the first preemption loses the hour since placement; the second loses nothing but the
    # 3 minutes of restart it had done; the last run pays the whole 5 minutes
    assert m.lost_by_kind["periodic checkpoints"] == pytest.approx(2.0)
    assert m.lost_by_kind["relaunch"] == pytest.approx(2 * (180 + 300) / H)
    assert m.preemptions == 2
    assert m.wait.count == 3 and m.queued is not None
    assert m.queued.max_s == pytest.approx(H + H - 180)


def test_large_jobs_and_the_longest_wait_under_share() -> None:
    """Two 8-GPU nodes, two teams with half each. Team a runs 16 GPUs 0-5 h (over its share);
    team b's 1-GPU job waits 1-5 h while b was delivered nothing (under its share); team a's
    second job (16 GPUs: large) waits 5-6 h while a is over its share."""
    events = [
        node(0, "n1"),
        node(0, "n2"),
        submitted(1, 0, 16, work_s=5 * H),
        placed(1, 0, 16),
        submitted(2, H, 1, account="lab/b", work_s=H),
        submitted(3, 5 * H, 16, work_s=H),
        finished(1, 5 * H),
        placed(2, 5 * H, 1),
        finished(2, 6 * H),
        placed(3, 6 * H, 16),
        finished(3, 7 * H),
    ]
    rows = [fs.TeamHour(t, h * H, 16, 0.5, 0, 0, 0) for t in ("lab/a", "lab/b") for h in range(8)]
    m = run(events, rows, end=8 * H, capacity=16)
    assert m.large_jobs == 2  # 16 GPUs >= 16/8; the 1-GPU job is not large
    assert m.queued_large is not None and m.queued_large.max_s == H
    assert (m.longest_under_share_s, m.longest_under_share_team) == (4 * H, "lab/b")


def test_idle_while_funded_work_waited_and_where() -> None:
    """One 8-GPU node: job 1 holds 4 GPUs 0-10 h; job 2 (8 GPUs) waits 2-10 h: 4 GPUs idle for
    8 h while funded work waited; the cycles said 4 were fragmented from 2 h to 6 h and 4 were
    kept for debug work from 6 h."""
    events = [
        node(),
        submitted(1, 0, 4, work_s=20 * H),
        placed(1, 0, 4),
        submitted(2, 2 * H, 8, work_s=H),
    ]
    samples = [
        IdleSample(0, 0, 0, 0, False),
        IdleSample(2 * H, 0, 0, 4, True),
        IdleSample(6 * H, 4, 0, 0, True),
    ]
    m = run(events, samples=samples)
    assert m.idle is not None
    assert m.idle.gpu_h == 32.0 and m.idle.share == pytest.approx(32 / 80)
    assert (m.idle.fragmented_gpu_h, m.idle.reserve_gpu_h, m.idle.other_gpu_h) == (16, 16, 0)
    assert m.idle.funded_waiting_share == pytest.approx(0.8)


@pytest.mark.parametrize(
    ("case", "jobs", "size", "want"),
    [
        ("a job larger than the partition shares it: half speed, twice as long",
         [(0, 8, H)], 4, [4.0, 4.0, 0.0]),
        ("jobs that fit run at their size", [(0, 2, H), (0, 2, H)], 4, [4.0, 0.0, 0.0]),
        ("a later job shares the partition: both end at 1.5 h",
         [(0, 4, H), (0.5 * H, 4, 0.5 * H)], 4, [4.0, 2.0, 0.0]),
        ("an empty partition owes nothing", [], 4, [0.0, 0.0, 0.0]),
        ("no allocation, nothing owed", [(0, 4, H)], 0, [0.0, 0.0, 0.0]),
    ],
)  # fmt: skip
def test_the_fixed_yardstick_is_a_fluid_partition_of_the_allocated_size(
    case: str, jobs: list[tuple[float, int, float]], size: float, want: list[float]
) -> None:
    demand = [yardstick.Demand("lab/a", at, g, w) for at, g, w in jobs]
    got = yardstick.owed_hours(demand, {"lab/a": size / 8}, 8, 0, 3 * H)
    assert got["lab/a"] == pytest.approx(want), case


def test_the_fixed_yardstick_does_not_move_with_the_policy() -> None:
    """Two runs of the same submissions, one that ran team a's job at once and one that left it
    waiting 5 h: Ai2's owed grows with the wait (demand under the policy), the fixed one does
    not, so the late run is 100% on Ai2's yardstick and below on the fixed one."""
    subs = [node(), submitted(1, 0, 8, work_s=2 * H)]
    prompt = [*subs, placed(1, 0, 8), finished(1, 2 * H)]
    late = [*subs, placed(1, 5 * H, 8), finished(1, 7 * H)]
    rows_prompt = [fs.TeamHour("lab/a", h * H, 8, 1.0, 8, 8, 8) for h in range(2)]
    rows_late = [fs.TeamHour("lab/a", h * H, 8, 1.0, 8, 8, 8 if h >= 5 else 0) for h in range(7)]
    a, b = run(prompt, rows_prompt), run(late, rows_late)
    assert a.owed_by_period == 1.0 and b.owed_by_period == pytest.approx(2 / 7)
    assert a.fixed_by_period == 1.0 and a.fixed_hour_by_hour == 1.0
    assert b.fixed_by_period == 1.0  # delivered all 16 GPU-h in the period, if late
    assert b.fixed_hour_by_hour == 0.0  # none of it in the hours it was owed
    assert [t.fixed_owed_gpu_h for t in a.team_rows] == [t.fixed_owed_gpu_h for t in b.team_rows]


@pytest.mark.parametrize(
    ("case", "values", "q", "want"),
    [
        ("empty", [], 0.9, None),
        ("one value", [5.0], 0.99, 5.0),
        ("interpolates", [0.0, 10.0], 0.9, 9.0),
        ("median of odd count", [3.0, 1.0, 2.0], 0.5, 2.0),
    ],
)
def test_quantile(case: str, values: list[float], q: float, want: float | None) -> None:
    assert quantile(values, q) == want, case


@pytest.mark.parametrize(
    ("case", "values", "want"),
    [
        ("all equal", [0.9, 0.9, 0.9], 1.0),
        ("one gets everything", [1.0, 0.0, 0.0, 0.0], 0.25),
        ("none", [], None),
    ],
)
def test_jain(case: str, values: list[float], want: float | None) -> None:
    assert jain(values) == (pytest.approx(want) if want is not None else None), case


def test_capacity_follows_drains() -> None:
    fold = JobFold()
    events: list[e.AnyEvent] = [
        node(0, "n1"),
        node(0, "n2"),
        e.NodeDrained(**kw(2 * H), node="n1"),  # type: ignore[arg-type]
        e.NodeReturned(**kw(5 * H), node="n1"),  # type: ignore[arg-type]
    ]
    for ev in events:
        fold.apply(ev)
    assert capacity_gpu_s(fold, 0, 10 * H) == (8 * 10 + 8 * 7) * H


def _result(m: Metrics) -> RunResult:
    return RunResult(
        metrics=m, home=Path("runs/t"), config=SimConfig(),
        workload=Workload("t", (), BudgetFile()), submitted=0, dropped=[], offered_gpu_h=0.0,
    )  # fmt: skip


def test_queued_per_job_sums_every_wait_and_is_the_sweep_tables_wait_measure() -> None:
    """atk52-26 F1: job 1 (resumable) is requeued twice and waits 1 h after each requeue, then
    1 h from 9 h to the horizon (10 h; open, so up to it): queued 3 h. Job 2 waits 1 h once.
    Every wait as its own sample (0 s, 1 h, 1 h, 1 h; 1 h) shows a p90 of 1 h, as if the
    requeued job waited no longer than job 2: queued per job shows its 3 h, and the printed
    table and the sweep's show it (p90 of [3 h, 1 h] = 2.8 h)."""
    events = [
        node(),
        submitted(1, 0, 4, resumable=True, work_s=20 * H),
        placed(1, 0, 4),
        preempted(1, 2 * H),
        requeued(1, 2 * H),
        placed(1, 3 * H, 4),
        preempted(1, 5 * H),
        requeued(1, 5 * H),
        placed(1, 6 * H, 4),
        preempted(1, 9 * H),
        requeued(1, 9 * H),
        submitted(2, H, 8, work_s=H),
        placed(2, 2 * H, 8),
        finished(2, 3 * H),
    ]
    m = run(events)
    assert m.wait.count == 5 and m.wait.p90_s == H
    assert m.queued is not None and m.queued.count == 2
    assert m.queued.max_s == 3 * H and m.queued.p90_s == pytest.approx(2.8 * H)
    r = _result(m)
    assert report.row(r)["queued_p90"] == "2.8h"
    assert ("queued_p90", "queued per job p90") in report.COLUMNS
    table = report.sweep_markdown([("w", [r])], "t").splitlines()
    header = [h.strip() for h in table[2].strip("|").split("|")]
    cells = [c.strip() for c in table[4].strip("|").split("|")]
    assert cells[header.index("queued per job p90")] == "2.8h"
    assert "| queued per job p50/p90/p99 |" in report.markdown([r]).replace("| policy ", "")


def test_a_wait_that_begins_at_the_first_instant_is_under_share() -> None:
    """atk52-26 F5: team b's job is submitted at the run's first instant, when b has had none
    of its half of the cluster, and waits 4 h behind team a's: the longest wait under share.
    (Before, a window of no length compared 0 < 0 and left the wait out.)"""
    events = [
        node(0, "n1"),
        submitted(1, 0, 8, work_s=4 * H),
        submitted(2, 0, 8, account="lab/b", work_s=H),
        placed(1, 0, 8),
        finished(1, 4 * H),
        placed(2, 4 * H, 8),
        finished(2, 5 * H),
    ]
    rows = [fs.TeamHour(t, h * H, 8, 0.5, 0, 0, 0) for t in ("lab/a", "lab/b") for h in range(6)]
    m = run(events, rows, end=6 * H)
    assert (m.longest_under_share_s, m.longest_under_share_team) == (4 * H, "lab/b")


def test_a_job_killed_and_not_resubmitted_waits_to_the_horizon() -> None:
    """atk53-26 F2 (`--no-resubmit`): job 1 (not resumable) runs 0-2 h and is killed by a
    preemption; nobody resubmits it, so its work is still owed: it waits from the kill to the
    horizon (10 h), 8 h queued, in every wait and the longest wait under share (team a had 4
    of its 8 GPUs). Before, its queued time ended at its placement (0 s)."""
    events = [
        node(),
        submitted(1, 0, 4, work_s=5 * H),
        placed(1, 0, 4),
        preempted(1, 2 * H),
        finished(1, 2 * H, "preempted"),
    ]
    rows = [fs.TeamHour(t, h * H, 8, 0.5, 0, 0, 0) for t in ("lab/a", "lab/b") for h in range(10)]
    m = run(events, rows, capacity=16)
    assert m.queued is not None and m.queued.max_s == 8 * H
    assert m.queued_funded is not None and m.queued_funded.max_s == 8 * H
    assert m.wait.count == 2 and m.wait.max_s == 8 * H
    assert m.queued.never_started == 0  # it ran
    assert m.censored == 1 and m.jobs_completed == 0
    assert (m.longest_under_share_s, m.longest_under_share_team) == (8 * H, "lab/a")


def test_a_team_holding_the_cluster_at_the_first_instant_is_not_under_share() -> None:
    """atk53-26 F3: team a (half the cluster) takes both nodes at the run's first instant and
    its third job, submitted then, waits 4 h: a held all of it, so it was not under its share
    (as when the third is submitted a second later). Before, the first instant counted every
    team with a share as under it, whatever it held."""
    events = [
        node(0, "n1"),
        node(0, "n2"),
        submitted(1, 0, 8, work_s=4 * H),
        submitted(2, 0, 8, work_s=4 * H),
        submitted(3, 0, 8, work_s=H),
        placed(1, 0, 8),
        placed(2, 0, 8),
        finished(1, 4 * H),
        placed(3, 4 * H, 8),
        finished(2, 4 * H),
        finished(3, 5 * H),
    ]
    rows = [fs.TeamHour(t, h * H, 16, 0.5, 0, 0, 0) for t in ("lab/a", "lab/b") for h in range(6)]
    m = run(events, rows, end=6 * H, capacity=16)
    assert (m.longest_under_share_s, m.longest_under_share_team) == (None, None)


def test_the_restart_of_a_run_still_going_at_the_end_is_lost() -> None:
    """atk53-26 F4: job 1 (resumable) is preempted at 1 h and placed again at 2 h, and still
    runs at the horizon (3 h): its relaunch paid its 10-minute restart, lost like any other
    (4 GPUs x 10 min). Before, a restart was charged only when its run ended."""
    events = [
        node(),
        submitted(1, 0, 4, resumable=True, work_s=10 * H),
        placed(1, 0, 4),
        preempted(1, H),
        requeued(1, H),
        placed(1, 2 * H, 4),
    ]
    m = run(events, end=3 * H, relaunch_s=600.0)
    assert m.lost_by_kind["relaunch"] == pytest.approx(4 * 600 / H)
    assert m.lost_funded_gpu_h == pytest.approx(4.0 + 4 * 600 / H)
    # a horizon inside the restart: what it paid by then
    m = run(events, end=2 * H + 120, relaunch_s=600.0)
    assert m.lost_by_kind["relaunch"] == pytest.approx(4 * 120 / H)


def test_funded_non_debug_figures_leave_out_the_debug_jobs_that_hide_a_funded_wait() -> None:
    """atk54-26 F4: on one 8-GPU node, funded job 1 runs 0-6 h, job 2 (submitted at 0) waits
    for it 6 h and runs 6-8 h, job 3 (submitted at 1 h) never starts: it waits to the horizon
    (9 h; JCT 9 h so far). 20 funded 1-GPU debug jobs of 5 min each run on a second node from 8 h
    on, none waiting. The funded figures count the debug jobs: queued p90 0 s, JCT p90 about
    1.3 h, as if no funded job waited. The funded non-debug figures are of jobs 1-3 alone:
    queued [0, 6 h, 9 h] p90 8.4 h (job 3 never started, counted to the horizon), JCT [6 h, 8 h,
    9 h] p90 8.8 h; the printed row and the JSON show them."""
    M = 300.0
    events: list[e.AnyEvent] = [
        node(),
        node(0, "n2"),
        submitted(1, 0, 8, work_s=6 * H),
        submitted(2, 0, 8, work_s=2 * H),
        placed(1, 0, 8),
        submitted(3, H, 8, work_s=H),
        finished(1, 6 * H),
        placed(2, 6 * H, 8),
        finished(2, 8 * H),
    ]
    for k in range(20):
        at = 8 * H + k * M
        slot = GpuSlot(node="n2", gpu_indices=(k % 8,))
        events += [
            submitted(10 + k, at, 1, debug=True, account="lab/b", work_s=M),
            e.JobPlaced(**kw(at), job_id=10 + k, slots=(slot,), cycle_id="c", based_on=0),  # type: ignore[arg-type]
            finished(10 + k, at + M),
        ]
    m = run(events, capacity=16)
    assert m.queued_funded is not None and m.queued_funded.p90_s == 0.0
    assert m.jct_funded is not None and m.jct_funded.p90_s == pytest.approx(0.8 * 6 * H + 0.2 * M)
    q = m.queued_funded_nondebug
    assert q is not None and (q.count, q.never_started) == (3, 1)
    assert q.p90_s == pytest.approx(8.4 * H)
    jct = m.jct_funded_nondebug
    assert jct is not None and jct.count == 3 and jct.p90_s == pytest.approx(8.8 * H)
    r = _result(m)
    assert report.row(r)["nondebug_p90"] == "8.4h / 8.8h"
    assert ("nondebug_p90", "funded non-debug queued / JCT p90") in report.COLUMNS
    assert "| funded non-debug queued / JCT p90 |" in report.markdown([r])
    out = report.summary(r)["metrics"]
    assert out["queued_funded_nondebug"]["p90_s"] == pytest.approx(8.4 * H)
    assert out["jct_funded_nondebug"]["p90_s"] == pytest.approx(8.8 * H)
