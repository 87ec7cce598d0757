"""`explain`'s line of a stopped run's real end says "charged from its own start ... (the ledger
had stopped it before seeing it start)" only of a run whose start the ledger had not recorded
(atk44s F3). The node agents' parts say their start at every stop (`JobRunEnded.started_at`),
so it said so of every stopped run on agents, started normally or not (atk58 F7). Pure: the
fold and `explain_history`."""

from __future__ import annotations

import pytest

from ledger.core.state import State
from ledger.cycle.inputs import snapshot_from_state
from ledger.dispatch.engine import decide as dispatch
from ledger.dispatch.registry import build
from ledger.reads.explain import explain_history
from schemas import commands as c
from tests.unit.domainkit import ONE_NODE
from tests.unit.domainkit import run as _run

STOPPED = "the ledger had stopped it before seeing it start"


@pytest.mark.parametrize("seen", [True, False])
def test_its_own_start_is_named_only_for_a_run_the_ledger_never_saw_start(seen: bool) -> None:
    state = State()
    history = _run(state, 0.0,
         *ONE_NODE,
         c.SubmitJob(actor="u", account="p/q", gpus=2, time_limit_s=600, grace_s=30))  # fmt: skip
    decision = dispatch(snapshot_from_state(state, {}, 0.0), build("fifo"), 0.0)
    body = c.DecisionBody(cycle_id="c0", based_on=state.events, policy_version="x",
                          placements=tuple(decision.placements))  # fmt: skip
    history += _run(state, 0.0, c.ApplyDecision(actor="@dispatcher", decision=body))
    if seen:  # recorded started at 1.0, before the cancel
        history += _run(state, 1.0, c.StartJob(actor="@executor", job_id=1, started_at=1.0))
    history += _run(state, 5.0, c.CancelJob(actor="u", job_id=1))
    history += _run(state, 9.0, c.ConfirmRunEnded(actor="@executor", job_id=1, engine="agent",
                                                  engine_job_id="1.1", run=0, ended_at=8.0,
                                                  started_at=1.0))  # fmt: skip
    said = "\n".join(explain_history(state.jobs[1], history, {}, 10.0, 30.0))
    (line,) = [ln for ln in said.splitlines() if "really ended" in ln]
    # before: the parenthesis (and its own start) for a run recorded started at 1.0 too
    assert (STOPPED in line) is (not seen), said
    assert ("charged from its own start" in line) is (not seen), said
