"""A job's end is recorded whatever the number of dependents others hung on it: the ends of
those dependents (`jobs.dependents_ended`, written with it) are the ledger's consequence, not
the request's, and are not counted against what a request may write (atk46-25 F1: 44,000
dependents from three plain users made a job's exit and its cancel `[too_large]` for good: the
exit was dropped and the job held its GPUs forever; nobody could cancel it). The bound is
lowered here so that 300 dependents exceed it; on the old code both ends below were refused."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from ledger.core import jobs
from ledger.core.state import State
from ledger.cycle.executor import Exit, Observed
from ledger.cycle.record import record
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from schemas import bounds, codec
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidTransition, TooLarge
from schemas.events import GpuSlot

USERS = ("a1", "a2", "a3")
TASKS = 100


@pytest.fixture
def lab(tmp_path: Path) -> Ledger:
    ledger = Ledger(tmp_path, SimClock(1_000.0), seeded_ids(1))
    ledger.execute(c.InitLedger(actor="root", admin="root", min_runtime_cap_s=3600))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="lab", kind="program"),
            c.OpenAccount(actor="root", path="lab/a", kind="project", shares=1),
            *[c.AddMember(actor="root", user=u, project="lab/a") for u in ("victim", *USERS)],
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )
    return ledger


def hang_dependents(lab: Ledger, kind: e.DependencyKind) -> list[int]:
    """Job 1 (the victim's) running on n1, and 300 pending tasks of other users' arrays
    depending on it by `kind`; the ids of those tasks."""
    lab.execute(c.SubmitJob(actor="victim", account="lab/a", gpus=1, min_runtime_s=0))
    slots = (GpuSlot(node="n1", gpu_indices=(0,)),)
    body = c.DecisionBody(
        cycle_id="cycle-1",
        based_on=lab.state.events,
        policy_version="test",
        placements=(e.Placement(job_id=1, slots=slots),),
    )
    lab.execute(c.ApplyDecision(actor="@dispatcher", decision=body))
    lab.execute(c.StartJob(actor="@executor", job_id=1))
    dep = (e.Dependency(kind=kind, job_ids=(1,)),)
    ids: list[int] = []
    for user in USERS:
        done = lab.execute(
            c.SubmitJob(
                actor=user,
                account="lab/a",
                gpus=1,
                command=("/bin/true",),
                array=tuple(range(TASKS)),
                dependency=dep,
            )
        )
        ids += [ev.job_id for ev in done.events if isinstance(ev, e.JobSubmitted)]
    assert len(ids) == len(USERS) * TASKS
    return ids


def ends_of(lab: Ledger, ids: list[int]) -> set[str | None]:
    return {None if lab.state.jobs[j].active else "ended" for j in ids}


SMALL = 32 << 10
"""What a request may write, lowered (300 dependents' ends write ~110 KB)."""


def test_a_completed_exit_is_recorded_and_ends_every_afternotok_dependent(
    lab: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = hang_dependents(lab, "afternotok")
    monkeypatch.setattr(bounds, "MAX_REQUEST_WRITTEN", SMALL)
    done = lab.execute(c.FinishJob(actor="@executor", job_id=1, exit_code=0))
    own = [ev for ev in done.events if isinstance(ev, e.JobFinished) and ev.job_id == 1]
    assert [ev.outcome for ev in own] == ["completed"]
    assert not lab.state.jobs[1].active and 1 not in lab.state.active
    ended = [ev for ev in done.events if isinstance(ev, e.JobFinished) and ev.job_id != 1]
    assert sorted(ev.job_id for ev in ended) == ids  # oldest job id first, every one
    assert [ev.job_id for ev in ended] == ids
    assert {ev.reason for ev in ended} == {"dependency_never_satisfied"}
    assert ends_of(lab, ids) == {"ended"}
    stored = sum(len(codec.encode(ev)) for ev in done.events)
    assert stored > SMALL  # more than a request may write, and recorded all the same


def test_a_cancel_is_recorded_and_ends_every_afterok_dependent(
    lab: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = hang_dependents(lab, "afterok")
    monkeypatch.setattr(bounds, "MAX_REQUEST_WRITTEN", SMALL)
    done = lab.execute(c.CancelJob(actor="victim", job_id=1))
    assert not lab.state.jobs[1].active
    ended = [ev.job_id for ev in done.events if isinstance(ev, e.JobFinished) and ev.job_id != 1]
    assert ended == ids
    assert ends_of(lab, ids) == {"ended"}


def test_the_request_itself_is_still_bounded(lab: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the dependents' ends go uncounted: a submission over the bound is refused still."""
    monkeypatch.setattr(bounds, "MAX_REQUEST_WRITTEN", SMALL)
    with pytest.raises(TooLarge, match="this request would write more than 32,768 bytes"):
        lab.execute(c.SubmitJob(actor="a1", account="lab/a", gpus=1, array=tuple(range(TASKS))))


def test_another_users_jobs_may_bring_a_jobs_dependents_to_a_bound_only(
    lab: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Others' submissions naming a job are refused (409, one line) past the bound; the owner's
    own are not, and the first refusal names the job and the numbers."""
    monkeypatch.setattr(jobs, "MAX_FOREIGN_DEPENDENTS", 150)
    lab.execute(c.SubmitJob(actor="victim", account="lab/a", gpus=1, min_runtime_s=0))
    dep = (e.Dependency(kind="afternotok", job_ids=(1,)),)

    def submit(user: str, tasks: int) -> c.SubmitJob:
        array = tuple(range(tasks))
        return c.SubmitJob(actor=user, account="lab/a", gpus=1, array=array, dependency=dep)

    lab.execute(submit("a1", 100))
    before = lab.position
    with pytest.raises(InvalidTransition) as refused:
        lab.execute(submit("a2", 51))
    assert refused.value.line().startswith(
        "job 1 is another user's and 100 unfinished jobs wait on it: 51 more would pass the 150 "
        "another user's jobs may bring it to"
    )
    assert lab.head() == before
    lab.execute(submit("a2", 50))  # up to the bound
    lab.execute(submit("victim", 100))  # the owner's own: not bounded here
    assert len(lab.state.dependents()[1]) == 250


class RefusingNotes:
    """A ledger that refuses an exit carrying a note (as one too large to write)."""

    def __init__(self, lab: Ledger) -> None:
        self.lab = lab

    @property
    def state(self) -> State:
        return self.lab.state

    def execute(self, cmd: c.AnyCommand) -> object:
        if isinstance(cmd, c.FinishJob) and cmd.note:
            raise TooLarge("this request would write too much")
        return self.lab.execute(cmd)

    def execute_all(self, cmds: Sequence[c.AnyCommand]) -> object:
        return self.lab.execute_all(cmds)


def test_an_exit_refused_is_said_at_error_and_recorded_without_its_note(
    lab: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    hang_dependents(lab, "afterok")
    seen = Observed(exits=(Exit(job_id=1, exit_code=0, at=1_000.0, note="x" * 100),))
    with caplog.at_level(logging.INFO, logger="gpuledger.dispatcher"):
        done = record(RefusingNotes(lab), seen, "local")
    assert done.finished == 1 and not lab.state.jobs[1].active
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "exit of job 1 refused: this request would write too much",
        "exit of job 1 recorded without its note",
    ]
