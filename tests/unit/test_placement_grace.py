"""One grace per run: the service's grace in force when the run was placed (`Job.service_grace_s`,
kept with a stopped run: `StoppedRun.service_grace_s`), used by every read and engine alike
(atk49-23 F1): a stop spanning a restart with another `--grace` was read with the new grace
while the agent applied the one it launched with (a time limit's "SIGKILL at the latest" 90 s
in the past), and the server's kill order came with the new one."""

from __future__ import annotations

import msgspec
import pytest

from ledger.core.state import State
from ledger.engines.board import kills_by_node
from ledger.engines.slurm.stops import grace_in
from ledger.reads import layer
from ledger.reads.explain_job import explain_told
from ledger.store.snapshots import folded, same, unfolded
from projections.projector import Projector
from projections.source import ListSource, LogRecord
from projections.store import Store
from schemas import codec
from schemas import commands as c
from schemas import events as e
from schemas import views as v
from schemas.bounds import MAX_GRACE_S
from schemas.units import when
from tests.unit.test_service_grace import Recording, _configure, _queue, _running


@pytest.fixture
def w(org_state: State) -> Recording:
    return Recording(org_state)


def test_a_cancel_after_a_restart_with_another_grace_is_read_and_killed_with_the_placements(
    w: Recording,
) -> None:
    _configure(w, 20)
    job = _running(w)
    _configure(w, 90)  # `up --grace 90s` after a restart
    w.now += 5
    w.run(c.CancelJob(actor="alice", job_id=job))
    row = _queue(w, w.now + 1)[job]
    assert row.kill_at == w.now + 20  # was + 90: the agent kills at + 20
    assert f"SIGKILL at {when(w.now + 20)} at the latest" in row.reason
    # the server's kill order comes at the same time (it came at + 90)
    assert kills_by_node(w.state.stopped_runs, {job}, w.now + 20, w.state.grace_s)
    assert not kills_by_node(w.state.stopped_runs, {job}, w.now + 19, w.state.grace_s)


def test_a_time_limit_after_a_restart_with_another_grace_is_read_with_the_placements(
    w: Recording,
) -> None:
    _configure(w, 100)
    job = _running(w, time_limit_s=60)
    _configure(w, 10)
    start = w.state.jobs[job].started_at
    assert start is not None
    assert _queue(w, start + 61)[job].kill_at == start + 60 + 100  # was + 10, already past
    assert grace_in(w.state, job, 10) == 100  # the Slurm executor's fallback: the same rule
    records = [LogRecord(i + 1, e.tag_of(type(ev)), codec.encode(ev)) for i, ev in enumerate(w.log)]
    with Store(":memory:") as store:
        Projector(store, ListSource(records)).catch_up()
        (row,) = layer.jobs(store, v.JobFilter(job_ids=(job,)), start + 61, None)
        told = explain_told(store, job, w.state.jobs[job], None, start + 61)
    assert row.kill_at == start + 160
    assert any(f"SIGKILL at {when(start + 160)} at the latest" in line for line in told.lines)


def test_a_snapshot_made_before_runs_kept_their_grace_is_the_same_state(w: Recording) -> None:
    _configure(w, 20)
    job = _running(w)
    _running(w, 1)
    w.run(c.CancelJob(actor="alice", job_id=job))
    now = unfolded(folded(w.state))
    assert same(now, w.state)
    f = folded(w.state)
    old = msgspec.structs.replace(
        f,
        jobs=[msgspec.structs.replace(j, service_grace_s=None) for j in f.jobs],
        stopped_runs=[
            msgspec.structs.replace(r, service_grace_s=None) for r in f.stopped_runs or ()
        ],
    )
    before = unfolded(old)
    assert same(before, w.state) and same(w.state, before)
    # such a run reads with the service's current grace, as before
    assert _queue(w, w.now + 1)[job].kill_at == w.now + 20


def test_the_slurm_executors_grace_of_a_job_is_the_one_rule(w: Recording) -> None:
    """`grace_in` calls `Job.grace` (s50: it repeated the rule without the cap, and said
    "unknown" for a run placed before runs kept their grace)."""
    job = _running(w, grace_s=100)
    placed = _running(w, 1)  # no grace of its own, placed before the service recorded one
    j = w.state.jobs[job]
    spec = msgspec.structs.replace(j.spec, grace_s=600)  # recorded before the cap
    w.state.jobs[job] = msgspec.structs.replace(j, spec=spec)
    assert grace_in(w.state, job, 10) == MAX_GRACE_S == w.state.jobs[job].grace(10)  # capped
    assert grace_in(w.state, placed, 45) == w.state.jobs[placed].grace(45)
    assert grace_in(w.state, 999, 45) is None  # a job the ledger does not hold
