"""Fair share's order kept between cycles (`FairShare2.order_kept`, fed by `snapshot_kept`'s
views and carried by `decide_carried`) is the order made afresh, after any sequence of events:
submissions (with priorities, dependencies, arrays with a limit), cancels, holds and releases,
requeues, placements, preemptions, finishes (a dependency released), budget and share changes,
clock steps, ranks and shares that move.

Random command scripts (test_domain_properties' universe, with the steps below added) run
through `decide` + `evolve`; after every accepted command the kept order (kept from any length
of queue: `KEEP_FROM` 0) is compared with the order of a snapshot made afresh, with every job's
whole key sorted, and the carried `decide()` with one from nothing."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.core.decide import decide as apply
from ledger.core.evolve import evolve
from ledger.cycle import inputs
from ledger.cycle.inputs import snapshot_from_state, snapshot_kept
from ledger.dispatch import decide, fairshare2
from ledger.dispatch.engine import decide_carried
from ledger.dispatch.fairshare2 import FairShare2
from ledger.dispatch.registry import build
from schemas import commands as c
from schemas import events as e
from schemas.errors import LedgerError
from tests.unit.test_dispatch_carry import _old_order
from tests.unit.test_domain_properties import (
    MEMBERS,
    T0,
    Step,
    _ids,
    pick_job,
    seed_org,
    step_strategies,
    to_command,
)

TEAMS = ("ai2/olmo", "ai2/tulu", "lab/x", "ai2/olmo/alice", "ai2/olmo/bob", "ai2/tulu/carol")

extra: list[tuple[int, st.SearchStrategy[Step]]] = [
    (6, st.tuples(  # a submission with a priority, maybe after (or singleton with) a recent job
        st.just("submit2"), st.sampled_from(MEMBERS), st.integers(1, 4),
        st.sampled_from((None, 0, 3600)), st.sampled_from((-1, 0, 0, 1, 5)),
        st.sampled_from((None, None, "afterok", "afterany", "afternotok", "singleton")),
        st.integers(0, 4), st.sampled_from((0, 0, 3)), st.sampled_from(("", "x")),
    )),
    (2, st.tuples(st.just("hold"), st.integers(0, 4))),
    (2, st.tuples(st.just("release"), st.integers(0, 4))),
    (2, st.tuples(st.just("requeue"), st.integers(0, 4))),
    (3, st.tuples(st.just("ranks"), st.permutations(TEAMS), st.floats(0.1, 4.0))),
]  # fmt: skip
_all = [*step_strategies, *extra]
_weighted = tuple(i for i, (weight, _) in enumerate(_all) for _ in range(weight))
scripts = st.lists(st.sampled_from(_weighted).flatmap(lambda i: _all[i][1]), min_size=25,
                   max_size=90)  # fmt: skip

_WANTS = {"hold": ("pending",), "release": ("held", "pending"), "requeue": ("placed", "running")}


def _command(state: Any, step: Step) -> c.AnyCommand | float | None:
    """A step as a command (None: a step that moves the ranks, handled by the caller)."""
    kind, *a = step
    if kind == "ranks":
        return None
    if kind == "submit2":
        (user, project), gpus, min_rt, priority, dep, ref, tasks, name = a
        on = pick_job(state, (ref, False), ())
        deps = () if dep is None else (e.Dependency(kind=dep, job_ids=() if dep == "singleton"
                                                    else (on,)),)  # fmt: skip
        # an array of 3 with at most 1 placed: its other tasks held back without a change
        return c.SubmitJob(actor=user, account=project, gpus=gpus, min_runtime_s=min_rt,
                           priority=priority, dependency=deps, job_name=name,
                           array=tuple(range(tasks)), array_limit=1 if tasks else None)  # fmt: skip
    if kind in _WANTS:
        job_id = pick_job(state, (a[0], True), _WANTS[kind])
        owner = state.jobs[job_id].spec.user if job_id in state.jobs else "alice"
        if kind == "hold":
            return c.HoldJob(actor=owner, job_id=job_id)
        if kind == "release":
            return c.ReleaseJob(actor=owner, job_id=job_id)
        return c.RequeueJob(actor="root", job_id=job_id)
    return to_command(state, step)


def _check(script: list[Step], version: str) -> tuple[int, int]:
    """Run `script`; after every accepted command compare the kept order with a fresh one.
    Returns the number of comparisons with a non-empty queue, and of those whose classes were
    made from the snapshot's `delta` alone (no view compared)."""
    name, _, knob = version.partition("+")  # "fairshare-16+requeued_first": that setting on
    key, _, value = knob.partition("=")  # "fairshare-17+free_order=oldest": that value
    policy = build(name, {key: value or "true"} if knob else None)
    assert isinstance(policy, FairShare2)
    state, _ = seed_org()
    now, ids = T0, _ids()
    ranks: dict[str, int] = {"ai2/olmo": 0}
    level_fs: dict[str, float] = {}
    views = classes = carry = None
    compared = applied = 0
    for step in script:
        cmd = _command(state, step)
        if cmd is None:  # the ranks and shares move
            ranks = {t: r for r, t in enumerate(step[1][: 1 + len(step[1]) // 2])}
            level_fs = {t: step[2] * (1 + r) for r, t in enumerate(step[1])}
        elif isinstance(cmd, float):
            now += cmd
            continue
        else:
            before = copy.deepcopy(state)
            try:
                new = apply(state, cmd, now, ids)
            except LedgerError:
                assert state == before
                continue
            for ev in new:
                evolve(state, ev)
        kept, views = snapshot_kept(state, ranks, now, views, level_fs=level_fs)
        fresh = snapshot_from_state(state, ranks, now, level_fs=level_fs)
        assert kept == fresh
        ordered, classes = policy.order_kept(kept, classes)
        want = list(policy.order(fresh))
        assert list(ordered) == want, step
        assert want == _old_order(policy, fresh), step
        carried, carry = decide_carried(kept, policy, now, carry)
        assert carried == decide(fresh, policy, now), step
        compared += bool(fresh.pending)
        applied += classes is not None and classes.members is None
    return compared, applied


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scripts,
    st.sampled_from(
        [
            "fairshare-7",
            "fairshare-3",
            "fairshare-2",
            "fairshare-16+requeued_first",
            "fairshare-17+free_order=oldest",  # built today's share order is made afresh
        ]
    ),
)
def test_the_kept_order_is_the_fresh_order_after_any_events(
    script: list[Step], version: str
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inputs, "KEEP_FROM", 0)  # the views kept from any number of live jobs
        mp.setattr(fairshare2, "KEEP_FROM", 0)  # the order kept from any length of queue
        _check(script, version)


def test_the_script_steps_reach_a_queue_the_kept_order_works_on() -> None:
    """Guard against a universe where the comparisons run on empty queues: a fixed script
    submits with priorities and a dependency, holds, releases, moves the ranks and requeues;
    and most of its orders are made from the snapshot's difference (`PendingDelta`)."""
    script: list[Step] = [
        ("submit2", ("alice", "ai2/olmo"), 1, 3600, 0, None, 0, 3, ""),
        ("submit2", ("bob", "ai2/olmo"), 2, None, 5, "afterany", 0, 0, "x"),
        ("submit2", ("carol", "ai2/tulu"), 1, 0, -1, "singleton", 0, 0, "x"),
        ("hold", 0),
        ("ranks", TEAMS, 1.5),
        ("release", 0),
        ("decide", "@dispatcher", [((0, True), "n1", "free")], []),
        ("requeue", 0),
        ("tick", 3600.0),
        ("ranks", tuple(reversed(TEAMS)), 0.5),
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inputs, "KEEP_FROM", 0)
        mp.setattr(fairshare2, "KEEP_FROM", 0)
        compared, applied = _check(script, "fairshare-7")
        assert compared >= 8 and applied >= 4
