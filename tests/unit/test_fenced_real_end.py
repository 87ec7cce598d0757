"""A run its node's fence ended, whose agent later reports its real end (atk46-23 F5): the
engine's word wins over the fence's presumption, charged to the real end alike by the in-memory
fold, the Python reference and the audit (the projection's SQL: test_charged_sql.py)."""

from __future__ import annotations

import pytest

from ledger.core.evolve import evolve
from ledger.core.runs import settle_commands
from ledger.core.state import State
from ledger.history.audit import check
from projections import fairshare as fs
from projections.testing.reference import fold
from projections.usage import UsageFold
from schemas import commands as c
from schemas import events as e
from tests.unit.test_charged_from_start import AT, ORG, REAL, RUN, T0, decision, history

LOST, FENCE_S, REAL_END = T0 + 20, 300, T0 + 40
SETTLED = LOST + FENCE_S + 60


def fenced_then_heard(resumable: bool = False) -> list[e.AnyEvent]:
    """Job 4 runs on n1 from T0 + 2 (agents); n1's agent goes silent, the node is lost at T0 + 20
    with a 300 s fence; the job's process exits 0 at T0 + 40 (its supervisor records it); the
    fence passes (the run ends `node_failure` at the fence); the agent returns at T0 + 600 and
    reports the real end."""
    cmds: list[tuple[float, c.AnyCommand]] = [
        *ORG,
        (T0, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2, min_runtime_s=60,
                         resumable=resumable)),
        (T0, decision("c1", "fairtree-3", placed=(4,))),
        (T0 + 5, c.StartJob(actor="@executor", job_id=4, engine="agent", engine_job_id="4.1",
                            started_at=T0 + 2)),
        (LOST, c.MarkNodeLost(actor="@executor", node="n1", reason="silent", fence_s=FENCE_S)),
    ]  # fmt: skip
    state = State()
    for ev in history(cmds):
        evolve(state, ev)
    later = SETTLED
    (settle,) = settle_commands(state, later, "@executor")
    heard = c.ConfirmRunEnded(actor="@executor", job_id=4, engine="agent", engine_job_id="4.1",
                              run=0, ended_at=REAL_END, exit_code=0, by_itself=True)  # fmt: skip
    return history([*cmds, (later, settle), (T0 + 600, heard)])


@pytest.mark.parametrize("resumable", [False, True], ids=["fails", "requeued"])
def test_the_real_end_the_returning_agent_reports_is_charged_not_the_fence(resumable: bool) -> None:
    events = fenced_then_heard(resumable)
    fenced = [ev for ev in events if isinstance(ev, e.JobEngineEnded)]
    assert [ev.engine_state for ev in fenced] == ["FENCED"]
    (heard,) = [ev for ev in events if isinstance(ev, e.JobRunEnded)]
    assert heard.ended_at == REAL_END
    want = 2 * (REAL_END - (T0 + 2))  # 2 GPUs from its start to its real end, not the fence's
    folded = UsageFold(REAL)
    folded.apply_all(events)
    assert folded.usage(AT) == {"ai2/olmo/alice": want}
    ref = fold(enumerate(events, 1))
    assert fs.user_usage(ref.usage_intervals(), AT, REAL) == {"alice": want}
    assert fs.user_usage(ref.usage_intervals(), AT, RUN) == {"alice": want}
    assert check(events).violations == ()
    # before the agent's word, the fence's end is what it held: charged to it
    before = UsageFold(REAL)
    before.apply_all(events[: events.index(heard)])
    assert before.usage(AT)["ai2/olmo/alice"] > want
