"""`serve --new-settings` onto another Slurm cluster while a cancelled job's run is still being
stopped on the recorded one (atk45ha F2): the job has finished (it is no live job of the
ledger), its run is still held (`State.stopped_runs`). Before, the vet looked the job up among
the live jobs and the start crashed, "internal error: KeyError: <job>", exit 70, with and
without `--abandon-runs`. Now the refusal names it in one line, and `--abandon-runs` passes.
`runs_not_on` (Slurm's list, read by `scontrol`) is given: the judgement around it is tested."""

from __future__ import annotations

import itertools
import json
import logging
from types import SimpleNamespace

import pytest

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.engines.slurm import cluster, opening
from ledger.server import run
from ledger.store.lease import Settings
from ledger.wire.config import ServeConfig
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidCommand

RECORDED = {"slurm_cluster": "a at h port 1", "slurm_state": "/a"}
MINE = {"slurm_cluster": "b at h port 2", "slurm_state": "/b"}


def _cancelled_while_running(state: State) -> int:
    now = itertools.count(1000)
    ids = (lambda n: lambda: f"s{next(n)}")(itertools.count(1))

    def do(cmd: c.AnyCommand) -> list[e.AnyEvent]:
        events = decide(state, cmd, float(next(now)), ids)
        for ev in events:
            evolve(state, ev)
        return events

    (sub,) = [ev for ev in do(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1))
              if isinstance(ev, e.JobSubmitted)]  # fmt: skip
    job = sub.job_id
    body = c.DecisionBody(
        cycle_id="c1", based_on=state.events, policy_version="test",
        placements=(c.Placement(job_id=job, slots=(e.GpuSlot(node="n1", gpu_indices=(0,)),)),),
    )  # fmt: skip
    do(c.ApplyDecision(actor="@dispatcher", decision=body))
    do(c.StartJob(actor="@executor", job_id=job, engine="slurm", engine_job_id="77", run=0))
    do(c.CancelJob(actor="alice", job_id=job))
    return job


@pytest.mark.parametrize("abandon", [False, True])
def test_a_cancelled_job_whose_run_is_still_stopping_is_named_not_a_crash(
    org_state: State, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    abandon: bool,
) -> None:  # fmt: skip
    org_state.live_only = True  # as a service's state: no finished job is kept
    job = _cancelled_while_running(org_state)
    assert job not in org_state.jobs and (job, 0) in org_state.stopped_runs
    monkeypatch.setattr(cluster, "runs_not_on", lambda env, part, lid, held: sorted(j for j, _ in held))  # fmt: skip  # noqa: E501
    monkeypatch.setattr(opening, "ledger_id", lambda ledger: "0123abcd4567")
    config = ServeConfig(executor="slurm", partition="gpu", new_settings=True,
                         abandon_runs=abandon)  # fmt: skip
    recorded = Settings(5.0, admission=json.dumps(RECORDED))
    ledger = SimpleNamespace(state=org_state)
    if not abandon:
        with pytest.raises(InvalidCommand) as err:
            run._runs_left(ledger, config, MINE, recorded)  # type: ignore[arg-type]
        assert (
            f"would record lost 1 runs the ledger holds that it does not list (jobs {job})"
            in err.value.line()
        )
        return
    with caplog.at_level(logging.WARNING, "gpuledger"):
        run._runs_left(ledger, config, MINE, recorded)  # type: ignore[arg-type]
    assert f"(jobs {job})" in caplog.text, caplog.text


def test_a_finished_job_left_behind_is_being_stopped() -> None:
    assert cluster.left_status([3, 4], {4: "placed"}) == {3: "stopping", 4: "placed"}
