"""A run's contract counts from the engine's real start where the engine may hold a placement
before it starts it (Slurm; issue 24, finding F7): a placement waiting for its GPUs in Slurm
does not use up its min-runtime protection."""

from __future__ import annotations

from collections.abc import Callable

from ledger.core.state import State
from ledger.cycle.inputs import snapshot_from_state
from schemas import commands as c
from schemas import events as e
from tests.conftest import T0
from tests.unit.test_fence import _run


def _placed(state: State, ids: Callable[[], str]) -> None:
    """Job 1 (funded) placed at T0, not started."""
    _run(state, ids, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=2), T0)
    body = c.DecisionBody(
        cycle_id="c", based_on=0, policy_version="t",
        placements=(c.Placement(job_id=1, slots=(e.GpuSlot(node="n1", gpu_indices=(0, 1)),)),),
    )  # fmt: skip
    _run(state, ids, c.ApplyDecision(actor="@dispatcher", decision=body), T0)


def test_a_placement_slurm_has_not_started_keeps_its_whole_contract(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    s = org_state
    _placed(s, counter_ids)
    min_runtime = s.jobs[1].spec.min_runtime_s
    later = T0 + min_runtime + 100  # long past placement + contract
    [run] = snapshot_from_state(s, {}, later, from_start=True).running
    assert run.in_contract(later)  # not started: its contract has not begun
    [old] = snapshot_from_state(s, {}, later).running
    assert not old.in_contract(later)  # counted from placement (other executors)


def test_a_started_runs_contract_counts_from_the_engines_start(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    s = org_state
    _placed(s, counter_ids)
    start = T0 + 500
    _run(s, counter_ids, c.StartJob(actor="@executor", job_id=1, engine="slurm",
                                    engine_job_id="7", started_at=start), T0 + 501)  # fmt: skip
    min_runtime = s.jobs[1].spec.min_runtime_s
    [run] = snapshot_from_state(s, {}, start + min_runtime - 1, from_start=True).running
    assert run.placed_at == s.jobs[1].started_at and run.in_contract(start + min_runtime - 1)
    assert s.jobs[1].contract_ends_at() == s.jobs[1].started_at + min_runtime


def test_a_job_over_the_engines_longest_time_limit_is_not_pending_for_the_dispatcher(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    """F6: Slurm never starts a job over its partition's MaxTime: nothing is placed or
    preempted for it (counted in Slurm's whole minutes, rounded up), nor for one whose limit,
    grace (30 s) and a minute do not fit in it (atk62b G2: Slurm's TIMEOUT would come first)."""
    s = org_state
    for limit in (7200, 121, 90, 60):
        _run(s, counter_ids, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1,
                                         time_limit_s=limit), T0)  # fmt: skip
    pending = {
        p.job_id for p in snapshot_from_state(s, {}, T0, longest_s=180.0, hold_grace=True).pending
    }
    assert pending == {3, 4}  # 121 s is three minutes in Slurm, but 121 + 30 + 60 > 180
    assert {p.job_id for p in snapshot_from_state(s, {}, T0).pending} == {1, 2, 3, 4}
