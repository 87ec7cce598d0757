"""The projection's SQL charges usage as the fold and the reference do (tests/unit/
test_charged_from_start.py): from the run's real start under `fairtree-3` and `fairtree-2`, from
the placement under `fairtree-1`, to the real end (`fairtree-3`: a stopped run's, after its
release too); batch boundaries do not change it, and the projection as of
a position before the run started charges nothing for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.reads.layer import jobs_as_of
from ledger.store.embedded import EmbeddedSource
from projections import fairshare as fs
from projections import history, queries
from projections.as_of import AS_OF_SQL, AsOf
from projections.projector import Projector
from projections.store import Store
from projections.testing.compare import REFERENCE_TABLES, differences, dump, reference_dump
from projections.testing.reference import fold
from projections.testing.synthetic import append_to_store
from schemas import commands as c
from schemas import events as e
from schemas import views as v
from tests.unit.test_charged_from_start import (
    AT,
    GRACE,
    ORG,
    PLACEMENT,
    REAL,
    RUN,
    STOPS,
    T0,
    WANT,
    H,
    decision,
    lost_with_its_node,
    stopped_early,
    stopped_late,
    waiting_runs,
)
from tests.unit.test_charged_from_start import history as c_history
from tests.unit.test_fenced_real_end import FENCE_S, LOST, REAL_END, SETTLED, fenced_then_heard


def projected(home: Path, batch: int | None = None) -> Store:
    store = Store(":memory:")
    with EmbeddedSource(home) as source:
        Projector(store, source, **({} if batch is None else {"batch_size": batch})).catch_up()
    return store


@pytest.mark.parametrize("version", ["fairtree-3", "fairtree-2", "fairtree-1"])
@pytest.mark.parametrize("batch", [None, 1])
def test_the_sql_charges_as_the_reference(tmp_path: Path, version: str, batch: int | None) -> None:
    events = waiting_runs(version)
    home = tmp_path / "home"
    append_to_store(home, iter(events))
    with projected(home, batch) as store:
        assert (
            differences(dump(store, REFERENCE_TABLES), reference_dump(fold(enumerate(events, 1))))
            == []
        )
        for policy in (REAL, RUN, PLACEMENT):
            got = {
                r.name: r.gpu_seconds for r in queries.usage(store, AT, by="user", policy=policy)
            }
            assert got == {"alice": WANT[policy.charge]}
            half = fs.UsagePolicy(half_life_s=H, charge=policy.charge)
            sql = {r.name: r.gpu_seconds for r in queries.usage(store, AT, by="user", policy=half)}
            ref = fs.user_usage(fold(enumerate(events, 1)).usage_intervals(), AT, half)
            assert sql["alice"] == pytest.approx(ref["alice"], rel=1e-12)


def test_as_of_a_position_before_the_start_the_run_is_not_charged(tmp_path: Path) -> None:
    events = waiting_runs("fairtree-2")
    home = tmp_path / "home"
    append_to_store(home, iter(events))
    started = next(
        i for i, ev in enumerate(events, 1) if isinstance(ev, e.JobStarted) and ev.job_id == 1
    )
    with projected(home) as store:
        store.con.execute(AS_OF_SQL)
        reader = AsOf(store)
        reader.at(started - 1)
        before = {r.name: r.gpu_seconds for r in queries.usage(reader, T0 + 1.5 * H, by="user")}
        reader.at(started)
        after = {r.name: r.gpu_seconds for r in queries.usage(reader, T0 + 1.5 * H, by="user")}
    job3 = 2 * (1.5 * H - 1)
    assert before == {"alice": job3}  # job 1 placed, not started: nothing yet
    assert after == {"alice": job3 + 2 * 0.5 * H}


@pytest.mark.parametrize("batch", [None, 1])
def test_a_stopped_run_is_charged_to_its_real_end_in_sql_too(
    tmp_path: Path, batch: int | None
) -> None:
    events = stopped_early("fairtree-2")
    home = tmp_path / "home"
    append_to_store(home, iter(events))
    ended = len(events)  # the JobRunEnded is last
    with projected(home, batch) as store:
        assert (
            differences(dump(store, REFERENCE_TABLES), reference_dump(fold(enumerate(events, 1))))
            == []
        )
        got = {r.name: r.gpu_seconds for r in queries.usage(store, AT, by="user")}
        old = {r.name: r.gpu_seconds for r in queries.usage(store, AT, by="user", policy=PLACEMENT)}
        assert (got, old) == ({"alice": 2 * 48.0}, {"alice": 2 * 100.0})
        store.con.execute(AS_OF_SQL)
        reader = AsOf(store)
        reader.at(ended - 1)  # before the end was heard: charged to the requeue
        assert {r.name: r.gpu_seconds for r in queries.usage(reader, AT, by="user")} == {
            "alice": 2 * 98.0
        }


def test_a_run_that_ended_with_its_node_is_charged_to_its_engines_end_in_sql(
    tmp_path: Path,
) -> None:
    events = lost_with_its_node()
    home = tmp_path / "home"
    append_to_store(home, iter(events))
    with projected(home, 1) as store:
        ref = reference_dump(fold(enumerate(events, 1)))
        assert differences(dump(store, REFERENCE_TABLES), ref) == []
        got = {r.name: r.gpu_seconds for r in queries.usage(store, AT, by="user")}
    assert got == {"alice": 2 * 38.0}


@pytest.mark.parametrize("how", sorted(STOPS))
@pytest.mark.parametrize("batch", [None, 1])
def test_fairtree_3_charges_a_stopped_run_through_its_grace_in_sql(
    tmp_path: Path, how: str, batch: int | None
) -> None:
    """F1: the run the ledger stopped at T0 + 100 really ended GRACE s later: the projection
    charges it to then (fairtree-3, the default), to the release under fairtree-2, and to the
    release as of a position before the end was reported."""
    events = stopped_late("fairtree-3", STOPS[how])
    home = tmp_path / "home"
    append_to_store(home, iter(events))
    with projected(home, batch) as store:
        assert (
            differences(dump(store, REFERENCE_TABLES), reference_dump(fold(enumerate(events, 1))))
            == []
        )
        got = {r.name: r.gpu_seconds for r in queries.usage(store, AT, by="user")}
        old = {r.name: r.gpu_seconds for r in queries.usage(store, AT, by="user", policy=RUN)}
        assert (got, old) == ({"alice": 2 * (98.0 + GRACE)}, {"alice": 2 * 98.0})
        half = fs.UsagePolicy(half_life_s=H)
        sql = {r.name: r.gpu_seconds for r in queries.usage(store, AT, by="user", policy=half)}
        ref = fs.user_usage(fold(enumerate(events, 1)).usage_intervals(), AT, half)
        assert sql["alice"] == pytest.approx(ref["alice"], rel=1e-12)
        store.con.execute(AS_OF_SQL)
        reader = AsOf(store)
        reader.at(len(events) - 1)  # before the end was heard: charged to the release
        assert {r.name: r.gpu_seconds for r in queries.usage(reader, AT, by="user")} == {
            "alice": 2 * 98.0
        }


@pytest.mark.parametrize("resumable", [False, True], ids=["fails", "requeued"])
def test_a_fenced_runs_real_end_its_agent_reports_is_charged_and_shown_in_sql(
    tmp_path: Path, resumable: bool
) -> None:
    """atk46-23 F5: a run its lost node's fence ended at T0 + 320, which really ended at T0 + 40
    (its agent's report on return): charged to T0 + 40 by the SQL as by the reference, and
    `jobs` shows it ended then (the fence's end, as of a position before the report)."""
    events = fenced_then_heard(resumable)
    home = tmp_path / "home"
    append_to_store(home, iter(events))
    heard = next(i for i, ev in enumerate(events, 1) if isinstance(ev, e.JobRunEnded))
    with projected(home, 1) as store:
        ref = reference_dump(fold(enumerate(events, 1)))
        assert differences(dump(store, REFERENCE_TABLES), ref) == []
        got = {r.name: r.gpu_seconds for r in queries.usage(store, AT, by="user")}
        assert got == {"alice": 2 * (REAL_END - (T0 + 2))}
        (row,) = history.jobs_page(store.con, v.JobFilter(), job_id=4)
        assert row[18] == REAL_END  # finished_at
        # its exit code is the run's real one (exit 0), not the fence's -1 (atk46-23 F5); one
        # that failed there stays node_lost (the ledger acted on it), a requeued one completed
        assert (row[8], row[24]) == ((0, "completed") if resumable else (0, "node_lost"))
        then = jobs_as_of(store, v.JobFilter(job_ids=(4,)), heard - 1)
        assert [r[8] for r in then] == [None if resumable else -1]  # before it: the fence's
        store.con.execute(AS_OF_SQL)
        reader = AsOf(store)
        # before the agent's word: charged to the release, the fence's end (a requeued run:
        # its requeue, when the server saw the fence had passed), as any stopped run's
        released = SETTLED if resumable else LOST + FENCE_S
        reader.at(heard - 1)
        assert {r.name: r.gpu_seconds for r in queries.usage(reader, AT, by="user")} == {
            "alice": 2 * (released - (T0 + 2))
        }


@pytest.mark.parametrize(("code", "by_itself", "shown"), [(3, True, 3), (0, True, 0),
                                                          (143, False, None)])  # fmt: skip
def test_a_cancelled_jobs_command_that_exited_by_itself_shows_its_code(
    tmp_path: Path, code: int, by_itself: bool, shown: int | None
) -> None:
    """atk54-23 F4: a cancel recorded before its agent reported the command's exit (exit 3, a
    few tenths of a second before the SIGTERM reached it): the job stays `cancelled` (the
    ledger decided without that exit) and shows the command's own code once the run's end,
    by itself, is reported, in the SQL as in the reference; a run the cancel's SIGTERM ended
    (143, not by itself) shows none, as before. Before: no exit code at all."""
    cmds: list[tuple[float, c.AnyCommand]] = [
        *ORG,
        (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=60)),
        (T0, decision("c1", "fairtree-3", placed=(4,))),
        (T0 + 5, c.StartJob(actor="@executor", job_id=4, engine="agent", engine_job_id="4.1",
                            started_at=T0 + 2)),
        (T0 + 10, c.CancelJob(actor="alice", job_id=4)),
        (T0 + 11, c.ConfirmRunEnded(actor="@executor", job_id=4, engine="agent",
                                    engine_job_id="4.1", run=0, ended_at=T0 + 10.5,
                                    exit_code=code, by_itself=by_itself)),
    ]  # fmt: skip
    events = c_history(cmds)
    (end,) = [ev for ev in events if isinstance(ev, e.JobFinished)]
    assert (end.outcome, end.exit_code) == ("cancelled", None)
    home = tmp_path / "home"
    append_to_store(home, iter(events))
    with projected(home, 1) as store:
        assert differences(dump(store, REFERENCE_TABLES), reference_dump(fold(enumerate(events, 1)))) == []  # fmt: skip  # noqa: E501
        (row,) = history.jobs_page(store.con, v.JobFilter(), job_id=4)
        assert (row[7], row[8], row[24]) == ("cancelled", shown, "cancelled"), row
        then = jobs_as_of(store, v.JobFilter(job_ids=(4,)), len(events) - 1)
        assert [r[8] for r in then] == [None]  # before the run's end was reported
