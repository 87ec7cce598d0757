"""The stops a restart of the Slurm executor takes up from the ledger and Slurm (atk39-24 F1,
F2) and the nodes it never submits onto (F3). Pure."""

from __future__ import annotations

import pytest

from ledger.core.state import StoppedRun
from ledger.cycle.executor import Launch
from ledger.engines.slurm import parse_jobs
from ledger.engines.slurm.stops import Stopping, grace_of, resumed, resumed_stops, unplaceable
from ledger.engines.slurm.words import SlurmJob
from schemas.bounds import MAX_GRACE_S
from schemas.events import GpuSlot

LEDGER = "0123abcd4567"
LINE = (
    "JobId=51 JobName=gpuledger-6 JobState={state} Reason=None ExitCode=0:0"
    " StartTime=2026-12-02T01:11:47 EndTime=2026-12-02T01:12:10 Partition=gpuledger NodeList=vm"
    f" Comment=gpuledger:{LEDGER}:job=6:run=0"
)
STOPPED = {(6, 0): StoppedRun(job_id=6, run=0, slots=(GpuSlot(node="vm", gpu_indices=(0, 1)),),
                              at=1000.0, grace_s=40)}  # fmt: skip


def _job(state: str) -> SlurmJob:
    (j,) = parse_jobs(LINE.format(state=state))
    return j


Found = list[tuple[SlurmJob, Stopping | None, float]]


def _found(state: str, noted: float | None, partition: str = "gpuledger",
           skip: frozenset[str] = frozenset()) -> Found:  # fmt: skip
    j = _job(state)
    return list(resumed_stops({j.slurm_id: j}, STOPPED, skip, LEDGER, partition,
                              lambda _: noted, lambda _: None, 30.0))  # fmt: skip


@pytest.mark.parametrize(
    ("case", "state", "noted", "want_stop", "want_since", "want_cancelled"),
    [
        # F1: requeued, the service killed before its SIGTERM, the command then completed:
        # its end is recorded (from the ledger's stop on), never forgotten
        ("completed while down, never signalled", "COMPLETED", None, True, 1000.0, True),
        ("ended after its noted stop", "CANCELLED", 1002.5, True, 1002.5, True),
        # F2: signalled before the restart: the rest of its grace, no second SIGTERM
        ("running, its SIGTERM noted", "RUNNING", 1002.5, True, 1002.5, False),
        # never signalled: stopped as any stop is, from now (SIGTERM, its whole grace)
        ("running, never signalled", "RUNNING", None, False, None, None),
        ("never started, noted", "PENDING", 1002.5, False, None, None),
    ],
)
def test_a_restart_takes_up_every_stop_the_ledger_made(
    case: str, state: str, noted: float | None, want_stop: bool, want_since: float | None,
    want_cancelled: bool | None,
) -> None:  # fmt: skip
    ((j, st, grace),) = _found(state, noted)
    assert grace == 40
    assert j.slurm_id == "51", case
    assert (st is not None) == want_stop, case
    if st is not None:
        assert st.since == want_since and st.cancelled == want_cancelled, case
        assert st.run == (6, 0) and st.grace_s == 40
        assert dict(st.gpus) == {"vm": (0, 1)}  # held in doubt


def test_only_stops_the_executor_does_not_carry_of_this_ledgers_partition_are_taken_up() -> None:
    assert _found("COMPLETED", None, skip=frozenset({"51"})) == []
    assert _found("COMPLETED", None, partition="other") == []
    for state, want in (("COMPLETED", 0), ("RUNNING", 1)):
        j = _job(state)
        found = resumed_stops({"51": j}, {}, (), LEDGER, "gpuledger", lambda _: None,
                              lambda _: 25.0, 30.0)  # fmt: skip
        # ended, its end recorded: nothing awaited; still running: a stray, stopped (its grace)
        assert [(x.slurm_id, st, g) for x, st, g in found] == [("51", None, 25.0)][:want], state


def test_a_resumed_stops_grace_is_its_own_else_the_services() -> None:
    j = _job("RUNNING")
    st = resumed(j, (6, 0), 5.0, 12.0)
    assert st is not None and st.grace_s == 12.0 and not st.cancelled
    assert resumed(j, (6, 0), None, 12.0) is None


def test_nothing_is_submitted_onto_a_lost_or_down_node() -> None:
    slots = (GpuSlot(node="a", gpu_indices=(0,)), GpuSlot(node="b", gpu_indices=(1,)))
    launch = Launch(job_id=1, slots=slots, command=("true",), duration_s=None, user="alice",
                    account="ai2")  # fmt: skip
    assert unplaceable(launch, frozenset({"b"})) == "b"
    assert unplaceable(launch, frozenset({"c"})) == ""


def test_a_jobs_own_grace_recorded_before_the_cap_is_capped_on_slurm_too() -> None:
    # atk46-23 F7: a job recorded with `--grace 1h` (before MAX_GRACE_S) kept its hour on the
    # Slurm executor: its stop waited an hour before scancel, and so did its --time backstop
    slots = (GpuSlot(node="vm", gpu_indices=(0,)),)
    launch = Launch(job_id=6, slots=slots, command=("true",), duration_s=None, user="alice",
                    account="ai2", grace_s=3600.0)  # fmt: skip
    assert grace_of(launch, None, lambda: None, 30.0) == MAX_GRACE_S
    assert grace_of(None, None, lambda: 3600.0, 30.0) == MAX_GRACE_S  # the ledger's word
    assert grace_of(None, None, lambda: None, 100.0) == 100.0  # the service's: the admin's
    assert grace_of(None, None, lambda: None, 300.0) == MAX_GRACE_S  # capped too (atk49-23 F6)
    assert grace_of(None, None, lambda: 12.0, 30.0) == 12.0
    (j,) = parse_jobs(LINE.format(state="RUNNING") + ":grace=3600")  # its comment says an hour
    assert j.grace_s == 3600.0
    assert grace_of(None, j, lambda: None, 30.0) == MAX_GRACE_S
    ((_, st, grace),) = resumed_stops({"51": j}, STOPPED, (), LEDGER, "gpuledger",
                                      lambda _: 1002.5, lambda _: None, 30.0)  # fmt: skip
    assert grace == MAX_GRACE_S and st is not None and st.grace_s == MAX_GRACE_S
