"""Decisions against a real ledger: the domain accepts what `decide()` produces."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from ledger.core.state import State
from ledger.cycle.inputs import Views, snapshot_from_state, snapshot_kept
from ledger.dispatch import Decision, FairShare, Policy, Snapshot, decide, snapshot
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from schemas import commands as c
from schemas import events as e
from schemas.errors import Conflict

SHARES = {"lab/a": 3, "lab/b": 2, "lab/c": 1}
USERS = ("u1", "u2")


def make_ledger(tmp_path: Path) -> tuple[Ledger, SimClock]:
    clock = SimClock(1_000.0)
    ledger = Ledger(tmp_path, clock, seeded_ids(1))
    ledger.execute(c.InitLedger(actor="root", admin="root", min_runtime_cap_s=4 * 3600))
    setup: list[c.AnyCommand] = [c.OpenAccount(actor="root", path="lab", kind="program")]
    for project, shares in SHARES.items():
        setup.append(c.OpenAccount(actor="root", path=project, kind="project", shares=shares))
        setup += [c.AddMember(actor="root", user=u, project=project) for u in USERS]
    setup += [c.RegisterNode(actor="root", node=f"n{i}", gpu_type="h100", gpus=8) for i in range(6)]
    setup += [c.RegisterNode(actor="root", node=f"a{i}", gpu_type="a100", gpus=4) for i in range(2)]
    ledger.execute_all(setup)
    return ledger, clock


def fair_share(state: State, used: dict[str, float]) -> tuple[dict[str, int], dict[str, float]]:
    """Level fair shares (share of budget / share of usage) and depth-first leaf ranks."""
    level: dict[str, float] = {}
    total = sum(used.get(p, 0.0) for p in SHARES) or 1.0
    for project, shares in SHARES.items():
        u = used.get(project, 0.0) / total
        level[project] = math.inf if u == 0 else (shares / sum(SHARES.values())) / u
        inner = sum(used.get(f"{project}/{x}", 0.0) for x in USERS) or 1.0
        for x in USERS:
            ux = used.get(f"{project}/{x}", 0.0) / inner
            level[f"{project}/{x}"] = math.inf if ux == 0 else (1 / len(USERS)) / ux
    ranks: dict[str, int] = {}
    for project in sorted(SHARES, key=lambda p: (-level[p], p)):
        for leaf in sorted((f"{project}/{x}" for x in USERS), key=lambda p: (-level[p], p)):
            ranks[leaf] = len(ranks)
    return ranks, level


def cycle(
    ledger: Ledger,
    clock: SimClock,
    used: dict[str, float],
    n: int,
    policy: Policy | None = None,
    low_util_since: dict[int, float] | None = None,
) -> Decision:
    ranks, level = fair_share(ledger.state, used)
    now = clock.now()
    snap, _KEPT[id(ledger)] = snapshot_kept(
        ledger.state, ranks, now, _KEPT.get(id(ledger)), level_fs=level,
        low_util_since=low_util_since,
    )  # fmt: skip
    assert snap == fresh_snapshot(
        ledger.state, ranks, now, level_fs=level, low_util_since=low_util_since
    )
    assert snap.position == ledger.position
    d = decide(snap, policy or FairShare(), now)
    appended = ledger.execute(d.to_command("@dispatcher", f"c{n}"))
    decided = appended.events[0]
    assert isinstance(decided, e.CycleDecided)
    assert decided.waiting == d.summary() and decided.based_on == snap.position
    assert decided.placed == tuple(p.job_id for p in d.placements)
    return d


_KEPT: dict[int, Views] = {}
"""What each test ledger's last `cycle` snapshot handed on (by the ledger's id), as a
dispatcher keeps it."""


def fresh_snapshot(state: State, ranks: dict[str, int], now: float, **kw: Any) -> Snapshot:
    """`snapshot_from_state`: nothing kept from an earlier call."""
    return snapshot_from_state(state, dict(ranks), now, **kw)


def test_views_of_unchanged_jobs_are_reused_and_equal_fresh_ones(tmp_path: Path) -> None:
    """A cycle builds the dispatcher's view only of the jobs that changed since the last
    snapshot (records are frozen: a change is a new record), and of a running job whose other
    inputs (since when it runs, since when it idles) moved; every snapshot equals one built
    from nothing."""
    ledger, clock = make_ledger(tmp_path)
    a = submit(ledger, "lab/a", 4, min_runtime_s=600, resumable=True, gpu_type="h100")
    b = submit(ledger, "lab/b", 8, min_runtime_s=600)
    cycle(ledger, clock, {}, 1)
    big = submit(ledger, "lab/c", 32, min_runtime_s=600)  # no cycle after it: pending
    ledger.execute(c.StartJob(actor="@executor", job_id=a))
    ranks = {"lab/a/u1": 0}
    one, kept = snapshot_kept(ledger.state, ranks, 1_600.0, None)
    two, kept = snapshot_kept(ledger.state, ranks, 1_600.0, kept)
    assert [r.job_id for r in one.running] == [a, b] and [p.job_id for p in one.pending] == [big]
    assert two == one and all(x is y for x, y in zip(two.running, one.running, strict=True))
    assert two.pending[0] is one.pending[0]
    assert all(x is y for x, y in zip(two.nodes, one.nodes, strict=True))
    ledger.execute(c.ReportCheckpoint(actor="@executor", job_id=a))
    ledger.execute(c.DrainNode(actor="root", node="a0", reason="fan"))
    kw: dict[str, Any] = {"low_util_since": {b: 1_550.0}}
    three, kept = snapshot_kept(ledger.state, ranks, 1_600.0, kept, **kw)
    assert three == fresh_snapshot(ledger.state, ranks, 1_600.0, **kw)
    assert three.running[0] is not one.running[0] and three.running[0].checkpoint_at is not None
    assert three.running[1] is not one.running[1] and three.running[1].low_util_since == 1_550.0
    assert three.pending[0] is one.pending[0]
    changed = [x.name for x, y in zip(three.nodes, one.nodes, strict=True) if x is not y]
    assert changed == ["a0"] and three.nodes[0].state == "drained"  # it held no job
    busy, kept = snapshot_kept(
        ledger.state, ranks, 1_600.0, kept, unavailable={"n5": frozenset({0})}
    )
    assert busy.nodes[-1].name == "n5" and 0 not in busy.nodes[-1].free
    assert busy == fresh_snapshot(ledger.state, ranks, 1_600.0, unavailable={"n5": frozenset({0})})
    # placed but not started, contracts from the engine's start: its view moves with `now`
    later, kept = snapshot_kept(ledger.state, ranks, 1_700.0, kept, from_start=True, **kw)
    assert later == fresh_snapshot(ledger.state, ranks, 1_700.0, from_start=True, **kw)
    assert later.running[1].placed_at == 1_700.0


def test_equal_leaf_ranks_complete_as_the_last_ones_did() -> None:
    """Ranks equal to the last ones completed, in the same order, get the same answer; in
    another order, the answer a walk gives (the same ranks, keys in that order)."""
    first, kept = snapshot.complete_ranks_kept({"a/x/u": 0, "b/y/u": 1}, None)
    again, kept = snapshot.complete_ranks_kept({"a/x/u": 0, "b/y/u": 1}, kept)
    assert again is first and first == {"a/x/u": 0, "a": 0, "a/x": 0, "b/y/u": 1, "b": 1, "b/y": 1}
    assert snapshot.complete_ranks_kept(first, kept)[0] is first  # completing it changes nothing
    other, kept = snapshot.complete_ranks_kept({"b/y/u": 1, "a/x/u": 0}, kept)
    assert other == first and list(other) == ["b/y/u", "a/x/u", "b", "b/y", "a", "a/x"]
    assert snapshot.complete_ranks_kept({"a/x/u": 1, "b/y/u": 0}, kept)[0]["a"] == 1
    assert snapshot.complete_ranks({"a/x/u": 0, "b/y/u": 1}) is not first  # nothing kept


def submit(ledger: Ledger, project: str, gpus: int, **kw: object) -> int:
    appended = ledger.execute(
        c.SubmitJob(actor="root", user="u1", account=project, gpus=gpus, **kw)  # type: ignore[arg-type]
    )
    job = appended.events[0]
    assert isinstance(job, e.JobSubmitted)
    return job.job_id


def test_a_fair_share_preemption_is_applied_and_requeues_the_victim(tmp_path: Path) -> None:
    ledger, clock = make_ledger(tmp_path)
    filler = [
        submit(ledger, "lab/c", 8, min_runtime_s=600, resumable=True, gpu_type="h100")
        for _ in range(6)
    ]
    d = cycle(ledger, clock, {}, 1)
    assert sorted(p.job_id for p in d.placements) == filler
    clock.advance_to(1_000.0 + 3600)
    big = submit(ledger, "lab/a", 16, min_runtime_s=600, gpu_type="h100")
    used = {"lab/c": 6 * 8 * 3600.0, "lab/c/u1": 6 * 8 * 3600.0}
    d = cycle(ledger, clock, used, 2)
    assert [p.reason for p in d.preemptions] == ["fairness", "fairness"]
    assert [p.job_id for p in d.placements] == [big]
    state = ledger.state
    assert state.jobs[big].status == "placed"
    for p in d.preemptions:
        assert state.jobs[p.job_id].status == "pending"  # resumable: requeued
        assert state.jobs[p.job_id].preemptions == 1
    # the next snapshot says the requeued victims ran before (fairshare-5 orders by it)
    snap = snapshot_from_state(state, {}, clock.now())
    runs = {j.job_id: j.runs for j in snap.pending}
    assert runs == {p.job_id: 1 for p in d.preemptions}


def test_a_draining_node_is_emptied_as_contracts_end(tmp_path: Path) -> None:
    ledger, clock = make_ledger(tmp_path)
    early = submit(ledger, "lab/b", 8, min_runtime_s=600, gpu_type="a100")
    d = cycle(ledger, clock, {}, 1)
    (placed,) = d.placements
    assert placed.job_id == early and [s.node for s in placed.slots] == ["a0", "a1"]
    ledger.execute(c.DrainNode(actor="root", node="a0", reason="firmware"))
    d = cycle(ledger, clock, {}, 2)
    assert d.preemptions == () and d.wake_at == 1_600.0
    clock.advance_to(1_600.0)
    d = cycle(ledger, clock, {}, 3)
    assert [(p.job_id, p.reason) for p in d.preemptions] == [(early, "maintenance")]
    assert ledger.state.nodes["a0"].state == "drained"
    assert ledger.state.jobs[early].status == "finished"  # not resumable


def test_a_decision_the_log_overtook_is_rejected(tmp_path: Path) -> None:
    ledger, clock = make_ledger(tmp_path)
    job = submit(ledger, "lab/a", 2)
    ranks, level = fair_share(ledger.state, {})
    snap = snapshot_from_state(ledger.state, ranks, clock.now(), level_fs=level)
    d = decide(snap, FairShare(), clock.now())
    ledger.execute(c.CancelJob(actor="u1", job_id=job))
    with pytest.raises(Conflict):
        ledger.execute(d.to_command("@dispatcher", "late"))


@pytest.mark.parametrize("seed", range(4))
def test_random_cycles_are_always_accepted_by_the_ledger(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    ledger, clock = make_ledger(tmp_path)
    used: dict[str, float] = {}
    low: dict[int, float] = {}
    preempted = placed = 0
    for n in range(40):
        for _ in range(rng.randrange(5)):
            gpus = rng.choice((1, 2, 4, 8, 8, 16))
            debug = gpus <= 8 and rng.random() < 0.15
            submit(
                ledger,
                rng.choice(list(SHARES)),
                gpus,
                min_runtime_s=rng.choice((0, 600, 1800)),
                resumable=rng.random() < 0.6,
                gpu_type=rng.choice((None, None, "h100")),
                time_limit_s=600 if debug else None,
            )
        d = cycle(ledger, clock, used, n, low_util_since=low)
        preempted += len(d.preemptions)
        placed += len(d.placements)
        state = ledger.state
        for pl in d.placements:
            if rng.random() < 0.8:
                ledger.execute(c.StartJob(actor="@executor", job_id=pl.job_id))
            if rng.random() < 0.1:
                low[pl.job_id] = clock.now()
        if rng.random() < 0.1:
            node = rng.choice(sorted(state.nodes))
            if state.nodes[node].state == "active":
                ledger.execute(c.DrainNode(actor="root", node=node, reason="maintenance"))
            else:
                ledger.execute(c.ReturnNode(actor="root", node=node))
        clock.advance_to(clock.now() + 300)
        for job in list(ledger.state.jobs.values()):
            if job.status in ("placed", "running"):
                for key in (job.spec.account, f"{job.spec.account}/{job.spec.user}"):
                    if job.funded:
                        used[key] = used.get(key, 0.0) + job.spec.gpus * 300
                if job.status == "running" and rng.random() < 0.2:
                    ledger.execute(c.FinishJob(actor="@executor", job_id=job.job_id, exit_code=0))
                elif job.status == "running" and job.spec.resumable and rng.random() < 0.3:
                    ledger.execute(c.ReportCheckpoint(actor="@executor", job_id=job.job_id))
    assert placed > 20
    assert preempted > 0


def test_snapshot_from_state_reflects_the_write_side(tmp_path: Path) -> None:
    ledger, clock = make_ledger(tmp_path)
    running = submit(ledger, "lab/a", 4, min_runtime_s=600, resumable=True, gpu_type="h100")
    cycle(ledger, clock, {}, 1)
    clock.advance_to(1_500.0)
    waiting = submit(ledger, "lab/b", 2, priority=3, min_runtime_s=0)
    ledger.execute(c.StartJob(actor="@executor", job_id=running))
    ledger.execute(c.ReportCheckpoint(actor="u1", job_id=running))
    ledger.execute(c.DrainNode(actor="root", node="a1", reason="fan"))
    ledger.execute(c.RemoveNode(actor="root", node="a1"))
    snap = snapshot_from_state(
        ledger.state, {"lab/a/u1": 0}, 1_600.0, low_util_since={running: 1_550.0}
    )
    assert (snap.position, snap.taken_at) == (ledger.position, 1_600.0)
    assert [n.name for n in snap.nodes] == ["a0", *(f"n{i}" for i in range(6))]
    (r,) = snap.running
    assert (r.job_id, r.account, r.user, r.gpus, r.placed_at, r.min_runtime_s) == (
        running,
        "lab/a",
        "u1",
        4,
        1_000.0,
        600,
    )
    assert (r.resumable, r.checkpoint_at, r.low_util_since) == (True, 1_500.0, 1_550.0)
    held = {(s.node, i) for s in r.slots for i in s.gpu_indices}
    for n in snap.nodes:
        assert set(n.free) == {i for i in range(n.gpus) if (n.name, i) not in held}
    (p,) = snap.pending
    assert (p.job_id, p.account, p.priority, p.submitted_at, p.min_runtime_s) == (
        waiting,
        "lab/b",
        3,
        1_500.0,
        0,
    )
    assert snap.ranks == {"lab/a/u1": 0, "lab/a": 0, "lab": 0}


def test_in_an_outage_nothing_is_placed_on_or_preempted_from_what_the_engine_cannot_see(
    tmp_path: Path,
) -> None:
    """The same fair-share preemption as above, with n0-n2 unobserved (their engine does not
    answer): their runs are no victims and their free GPUs take nothing; seen again, it happens."""
    ledger, clock = make_ledger(tmp_path)
    filler = [
        submit(ledger, "lab/c", 8, min_runtime_s=600, resumable=True, gpu_type="h100")
        for _ in range(6)
    ]
    cycle(ledger, clock, {}, 1)
    clock.advance_to(1_000.0 + 3600)
    big = submit(ledger, "lab/a", 16, min_runtime_s=600, gpu_type="h100")
    used = {"lab/c": 6 * 8 * 3600.0, "lab/c/u1": 6 * 8 * 3600.0}
    ranks, level = fair_share(ledger.state, used)
    blind = frozenset(f"n{i}" for i in range(6))
    snap = snapshot_from_state(ledger.state, ranks, clock.now(), level_fs=level, unobserved=blind)
    assert {j.job_id for j in snap.running} == set()  # no victims
    assert all(n.free == () for n in snap.nodes if n.name in blind)
    d = decide(snap, FairShare(), clock.now())
    assert d.preemptions == () and [p.job_id for p in d.placements] == []
    half = frozenset(f"n{i}" for i in range(3))
    snap = snapshot_from_state(ledger.state, ranks, clock.now(), level_fs=level, unobserved=half)
    d = decide(snap, FairShare(), clock.now())
    victims = {sl.node for p in d.preemptions for sl in ledger.state.jobs[p.job_id].slots}
    assert victims and not victims & half  # only what it sees
    assert [p.job_id for p in d.placements] == [big] and len(filler) == 6
