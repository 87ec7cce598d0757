"""What survives a restart of the service about a job (issue 23, atk36-23 F1, F4 and the output
files' mode), in its pure parts:

- the runs the ledger stopped while they ran and whose end is not recorded yet are folded state
  (`State.stopped_runs`), kept by snapshots, and a restarted node-agents executor holds their
  GPUs (`stopping`) until their node says they are gone;
- a start an agent reports without its output path names the file the submission names;
- the submitter's umask is recorded and becomes the job's and its named output files'.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.cycle.executor import Launch
from ledger.engines.agents import AgentExecutor
from ledger.engines.slurm.outputs import PRIVATE, files_umask, sbatch_env
from ledger.engines.slurm.script import batch_script
from ledger.engines.slurm.words import SbatchUser
from ledger.store import snapshots
from schemas import agent as a
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidCommand

T0 = 1_000.0


class World:
    """The organisation of tests/conftest.py folded through decide + evolve."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.now = T0
        self.ids = (lambda n: lambda: f"s{next(n)}")(itertools.count(1))

    def run(self, cmd: c.AnyCommand) -> list[e.AnyEvent]:
        self.now += 1.0
        events = decide(self.state, cmd, self.now, self.ids)
        for ev in events:
            evolve(self.state, ev)
        return events

    def running(self, gpus: tuple[int, ...] = (0,), **kw: Any) -> int:
        """A job submitted, placed on n1 at `gpus` and started by the `agent` engine."""
        (sub,) = [
            ev
            for ev in self.run(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=len(gpus), **kw))
            if isinstance(ev, e.JobSubmitted)
        ]
        job = sub.job_id
        slot = e.GpuSlot(node="n1", gpu_indices=gpus)
        body = c.DecisionBody(
            cycle_id=f"c{job}", based_on=self.state.events, policy_version="test",
            placements=(c.Placement(job_id=job, slots=(slot,)),),
        )  # fmt: skip
        self.run(c.ApplyDecision(actor="@dispatcher", decision=body))
        run = self.state.jobs[job].preemptions
        self.run(c.StartJob(actor="@executor", job_id=job, engine="agent",
                            engine_job_id=f"{job}.{run + 1}", run=run))  # fmt: skip
        return job

    def ended(self, job: int, run: int = 0) -> None:
        name = f"{job}.{run + 1}"
        self.run(c.ConfirmRunEnded(actor="@executor", job_id=job, engine="agent",
                                   engine_job_id=name, run=run, ended_at=self.now))  # fmt: skip


@pytest.fixture
def w(org_state: State) -> World:
    return World(org_state)


def test_a_cancelled_run_is_awaited_until_its_end_is_recorded(w: World) -> None:
    job = w.running(gpus=(0, 1), grace_s=45)
    w.run(c.CancelJob(actor="alice", job_id=job))
    [(key, r)] = w.state.stopped_runs.items()
    assert key == (job, 0) and r.slots == (e.GpuSlot(node="n1", gpu_indices=(0, 1)),)
    assert (r.grace_s, r.at) == (45, w.now)
    w.ended(job)
    assert w.state.stopped_runs == {}


def test_a_requeued_run_is_awaited_and_a_runs_own_end_is_not(w: World) -> None:
    job = w.running(resumable=True)
    w.run(c.RequeueJob(actor="alice", job_id=job))
    assert list(w.state.stopped_runs) == [(job, 0)]
    done = w.running(gpus=(1,))
    w.run(c.FinishJob(actor="@executor", job_id=done, exit_code=0, engine="agent",
                      engine_job_id=f"{done}.1", ended_at=w.now))  # fmt: skip
    (pending,) = [
        ev for ev in w.run(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1))
        if isinstance(ev, e.JobSubmitted)
    ]  # fmt: skip
    w.run(c.CancelJob(actor="alice", job_id=pending.job_id))  # never ran: nothing to await
    assert list(w.state.stopped_runs) == [(job, 0)]


def test_stopped_runs_are_forgotten_a_day_after_the_stop(w: World) -> None:
    first = w.running()
    w.run(c.CancelJob(actor="alice", job_id=first))
    w.now += 86_400.0 + 10
    second = w.running(gpus=(1,))
    w.run(c.CancelJob(actor="alice", job_id=second))
    assert list(w.state.stopped_runs) == [(second, 0)]


def _live(state: State) -> State:
    out = state.copy()
    out.live_only = True
    out.jobs = {k: j for k, j in out.jobs.items() if j.active}
    return out


def test_a_snapshot_keeps_them_and_an_older_snapshot_still_verifies(w: World) -> None:
    job = w.running()
    w.run(c.CancelJob(actor="alice", job_id=job))
    live = _live(w.state)
    data = msgspec.msgpack.encode(snapshots.folded(live))
    back = snapshots.unfolded(msgspec.msgpack.decode(data, type=snapshots.Folded))
    assert back.stopped_runs == live.stopped_runs and snapshots.same(back, live)
    older = msgspec.structs.replace(snapshots.folded(live), stopped_runs=None)
    old = snapshots.unfolded(older)
    assert old.stopped_runs == {} and snapshots.same(old, live)  # made before they were kept
    other = _live(w.state)
    other.stopped_runs = {}
    assert not snapshots.same(back, other)


def _executor(state: State) -> AgentExecutor:
    ledger = SimpleNamespace(state=state, execute_all=lambda cmds: None)
    return AgentExecutor(ledger, node_lost_after_s=60.0, grace_s=30.0)


def test_a_restarted_agents_executor_holds_a_stopping_runs_gpus_until_its_node_says_gone(
    w: World,
) -> None:
    """atk36-23 F1: after a restart during a cancel's grace, `node list` showed the GPUs free."""
    job = w.running(gpus=(0,))
    w.run(c.CancelJob(actor="alice", job_id=job))
    ex = _executor(w.state)
    assert ex.adopt({}, w.now) == set()
    nodes = dict(w.state.nodes)
    assert ex.observe(w.now, nodes).stopping == {"n1": frozenset({0})}
    version = ex.board.version("n1")
    still = a.Report(node="n1", version=version, running=(a.PartRun(job_id=job, run=0),))
    ex.receive(still, w.now + 1)
    assert ex.observe(w.now + 1, nodes).stopping == {"n1": frozenset({0})}
    stale = a.Report(node="n1", version="0000.9", running=())  # before the restart: proves nothing
    ex.receive(stale, w.now + 2)
    assert ex.observe(w.now + 2, nodes).stopping == {"n1": frozenset({0})}
    ex.receive(a.Report(node="n1", version=version, running=()), w.now + 3)
    assert ex.observe(w.now + 3, nodes).stopping == {}


def test_a_start_told_without_its_output_names_the_submissions_file(w: World) -> None:
    """atk36-23 F4: a start first reported after a restart (with no log) recorded no output."""
    job = w.running(workdir="/home/alice/proj", stdout="out-%j.txt")
    ex = _executor(w.state)
    slot = e.GpuSlot(node="n1", gpu_indices=(0,))
    ex._add(Launch(job, (slot,), ("true",), None, "alice", "ai2/olmo"), "", publish=False)
    ex.receive(a.Report(node="n1", exited=(a.PartExited(job_id=job, run=0, exit_code=0),)), w.now)
    [start] = ex.observe(w.now, dict(w.state.nodes)).starts
    assert start.logs == (f"n1:/home/alice/proj/out-{job}.txt",)


def test_the_submitters_umask_is_recorded_and_is_the_jobs(w: World) -> None:
    job = w.running(workdir="/home/alice/proj", umask=0o027)
    assert w.state.jobs[job].spec.umask == 0o027
    (old,) = [
        ev for ev in w.run(c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1))
        if isinstance(ev, e.JobSubmitted)
    ]  # fmt: skip
    assert old.umask is None  # none sent: the engine's old rule
    launch = Launch(job, (), ("true",), None, "alice", "a", workdir="/w", umask=0o027)
    assert batch_script(launch, SbatchUser(), umask=0o027).splitlines()[1] == "umask 0027"


@pytest.mark.parametrize("mask", [0o777, 0o277, 0o200, 0o400, 0o100])
def test_a_umask_that_takes_the_owners_own_rights_is_refused_at_submit(w: World, mask: int) -> None:
    """atk37-23 F2: umask 0777 made a 0000 output file the job could not open: recorded
    started, then failed exit 2 with no word (on Slurm: launch_failed). Refused at submit, in
    one line, on every engine; a umask that leaves the owner's bits alone is taken."""
    cmd = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, workdir="/w", umask=mask)
    with pytest.raises(InvalidCommand, match=f"umask {mask:04o} takes from the job's user"):
        w.run(cmd)
    assert w.run(msgspec.structs.replace(cmd, umask=0o077))


@pytest.mark.parametrize(
    ("job_umask", "names_output", "want"),
    [
        (0o022, True, 0o022),  # sbatch's rule: the output file 0644
        (0o002, True, 0o002),
        (0o022, False, PRIVATE),  # the engine's log in the service's directory: 0600
        (None, True, PRIVATE),  # a submission from before the umask was recorded
    ],
)
def test_output_files_are_made_with_the_jobs_umask_when_it_names_them(
    job_umask: int | None, names_output: bool, want: int
) -> None:
    assert files_umask(job_umask, names_output) == want
    assert sbatch_env({}, files_umask(job_umask, names_output))["SLURM_UMASK"] == f"{want:04o}"
