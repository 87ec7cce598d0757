"""A short catch-up (a server's read after a few commands, a cycle's) pays only for what its
events change (issue 29: the cold Queue page's catch-up of ~3 events took 35-190 ms at load
12-21, ~40 ms of CPU of which every statement's planning, whatever its input, was most): no
reader thread is started for it, the tracked position is read once, the interval updates run
only for a batch with the events they read, and the chain's row is updated in place. The same
log still gives the same projection, however it is cut into catch-ups."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from projections.projector import Projector
from projections.source import ListSource, LogRecord
from projections.store import READ_MODELS, Store
from schemas import codec
from schemas import events as e
from schemas.events import GpuSlot, tag_of


def ev(n: int, event: type[Any], at: float = 1000.0, **kw: Any) -> Any:
    return event(event_id=f"e{n}", actor="root", at=at + n, **kw)


def slot() -> tuple[GpuSlot, ...]:
    return (GpuSlot(node="n1", gpu_indices=(0, 1)),)


HISTORY = [
    ev(1, e.AccountOpened, path="ai2", parent=None, kind="program"),
    ev(2, e.SharesSet, account="ai2", shares=3, reason="opened"),
    ev(3, e.NodeRegistered, cluster="c", node="n1", gpu_type="h100", gpus=8),
    ev(4, e.JobSubmitted, job_id=1, account="ai2/p", user="ann", gpus=2, min_runtime_s=60),
    ev(5, e.JobSubmitted, job_id=2, account="ai2/p", user="bob", gpus=2, min_runtime_s=0),
    ev(6, e.JobPlaced, job_id=1, slots=slot(), cycle_id="c1", based_on=5),
    ev(7, e.JobStarted, job_id=1),
    ev(8, e.JobHeld, job_id=2),
    ev(9, e.JobReleased, job_id=2),
    ev(10, e.JobPreempted, job_id=1, reason="fairness", for_job=2, cycle_id="c2"),
    ev(11, e.JobRequeued, job_id=1),
    ev(12, e.JobPlaced, job_id=2, slots=slot(), cycle_id="c2", based_on=11),
    ev(13, e.JobHeld, job_id=1),
    ev(14, e.JobStarted, job_id=2),
    ev(15, e.JobReleased, job_id=1),
    ev(16, e.JobFinished, job_id=2, outcome="completed", exit_code=0, reason="completed"),
    ev(17, e.JobPlaced, job_id=1, slots=slot(), cycle_id="c3", based_on=16),
    ev(18, e.JobHeld, job_id=1),
    ev(19, e.JobStarted, job_id=1),
    ev(20, e.JobReleased, job_id=1),
]


def records() -> list[LogRecord]:
    return [LogRecord(i + 1, tag_of(type(x)), codec.encode(x)) for i, x in enumerate(HISTORY)]


def dump(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    con = store.con
    out = {
        t: con.execute(f"SELECT * FROM {t} ORDER BY {k}").fetchall() for t, k in READ_MODELS.items()
    }
    out["tracking"] = con.execute("SELECT * FROM tracking").fetchall()
    out["chain"] = con.execute("SELECT * FROM chain").fetchall()
    return out


class Counting:
    """The store's connection, every statement it is given kept."""

    def __init__(self, con: Any) -> None:
        self.con = con
        self.said: list[str] = []

    def execute(self, sql: str, *args: Any) -> Any:
        self.said.append(" ".join(sql.split()))
        return self.con.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)


@pytest.mark.parametrize("steps", [(20,), (1,) * 20, (3, 2, 1, 4, 5, 5), (7, 2, 2, 9)])
def test_the_same_log_gives_the_same_projection_however_it_is_caught_up(
    tmp_path: Path, steps: tuple[int, ...]
) -> None:
    rs = records()
    with Store(tmp_path / "whole.duckdb") as store:
        Projector(store, ListSource(rs), batch_size=64).catch_up()
        whole = dump(store)
    with Store(tmp_path / "ones.duckdb") as store:
        Projector(store, ListSource(rs), batch_size=1).catch_up()
        assert dump(store) == whole
    with Store(tmp_path / "steps.duckdb") as store:
        projector = Projector(store, ListSource(rs))
        at = 0
        for n in steps:
            at += n
            assert projector.catch_up(until=at).position == at
        assert dump(store) == whole
        kinds = store.con.execute(
            "SELECT count(*), count(end_position), count(run_start_position) FROM job_intervals"
        ).fetchall()
    assert kinds == [(3, 2, 3)]  # every kind of interval change is in the log


def test_a_short_catch_up_starts_no_thread_and_runs_only_what_its_events_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rs = records()
    with Store(tmp_path / "p.duckdb") as store:
        projector = Projector(store, ListSource(rs))
        projector.catch_up(until=7)  # placed and started: intervals open
        counting = Counting(store.con)
        store.con = counting

        def no_thread(*args: Any, **kw: Any) -> threading.Thread:
            raise AssertionError("a catch-up of a few events started a thread")

        monkeypatch.setattr(threading, "Thread", no_thread)
        assert projector.catch_up(until=9).applied == 2  # a hold and a release
        said = counting.said
        assert [s for s in said if "job_intervals" in s] == []
        assert len([s for s in said if s.startswith("SELECT position FROM tracking")]) == 1
        assert [s for s in said if "INSERT OR REPLACE INTO chain" in s] == []
        counting.said.clear()
        assert projector.catch_up(until=11).applied == 2  # a preemption closes an interval
        assert len([s for s in said if "end_position = c.position" in s]) == 1
        assert [s for s in said if "run_start_position = c.position" in s] == []
