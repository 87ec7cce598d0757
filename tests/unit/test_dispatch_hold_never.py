"""A gang reservation known to be impossible is not worked out (`_Cycle._whole_ever`,
`Frees.never`): when the nodes no running job holds for ever have too few GPUs for the job,
`soonest` would find none, so `_hold_for` returns without timing every node. The same
reservations, and the same logs, as timing every node each time."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

from ledger.dispatch import engine
from ledger.dispatch.engine import _Cycle
from ledger.dispatch.placement import FreeIndex
from ledger.dispatch.registry import VERSIONS, default_config, policy_from_config
from ledger.dispatch.reservation import Frees
from ledger.dispatch.snapshot import NodeView, PendingJob, RunningJob, Snapshot, complete_ranks
from ledger.sim.family import Family, family
from ledger.sim.runner import Cluster, SimConfig, simulate
from ledger.store.locate import open_source, stored_rows
from schemas.events import GpuSlot

TEAMS = ["lab/a", "lab/b", "lab/c", "lab/d"]


def _running(rng: random.Random, job_id: int, nodes: list[str], now: float) -> RunningJob:
    """A job on 1-3 nodes, all of some and part of others; with or without a time limit,
    inside or past its contract."""
    on = rng.sample(nodes, rng.choice([1, 1, 2, 3]))
    whole = rng.random() < 0.5
    slots = tuple(
        GpuSlot(node=n, gpu_indices=tuple(range(8)) if whole else (2 * k, 2 * k + 1))
        for n in on
        for k in [rng.randrange(4)]
    )
    return RunningJob(
        job_id=job_id, account=rng.choice(TEAMS), user="u",
        gpus=sum(len(s.gpu_indices) for s in slots), slots=slots,
        placed_at=now - rng.choice([100.0, 5_000.0, 50_000.0]),
        min_runtime_s=rng.choice([0, 3_600, 20_000]), resumable=rng.random() < 0.5,
        time_limit_s=rng.choice([None, None, 7_200, 100_000]),
    )  # fmt: skip


def _case(rng: random.Random) -> tuple[Snapshot, PendingJob]:
    now = 100_000.0
    names = [f"n{i:02d}" for i in range(rng.choice([8, 16]))]
    running: list[RunningJob] = []
    used: dict[str, set[int]] = {n: set() for n in names}
    for i in range(rng.randint(0, 24)):
        r = _running(rng, 1000 + i, names, now)
        gpus = {(s.node, g) for s in r.slots for g in s.gpu_indices}
        if any(g in used[n] for n, g in gpus):
            continue  # a GPU holds one job
        for n, g in gpus:
            used[n].add(g)
        running.append(r)
    nodes = tuple(
        NodeView(name=n, cluster="c", gpu_type="h100", gpus=8,
                 state=rng.choice(["active"] * 6 + ["draining"]),
                 free=tuple(g for g in range(8) if g not in used[n]))
        for n in names
    )  # fmt: skip
    job = PendingJob(job_id=1, account=rng.choice(TEAMS), user="u",
                     gpus=8 * rng.randint(2, len(names)), min_runtime_s=3_600,
                     submitted_at=0.0)  # fmt: skip
    shares = {t: rng.uniform(0.2, 3.0) for t in TEAMS}
    ranked = sorted(TEAMS, key=lambda t: -shares[t])
    snap = Snapshot(position=1, taken_at=now, nodes=nodes, running=tuple(running),
                    pending=(job,), ranks=complete_ranks({t: i for i, t in enumerate(ranked)}),
                    level_fs=shares)  # fmt: skip
    return snap, job


def _hold(snap: Snapshot, job: PendingJob, version: str, known: bool) -> object:
    policy = policy_from_config(default_config(version))
    cycle = _Cycle(snap, policy, snap.taken_at, FreeIndex(snap.nodes))
    if not known:  # time every node, as before `_whole_ever`
        cycle._whole_ever = lambda *a: 1 << 30  # type: ignore[method-assign]
    cycle._hold_for(job, True)
    return cycle.hold


@pytest.mark.parametrize("version", ["fairshare-7", "fairshare-11", "slurm-lab"])
def test_a_reservation_skipped_as_impossible_is_one_soonest_finds_none(version: str) -> None:
    """On random clusters (jobs with and without time limits, of teams the waiting job may or
    may not preempt, inside or past their contracts, nodes draining), the reservation made
    with the shortcut equals the one made by timing every node; and the shortcut does skip
    some (fairshare-7: jobs that declared no time limit hold nodes for ever)."""
    rng = random.Random(11)
    none = 0
    for _ in range(400):
        snap, job = _case(rng)
        made = _hold(snap, job, version, known=True)
        assert made == _hold(snap, job, version, known=False)
        none += made is None
    assert none > 50


def _log(home: Path) -> str:
    digest = hashlib.sha256()
    source = open_source(home)
    rows = stored_rows(source)
    try:
        after = 0
        while batch := rows.read(after, 10_000):
            for record in batch:
                digest.update(repr(record).encode())
            after += len(batch)
    finally:
        source.close()
    assert after > 100
    return digest.hexdigest()


def _run(tmp: Path, known: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[str, int]:
    """The log of a day of the tuning workload (32 nodes: most reservations asked for are
    impossible), and how many reservations the shortcut skipped."""
    asked, timed = 0, 0
    whole_ever, on = engine._Cycle._whole_ever, Frees.on

    def counted(self: _Cycle, *a: object) -> int:
        nonlocal asked
        asked += 1
        return whole_ever(self, *a) if known else 1 << 30  # type: ignore[arg-type]

    def timing(self: Frees, *a: object) -> object:
        nonlocal timed
        timed += 1
        return on(self, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(engine._Cycle, "_whole_ever", counted)
    monkeypatch.setattr(Frees, "on", timing)
    work = family(Family(gpus=256, days=1.0, seed=1))
    home = tmp / f"run-{known}"
    simulate(work, SimConfig(policy="fairshare", cluster=Cluster(nodes=32), days=1.0, seed=1), home)
    monkeypatch.undo()
    return _log(home), asked - timed


def test_a_simulation_skipping_impossible_reservations_writes_the_same_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default policy's log is the same, byte for byte, with and without the shortcut,
    which skipped most of the reservations asked for."""
    log, skipped = _run(tmp_path, True, monkeypatch)
    assert skipped > 100
    assert log == _run(tmp_path, False, monkeypatch)[0]


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_every_policys_victims_filter_the_candidates_one_by_one(version: str) -> None:
    """`Policy.victims` offers a candidate, and as what, by it alone: asked about a part of
    the candidates (`_whole_ever` asks about the jobs that would keep nodes for ever), it
    offers exactly what it offers of that part when asked about all of them."""
    policy = policy_from_config(default_config(version))
    rng = random.Random(5)
    offered = 0
    for _ in range(60):
        snap, job = _case(rng)
        job = PendingJob(job_id=1, account=job.account, user="u", gpus=job.gpus,
                         min_runtime_s=3_600, submitted_at=0.0,
                         debug=rng.random() < 0.2)  # fmt: skip
        now = snap.taken_at
        every = list(snap.running)
        whole = {v.job.job_id: v for v in policy.victims(job, every, snap, now)}
        part = rng.sample(every, len(every) // 2)
        asked = {v.job.job_id: v for v in policy.victims(job, part, snap, now)}
        assert asked == {r.job_id: whole[r.job_id] for r in part if r.job_id in whole}
        offered += len(asked)
    assert offered > 0 or not policy.may_preempt(job) or version.startswith("legacy")
