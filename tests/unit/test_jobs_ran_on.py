"""atk53-23 F7: a resumable job requeued just as its command completed (its run's end by itself
completes it: `runs.ended_meanwhile`) had been placed again on another node, where it never
launched; `jobs` named that node (the last placement's GPUs). A finished job shows the GPUs of
its last run that started (`projections.history.jobs_page`)."""

from __future__ import annotations

from pathlib import Path

from schemas import commands as c
from schemas import events as e
from tests.unit.test_charged_from_start import ORG, T0
from tests.unit.test_jobs_own_start import jobs

SLOTS = 21  # `jobs_page`'s column


def _placed(cycle: str, job: int, node: str) -> c.AnyCommand:
    slot = e.GpuSlot(node=node, gpu_indices=(0, 1))
    return c.ApplyDecision(actor="@dispatcher", decision=c.DecisionBody(
        cycle_id=cycle, based_on=1, policy_version="test",
        placements=(c.Placement(job_id=job, slots=(slot,)),)))  # fmt: skip


def test_a_job_completed_by_its_first_run_shows_where_that_run_ran(tmp_path: Path) -> None:
    got = jobs(tmp_path, [
        *ORG,
        (T0, c.RegisterNode(actor="root", node="n2", gpu_type="h100", gpus=8)),
        (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=0,
                         resumable=True)),
        (T0, _placed("c1", 4, "n1")),
        (T0 + 1, c.StartJob(actor="@executor", job_id=4, engine="agent", engine_job_id="4.1")),
        (T0 + 20, c.RequeueJob(actor="alice", job_id=4)),
        (T0 + 21, _placed("c2", 4, "n2")),  # placed again, never launched
        (T0 + 22, c.ConfirmRunEnded(actor="@executor", job_id=4, engine="agent",
                                    engine_job_id="4.1", run=0, ended_at=T0 + 19, exit_code=0,
                                    by_itself=True, exit_decides=True)),
    ])  # fmt: skip
    row = got[4]
    assert (row[6], row[7]) == ("finished", "completed"), row
    assert [s["node"] for s in row[SLOTS]] == ["n1"], row  # the old code: n2


def test_a_job_cancelled_while_placed_that_never_ran_shows_its_placement(tmp_path: Path) -> None:
    got = jobs(tmp_path, [
        *ORG,
        (T0, _placed("c1", 2, "n1")),
        (T0 + 30, c.CancelJob(actor="alice", job_id=2)),
    ])  # fmt: skip
    assert [s["node"] for s in got[2][SLOTS]] == ["n1"], got[2]
