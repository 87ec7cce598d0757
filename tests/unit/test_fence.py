"""Fenced launches, pure: which nodes may still run an earlier launch of a job
(`ledger.engines.fence`), the runs of a node lost with a fence kept in doubt until its agent
says how they ended or the fence passes (`ledger.core.runs`), and a part's lease
(`lease_file.NodeLease`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.runs import settle_commands
from ledger.core.state import State
from ledger.engines.fence import ANY_RUN, Fence, version_number
from ledger.engines.lease_file import UNSEEN_LEASE_S, NodeLease
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidTransition
from tests.conftest import T0

# --- the server's fence ---------------------------------------------------------------------


def test_a_stopped_run_blocks_its_job_until_a_newer_report_no_longer_lists_it() -> None:
    f = Fence("ep", fence_s=60)
    f.stopped(7, 0, ["n1", "n2"], {"n1": 3, "n2": 5}, grace_s=10, now=T0)
    assert f.blocking(7, T0 + 1000) == ["n1", "n2"]  # no time frees a node that is up
    assert f.reported("n1", "ep.2", [], {7: 1}) == []  # older than the stop: proves nothing
    assert f.reported("n1", "ep.3", [(7, 0)], {7: 1}) == []  # still has it (in its grace)
    assert f.reported("n1", "other.9", [], {7: 1}) == []  # another server process's version
    assert f.reported("n1", "ep.3", [], {7: 1}) == [(7, 0)]
    assert f.blocking(7, T0) == ["n2"]
    assert f.reported("n2", "ep.6", [(7, 1)], {7: 1}) == [(7, 0)]  # the new run is not the old
    assert f.blocking(7, T0) == []


def test_a_stopped_runs_gpus_are_held_until_its_node_says_it_is_gone() -> None:
    """`node list` showed a stopped run's GPUs free during its grace, while the agent waits
    for its processes before it starts the next job there: they are held (`stopping`) until
    the node's report no longer lists the run, or its fence passes once the node is lost."""
    f = Fence("ep", fence_s=60)
    f.stopped(7, 0, ["n1", "n2"], {"n1": 3, "n2": 5}, 10, T0, {"n1": (0, 1), "n2": (2,)})
    assert f.holding(T0) == {"n1": frozenset({0, 1}), "n2": frozenset({2})}
    f.reported("n1", "ep.3", [], {7: 1})
    assert f.holding(T0) == {"n2": frozenset({2})}
    f.lost("n2", T0)
    assert f.holding(T0 + 69) == {"n2": frozenset({2})}
    assert f.holding(T0 + 70) == {}  # its fence and the grace have passed
    f.adopted(8, ["n1"], {}, 10)  # after a restart: which GPUs is not known
    assert f.holding(T0 + 70) == {}


def test_a_lost_node_blocks_until_its_fence_and_the_grace_pass_and_again_once_back() -> None:
    f = Fence("ep", fence_s=60)
    f.stopped(7, 0, ["n1"], {"n1": 1}, grace_s=10, now=T0)
    f.lost("n1", T0 + 5)
    assert f.blocking(7, T0 + 5 + 69.9) == ["n1"]
    f.returned("n1")  # back before the fence: it must report again
    assert f.blocking(7, T0 + 500) == ["n1"]
    f.lost("n1", T0 + 600)
    assert f.blocking(7, T0 + 670) == []


def test_a_run_stopped_on_a_node_already_lost_waits_for_its_fence_from_the_loss() -> None:
    f = Fence("ep", fence_s=60)
    f.lost("n1", T0)
    f.stopped(7, 2, ["n1"], {}, grace_s=0, now=T0 + 10)
    assert f.blocking(7, T0 + 59) == ["n1"]
    assert f.blocking(7, T0 + 60) == []


def test_after_a_restart_every_node_blocks_a_relaunch_until_it_reports_once() -> None:
    f = Fence("ep", fence_s=60)
    f.adopted(4, ["n1", "n2"], {}, grace_s=5)
    assert f.blockers[4]["n1"].run == ANY_RUN
    f.reported("n1", "ep.1", [(4, 2)], {4: 2})  # its current run is not an earlier one
    assert f.blocking(4, T0) == ["n2"]
    f.reported("n2", "ep.1", [(4, 1)], {4: 2})  # an earlier run still lives there
    assert f.blocking(4, T0) == ["n2"]
    f.reported("n2", "ep.2", [], {4: 2})
    assert f.blocking(4, T0) == []


def test_version_numbers_belong_to_one_server_process() -> None:
    assert version_number("ab12.7", "ab12") == 7
    assert version_number("cd34.7", "ab12") is None
    assert version_number("", "ab12") is None
    assert version_number("ab12.x", "ab12") is None


# --- the ledger: runs in doubt ----------------------------------------------------------------


def _run(state: State, ids: Callable[[], str], cmd: c.AnyCommand, now: float) -> list[e.AnyEvent]:
    out = decide(state, cmd, now, ids)
    for ev in out:
        evolve(state, ev)
    return out


def _running(state: State, ids: Callable[[], str], resumable: bool = False) -> None:
    _run(state, ids, c.SubmitJob(actor="alice", account="ai2/olmo", gpus=4,
                                 resumable=resumable, grace_s=10), T0)  # fmt: skip
    body = c.DecisionBody(
        cycle_id="c", based_on=0, policy_version="t",
        placements=(c.Placement(job_id=1, slots=(e.GpuSlot(node="n1", gpu_indices=(0, 1)),
                                                 e.GpuSlot(node="n2", gpu_indices=(0, 1)))),),
    )  # fmt: skip
    _run(state, ids, c.ApplyDecision(actor="@dispatcher", decision=body), T0)
    _run(state, ids, c.StartJob(actor="@executor", job_id=1, engine="agent",
                                engine_job_id="1.1"), T0 + 1)  # fmt: skip


def _lost(node: str, fence_s: int = 60) -> c.MarkNodeLost:
    return c.MarkNodeLost(actor="@executor", node=node, reason="silent", fence_s=fence_s)


def test_a_node_lost_with_a_fence_ends_nothing_and_its_runs_are_no_victims(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    s = org_state
    _running(s, counter_ids)
    assert [type(x) for x in _run(s, counter_ids, _lost("n1"), T0 + 100)] == [e.NodeLost]
    job = s.jobs[1]
    assert (job.status, job.lost_at, job.doubt_until) == ("running", T0 + 100, T0 + 170)
    assert settle_commands(s, T0 + 169, "@executor") == []


def test_past_the_fence_a_run_in_doubt_ends_node_failure_at_the_fence_time(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    s = org_state
    _running(s, counter_ids)
    _run(s, counter_ids, _lost("n1"), T0 + 100)
    [cmd] = settle_commands(s, T0 + 170, "@executor")
    # its processes may have run until its node's lease stopped them: charged to the fence
    assert (cmd.reason, cmd.ended_at, cmd.engine_job_id) == ("node_failure", T0 + 170, "1.1")
    out = _run(s, counter_ids, cmd, T0 + 171)
    [fin] = [x for x in out if isinstance(x, e.JobFinished)]
    assert (fin.outcome, fin.ended_at) == ("failed", T0 + 170)
    assert s.jobs[1].status == "finished" and settle_commands(s, T0 + 999, "x") == []


def test_a_resumable_run_in_doubt_is_requeued_past_the_fence_and_its_doubt_cleared(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    s = org_state
    _running(s, counter_ids, resumable=True)
    _run(s, counter_ids, _lost("n2"), T0 + 100)
    [cmd] = settle_commands(s, T0 + 200, "@executor")
    kinds = [type(x) for x in _run(s, counter_ids, cmd, T0 + 200)]
    assert kinds[:2] == [e.JobPreempted, e.JobRequeued]
    job = s.jobs[1]
    assert (job.status, job.doubt_until, job.lost_at) == ("pending", None, None)


def test_an_exit_reported_by_a_returning_node_is_recorded_as_it_happened(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    s = org_state
    _running(s, counter_ids)
    _run(s, counter_ids, _lost("n1"), T0 + 100)
    done = c.FinishJob(actor="@executor", job_id=1, exit_code=0, engine="agent",
                       engine_job_id="1.1", ended_at=T0 + 120)  # fmt: skip
    out = _run(s, counter_ids, done, T0 + 150)
    [fin] = [x for x in out if isinstance(x, e.JobFinished)]
    assert (fin.outcome, fin.ended_at) == ("completed", T0 + 120)


def test_a_node_back_before_the_fence_keeps_its_runs_once_none_of_their_nodes_is_lost(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    s = org_state
    _running(s, counter_ids)
    _run(s, counter_ids, _lost("n1"), T0 + 100)
    _run(s, counter_ids, _lost("n2"), T0 + 110)
    _run(s, counter_ids, c.ReturnNode(actor="@executor", node="n1"), T0 + 120)
    assert s.jobs[1].doubt_until == T0 + 180  # n2 is still lost
    _run(s, counter_ids, c.ReturnNode(actor="@executor", node="n2"), T0 + 130)
    assert (s.jobs[1].status, s.jobs[1].doubt_until) == ("running", None)
    assert settle_commands(s, T0 + 999, "@executor") == []


def test_a_node_lost_without_a_fence_ends_its_runs_at_once(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    s = org_state
    _running(s, counter_ids)
    kinds = [type(x) for x in _run(s, counter_ids, _lost("n1", fence_s=0), T0 + 100)]
    assert e.JobFinished in kinds and s.jobs[1].status == "finished"


def test_the_end_of_a_stopped_run_is_recorded_for_any_run_the_job_had(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    s = org_state
    _running(s, counter_ids)
    ok = c.ConfirmRunEnded(actor="@executor", job_id=1, engine="agent", engine_job_id="1.1",
                           run=0, ended_at=T0 + 9e9, killed=True)  # fmt: skip
    [ev] = _run(s, counter_ids, ok, T0 + 50)
    assert isinstance(ev, e.JobRunEnded) and (ev.ended_at, ev.killed) == (T0 + 50, True)
    later = c.ConfirmRunEnded(actor="@executor", job_id=1, engine="agent",
                              engine_job_id="1.2", run=1)  # fmt: skip
    try:
        _run(s, counter_ids, later, T0 + 50)
    except InvalidTransition as err:
        assert "is at its run 0, not run 1" in str(err)
    else:
        raise AssertionError("a run the job never had was recorded")


# --- a part's lease ---------------------------------------------------------------------------


def test_a_part_stops_itself_only_once_its_lease_has_run_out(tmp_path: Path) -> None:
    lease = tmp_path / "lease"
    seen = NodeLease(str(lease))
    lease.write_bytes(json.dumps({"until": T0 + 10}).encode())
    assert not seen.passed(T0 + 10)
    assert seen.passed(T0 + 10.5)
    lease.write_bytes(json.dumps({"until": "inf"}).encode())
    assert seen.passed(T0)  # no file turns the fence off


@pytest.mark.parametrize("gone", ["removed", "unreadable"])
def test_a_lease_that_vanishes_runs_out_at_the_last_until_the_part_read(
    tmp_path: Path, gone: str
) -> None:
    """atk39-23 F7: a state directory removed while its jobs ran took the lease with it, and
    "no lease file: no fence" let them run for ever beside the next job on their GPUs."""
    lease = tmp_path / "lease"
    seen = NodeLease(str(lease))
    lease.write_bytes(json.dumps({"until": T0 + 10}).encode())
    assert not seen.passed(T0)
    if gone == "removed":
        lease.unlink()
    else:
        lease.write_bytes(b"{not json")
    assert not seen.passed(T0 + 10)
    assert seen.passed(T0 + 10.5)


def test_a_lease_never_read_runs_out_a_whole_default_lease_after_it_was_found_missing(
    tmp_path: Path,
) -> None:
    seen = NodeLease(str(tmp_path / "lease"))
    assert not seen.passed(T0)
    assert not seen.passed(T0 + UNSEEN_LEASE_S)
    assert seen.passed(T0 + UNSEEN_LEASE_S + 0.5)


def test_a_part_the_watchdog_stopped_first_says_fenced_though_it_exits_0(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The race of atk28 F2: the watchdog's SIGTERM wins, the job exits 0 as the signal contract
    asks, and the supervisor's own look at the lease never came: the exit still says fenced."""
    import os
    import subprocess
    import threading
    import time

    from ledger.engines import supervise
    from ledger.engines.tree import Containment, Tree

    lease = tmp_path / "lease"
    lease.write_bytes(json.dumps({"until": time.time() - 1}).encode())
    ready = tmp_path / "trapped"
    job = subprocess.Popen(
        ["/bin/sh", "-c", f"trap 'exit 0' TERM; : > {ready}; while :; do sleep 0.05; done"],
        start_new_session=True,
    )
    deadline = time.monotonic() + 30  # its trap set before the SIGTERM (a loaded host: 143)
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    tree = Tree("", Containment(why_not="unit test"), sid=job.pid)
    monkeypatch.setattr(supervise, "FENCE_CHECK_S", 30.0)  # the supervisor looks too late
    mark = tmp_path / supervise.FENCED_MARK
    dog = threading.Thread(
        target=supervise.watch_lease, args=(tree, str(lease), 5.0, mark), daemon=True
    )
    try:
        dog.start()
        code, fenced = supervise.wait_leader(job, tree, str(lease), 5.0, mark)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
        dog.join(timeout=0.1)  # it sleeps FENCE_CHECK_S before it sees the tree empty
    assert code == 0 and fenced


def test_a_local_run_the_ledger_stopped_holds_its_gpus_until_its_parts_end() -> None:
    """`up`/`--executor local`: the GPUs of a stopped run's parts not ended yet are `stopping`
    (`Observed.stopping`); a run stopped at its limit or by itself is still the ledger's."""
    from ledger.engines.runs import Handle, Part, stopping_gpus

    def part(node: str, gpus: tuple[int, ...], code: int | None) -> Part:
        return Part(rank=0, node=node, gpu_indices=gpus, rundir="/r", log="/l", exit_code=code)

    parts = [part("a", (0, 1), None), part("b", (2,), 143)]
    stopped = Handle(job_id=1, launch=1, launched_at=T0, time_limit_s=None, grace_s=30,
                     parts=parts, stop_reason="ledger")  # fmt: skip
    limited = Handle(job_id=2, launch=1, launched_at=T0, time_limit_s=60, grace_s=30,
                     parts=[part("a", (3,), None)], stop_reason="time_limit")  # fmt: skip
    assert stopping_gpus([stopped, limited]) == {"a": frozenset({0, 1})}
