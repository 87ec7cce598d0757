"""A lab's Slurm ends runs at their time limits (`slurm-lab-2`, atk52-26 F3): the kernel's
`limit_runs`, and a simulated job with no declared limit ended at the partition's DefaultTime
(3 days) and resubmitted by its user for the rest, worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.core.budget import BudgetAccount, BudgetFile
from ledger.cycle.executor import Launch, Orders
from ledger.dispatch import registry
from ledger.sim.kernel import KernelExecutor
from ledger.sim.runner import START_AT, Cluster, SimConfig, simulate
from ledger.sim.workload import SimJob, Workload
from ledger.store.application import Ledger
from ledger.store.clock import SimClock
from schemas import events as e
from schemas.events import GpuSlot

H = 3600
D = 86_400


def launch(job_id: int, duration_s: float, limit_s: int | None, run: int = 0) -> Launch:
    slot = GpuSlot(node="n1", gpu_indices=(0,))
    return Launch(job_id, (slot,), (), duration_s, "u", "lab/a", run=run, time_limit_s=limit_s)


@pytest.mark.parametrize(
    ("case", "limit_runs", "limit_s", "want_at", "want_reason", "want_done"),
    [
        ("a limit enforced ends the run there, its work unfinished",
         True, H, H, "time_limit", H),
        ("work done before the limit ends by itself", True, 3 * H, 2 * H, "exited", None),
        ("no limit enforced: the run goes on to the end of its work",
         False, H, 2 * H, "exited", None),
        ("no limit declared", True, None, 2 * H, "exited", None),
    ],
)  # fmt: skip
def test_the_kernel_ends_a_run_at_its_time_limit_when_told(
    case: str, limit_runs: bool, limit_s: int | None, want_at: float, want_reason: str,
    want_done: float | None,
) -> None:  # fmt: skip
    ex = KernelExecutor(limit_runs=limit_runs)
    ex.carry_out(Orders(launches=(launch(1, 2 * H, limit_s),)), 0.0)
    assert ex.next_event_at() == want_at, case
    (exit_,) = ex.observe(want_at, {}).exits
    assert (exit_.at, exit_.reason) == (want_at, want_reason), case
    assert ex.timed_out.get(1) == want_done, case


def test_a_relaunch_gets_its_whole_limit_again_and_keeps_its_checkpoints() -> None:
    """Slurm's limit is per run: a run that checkpointed 30 min in and was stopped at 40 min
    runs again with a full hour's limit (restart overhead inside it) from its checkpoint."""
    ex = KernelExecutor(limit_runs=True, relaunch_s=600.0)
    ex.carry_out(Orders(launches=(launch(1, 4 * H, H),)), 0.0)
    ex.checkpoint(1, 0.5 * H)
    ex.carry_out(Orders(stops=(1,)), 40 * 60)
    ex.carry_out(Orders(launches=(launch(1, 4 * H, H, run=1),)), 2 * H)
    assert ex.next_event_at() == 3 * H
    (exit_,) = ex.observe(3 * H, {}).exits
    assert exit_.reason == "time_limit" and ex.timed_out[1] == 0.5 * H + H - 600


def one_team() -> BudgetFile:
    return BudgetFile(
        accounts={
            "lab": BudgetAccount(kind="program"),
            "lab/a": BudgetAccount(kind="project", shares=1, members=["alice"]),
        }
    )


def long_job(key: str, at_h: float, days: float, gpus: int = 8) -> SimJob:
    return SimJob(
        key=key, account="lab/a", user="alice", submit_s=int(at_h * H), duration_s=int(days * D),
        gpus=gpus, min_runtime_s=H, resumable=True,
    )  # fmt: skip


def events_of(home: Path) -> list[e.AnyEvent]:
    ledger = Ledger(home, SimClock(START_AT))
    try:
        return [ev for _, ev in ledger.read(0, 1_000_000)]
    finally:
        ledger.close()


@pytest.mark.parametrize("policy", ["slurm-lab", "slurm-lab-2"])
def test_slurm_lab_ends_a_job_at_default_time_and_its_user_resubmits_the_rest(
    tmp_path: Path, policy: str
) -> None:
    """One 8-GPU node, one job of 4 days with no declared limit. A lab's Slurm gives it the
    partition's DefaultTime (3 d) and ends it there (TIMEOUT); its user resubmits the day left
    at once, which restarts (5 min) and completes at 4 d 5 min: one original job, done then.
    (`slurm-lab-1` let it run its 4 days past the 3 its backfill assumed.)"""
    assert registry.CURRENT["slurm-lab"] == "slurm-lab-2"
    work = Workload(name="hand", jobs=(long_job("a", 0, 4.0),), budget=one_team())
    cfg = SimConfig(policy=policy, cluster=Cluster(nodes=1), days=5.0, relaunch_s=300.0)
    result = simulate(work, cfg, tmp_path / "h")
    ends = [(ev.job_id, ev.at - START_AT, ev.reason)
            for ev in events_of(tmp_path / "h") if isinstance(ev, e.JobFinished)]  # fmt: skip
    subs = [ev for ev in events_of(tmp_path / "h") if isinstance(ev, e.JobSubmitted)]
    assert subs[0].time_limit_s == 3 * D and subs[0].duration_s == 4 * D
    assert ends == [(1, 3 * D, "time_limit"), (2, 4 * D + 300, "completed")]
    assert subs[1].labels["resubmit_of"] == "1" and subs[1].duration_s == D
    m = result.metrics
    assert (m.jobs_submitted, m.jobs_completed, m.censored) == (1, 1, 0)
    assert m.jct_funded is not None and m.jct_funded.max_s == 4 * D + 300
    assert m.queued is not None and m.queued.max_s == 0.0
    assert m.lost_by_kind["relaunch"] == pytest.approx(8 * 300 / H)


def test_slurm_lab_1_still_lets_runs_outlive_the_limit_its_backfill_assumes(
    tmp_path: Path,
) -> None:
    """The old version replays as recorded: no limit given, the job runs its 4 days."""
    work = Workload(name="hand", jobs=(long_job("a", 0, 4.0),), budget=one_team())
    cfg = SimConfig(policy="slurm-lab-1", cluster=Cluster(nodes=1), days=5.0)
    simulate(work, cfg, tmp_path / "h")
    evs = events_of(tmp_path / "h")
    assert [ev.time_limit_s for ev in evs if isinstance(ev, e.JobSubmitted)] == [None]
    assert [(ev.at - START_AT, ev.reason) for ev in evs if isinstance(ev, e.JobFinished)] == [
        (4 * D, "completed")
    ]
