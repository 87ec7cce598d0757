"""F1 of atk23c: `jobs` and `explain` show a run's real start and end, the ones its events carry
(`JobStarted.started_at`, `JobFinished.ended_at`), not when they were recorded: a run adopted
after a restart, or first seen after it ended, was shown starting at the restart (after its
own end, elapsed 0). The projection (DuckDB), its reference fold and `explain` agree."""

from __future__ import annotations

from ledger.core.state import Job
from ledger.reads import layer
from ledger.reads.explain import explain_history
from projections.projector import Projector
from projections.source import ListSource, LogRecord
from projections.store import Store
from projections.testing.reference import fold
from schemas import codec
from schemas import events as e
from schemas import views as v
from schemas.events import GpuSlot, tag_of

T = 1_796_172_000.0


def _kw(n: int, at: float) -> dict[str, object]:
    return {"event_id": f"e{n}", "actor": "@executor", "at": at}


HISTORY: list[e.AnyEvent] = [
    e.AccountOpened(**_kw(1, T), path="ai2", parent=None, kind="program"),
    e.NodeRegistered(**_kw(2, T), cluster="c", node="n1", gpu_type="h100", gpus=8),
    e.JobSubmitted(**_kw(3, T), job_id=1, account="ai2/p", user="ann", gpus=1, min_runtime_s=0),
    e.JobPlaced(
        **_kw(4, T + 1),
        job_id=1,
        slots=(GpuSlot(node="n1", gpu_indices=(0,)),),
        cycle_id="c1",
        based_on=3,
    ),
    # recorded 37 s after the restart; the run started at T+10 and ended at T+22
    e.JobStarted(**_kw(5, T + 37), job_id=1, logs=("/w/o-1.out",), started_at=T + 10),
    e.JobFinished(
        **_kw(6, T + 37),
        job_id=1,
        outcome="completed",
        exit_code=0,
        reason="completed",
        ended_at=T + 22,
    ),
]


def _records() -> list[LogRecord]:
    return [LogRecord(i + 1, tag_of(type(ev)), codec.encode(ev)) for i, ev in enumerate(HISTORY)]


def test_jobs_shows_the_runs_own_start_and_end_not_when_they_were_recorded() -> None:
    with Store(":memory:") as store:
        Projector(store, ListSource(_records())).catch_up()
        (row,) = layer.jobs(store, v.JobFilter(job_ids=(1,)), T + 100, None)
    assert (row.started_at, row.finished_at, row.elapsed_s) == (T + 10, T + 22, 12.0)


def test_the_reference_fold_agrees() -> None:
    got = fold([(i + 1, ev) for i, ev in enumerate(HISTORY)])
    job = got.jobs[1]
    assert (job["started_at"], job["run_started_at"], job["finished_at"]) == (
        T + 10,
        T + 10,
        T + 22,
    )


def test_explain_tells_the_runs_own_start_and_end_and_when_they_were_recorded() -> None:
    sub = HISTORY[2]
    assert isinstance(sub, e.JobSubmitted)
    job = Job(spec=sub, status="finished", outcome="completed")
    lines = explain_history(job, HISTORY[2:], {}, T + 100, 30.0)
    started = next(line for line in lines if " started" in line)
    ended = next(line for line in lines if " completed" in line)
    assert started.startswith("2026-12-02 00:40:10Z started, recorded at 2026-12-02 00:40:37Z"), (
        started
    )
    assert ended.startswith("2026-12-02 00:40:22Z it completed"), ended
