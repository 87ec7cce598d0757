"""A run's end that its engine decided says whether its processes were killed after their grace
(`job.engine_ended.v2` `killed`; atk60-slurm F3: a gang that Slurm's TIMEOUT SIGKILLed while the
service was down was recorded with `killed` null, `job.engine_ended.v1` having none). The Slurm
executor's rule (`ends.ended_killed`: its batch script's end record, Slurm's state), the record
the domain writes, and the v1 records: read as v2 with `killed` None, projected as before."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.cycle.executor import Exit
from ledger.cycle.record import exit_command
from ledger.engines.slurm.ends import OwnEnd, ended_killed
from projections.projector import Projector
from projections.source import ListSource, LogRecord
from projections.store import Store
from projections.testing.compare import REFERENCE_TABLES, differences, dump
from schemas import codec
from schemas import commands as c
from schemas import events as e
from tests.unit.test_charged_from_start import ORG, T0, decision, ids

KILLED = OwnEnd(137, T0, True, killed=True)
"""An end record whose script SIGKILLed what its command left after the grace."""
CLEAN = OwnEnd(143, T0, True)
"""One whose command ended at the SIGTERM, nothing left to kill."""
STEPS = OwnEnd(143, T0, True, steps=True)
"""One written while a step of the job's still had processes on its node."""


@pytest.mark.parametrize(
    ("state", "script_killed", "own", "stopped", "gang", "want"),
    [
        # Slurm's TIMEOUT (or a scancel): its SIGKILL, KillWait after the SIGTERM, killed the
        # batch script (ExitCode 0:9): the processes outlived their grace (the case of F3)
        ("TIMEOUT", True, None, False, True, True),
        ("TIMEOUT", True, None, False, False, True),
        ("CANCELLED by 0", True, None, False, False, True),
        # the executor's own SIGKILL after the grace (FAILED 0:9): killed
        ("FAILED", True, None, True, False, True),
        # the job's own process killed its script: nobody's grace ran out
        ("FAILED", True, None, False, False, None),
        # its script's record: killed as it says, on its one node
        ("TIMEOUT", False, KILLED, False, False, True),
        ("TIMEOUT", False, KILLED, False, True, True),
        ("TIMEOUT", False, CLEAN, False, False, False),
        ("COMPLETED", False, OwnEnd(0, T0), False, False, False),
        # a gang's ranks elsewhere, a step left on its node: out of the record's sight
        ("TIMEOUT", False, CLEAN, False, True, None),
        ("TIMEOUT", False, STEPS, False, False, None),
        # no record (a node that does not share the run's directory)
        ("TIMEOUT", False, None, False, False, None),
    ],
)
def test_whether_a_run_slurm_ended_was_killed(
    state: str,
    script_killed: bool,
    own: OwnEnd | None,
    stopped: bool,
    gang: bool,
    want: bool | None,
) -> None:
    assert ended_killed(state, script_killed, own, stopped, gang) is want


def _timed_out(killed: bool | None) -> list[e.AnyEvent]:
    """Job 4 placed, started and ended by Slurm's TIMEOUT (its engine saying `killed`)."""
    exit_ = Exit(4, 137, T0 + 130, "time_limit", "9", "TIMEOUT", run=0, killed=killed)
    placed = [
        *ORG,
        (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2)),
        (T0, decision("c1", "fairtree-3", placed=(4,))),
        (T0 + 5, c.StartJob(actor="@executor", job_id=4, engine="slurm", engine_job_id="9",
                            started_at=T0 + 2)),
    ]  # fmt: skip
    st, new_id, out = State(), ids(), []
    for at, cmd in placed:
        for ev in decide(st, cmd, at, new_id):
            evolve(st, ev)
            out.append(ev)
    finish = exit_command(exit_, st.jobs, "slurm")
    assert finish is not None and finish.killed is killed
    out += decide(st, finish, T0 + 131, new_id)
    return out


@pytest.mark.parametrize("killed", [True, False, None])
def test_the_engines_word_is_recorded_in_the_runs_end(killed: bool | None) -> None:
    (ended,) = [ev for ev in _timed_out(killed) if isinstance(ev, e.JobEngineEnded)]
    assert e.tag_of(type(ended)) == "job.engine_ended.v2"
    assert (ended.reason, ended.engine_state, ended.killed) == ("time_limit", "TIMEOUT", killed)
    assert codec.decode(codec.encode(ended)) == ended


def _v1(ev: e.JobEngineEnded) -> e.JobEngineEndedV1:
    """`ev` as the code before `job.engine_ended.v2` stored it."""
    fields = msgspec.structs.asdict(ev)
    assert fields.pop("killed") is None
    return e.JobEngineEndedV1(**fields)


def test_a_v1_record_reads_as_v2_with_killed_not_said() -> None:
    (ended,) = [ev for ev in _timed_out(None) if isinstance(ev, e.JobEngineEnded)]
    stored = codec.encode(_v1(ended))
    assert b'"type":"job.engine_ended.v1"' in stored and b"killed" not in stored
    assert codec.decode(stored) == ended  # upcast: the same end, `killed` None


def _projected(tmp_path: Path, events: list[e.AnyEvent], v1: bool) -> list[object]:
    records = []
    for pos, ev in enumerate(events, 1):
        if v1 and isinstance(ev, e.JobEngineEnded):
            ev = _v1(ev)  # type: ignore[assignment]
        records.append(LogRecord(pos, e.tag_of(type(ev)), codec.encode(ev)))  # type: ignore[arg-type]
    with Store(tmp_path / f"p{len(list(tmp_path.iterdir()))}.duckdb") as store:
        Projector(store, ListSource(records)).catch_up()
        return [dump(store, REFERENCE_TABLES)]


def test_v1_and_v2_records_project_row_for_row_alike(tmp_path: Path) -> None:
    """The projection's SQL reads a job's engine reason from both tags (`apply.sql` b_jobev)."""
    events = _timed_out(None)
    old, new = _projected(tmp_path, events, v1=True), _projected(tmp_path, events, v1=False)
    assert differences(old[0], new[0]) == []  # type: ignore[arg-type]
    with Store(tmp_path / "check.duckdb") as store:
        records = [LogRecord(p, e.tag_of(type(ev)), codec.encode(ev))
                   for p, ev in enumerate(events, 1)]  # fmt: skip
        Projector(store, ListSource(records)).catch_up()
        got = store.con.execute("SELECT engine_reason FROM jobs WHERE job_id = 4").fetchall()
    assert got == [("time_limit",)]
