"""The service's `--grace` (the grace of a job stopped without one of its own) is what every read
counts a SIGKILL with: `service.configured.v2` records it and the reads take it from the state
(`State.grace_s`) or the projection (`history.service_grace`). atk48-23 F4: with `up --grace
90s`, `queue`, `explain`, `jobs` and `node list` said "SIGKILL at T at the latest" 60 s before
the service sent it (they assumed 30 s)."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import pytest

from ledger.core.state import State
from ledger.cycle.loop import record_settings
from ledger.dispatch.policy import FairShare
from ledger.reads import layer
from ledger.reads.explain_job import explain_told
from ledger.reads.preview import _holding_rows
from ledger.store.snapshots import Folded, unfolded
from projections.projector import Projector
from projections.source import ListSource, LogRecord
from projections.store import Store
from schemas import codec
from schemas import commands as c
from schemas import events as e
from schemas import views as v
from schemas.bounds import DEFAULT_GRACE_S
from schemas.policy import FairShareConfig
from schemas.units import when
from tests.unit.test_jobs_world import World


class Recording(World):
    """A `World` that keeps the events it appends (for a projection of them)."""

    def __init__(self, state: State) -> None:
        super().__init__(state)
        self.log: list[e.AnyEvent] = []

    def run(self, cmd: c.AnyCommand) -> list[e.AnyEvent]:
        got = super().run(cmd)
        self.log += got
        return got


@pytest.fixture
def w(org_state: State) -> Recording:
    return Recording(org_state)


def _configure(w: World, grace_s: int | None) -> None:
    w.run(c.ConfigureService(actor="root", policy=FairShareConfig(), interval_s=1.0,
                             executor="agents", grace_s=grace_s))  # fmt: skip


def _running(w: World, gpu: int = 0, **kw: Any) -> int:
    (job,) = w.submit(command=("t",), **kw)
    w.place(job.job_id, "n1", gpu)
    w.run(c.StartJob(actor="@executor", job_id=job.job_id, engine="agent",
                     engine_job_id=f"{job.job_id}.1"))  # fmt: skip
    return job.job_id


def _queue(w: World, now: float) -> dict[int, v.QueueRow]:
    rows = _holding_rows(w.state, v.QueueFilter(state="running"), now, 100)
    return {r.job_id: r for r in rows}


def test_a_v1_record_reads_as_v2_without_a_grace_and_the_reads_assume_the_default() -> None:
    old = e.ServiceConfiguredV1(event_id="x", at=1.0, actor="root", policy=FairShareConfig(),
                                interval_s=2.0, executor="agents")  # fmt: skip
    got = codec.decode(codec.encode(old))  # type: ignore[arg-type]
    assert isinstance(got, e.ServiceConfigured) and got.grace_s is None
    assert (got.policy, got.interval_s, got.executor) == (old.policy, 2.0, "agents")
    assert State(service=got).grace_s == DEFAULT_GRACE_S == State().grace_s
    # a snapshot made before v2 holds a v1 record: it reads upcast
    folded = Folded(initialised=True, cluster="c", min_runtime_cap_s=1, admins=[], accounts=[],
                    members={}, managers={}, nodes=[], jobs=[], next_job_id=1, events=1,
                    finished=0, service=old)  # fmt: skip
    raw = msgspec.msgpack.encode(folded)
    assert unfolded(msgspec.msgpack.decode(raw, type=Folded)).service == got


def test_the_service_records_its_grace_and_records_again_when_it_changes(ledger: Any) -> None:
    log = logging.getLogger("t")
    record_settings(ledger, FairShare(), 1.0, "agents", log, 90)
    assert ledger.state.grace_s == 90.0
    record_settings(ledger, FairShare(), 1.0, "agents", log, 90)  # the same: nothing appended
    events = ledger.state.events
    record_settings(ledger, FairShare(), 1.0, "agents", log, 45)
    assert (ledger.state.events, ledger.state.grace_s) == (events + 1, 45.0)


def test_queue_and_explain_count_a_cancel_and_a_limit_with_the_services_grace(w: Recording) -> None:
    _configure(w, 90)
    cancelled = _running(w)
    own = _running(w, 1, grace_s=10)  # a job's own grace still wins
    w.now += 5
    w.run(c.CancelJob(actor="alice", job_id=cancelled))
    w.run(c.CancelJob(actor="alice", job_id=own))
    rows = _queue(w, w.now + 1)
    assert rows[cancelled].kill_at == w.now + 90  # not + 30
    assert f"SIGKILL at {when(w.now + 90)} at the latest" in rows[cancelled].reason
    assert rows[own].kill_at == w.now + 10
    limited = _running(w, 2, time_limit_s=60)
    start = w.state.jobs[limited].started_at
    assert start is not None
    row = _queue(w, start + 61)[limited]
    assert (row.state, row.kill_at) == ("stopping", start + 60 + 90)


def test_jobs_and_explain_read_the_services_grace_from_the_projection(w: Recording) -> None:
    _configure(w, 90)
    limited = _running(w, time_limit_s=60)
    start = w.state.jobs[limited].started_at
    assert start is not None
    records = [LogRecord(i + 1, e.tag_of(type(ev)), codec.encode(ev)) for i, ev in enumerate(w.log)]
    with Store(":memory:") as store:
        Projector(store, ListSource(records)).catch_up()
        (row,) = layer.jobs(store, v.JobFilter(job_ids=(limited,)), start + 61, None)
        told = explain_told(store, limited, w.state.jobs[limited], None, start + 61)
    assert (row.status, row.kill_at) == ("stopping", start + 60 + 90)
    assert any(f"SIGKILL at {when(start + 150)} at the latest" in line for line in told.lines)
