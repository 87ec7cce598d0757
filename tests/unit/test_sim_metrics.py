"""Run metrics on hand-made event histories: waits, loss to preemption, occupancy, owed."""

from __future__ import annotations

import pytest

from ledger.sim.metrics import JobFold, capacity_gpu_s, compute, jain, quantile
from projections import fairshare as fs
from schemas import events as e
from schemas.events import GpuSlot

T0 = 0.0
H = 3600.0


def kw(at: float) -> dict[str, object]:
    return {"event_id": f"e{at}", "at": at, "actor": "@t"}


def submitted(job_id: int, at: float, gpus: int, *, funded: bool = True, resumable: bool = False,
              debug: bool = False, account: str = "lab/a") -> e.JobSubmitted:  # fmt: skip
    return e.JobSubmitted(
        **kw(at),  # type: ignore[arg-type]
        job_id=job_id,
        account=account,
        user="u",
        gpus=gpus,
        min_runtime_s=3600 if funded else 0,
        resumable=resumable,
        debug=debug,
    )


def placed(job_id: int, at: float, gpus: int) -> e.JobPlaced:
    slot = GpuSlot(node="n1", gpu_indices=tuple(range(gpus)))
    return e.JobPlaced(**kw(at), job_id=job_id, slots=(slot,), cycle_id="c", based_on=0)  # type: ignore[arg-type]


def history() -> list[e.AnyEvent]:
    """One 8-GPU node for 10 h. Job 1 (resumable, 8 GPUs) runs 0-4 h, checkpoints at 3 h and is
    preempted at 4 h for job 2 (debug, submitted at 4 h, runs 4-5 h); job 1 runs again 5-10 h.
    Job 3 (unfunded) waits the whole time."""
    return [
        e.NodeRegistered(**kw(0), cluster="c", node="n1", gpu_type="h100", gpus=8),  # type: ignore[arg-type]
        submitted(1, 0, 8, resumable=True),
        placed(1, 0, 8),
        e.CheckpointReported(**kw(3 * H), job_id=1),  # type: ignore[arg-type]
        submitted(3, 3.5 * H, 8, funded=False),
        submitted(2, 4 * H, 8, debug=True, account="lab/b"),
        e.JobPreempted(**kw(4 * H), job_id=1, reason="debug", for_job=2),  # type: ignore[arg-type]
        e.JobRequeued(**kw(4 * H), job_id=1),  # type: ignore[arg-type]
        placed(2, 4 * H, 8),
        e.JobFinished(**kw(5 * H), job_id=2, outcome="completed", exit_code=0, reason="completed"),  # type: ignore[arg-type]
        placed(1, 5 * H, 8),
    ]


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
    rows = [
        fs.TeamHour("lab/a", h * H, 8, 0.5, 8, 4, 8 if h not in (4,) else 0)
        for h in range(10)
    ] + [fs.TeamHour("lab/b", h * H, 8, 0.5, 8 if h == 4 else 0, 4 if h == 4 else 0,
                     8 if h == 4 else 0) for h in range(10)]  # fmt: skip
    m = compute("t", fold, rows, [(0, 0), (5 * H, 8)], start=0, end=10 * H, capacity_gpus=8)
    assert m.occupancy == 1.0
    assert m.unfunded_share == 0.0
    assert m.lost_gpu_h == 8.0  # one hour since the checkpoint, on 8 GPUs
    assert m.lost_share == pytest.approx(8 / 80)
    assert m.lost_funded_gpu_h == 8.0 and m.lost_funded_share == pytest.approx(8 / 80)
    assert m.lost_by_kind == {
        "unfunded": 0.0, "non-resumable": 0.0, "periodic checkpoints": 8.0,
        "checkpoints on SIGTERM": 0.0,
    }  # fmt: skip
    assert m.preemptions == 1 and m.preempted_jobs == 1
    assert m.preemptions_by_reason == {"debug": 1}
    assert (m.wait_debug.count, m.wait_debug.p90_s) == (1, 0.0)
    # job 3 never started: it counts with its wait so far (6.5 h) and as never started
    assert m.wait.never_started == 1
    assert m.wait.count == 3
    assert m.wait.p50_s == 0.0
    assert m.wait_funded.count == 2
    assert m.wait_unfunded is not None and m.wait_unfunded.count == 1
    assert (m.wait_unfunded.never_started, m.wait_unfunded.p90_s) == (1, 6.5 * H)  # job 3
    assert m.fragmentation_gpus == pytest.approx(8 * 5 / 10)
    assert m.owed_by_period == 1.0  # a delivered 72 of 36 owed, b 8 of 4
    assert m.teams_at_95 == 2 and m.jain == 1.0
    assert m.convergence[-1][0] == 1.0


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
        e.NodeRegistered(**kw(0), cluster="c", node="n1", gpu_type="h100", gpus=8),  # type: ignore[arg-type]
        e.NodeRegistered(**kw(0), cluster="c", node="n2", gpu_type="h100", gpus=8),  # type: ignore[arg-type]
        e.NodeDrained(**kw(2 * H), node="n1"),  # type: ignore[arg-type]
        e.NodeReturned(**kw(5 * H), node="n1"),  # type: ignore[arg-type]
    ]
    for ev in events:
        fold.apply(ev)
    assert capacity_gpu_s(fold, 0, 10 * H) == (8 * 10 + 8 * 7) * H
