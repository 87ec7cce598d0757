"""A job in its stop's grace is `stopping`, with its SIGKILL at the latest, in every read: one
definition (`ledger.reads.stopping`) used by `jobs`, `queue`, `node list` and `explain`
(atk46-23 F7: a job past its time limit in a long grace, and a cancelled job whose processes
lived on, showed plain `running`, or nothing)."""

from __future__ import annotations

import pytest

from ledger.core.state import State
from ledger.reads import layer
from ledger.reads.explain import explain_history, run_ended_line
from ledger.reads.explain_job import explain_now
from ledger.reads.preview import _holding_rows
from ledger.reads.stopping import DEFAULT_GRACE_S, limit_kill_at, shown
from schemas import agent as a
from schemas import commands as c
from schemas import events as e
from schemas import views as v
from schemas.bounds import MAX_GRACE_S
from schemas.errors import InvalidTransition, NotAuthorised
from tests.unit.test_jobs_world import World


@pytest.fixture
def w(org_state: State) -> World:
    return World(org_state)


@pytest.mark.parametrize(
    ("case", "status", "now", "grace", "want"),
    [
        ("inside its limit", "running", 159.0, 60, ("running", None)),
        ("at its limit", "running", 160.0, 60, ("stopping", 220.0)),
        ("its own grace", "running", 200.0, 5, ("stopping", 165.0)),
        ("the default grace", "running", 200.0, None, ("stopping", 160.0 + DEFAULT_GRACE_S)),
        ("an hour recorded before", "running", 200.0, 3600, ("stopping", 160.0 + MAX_GRACE_S)),
        ("placed, not started", "placed", 500.0, 60, ("placed", None)),
        ("finished", "finished", 500.0, 60, ("finished", None)),
    ],
)
def test_a_running_job_past_its_limit_is_stopping_until_its_kill(
    case: str, status: str, now: float, grace: int | None, want: tuple[str, float | None]
) -> None:
    started = None if status == "placed" else 100.0
    assert shown(status, started, 60, grace, now, DEFAULT_GRACE_S) == want, case
    assert shown("running", 100.0, None, grace, 10_000.0, 30) == ("running", None)  # no limit


def _running(w: World, gpu: int = 0, **kw: object) -> int:
    (job,) = w.submit(command=("t",), **kw)  # type: ignore[arg-type]
    w.place(job.job_id, "n1", gpu)
    w.run(c.StartJob(actor="@executor", job_id=job.job_id, engine="agent",
                     engine_job_id=f"{job.job_id}.1"))  # fmt: skip
    return job.job_id


def _queue(w: World, now: float) -> dict[int, v.QueueRow]:
    rows = _holding_rows(w.state, v.QueueFilter(state="running"), now, 100)
    return {r.job_id: r for r in rows}


def test_queue_node_list_and_explain_show_a_job_past_its_limit_stopping(w: World) -> None:
    job_id = _running(w, time_limit_s=5, grace_s=60)
    start = w.state.jobs[job_id].started_at
    assert start is not None
    before, after = start + 4, start + 10
    early = _queue(w, before)[job_id]
    assert (early.state, early.kill_at) == ("running", None)
    row = _queue(w, after)[job_id]
    assert (row.state, row.code, row.kill_at) == ("stopping", "STOPPING", start + 65)
    assert "reached its time limit" in row.reason
    (n1,) = [n for n in layer.node_list(w.state, now=after) if n.node == "n1"]
    assert n1.stopping_jobs == [job_id] and job_id in n1.jobs
    (n1,) = [n for n in layer.node_list(w.state, now=before) if n.node == "n1"]
    assert n1.stopping_jobs == []
    job = w.state.jobs[job_id]
    assert explain_now(None, None, job, None, after).status == "stopping"
    assert explain_history(job, [], {}, after, DEFAULT_GRACE_S)[0].endswith(" is stopping.")
    assert limit_kill_at(start, 5, 60, DEFAULT_GRACE_S) == row.kill_at  # the one definition


def test_a_cancelled_job_whose_run_lives_on_is_stopping_in_queue_and_node_list(w: World) -> None:
    job_id = _running(w, grace_s=40, time_limit_s=3600)
    started = w.state.jobs[job_id].started_at
    assert started is not None
    w.now += 10
    w.run(c.CancelJob(actor="alice", job_id=job_id))
    cancelled_at = w.now
    row = _queue(w, w.now + 1)[job_id]
    assert (row.state, row.kill_at, row.user, row.nodes) == (
        "stopping", cancelled_at + 40, "alice", ["n1"])  # fmt: skip
    # its limit and its time so far, as `jobs` shows them (atk62-slurm F8: null)
    assert (row.time_limit_s, row.elapsed_s) == (3600, w.now + 1 - started), row
    assert row.reason.startswith("cancelled at ")
    (n1,) = [n for n in layer.node_list(w.state, now=w.now) if n.node == "n1"]
    assert n1.stopping_jobs == [job_id] and n1.jobs == []
    # with no engine's word (embedded, the service down): its GPU stopping, not free (F4)
    assert (n1.stopping_gpus, n1.free_gpus) == ([0], 7)
    # its engine reports its processes gone: nothing is stopping any more
    w.run(c.ConfirmRunEnded(actor="@executor", job_id=job_id, engine="agent",
                            engine_job_id=f"{job_id}.1", run=0, ended_at=w.now + 3))  # fmt: skip
    assert job_id not in _queue(w, w.now + 4)
    (n1,) = [n for n in layer.node_list(w.state, now=w.now) if n.node == "n1"]
    assert n1.stopping_jobs == [] and (n1.stopping_gpus, n1.free_gpus) == ([], 8)


def test_a_cancel_of_a_job_past_its_limit_kills_it_at_once(w: World) -> None:
    job_id = _running(w, time_limit_s=5, grace_s=60)
    w.now += 30  # past its limit, in its grace
    w.run(c.CancelJob(actor="alice", job_id=job_id))
    row = _queue(w, w.now)[job_id]
    assert (row.state, row.kill_at) == ("stopping", w.now)  # killed at once, as scancel


def test_a_job_cancelled_in_its_time_limits_grace_ends_time_limit(w: World) -> None:
    """atk47-23 F11: a job past its time limit, cancelled in its limit's grace, was recorded
    `cancelled`; Slurm keeps such a job TIMEOUT (its `scancel` only cuts `KillWait`). Now it
    ends `time_limit` (outcome `failed`, as a time limit's end), its run killed at once and
    awaited as a cancel's is; a job cancelled inside its limit ends `cancelled` as before, and
    an engine's own time-limit end (no stop of the ledger's) awaits nothing."""
    job_id = _running(w, time_limit_s=5, grace_s=60)
    inside = _running(w, 1, time_limit_s=3600, grace_s=60)
    w.now += 30  # past the first's limit, in its grace
    (end,) = [ev for ev in w.run(c.CancelJob(actor="alice", job_id=job_id))
              if isinstance(ev, e.JobFinished)]  # fmt: skip
    assert (end.outcome, end.reason, end.exit_code, end.ended_at) == (
        "failed", "time_limit", None, None)  # fmt: skip
    assert end.note.endswith("cancelled by alice in its grace")
    stop = w.state.stopped_runs[(job_id, 0)]
    assert (stop.kill, stop.why) == (True, "cancelled")
    w.now += 1
    gone = w.run(c.ConfirmRunEnded(actor="@executor", job_id=job_id, engine="agent",
                                   engine_job_id=f"{job_id}.1", run=0, ended_at=w.now,
                                   killed=True))  # fmt: skip
    said = explain_history(w.state.jobs[job_id], [end, *gone], {}, w.now, DEFAULT_GRACE_S)
    assert said[0].endswith(" is finished (time limit).")
    assert "was stopped at its time limit" in said[1] and "cancelled by alice" in said[1]
    assert "really ended (killed (SIGKILL), its grace cut short)" in said[2], said
    (other,) = [ev for ev in w.run(c.CancelJob(actor="alice", job_id=inside))
                if isinstance(ev, e.JobFinished)]  # fmt: skip
    assert (other.outcome, other.reason) == ("cancelled", "cancelled")
    by_engine = _running(w, 2, time_limit_s=5)
    w.now += 10
    w.run(c.FinishJob(actor="@executor", job_id=by_engine, exit_code=137, reason="time_limit"))
    assert (by_engine, 0) not in w.state.stopped_runs


def test_a_second_cancel_kills_a_stopping_run_at_once(w: World) -> None:
    """atk46-23 F7: a cancel of a job already cancelled, its processes in their grace, was
    refused ("already cancelled") and could not cut the grace; now it orders the run killed."""
    job_id = _running(w, grace_s=100)
    w.run(c.CancelJob(actor="alice", job_id=job_id))
    assert _queue(w, w.now)[job_id].kill_at == w.now + 100
    with pytest.raises(NotAuthorised):
        w.run(c.CancelJob(actor="bob", job_id=job_id))  # not bob's
    w.now += 5
    (ordered,) = w.run(c.CancelJob(actor="alice", job_id=job_id))
    assert isinstance(ordered, e.JobKillOrdered) and (ordered.job_id, ordered.run) == (job_id, 0)
    assert w.state.stopped_runs[(job_id, 0)].kill
    row = _queue(w, w.now)[job_id]
    # its SIGKILL is the second cancel, not the first one's time, 5 s past (atk47-23 F6b)
    assert (row.kill_at, row.reason.endswith("killed at once")) == (w.now, True)
    with pytest.raises(InvalidTransition, match="its processes are being killed"):
        w.run(c.CancelJob(actor="alice", job_id=job_id))  # once
    gone = c.ConfirmRunEnded(
        actor="@executor",
        job_id=job_id,
        engine="agent",
        engine_job_id=f"{job_id}.1",
        run=0,
        ended_at=w.now,
        killed=True,
    )
    (ended,) = w.run(gone)
    line = run_ended_line(ended, cut=True)  # as `explain` says it of a run cut short (F6b)
    assert "its grace cut short" in line and "end of its grace" not in line, line
    with pytest.raises(InvalidTransition, match="already cancelled"):
        w.run(c.CancelJob(actor="alice", job_id=job_id))  # gone: a finished job, as before


def test_a_second_cancel_of_a_job_gone_from_the_live_state_is_its_owners(w: World) -> None:
    job_id = _running(w, grace_s=100)
    w.run(c.CancelJob(actor="alice", job_id=job_id))
    del w.state.jobs[job_id]  # a server keeps only live jobs (`State.live_only`)
    w.state.live_only = True
    with pytest.raises(NotAuthorised):
        w.run(c.CancelJob(actor="bob", job_id=job_id))
    (ordered,) = w.run(c.CancelJob(actor="alice", job_id=job_id))
    assert isinstance(ordered, e.JobKillOrdered)
    assert _queue(w, w.now)[job_id].state == "stopping"


def test_an_agent_reads_the_runs_to_kill_from_its_poll_answer() -> None:
    """The agents' answer reader rebuilt the assignment from its head and parts alone: the runs
    to kill at once (`Assignment.kill`) never reached the node's agent."""
    import msgspec

    from schemas import agent as a

    asg = a.Assignment(node="n1", version="v", parts=(), server_time=1.0,
                       kill=(a.PartRun(job_id=2, run=1),))  # fmt: skip
    got, bad = a.decode_assignment(msgspec.json.encode(asg))
    assert (got.kill, bad) == ((a.PartRun(job_id=2, run=1),), ())
    old = b'{"node":"n1","version":"v","parts":[],"server_time":1.0}'  # an older server's
    assert a.decode_assignment(old)[0].kill == ()


def test_a_second_cancel_after_the_grace_would_have_ended_keeps_the_graces_end() -> None:
    """`kill_at` is the second cancel, never later than the first one's grace: a kill order
    read after that (a replayed log) says the earlier of the two."""
    from ledger.core.state import StoppedRun
    from ledger.reads.stopping import stopped_kill_at

    sr = StoppedRun(job_id=1, run=0, slots=(), at=100.0, grace_s=10)
    assert stopped_kill_at(sr, 30.0) == 110.0
    import msgspec

    assert stopped_kill_at(msgspec.structs.replace(sr, kill=True, killed_at=105.0), 30.0) == 105.0
    assert stopped_kill_at(msgspec.structs.replace(sr, kill=True, killed_at=130.0), 30.0) == 110.0
    assert stopped_kill_at(msgspec.structs.replace(sr, kill=True), 30.0) == 100.0  # kept before


@pytest.mark.parametrize("live_only", [False, True])
def test_a_second_cancel_of_an_arrays_id_kills_every_task_in_its_grace(
    w: World, live_only: bool
) -> None:
    """atk47-23 F13: `cancel 44` of a running array cancelled its three tasks; `cancel 44` again
    (a second `scancel 44`, which Slurm applies to every task) killed only task 44, and the
    others lived out their grace. Now every task's run in its grace is ordered killed, and a
    bob's second cancel of alice's array is refused as the first is."""
    tasks = [t.job_id for t in w.submit(command=("t",), array=(0, 1, 2), grace_s=100)]
    for gpu, job_id in enumerate(tasks):
        w.place(job_id, "n1", gpu)
        w.run(c.StartJob(actor="@executor", job_id=job_id, engine="agent",
                         engine_job_id=f"{job_id}.1"))  # fmt: skip
    first = tasks[0]
    cancelled = w.run(c.CancelJob(actor="alice", job_id=first, whole_array=True))
    assert [ev.job_id for ev in cancelled if isinstance(ev, e.JobFinished)] == tasks
    if live_only:  # a server keeps only live jobs
        w.state.jobs = {k: j for k, j in w.state.jobs.items() if j.active}
        w.state.live_only = True
    with pytest.raises(NotAuthorised):
        w.run(c.CancelJob(actor="bob", job_id=first, whole_array=True))
    ordered = w.run(c.CancelJob(actor="alice", job_id=first, whole_array=True))
    assert [(ev.job_id, ev.run) for ev in ordered if isinstance(ev, e.JobKillOrdered)] == [
        (t, 0) for t in tasks
    ]
    assert all(w.state.stopped_runs[(t, 0)].kill for t in tasks)
    with pytest.raises(InvalidTransition, match="its processes are being killed"):
        w.run(c.CancelJob(actor="alice", job_id=first, whole_array=True))  # once
    # one task by its own id (`cancel 44_1`): that task alone, as before
    more = [t.job_id for t in w.submit(command=("t",), array=(0, 1), grace_s=100)]
    for gpu, job_id in enumerate(more, start=4):
        w.place(job_id, "n1", gpu)
        w.run(c.StartJob(actor="@executor", job_id=job_id, engine="agent",
                         engine_job_id=f"{job_id}.1"))  # fmt: skip
    w.run(c.CancelJob(actor="alice", job_id=more[0], whole_array=True))
    (one,) = w.run(c.CancelJob(actor="alice", job_id=more[1]))
    assert isinstance(one, e.JobKillOrdered) and one.job_id == more[1]


def test_a_stopped_run_is_ordered_killed_once_its_recorded_grace_has_passed() -> None:
    """atk47-23 F3: the SIGKILL of a stopped run is due at the recorded stop plus its grace
    (the job's own, else the engine's default), whatever restarts came between: the agents
    get it on their kill list then (`Assignment.kill`), at once after a second cancel."""
    from ledger.core.state import StoppedRun
    from ledger.engines.board import kills_by_node

    slot = (e.GpuSlot(node="n1", gpu_indices=(0,)),)
    own = StoppedRun(job_id=7, run=0, slots=slot, at=100.0, grace_s=20)
    default = StoppedRun(job_id=8, run=1, slots=slot, at=100.0)
    cut = StoppedRun(job_id=9, run=0, slots=slot, at=100.0, grace_s=60, kill=True)
    stopped = {(r.job_id, r.run): r for r in (own, default, cut)}
    assert (own.kill_at(45.0), default.kill_at(45.0), cut.kill_at(45.0)) == (120.0, 145.0, 100.0)
    runs = lambda now: [(k.job_id, k.run) for k in  # noqa: E731
                        kills_by_node(stopped, {7, 8, 9}, now, 45.0).get("n1", ())]  # fmt: skip
    assert runs(110.0) == [(9, 0)]
    assert runs(120.0) == [(7, 0), (9, 0)]
    assert runs(145.0) == [(7, 0), (8, 1), (9, 0)]
    assert kills_by_node(stopped, {8}, 200.0, 45.0) == {"n1": (a.PartRun(job_id=8, run=1),)}


def test_a_job_stopping_in_its_grace_holds_back_its_dependents_and_its_arrays_limit(
    w: World,
) -> None:
    """atk48-23 F5: a cancelled job whose processes lived out their grace did not hold back what
    waits on it: an `afterany` job started 1 s after the cancel (and read a checkpoint still
    being written), a `%1` array's next task ran beside it for 15 s. Slurm waits for the job's
    end; so does every cycle that holds stopping GPUs (`blocked(hold_stopping=True)`), and a
    replay of an older record (False) decides as it did."""
    from ledger.core import jobs

    (first,) = w.submit(command=("t",), grace_s=100)
    on_first = e.Dependency(kind="afterany", job_ids=(first.job_id,))
    (after,) = w.submit(command=("t",), dependency=(on_first,))
    tasks = [t.job_id for t in w.submit(command=("t",), array=(0, 1), array_limit=1)]
    for gpu, job_id in enumerate((first.job_id, tasks[0]), start=1):
        w.place(job_id, "n1", gpu)
        w.run(c.StartJob(actor="@executor", job_id=job_id, engine="agent",
                         engine_job_id=f"{job_id}.1"))  # fmt: skip
    assert set(jobs.blocked(w.state, hold_stopping=True)) == {after.job_id, tasks[1]}
    w.run(c.CancelJob(actor="alice", job_id=first.job_id))
    w.run(c.CancelJob(actor="alice", job_id=tasks[0]))
    assert w.state.stopped_of(first.job_id) and w.state.stopped_of(tasks[0])
    held = jobs.blocked(w.state, hold_stopping=True)
    assert held[after.job_id].reason == (
        f"afterany: job {first.job_id} is stopping (its processes in their grace)"
    )
    assert held[tasks[1]].code == "WAIT_ARRAY_LIMIT"
    assert set(jobs.blocked(w.state)) == set()  # an older record's rule: both may go
    for job_id in (first.job_id, tasks[0]):  # their runs' ends recorded: both may go
        (sr,) = w.state.stopped_of(job_id)
        w.run(c.ConfirmRunEnded(actor="@executor", job_id=job_id, engine="agent",
                                engine_job_id=f"{job_id}.1", run=sr.run, ended_at=w.now,
                                exit_code=143))  # fmt: skip
    assert set(jobs.blocked(w.state, hold_stopping=True)) == set()


def test_an_owners_requeue_is_explained_as_theirs_not_an_admin_preemption(w: World) -> None:
    """atk48-23 F7: `requeue` by the job's own (non-admin) owner was explained "preempted for
    admin ...: an admin preemption"."""
    (job,) = w.submit(command=("t",), resumable=True, min_runtime_s=3600)
    w.place(job.job_id, "n1", 0)
    w.run(c.StartJob(actor="@executor", job_id=job.job_id))
    got = w.run(c.RequeueJob(actor="alice", job_id=job.job_id))
    said = explain_history(w.state.jobs[job.job_id], got, {}, w.now, DEFAULT_GRACE_S)
    assert any("requeued by its owner alice" in s for s in said), said
    assert "admin" not in " ".join(said), said


@pytest.mark.parametrize("live_only", [False, True])
def test_a_job_stopping_in_its_grace_keeps_its_name_for_a_singleton(
    w: World, live_only: bool
) -> None:
    """atk48-23 F5 (singleton): a `singleton` job ran from 3 s after the cancel of its user's
    job of the same name, whose processes lived 14 s more. The stopping job keeps its name
    (from its stopped run: a live state has let its finished record go) under every cycle that
    holds stopping GPUs; a replay of an older record (`hold_stopping` False) decides as it
    did; the name is free once its run's end is recorded."""
    from ledger.core import jobs

    w.state.live_only = live_only
    (first,) = w.submit(command=("t",), grace_s=100, job_name="solo")
    solo = (e.Dependency(kind="singleton", job_ids=()),)
    (second,) = w.submit(command=("t",), job_name="solo", dependency=solo)
    (other,) = w.submit(command=("t",), job_name="other", dependency=solo)
    (bobs,) = w.submit("bob", command=("t",), job_name="solo", dependency=solo)
    w.place(first.job_id, "n1", 1)
    w.run(c.StartJob(actor="@executor", job_id=first.job_id, engine="agent",
                     engine_job_id=f"{first.job_id}.1"))  # fmt: skip
    assert set(jobs.blocked(w.state, hold_stopping=True)) == {second.job_id}
    w.run(c.CancelJob(actor="alice", job_id=first.job_id))
    assert (first.job_id in w.state.jobs) is not live_only
    held = jobs.blocked(w.state, hold_stopping=True)
    assert set(held) == {second.job_id}  # not another name, not another user's
    assert held[second.job_id].reason == (
        f"singleton: job {first.job_id} of alice named 'solo' is stopping (its processes in "
        "their grace)"
    )
    assert set(jobs.blocked(w.state)) == set()  # an older record's rule: it may go
    (sr,) = w.state.stopped_of(first.job_id)
    w.run(c.ConfirmRunEnded(actor="@executor", job_id=first.job_id, engine="agent",
                            engine_job_id=f"{first.job_id}.1", run=sr.run, ended_at=w.now,
                            exit_code=143))  # fmt: skip
    assert set(jobs.blocked(w.state, hold_stopping=True)) == set()
    del other, bobs


def test_a_snapshot_made_before_stopped_runs_kept_their_name_is_the_same_state(w: World) -> None:
    """A stopped run unfolded from an older snapshot has no name (None): it is compared with
    the fold of the log (which has it) without the name, not refused as a forgery."""
    import msgspec

    from ledger.store.snapshots import Folded, folded, same, unfolded

    w.state.live_only = True
    (job,) = w.submit(command=("t",), job_name="solo")
    w.place(job.job_id, "n1", 0)
    w.run(c.StartJob(actor="@executor", job_id=job.job_id, engine="agent",
                     engine_job_id=f"{job.job_id}.1"))  # fmt: skip
    w.run(c.CancelJob(actor="alice", job_id=job.job_id))
    f = folded(w.state)

    def runs(**kw: object) -> Folded:
        got = [msgspec.structs.replace(r, **kw) for r in f.stopped_runs or ()]
        return msgspec.structs.replace(f, stopped_runs=got)

    assert same(unfolded(f), w.state) and same(unfolded(runs(job_name=None)), w.state)
    assert not same(unfolded(runs(job_name=None, user="bob")), w.state)
