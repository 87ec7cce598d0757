"""A job's end and its pending dependents (`jobs.dependents_ended`): the kept ends are walked
once per command, whatever the number of dependents (it walked them once for each: a job with
10,000 pending dependents and 20,000 kept ends took 49 s to cancel, `scripts/bench_dependents.py`),
and the events are byte for byte those of the walk per dependent (kept here as the reference)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping

import msgspec
import pytest

from ledger.core import jobs
from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from schemas import commands as c
from schemas import events as e
from schemas.errors import LedgerError
from tests.unit.test_dependency_bounds import CountingEnds
from tests.unit.test_jobs_world import World


@pytest.fixture
def w(org_state: State) -> World:
    return World(org_state)


def test_a_jobs_end_walks_the_kept_ends_once_however_many_wait_on_it(w: World) -> None:
    for i in range(300):  # ends kept for dependencies
        w.state.ends[90_000 + i] = ("completed" if i % 2 else "failed", w.now, None)
    (x,) = w.submit()
    tasks = w.submit(array=(0, 1, 2))
    on_x = e.Dependency(kind="afterok", job_ids=(x.job_id,))
    on_array = e.Dependency(kind="afterok", job_ids=(tasks[0].job_id,))
    for _ in range(200):
        w.submit(dependency=(on_x,))
        w.submit(dependency=(on_array,))
    ends = CountingEnds(w.state.ends)
    w.state.ends = ends
    for job_id in (x.job_id, tasks[1].job_id):  # a job, then one task of the array
        ends.reads = 0
        got = decide(w.state, c.CancelJob(actor="alice", job_id=job_id), w.now, w.ids)
        assert sum(isinstance(ev, e.JobFinished) for ev in got) == 201
        assert ends.reads <= 4, ends.reads  # 2; was 400: a walk and a lookup for each dependent
        for ev in got:
            evolve(w.state, ev)


def reference(state: State, events: list[e.AnyEvent], kw: jobs.Envelope) -> list[e.AnyEvent]:
    """`dependents_ended` as it was: every dependent judged on a walk of the kept ends."""
    ending = [ev for ev in events if isinstance(ev, e.JobFinished)]
    if not ending or not state.dependents():
        return []
    done = {ev.job_id: ev.reason for ev in ending}

    def never_now(kind: e.DependencyKind, named: int, done: Mapping[int, str]) -> bool:
        members = {named} | state.array_tasks(named)
        live = [j for j in jobs.active_ids(state, named) if j not in done]
        ends = jobs.ends_of(state, named) + [why for jid, why in done.items() if jid in members]
        return jobs.never_met(kind, ends, bool(live))

    out: list[e.AnyEvent] = []
    while ending:
        ev = ending.pop(0)
        job = state.jobs.get(ev.job_id)
        keys = {ev.job_id} | ({job.spec.array_job_id} if job and job.spec.array_job_id else set())
        for child_id in sorted({d for k in keys for d in state.dependents().get(k, ())}):
            child = state.jobs.get(child_id)
            if child is None or child_id in done or not child.active:
                continue
            hit = next(
                (
                    (t, named)
                    for t in child.spec.dependency
                    for named in sorted(keys & set(t.job_ids))
                    if never_now(t.kind, named, done)
                ),
                None,
            )
            if hit is None:
                continue
            term, named = hit
            what = f"job {named}" if named == ev.job_id else f"task {ev.job_id} of array {named}"
            if term.kind == "afternotok" and named != ev.job_id:
                what = f"every task of array {named} completed (the last, {ev.job_id})"
                note = f"{what}: {term.kind}:{named} can never be satisfied"
            else:
                note = f"{what} ended {ev.reason}: {term.kind}:{named} can never be satisfied"
            end = e.JobFinished(
                **kw(),
                job_id=child_id,
                outcome="cancelled",
                reason="dependency_never_satisfied",
                note=note,
            )
            done[child_id] = end.reason
            out.append(end)
            ending.append(end)
    return out


KINDS: tuple[e.DependencyKind, ...] = ("afterok", "afternotok", "afterany")


def commands(rng: random.Random, state: State) -> c.AnyCommand:
    """A random command of alice's or the executor's on the jobs so far."""
    active = sorted(state.active)
    roll = rng.random()
    if roll < 0.45 or not active:
        named = sorted(set(active) | (set(state.ends) if rng.random() < 0.2 else set()))
        deps: tuple[e.Dependency, ...] = ()
        if named and rng.random() < 0.8:
            deps = tuple(
                e.Dependency(
                    kind=rng.choice(KINDS),
                    job_ids=tuple(
                        sorted(set(rng.sample(named, min(len(named), rng.randint(1, 3)))))
                    ),
                )
                for _ in range(rng.randint(1, 2))
            )
        array = tuple(range(rng.randint(2, 4))) if rng.random() < 0.25 else ()
        return c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, dependency=deps, array=array)
    job_id = rng.choice(active)
    if roll < 0.6:
        whole = state.jobs[job_id].spec.array_job_id is not None and rng.random() < 0.3
        return c.CancelJob(actor="alice", job_id=job_id, whole_array=whole)
    status = state.jobs[job_id].status
    free = [(n, i) for n in ("n1", "n2") for i in state.free_indices(n)]
    if status == "pending" and free:
        node, gpu = rng.choice(free)
        slot = e.GpuSlot(node=node, gpu_indices=(gpu,))
        body = c.DecisionBody(
            cycle_id=f"c{state.events}",
            based_on=state.events,
            policy_version="test",
            placements=(c.Placement(job_id=job_id, slots=(slot,)),),
        )
        return c.ApplyDecision(actor="@dispatcher", decision=body)
    if status == "placed":
        return c.StartJob(actor="@executor", job_id=job_id)
    if status == "pending":  # every GPU held: one holder ends
        job_id = rng.choice([j for j in active if state.jobs[j].status != "pending"])
    return c.FinishJob(actor="@executor", job_id=job_id, exit_code=rng.choice((0, 0, 1)))


def run_with(
    fn: Callable[..., list[e.AnyEvent]], state: State, cmd: c.AnyCommand, at: int
) -> list[e.AnyEvent] | str:
    ids = (lambda n: lambda: f"r{next(n)}")(itertools.count(at))
    original = jobs.dependents_ended
    jobs.dependents_ended = fn  # type: ignore[assignment]
    try:
        return decide(state, cmd, 1_000.0, ids)
    except LedgerError as err:
        return f"{type(err).__name__}: {err.message}"
    finally:
        jobs.dependents_ended = original  # type: ignore[assignment]


@pytest.mark.parametrize("seed", [*range(6), 19])  # 19: an afternotok on an array ended
def test_the_ends_are_byte_for_byte_those_of_the_walk_per_dependent(
    org_state: State, seed: int
) -> None:
    rng = random.Random(seed)
    state = org_state
    cascades = 0
    for step in range(400):
        cmd = commands(rng, state)
        want = run_with(reference, state, cmd, step * 10_000)
        got = run_with(jobs.dependents_ended, state, cmd, step * 10_000)
        if isinstance(want, str) or isinstance(got, str):
            assert got == want, (seed, step, cmd)
            continue
        assert msgspec.json.encode(got) == msgspec.json.encode(want), (seed, step, cmd)
        cascades += sum(
            isinstance(ev, e.JobFinished) and ev.reason == "dependency_never_satisfied"
            for ev in got
        )
        for ev in got:
            evolve(state, ev)
    assert cascades >= 5, (seed, cascades)  # the walks were tried
