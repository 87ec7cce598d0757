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
from pathlib import Path
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


def _cancelled_while_running(state: State, cancel: bool = True) -> int:
    now = itertools.count(int(state.events) * 10 + 1000)
    ids = (lambda n: lambda: f"s{next(n)}")(itertools.count(state.events + 1))

    def do(cmd: c.AnyCommand) -> list[e.AnyEvent]:
        events = decide(state, cmd, float(next(now)), ids)
        for ev in events:
            evolve(state, ev)
        return events

    (sub,) = [ev for ev in do(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1))
              if isinstance(ev, e.JobSubmitted)]  # fmt: skip
    job = sub.job_id
    slot = e.GpuSlot(node="n1", gpu_indices=(job - 1,))
    body = c.DecisionBody(cycle_id=f"c{job}", based_on=state.events, policy_version="test",
                          placements=(c.Placement(job_id=job, slots=(slot,)),))  # fmt: skip
    do(c.ApplyDecision(actor="@dispatcher", decision=body))
    do(c.StartJob(actor="@executor", job_id=job, engine="slurm", engine_job_id=f"7{job}", run=0))
    if cancel:
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
    abandoned: set[tuple[int, int]] = set()
    if not abandon:
        with pytest.raises(InvalidCommand) as err:
            run._runs_left(ledger, config, MINE, abandoned, recorded)  # type: ignore[arg-type]
        assert (
            f"would leave 1 runs being stopped on the recorded one that it does not list (jobs "
            f"{job})" in err.value.line()
        )
        return
    with caplog.at_level(logging.WARNING, "gpuledger"):
        run._runs_left(ledger, config, MINE, abandoned, recorded)  # type: ignore[arg-type]
    assert f"(jobs {job})" in caplog.text, caplog.text
    assert abandoned == set()  # its stop stays the ledger's, its end recorded on the way back
    running = _cancelled_while_running(org_state, cancel=False)
    run._runs_left(ledger, config, MINE, abandoned, recorded)  # type: ignore[arg-type]
    assert abandoned == {(running, 0)}  # never adopted: the takeover records it lost (L1)


def test_a_finished_job_left_behind_is_being_stopped() -> None:
    assert cluster.left_status([3, 4], {4: "placed"}) == {3: "stopping", 4: "placed"}


def test_abandoned_running_runs_are_never_adopted_so_the_takeover_records_them_lost(
    tmp_path: Path,
) -> None:
    """atk45ha L1: `--abandon-runs` said "recorded lost" and recorded nothing: the new leader
    carried the running run as one its Slurm forgot (its marks in this home), `running` for
    as long as its heartbeat lived on the recorded cluster. An abandoned run is not adopted,
    so `Dispatcher.recover` records it lost ("has no run in the engine")."""
    from ledger.engines.slurm.executor import SlurmExecutor
    from ledger.engines.slurm.launching import LAUNCHED
    from ledger.engines.slurm.tracked import checkpoint_file

    def slurm(args: list[str], stdin: str | None = None, env: object = None) -> str:
        return ""  # the new cluster lists none of the ledger's runs

    def executor(abandoned: frozenset[tuple[int, int]]) -> SlurmExecutor:
        ex = SlurmExecutor("gpu", "0123abcd4567", tmp_path, run_as="service")
        ex._run = slurm  # type: ignore[method-assign]
        ex.abandoned = abandoned
        ex._restarts.submitted(7, 0, "40")  # noted at its submission on the recorded cluster
        return ex

    run_dir = checkpoint_file(tmp_path, 7, 0).parent
    run_dir.mkdir(parents=True)
    (run_dir / LAUNCHED).touch()  # it launched there: Slurm "forgot" it, without the flag
    assert executor(frozenset()).adopt({7: 0}, 100.0) == {7}
    assert executor(frozenset({(7, 0)})).adopt({7: 0}, 100.0) == set()
