"""atk53-23 F6: a job whose command exited non-zero leaving processes (their SIGKILL at K, its
reaping), then cancelled (or requeued) in that grace: the stop does not give them a new grace,
they die at K (their supervisor's), and every read said a whole grace from the cancel. The stop
keeps the reaping's SIGKILL (`StoppedRun.reaping_kill_at`), so `queue`, `jobs` and `node list`
show K."""

from __future__ import annotations

import pytest

from ledger.core.state import State
from ledger.reads.stopping import stopped_kill_at, stopping_kills
from schemas import commands as c
from tests.unit.test_jobs_world import World


@pytest.fixture
def w(org_state: State) -> World:
    return World(org_state)


def _reaping(w: World, code: int, grace_s: int = 60, **kw: object) -> tuple[int, float]:
    (job,) = w.submit(command=("t",), grace_s=grace_s, **kw)  # type: ignore[arg-type]
    w.place(job.job_id, "n1", 0)
    w.run(c.StartJob(actor="@executor", job_id=job.job_id, engine="agent",
                     engine_job_id=f"{job.job_id}.1"))  # fmt: skip
    w.now += 5
    kill_at = w.now + grace_s
    w.run(c.ReportLeaderEnded(actor="@executor", job_id=job.job_id, run=0, leader_ended_at=w.now,
                              left=1, kill_at=kill_at, exit_code=code))  # fmt: skip
    return job.job_id, kill_at


def test_a_cancel_in_a_non_zero_exits_grace_shows_the_reapings_sigkill(w: World) -> None:
    job_id, kill_at = _reaping(w, 3)
    w.now += 20
    w.run(c.CancelJob(actor="alice", job_id=job_id))
    sr = w.state.stopped_runs[(job_id, 0)]
    assert stopped_kill_at(sr, w.state.grace_s) == kill_at  # the old code: the cancel + 60 s
    assert stopping_kills(w.state)[job_id] == kill_at


def test_a_requeue_in_a_reapings_grace_keeps_its_sigkill(w: World) -> None:
    job_id, kill_at = _reaping(w, 0, resumable=True, min_runtime_s=0)
    w.now += 20
    w.run(c.RequeueJob(actor="alice", job_id=job_id))
    sr = w.state.stopped_runs[(job_id, 0)]
    assert stopped_kill_at(sr, w.state.grace_s) == kill_at


def test_a_stop_with_no_reaping_gets_its_whole_grace(w: World) -> None:
    (job,) = w.submit(command=("t",), grace_s=60)
    w.place(job.job_id, "n1", 0)
    w.run(c.StartJob(actor="@executor", job_id=job.job_id, engine="agent",
                     engine_job_id=f"{job.job_id}.1"))  # fmt: skip
    w.now += 20
    w.run(c.CancelJob(actor="alice", job_id=job.job_id))
    sr = w.state.stopped_runs[(job.job_id, 0)]
    assert stopped_kill_at(sr, w.state.grace_s) == w.now + 60
