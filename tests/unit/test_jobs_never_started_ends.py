"""atk55-23 F2 and F3, `jobs` and `explain` of node-agent runs that ended while `up` was down.

F2: a placed launch that never started, cancelled while `up` was down, was not charged (its
run start NULL), but `jobs` named its node and `explain` said its GPUs were "held, and
charged, until then". F3: a command that exited 3 by itself 15 s into its run while `up` was
down, cancelled offline 6 s later, was charged its 15 s, but `jobs` showed the cancel as its end
(elapsed 21 s) and `explain` told the cancel before the earlier end."""

from __future__ import annotations

from pathlib import Path

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.reads.explain import explain_history
from ledger.reads.layer import _job_rows
from schemas import commands as c
from tests.unit.test_charged_from_start import ORG, T0, decision, ids
from tests.unit.test_jobs_own_start import jobs

FINISHED_AT = 18  # `jobs_page`'s column


def _cancelled_unstarted() -> list[tuple[float, c.AnyCommand]]:
    return [
        *ORG,
        (T0, decision("c1", "fairtree-3", placed=(2,))),
        (T0 + 30, c.CancelJob(actor="alice", job_id=2)),  # offline: the agent never had it
        (T0 + 40, c.ConfirmRunEnded(actor="@executor", job_id=2, engine="agent",
                                    engine_job_id="2.1", ended_at=T0 + 40,
                                    note="it never started: n1's agent reports no such run")),
    ]  # fmt: skip


def _exited_then_cancelled() -> list[tuple[float, c.AnyCommand]]:
    return [
        *ORG,
        (T0, decision("c1", "fairtree-3", placed=(2,))),
        (T0 + 1, c.StartJob(actor="@executor", job_id=2, engine="agent", engine_job_id="2.1",
                            started_at=T0 + 1)),
        (T0 + 22, c.CancelJob(actor="alice", job_id=2)),  # offline, after the exit
        (T0 + 25, c.ConfirmRunEnded(actor="@executor", job_id=2, engine="agent",
                                    engine_job_id="2.1", ended_at=T0 + 16, exit_code=3,
                                    by_itself=True, exit_decides=True)),
    ]  # fmt: skip


def _explained(cmds: list[tuple[float, c.AnyCommand]]) -> list[str]:
    state, new_id, history = State(), ids(), []
    for at, cmd in cmds:
        for ev in decide(state, cmd, at, new_id):
            evolve(state, ev)
            if getattr(ev, "job_id", None) == 2:
                history.append(ev)
    return explain_history(state.jobs[2], history, {}, T0 + 50, 30.0)


def test_a_cancelled_launch_that_never_started_names_no_node(tmp_path: Path) -> None:
    rows = list(jobs(tmp_path, _cancelled_unstarted()).values())
    (row,) = [r for r in _job_rows(rows, T0 + 50) if r.job_id == 2]
    assert row.status == "finished" and row.started_at is None, row
    assert row.nodes == [], row  # the old code: ['n1']
    assert [s.node for s in row.slots] == ["n1"]  # its placement, as before


def test_a_cancelled_launch_that_never_started_is_explained_never_started() -> None:
    said = _explained(_cancelled_unstarted())
    (end,) = [s for s in said if "its run 0" in s]
    assert "never started" in end and "not charged" in end, said
    assert "held, and charged" not in end, said


def test_a_run_that_exited_by_itself_before_an_offline_cancel_ends_at_its_exit(
    tmp_path: Path,
) -> None:
    row = jobs(tmp_path, _exited_then_cancelled())[2]
    assert row[8] == 3, row  # its own exit code, as before
    assert row[FINISHED_AT] == T0 + 16, row  # the old code: the cancel's T0 + 22
    (got,) = [r for r in _job_rows([row], T0 + 50) if r.job_id == 2]
    assert got.elapsed_s == 15.0, got


def test_its_explain_tells_the_exit_before_the_cancel() -> None:
    said = _explained(_exited_then_cancelled())
    ended = next(i for i, s in enumerate(said) if "really ended" in s)
    cancelled = next(i for i, s in enumerate(said) if "cancelled by alice" in s)
    assert ended < cancelled, said
    assert "exited 3 by itself" in said[ended], said
    # a run the stop ended is still told after the stop
    said = _explained([
        *ORG,
        (T0, decision("c1", "fairtree-3", placed=(2,))),
        (T0 + 1, c.StartJob(actor="@executor", job_id=2, engine="agent", engine_job_id="2.1")),
        (T0 + 22, c.CancelJob(actor="alice", job_id=2)),
        (T0 + 25, c.ConfirmRunEnded(actor="@executor", job_id=2, engine="agent",
                                    engine_job_id="2.1", ended_at=T0 + 24)),
    ])  # fmt: skip
    ended = next(i for i, s in enumerate(said) if "really ended" in s)
    cancelled = next(i for i, s in enumerate(said) if "cancelled by alice" in s)
    assert cancelled < ended and "held, and charged" in said[ended], said
