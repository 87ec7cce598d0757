"""A run not reported gone well past its SIGKILL "at the latest" (the service or its node's agent
down) is said overdue, not promised a SIGKILL at a time long past (atk49-23 F2)."""

from __future__ import annotations

import pytest

from ledger.core.state import State
from ledger.reads.explain import limit_line
from ledger.reads.stopping import OVERDUE_AFTER_S, kill_words
from schemas import commands as c
from schemas.units import when
from tests.unit.test_service_grace import Recording, _configure, _queue, _running


@pytest.fixture
def w(org_state: State) -> Recording:
    return Recording(org_state)


def test_a_sigkill_long_past_is_said_overdue(w: Recording) -> None:
    _configure(w, 30)
    cancelled = _running(w)
    w.now += 5
    w.run(c.CancelJob(actor="alice", job_id=cancelled))
    kill = w.now + 30
    assert f"SIGKILL at {when(kill)} at the latest" in _queue(w, w.now + 1)[cancelled].reason
    assert kill_words(kill, kill + OVERDUE_AFTER_S) == f"SIGKILL at {when(kill)} at the latest"
    late = _queue(w, kill + 12)[cancelled]
    assert late.kill_at == kill and f"SIGKILL overdue since {when(kill)}" in late.reason
    assert "at the latest" not in late.reason
    limited = _running(w, 1, time_limit_s=60)
    job = w.state.jobs[limited]
    assert job.started_at is not None
    end = job.started_at + 60 + 30
    row = _queue(w, end + 20)[limited]
    assert f"SIGKILL overdue since {when(end)}" in row.reason
    (line,) = limit_line(job, end + 20, w.state.grace_s)
    assert f"SIGKILL overdue since {when(end)}" in line
