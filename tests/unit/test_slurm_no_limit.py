"""A job submitted without a time limit (docs/slurm.md, "A job with no time limit").

atk61-slurm F3: one got no `--time`, so Slurm gave it the partition's DefaultTime (or MaxTime)
and killed it there while the service was up (`failed time_limit`, exit 143), inside a contract
`explain` promised. e4a7d9c4 asked `--time=UNLIMITED` and, on a partition with a MaxTime, never
placed such a job (PARTITION_TIME_LIMIT for good: at a real site, with a MaxTime of days, no job
without `-t` ever ran). Now it takes its limit from the partition's MaxTime, as Slurm does, from
the log: the service records the MaxTime it observes (`ServiceConfigured.max_time_s`), a
submission records the limit it took (`JobSubmitted.max_time_s`), and that limit is the job's
everywhere: the reads, the contract, the executor's stop, Slurm's backstop. Without a MaxTime
(agents, local, MaxTime=UNLIMITED) a job without one has none and asks `--time=UNLIMITED`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from ledger.cli.submit import asks_unlimited, taken_note
from ledger.core.jobs import taken_limit
from ledger.core.state import State
from ledger.cycle.executor import Launch
from ledger.cycle.inputs import snapshot_from_state, too_long
from ledger.cycle.loop import record_settings
from ledger.cycle.record import record_longest
from ledger.dispatch.policy import FairShare
from ledger.engines.slurm.words import SbatchUser, backstop_minutes, sbatch_args
from ledger.reads import layer
from ledger.reads.explain_job import explain_told
from ledger.reads.preview import NO_LIMIT, TOO_LONG, too_long_waits
from projections.projector import Projector
from projections.source import ListSource, LogRecord
from projections.store import Store
from schemas import codec
from schemas import commands as c
from schemas import events as e
from schemas import views as v
from schemas.errors import InvalidCommand
from schemas.events import GpuSlot
from schemas.policy import FairShareConfig
from schemas.units import format_duration, when
from tests.conftest import T0
from tests.unit.test_fence import _run
from tests.unit.test_service_grace import Recording, _queue, _running

DAYS_2 = 2 * 86_400


def _times(limit: int | None, max_time_s: float | None, grace_s: float = 30.0) -> list[str]:
    job = Launch(1, (GpuSlot(node="vm", gpu_indices=(0,)),), ("true",), None, "bob", "ai2/o",
                 time_limit_s=limit)  # fmt: skip
    args = sbatch_args(job, "gpuledger", "/dev/null", SbatchUser(), "0123abcd4567",
                       grace_s=grace_s, max_time_s=max_time_s)  # fmt: skip
    return [a for a in args if a.startswith("--time")]


def _max_time(w: Any, max_time_s: int | None, grace_s: int | None = None) -> None:
    """The service records the MaxTime it observes (`record_longest`'s command)."""
    w.run(c.ConfigureService(actor="@service", policy=FairShareConfig(), interval_s=1.0,
                             executor="slurm", grace_s=grace_s, max_time_s=max_time_s))  # fmt: skip


@pytest.fixture
def w(org_state: State) -> Recording:
    return Recording(org_state)


def test_the_limit_taken_from_max_time_leaves_its_grace_and_a_minute_before_it() -> None:
    assert taken_limit(120, 5.0) == 55  # MaxTime=2: SIGTERM at 55 s, SIGKILL at 60 s
    assert taken_limit(DAYS_2, 30.0) == DAYS_2 - 90
    assert taken_limit(120, 30.0) == 30 and taken_limit(90, 0.0) == 30  # at least 30 s
    # Slurm's --time is then MaxTime, past the limit and the grace by a minute: a backstop
    for max_time, grace in ((120, 5.0), (DAYS_2, 30.0), (7200, 600.0)):
        limit = taken_limit(max_time, grace)
        assert backstop_minutes(limit, grace, max_time) == max_time // 60
        assert limit + grace + 60 <= max_time
        assert _times(limit, max_time, grace) == [f"--time={max_time // 60}"]


@pytest.mark.parametrize(
    ("max_time", "grace", "hint"),
    [(120, 120, "ask --grace of at most 30s"), (60, 30, "give it a time limit with -t"),
     (60, 0, "give it a time limit with -t"), (150, 61, "ask --grace of at most 1m")],
)  # fmt: skip
def test_a_max_time_that_cannot_hold_30s_its_grace_and_a_minute_refuses_and_records_nothing(
    w: Recording, max_time: int, grace: int, hint: str
) -> None:
    """atk62-slurm F1: MaxTime=2 and `--grace 120s` took a 30 s floor and said "MaxTime less
    its grace and a minute" (false: 120-120-60 < 0); the SIGKILL due at 150 s came after
    Slurm's own TIMEOUT (146.9 s), and the run outlived MaxTime. Now such a submit is refused
    with one line and its hint, and nothing is recorded: limit + grace + a minute <= MaxTime."""
    _max_time(w, max_time, grace_s=30)
    before = len(w.log)
    with pytest.raises(InvalidCommand) as refused:
        w.submit(grace_s=grace)
    assert "cannot hold a limit of 30s" in str(refused.value), refused.value
    assert f"its grace ({format_duration(grace)}) and a minute" in str(refused.value)
    assert hint in (refused.value.hint or ""), refused.value.hint
    assert len(w.log) == before
    (own,) = w.submit(grace_s=grace, time_limit_s=max_time + 60)  # its own: waits for MaxTime
    assert own.max_time_s is None


def test_an_explicit_unlimited_is_refused_on_a_partition_with_a_max_time(w: Recording) -> None:
    """atk62-slurm F5: `-t 0`, `-t UNLIMITED`, `--time=INFINITE` were taken as "no time limit
    given" (its note said so) and stopped at MaxTime's limit; sbatch would leave such a job
    pending for good. Now `-t` says it asked none, and with a MaxTime recorded it is refused in
    one line, nothing recorded; with none recorded it has no limit, as before."""
    for text in ("0", "UNLIMITED", "infinite", "INFINITE", "00:00"):
        assert asks_unlimited(text), text
    assert not any(asks_unlimited(t) for t in (None, "5", "90s", "1-00:00:00"))
    (free,) = w.submit(unlimited=True)  # no MaxTime recorded: no limit, as before
    assert (free.time_limit_s, free.max_time_s) == (None, None)
    before = len(w.log)  # both asked (the API's fields): one line, nothing recorded (atk62b G4)
    with pytest.raises(InvalidCommand, match="both asked"):
        w.submit(unlimited=True, time_limit_s=60)
    assert len(w.log) == before
    _max_time(w, 7200)
    before = len(w.log)
    with pytest.raises(InvalidCommand) as refused:
        w.submit(unlimited=True)
    assert refused.value.line() == (
        "no time limit asked (-t UNLIMITED, INFINITE or 0), but the partition's MaxTime is 2h: "
        "Slurm would never start it (omit -t to take its limit from MaxTime, or ask one within "
        "MaxTime)"
    )
    assert len(w.log) == before
    (taken,) = w.submit()  # none given: it takes MaxTime's
    assert (taken.time_limit_s, taken.max_time_s) == (7200 - 90, 7200)


def test_a_job_without_a_limit_takes_the_recorded_max_time_as_slurm_does(w: Recording) -> None:
    _max_time(w, DAYS_2)
    (job,) = w.submit(min_runtime_s=4 * 3600)
    assert (job.time_limit_s, job.max_time_s) == (DAYS_2 - 90, DAYS_2)
    assert job.min_runtime_s == 4 * 3600 and not job.debug
    (own,) = w.submit(time_limit_s=3600)  # a limit of its own is its own
    assert (own.time_limit_s, own.max_time_s) == (3600, None)
    (graced,) = w.submit(grace_s=120)  # its own grace is left before MaxTime
    assert graced.time_limit_s == DAYS_2 - 180
    # it is placed: not over MaxTime (before: PARTITION_TIME_LIMIT for good)
    assert not too_long(job.time_limit_s, 30.0, DAYS_2) and too_long_waits(w.state, DAYS_2) == {}
    pending = {p.job_id for p in snapshot_from_state(w.state, {}, w.now, longest_s=DAYS_2).pending}
    assert {job.job_id, own.job_id, graced.job_id} <= pending


def test_a_contract_longer_than_max_time_is_cut_to_the_limit_and_submit_says_so(
    w: Recording,
) -> None:
    _max_time(w, 120, grace_s=5)
    (job,) = w.submit(min_runtime_s=3600)
    assert (job.time_limit_s, job.min_runtime_s) == (55, 55)  # never protected past its limit
    note = taken_note(job, 3600)
    assert note.startswith("note: no time limit given: its limit is 55s, the partition's MaxTime")
    assert "(2m)" in note and "its contract (1h) is cut to it" in note
    assert "MaxTime as the service last read it (2m) less its grace" in note  # F6: not today's
    assert "cut" not in taken_note(job, None)  # the default contract: nothing to say


def test_no_max_time_recorded_no_limit_as_before(w: Recording) -> None:
    (job,) = w.submit()  # agents, local: no MaxTime
    assert (job.time_limit_s, job.max_time_s) == (None, None)
    _max_time(w, None)  # Slurm with MaxTime=UNLIMITED
    (unlimited,) = w.submit()
    assert (unlimited.time_limit_s, unlimited.max_time_s) == (None, None)
    assert _times(None, None) == ["--time=UNLIMITED"] and backstop_minutes(None, 30, None) == (
        "UNLIMITED"
    )
    # one submitted while no MaxTime was recorded waits on a partition that has one now
    blocked = too_long_waits(w.state, 60.0)[job.job_id]
    assert (blocked.code, blocked.reason) == (TOO_LONG, NO_LIMIT.format("1m")), blocked
    # atk62-slurm F3: true of a job an older version kept waiting under a MaxTime it had seen
    assert "no MaxTime was recorded" in blocked.reason and "before a version" in blocked.reason
    assert "had no MaxTime)" not in blocked.reason and "cancelled and submitted" in blocked.reason
    assert too_long(None, 0.0, 60.0) and not too_long(None, 0.0, None)


def test_max_time_lowered_while_it_waits_keeps_its_limit_and_says_where_it_came_from(
    w: Recording,
) -> None:
    _max_time(w, 7200)
    (job,) = w.submit()
    assert job.time_limit_s == 7200 - 90
    _max_time(w, 3600)  # an admin lowered it: as in Slurm, the job keeps its limit and waits
    blocked = too_long_waits(w.state, 3600.0)[job.job_id]
    assert blocked.code == TOO_LONG
    assert "taken from its MaxTime of 2h" in blocked.reason and "1h" in blocked.reason
    assert "submitted again" in blocked.reason
    (later,) = w.submit()
    assert later.time_limit_s == 3600 - 90  # a later one takes today's


def test_queue_jobs_and_explain_show_the_limit_and_why_and_no_protection_past_it(
    w: Recording,
) -> None:
    _max_time(w, 600, grace_s=30)  # limit 510 s
    jid = _running(w, min_runtime_s=3600)
    job = w.state.jobs[jid]
    start = job.started_at
    assert start is not None and job.spec.time_limit_s == 510
    ends = job.contract_ends_at()
    assert ends is not None and ends <= start + 510  # no contract past its limit
    row = _queue(w, start + 100)[jid]
    assert (row.time_limit_s, row.remaining_s) == (510, 410)
    row = _queue(w, start + 511)[jid]  # the executor stops it there: SIGTERM, its grace
    assert (row.state, row.kill_at) == ("stopping", start + 510 + 30)
    records = [LogRecord(i + 1, e.tag_of(type(ev)), codec.encode(ev)) for i, ev in enumerate(w.log)]
    with Store(":memory:") as store:
        Projector(store, ListSource(records)).catch_up()
        (got,) = layer.jobs(store, v.JobFilter(job_ids=(jid,)), start + 100, None)
        told = explain_told(store, jid, w.state.jobs[jid], None, start + 100)
    assert (got.time_limit_s, got.kill_at) == (510, None)
    text = "\n".join(told.lines)
    said = "with no time limit of its own: its limit is 8m30s (510s), the partition's MaxTime (10m)"
    assert said in text, text
    assert f"stops it at {when(start + 510)}" in text
    assert f"Its contract protects it until {when(start + 510)}" in text  # never past it


def test_the_service_records_the_max_time_it_observes_and_again_when_it_changes(
    ledger: Any,
) -> None:
    log = logging.getLogger("t")
    record_longest(ledger, 7200.0, log)  # no settings recorded yet: nothing
    assert ledger.state.service is None
    record_settings(ledger, FairShare(), 1.0, "slurm", log, 30, 7200)
    assert ledger.state.max_time_s == 7200
    events = ledger.state.events
    record_longest(ledger, 7200.0, log)  # the same: nothing appended
    record_settings(ledger, FairShare(), 1.0, "slurm", log, 30, 7200)
    assert ledger.state.events == events
    record_longest(ledger, 3600.0, log)
    assert (ledger.state.events, ledger.state.max_time_s) == (events + 1, 3600)
    assert ledger.state.grace_s == 30.0  # the other settings as recorded
    record_longest(ledger, None, log)  # MaxTime=UNLIMITED
    assert (ledger.state.events, ledger.state.max_time_s) == (events + 2, None)


def test_an_older_record_reads_without_a_max_time(counter_ids: Callable[[], str]) -> None:
    old = codec.decode(codec.encode(e.ServiceConfigured(
        event_id="x", at=T0, actor="root", policy=FairShareConfig(), interval_s=1.0,
        executor="slurm",
    )))  # fmt: skip
    assert isinstance(old, e.ServiceConfigured) and State(service=old).max_time_s is None
    state = State()
    _run(state, counter_ids, c.InitLedger(actor="root", admin="root"), T0)
    assert state.max_time_s is None
