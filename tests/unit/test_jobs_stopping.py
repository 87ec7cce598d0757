"""`jobs` (and the dashboard's job page, `layer.job`) of a job cancelled while its processes
live out their grace: `stopping` with its SIGKILL, its end not known yet, as squeue's `CG`,
not `finished` at the cancel; once its engine reports the run gone, `finished` at that real
end (stop 48's open point on issue 23)."""

from __future__ import annotations

import pytest

from ledger.core.state import State
from ledger.reads import layer
from projections.projector import Projector
from projections.source import ListSource, LogRecord
from projections.store import Store
from schemas import codec
from schemas import commands as c
from schemas import events as e
from schemas import views as v
from tests.unit.test_service_grace import Recording, _configure, _running


@pytest.fixture
def w(org_state: State) -> Recording:
    return Recording(org_state)


def _rows(w: Recording, now: float, viewer: layer.Viewer | None) -> dict[int, v.JobRow]:
    records = [LogRecord(i + 1, e.tag_of(type(ev)), codec.encode(ev)) for i, ev in enumerate(w.log)]
    with Store(":memory:") as store:
        Projector(store, ListSource(records)).catch_up()
        rows = layer.jobs(store, v.JobFilter(), now, viewer)
        one = {r.job_id: layer.job(store, r.job_id, now, viewer) for r in rows}
    assert one == {r.job_id: r for r in rows}  # the job page shows it as `jobs` does
    return one


def test_a_cancelled_job_in_its_grace_is_stopping_until_its_end_is_recorded(w: Recording) -> None:
    _configure(w, 90)
    job_id = _running(w)
    started = w.state.jobs[job_id].started_at
    assert started is not None
    w.now += 20
    cancelled = w.now
    w.run(c.CancelJob(actor="alice", job_id=job_id))
    viewer = layer.Viewer("alice", w.state)
    row = _rows(w, cancelled + 5, viewer)[job_id]
    assert (row.status, row.kill_at, row.finished_at) == ("stopping", cancelled + 90, None)
    assert (row.outcome, row.finish_reason, row.elapsed_s) == ("cancelled", "cancelled", 25.0)
    # the pooled read's viewer is a detached copy: the same
    assert _rows(w, cancelled + 5, viewer.detached())[job_id] == row
    # without the live state (no viewer): as the projection holds it
    assert _rows(w, cancelled + 5, None)[job_id].status == "finished"
    (sr,) = w.state.stopped_of(job_id)
    w.now = cancelled + 13  # its engine reports it
    w.run(c.ConfirmRunEnded(actor="@executor", job_id=job_id, engine="agent",
                            engine_job_id=f"{job_id}.1", run=sr.run, ended_at=cancelled + 12,
                            exit_code=143))  # fmt: skip
    row = _rows(w, cancelled + 30, layer.Viewer("alice", w.state))[job_id]
    assert (row.status, row.kill_at, row.finished_at) == ("finished", None, cancelled + 12)
    assert row.elapsed_s == cancelled + 12 - started


def test_explain_of_a_cancelled_job_in_its_grace_says_it_is_stopping(w: Recording) -> None:
    """atk49-23 F7: `explain` said "is finished (cancelled)" with no SIGKILL time while `queue`,
    `jobs` and the job page's status said `stopping`; now it says so, with the same SIGKILL."""
    from ledger.reads.explain_job import explain_told
    from schemas.units import when

    _configure(w, 60)
    job_id = _running(w)
    w.now += 20
    cancelled = w.now
    w.run(c.CancelJob(actor="alice", job_id=job_id))
    records = [LogRecord(i + 1, e.tag_of(type(ev)), codec.encode(ev)) for i, ev in enumerate(w.log)]
    viewer = layer.Viewer("alice", w.state)
    with Store(":memory:") as store:
        Projector(store, ListSource(records)).catch_up()
        told = explain_told(store, job_id, None, None, cancelled + 5, viewer.detached())
        row = layer.job(store, job_id, cancelled + 5, viewer)
        bare = explain_told(store, job_id, None, None, cancelled + 5)  # no live state: as before
    assert told.status == row.status == "stopping"
    assert told.lines[0].endswith(" is stopping (cancelled).")
    assert told.lines[-1] == (
        f"{when(cancelled)} cancelled: it is stopping (SIGTERM sent, SIGKILL at "
        f"{when(cancelled + 60)} at the latest); its GPUs are held until its processes are gone."
    )
    assert row.kill_at == cancelled + 60
    assert bare.status == "finished" and bare.lines[0].endswith(" is finished (cancelled).")
