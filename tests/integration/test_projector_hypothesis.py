"""Random ledger histories: the SQL read models and numbers equal the Python reference.

Hypothesis draws a list of actions (submit, place, start, preempt, requeue, finish, cancel, hold,
release, share changes, members joining and leaving, drains, clock steps); they run as commands
through the real ledger (a command the ledger rejects simply adds nothing). The log is then
projected with a random batch size and compared with `reference.fold` of the same events: every
read-model row, usage per account and per user (window and half-life), level fair share, ranks
and owed/delivered hours.
Clock steps are whole seconds, so window usage sums are exact and compared with ==; half-life
values and owed/delivered are compared with approx.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.embedded import EmbeddedSource
from projections import fairshare as fs
from projections import queries
from projections.projector import Projector
from projections.store import Store
from projections.testing import compare as audit
from projections.testing.reference import RefState, fold
from schemas import commands as c
from schemas.errors import LedgerError
from schemas.events import GpuSlot, Placement, Preemption

T0 = 10_000.0
ROOT = "root"
STEPS = (1, 60, 600, 1800, 3600, 4 * 3600)

KINDS = (
    *("advance",) * 4,
    *("submit",) * 4,
    *("cycle",) * 3,
    "place",
    "start",
    *("finish",) * 2,
    "preempt",
    "admin_preempt",
    "cancel",
    "checkpoint",
    "hold",
    "release",
    "shares",
    "member",
    "leave",
    "drain",
    "return",
)
action = st.tuples(st.sampled_from(KINDS), st.integers(0, 50), st.integers(0, 11), st.booleans())
"""(kind, a, b, flag): what the numbers mean depends on the kind (see `command`)."""

PROJECTS = ("ai2/olmo", "ai2/tulu", "ai2/molmo", "lab/x", "lab/y", "lab/z")
USERS = ("u0", "u1", "u2", "u3")
NODES = ("n0", "n1", "n2")


def setup(led: Ledger) -> None:
    led.execute(c.InitLedger(actor=ROOT, admin=ROOT))
    cmds: list[c.AnyCommand] = [
        c.OpenAccount(actor=ROOT, path="ai2", kind="program", shares=3),
        c.OpenAccount(actor=ROOT, path="lab", kind="program", shares=1),
    ]
    for i, p in enumerate(PROJECTS):
        cmds.append(c.OpenAccount(actor=ROOT, path=p, kind="project", shares=1 + i % 3))
        cmds.append(c.AddMember(actor=ROOT, user=USERS[i % 4], project=p))
    cmds += [
        c.RegisterNode(actor=ROOT, node="n0", gpu_type="h100", gpus=8),
        c.RegisterNode(actor=ROOT, node="n1", gpu_type="h100", gpus=8),
        c.RegisterNode(actor=ROOT, node="n2", gpu_type="a100", gpus=4),
    ]
    led.execute_all(cmds)


def pick(jobs: list[Any], i: int) -> Any | None:
    return jobs[i % len(jobs)] if jobs else None


def command(led: Ledger, clock: SimClock, act: tuple[Any, ...], n: int) -> c.AnyCommand | None:
    """Turn one drawn action into a command against the ledger's current state (or None)."""
    state = led.state
    kind = act[0]
    jobs = sorted(state.jobs.values(), key=lambda j: j.job_id)
    pending = [j for j in jobs if j.status == "pending"]
    holding = [j for j in jobs if j.status in ("placed", "running")]
    _, a, b, flag = act
    if kind == "advance":
        clock.advance_to(clock.now() + STEPS[a % len(STEPS)])
        return None
    if kind == "submit":
        project = PROJECTS[a % len(PROJECTS)]
        members = sorted(state.members.get(project, ()))
        if not members:
            return None
        return c.SubmitJob(
            actor=members[b % len(members)],
            account=project,
            gpus=(1, 2, 4, 8)[b % 4],
            min_runtime_s=(0, 600, 3600)[a % 3],
            resumable=flag,
            command=("train", f"--seed={a}") if b % 2 else (),
        )
    if kind in ("place", "cycle"):
        chosen = [pick(pending, a)] if kind == "place" else pending
        free = {
            node: state.free_indices(node) for node in NODES if state.nodes[node].state == "active"
        }
        placements = []
        for job in chosen:
            if job is None:
                continue
            for node, idx in free.items():
                if len(idx) >= job.spec.gpus:
                    slot = GpuSlot(node=node, gpu_indices=tuple(idx[: job.spec.gpus]))
                    placements.append(Placement(job_id=job.job_id, slots=(slot,)))
                    free[node] = idx[job.spec.gpus :]
                    break
        if not placements:
            return None
        return c.ApplyDecision(
            actor="@dispatcher",
            decision=c.DecisionBody(
                cycle_id=f"c{n}",
                based_on=led.position,
                policy_version="hyp-1",
                placements=tuple(placements),
            ),
        )
    if kind in ("hold", "release"):
        job = pick(pending, a)
        if job is None:
            return None
        if kind == "hold":
            return c.HoldJob(actor=ROOT, job_id=job.job_id, reason="test")
        return c.ReleaseJob(actor=ROOT, job_id=job.job_id)
    job = pick(holding, a) if kind != "cancel" else pick(jobs, a)
    if kind == "start" and job:
        logs = (f"/logs/{job.job_id}-{n}.out",) if flag else ()
        return c.StartJob(actor="@executor", job_id=job.job_id, logs=logs)
    if kind == "finish" and job:
        if not flag:
            return c.FinishJob(actor="@executor", job_id=job.job_id, exit_code=b % 2)
        return c.FinishJob(
            actor="@executor",
            job_id=job.job_id,
            exit_code=b % 2,
            engine="test",
            engine_job_id=str(n),
            reason=("exited", "time_limit", "node_failure")[b % 3],
        )
    if kind == "preempt" and job:
        return c.ApplyDecision(
            actor="@dispatcher",
            decision=c.DecisionBody(
                cycle_id=f"c{n}",
                based_on=led.position,
                policy_version="hyp-1",
                preemptions=(Preemption(job_id=job.job_id, reason="fairness"),),
            ),
        )
    if kind == "admin_preempt" and job:
        return c.PreemptJob(actor=ROOT, job_id=job.job_id, note="test")
    if kind == "cancel" and job:
        return c.CancelJob(actor=ROOT, job_id=job.job_id)
    if kind == "checkpoint" and job:
        return c.ReportCheckpoint(actor="@executor", job_id=job.job_id)
    if kind == "shares":
        accounts = sorted(a.path for a in state.accounts.values() if a.open)
        return c.SetShares(actor=ROOT, account=accounts[a % len(accounts)], shares=b % 6)
    if kind == "member":
        return c.AddMember(actor=ROOT, user=USERS[b % 4], project=PROJECTS[a % len(PROJECTS)])
    if kind == "leave":
        return c.RemoveMember(actor=ROOT, user=USERS[b % 4], project=PROJECTS[a % len(PROJECTS)])
    if kind == "drain":
        return c.DrainNode(actor=ROOT, node=NODES[a % 3], reason="test")
    if kind == "return":
        return c.ReturnNode(actor=ROOT, node=NODES[a % 3])
    return None


def history(home: Path, actions: list[tuple[Any, ...]]) -> tuple[Ledger, SimClock]:
    clock = SimClock(T0)
    led = Ledger(home, clock, seeded_ids(7))
    setup(led)
    for n, act in enumerate(actions):
        cmd = command(led, clock, act, n)
        if cmd is None:
            continue
        with contextlib.suppress(LedgerError):  # a rejected command appends nothing
            led.execute(cmd)
    return led, clock


def check_queries(store: Store, ref: RefState, end: float) -> None:
    times = sorted({(T0 + end) / 2, end + 1800.0, end + 3 * 86400.0})
    policies = [
        fs.UsagePolicy(),
        fs.UsagePolicy(window_s=3600.0),
        fs.UsagePolicy(window_s=7200.0, weights={"h100": 2.0}),
    ]
    for at in times:
        for policy in policies:
            got = {u.name: u.gpu_seconds for u in queries.usage(store, at, policy=policy)}
            assert got == ref.account_usage(at, policy)
            by_user = {
                u.name: u.gpu_seconds for u in queries.usage(store, at, by="user", policy=policy)
            }
            assert by_user == ref.user_usage(at, policy)
            want_tree = ref.fair_tree(at, policy)
            sql_levels = {r.path: r.level_fs for r in queries.levels(store, at, policy)}
            assert sql_levels == want_tree.level_fs()
            assert queries.fair_share(store, at, policy) == want_tree
        half = fs.UsagePolicy(half_life_s=3600.0)
        got = {u.name: u.gpu_seconds for u in queries.usage(store, at, policy=half)}
        want = ref.account_usage(at, half)
        assert got.keys() == want.keys()
        assert got == pytest.approx(want, rel=1e-9)
    start = T0 - 1800.0
    got_hours = queries.team_hours(store, start, end + 3600.0)
    want_hours = ref.team_hours(start, end + 3600.0)
    assert [(h.team, h.hour) for h in got_hours] == [(h.team, h.hour) for h in want_hours]
    for g, w in zip(got_hours, want_hours, strict=True):
        assert (g.capacity_gpu_h, g.allocation, g.demand_gpu_h) == (
            pytest.approx(w.capacity_gpu_h),
            pytest.approx(w.allocation),
            pytest.approx(w.demand_gpu_h),
        )
        assert (g.owed_gpu_h, g.delivered_gpu_h) == (
            pytest.approx(w.owed_gpu_h),
            pytest.approx(w.delivered_gpu_h),
        )


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    actions=st.lists(action, min_size=5, max_size=80),
    batch_size=st.sampled_from((7, 50, 10_000)),
)
def test_sql_equals_the_reference_on_random_histories(
    actions: list[tuple[Any, ...]], batch_size: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        led, clock = history(home, actions)
        events = led.read(0, 1_000_000)
        led.close()
        ref = fold(events)
        with EmbeddedSource(home) as src, Store(Path(tmp) / "p.duckdb") as store:
            result = Projector(store, src, batch_size=batch_size).catch_up()
            assert result.position == len(events)
            got = audit.dump(store, audit.REFERENCE_TABLES)
            assert audit.differences(got, audit.reference_dump(ref)) == []
            check_queries(store, ref, clock.now())
