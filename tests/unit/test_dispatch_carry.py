"""What one cycle hands the next (`snapshot_kept`'s `Views`, `decide_carried`'s `Carry`: the
free-GPU index, the completed ranks, the running jobs' slots a reservation read) changes no
decision: a simulation whose dispatcher carries them writes the same log, byte for byte, as one
whose every cycle starts from nothing."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import msgspec
import pytest

from ledger.cycle import dispatcher
from ledger.dispatch import fairshare2
from ledger.dispatch.engine import decide_carried
from ledger.dispatch.fairshare2 import FREE_HEAD, FairShare2, team_of, team_places
from ledger.dispatch.ordering import SortKey
from ledger.dispatch.placement import FreeIndex
from ledger.dispatch.policy import declared_end
from ledger.dispatch.registry import default_config, policy_from_config, with_knobs
from ledger.dispatch.reservation import Frees
from ledger.dispatch.snapshot import (
    UNRANKED,
    NodeView,
    PendingJob,
    RunningJob,
    Snapshot,
    complete_ranks,
)
from ledger.sim.family import Family, family
from ledger.sim.runner import Cluster, SimConfig, simulate
from ledger.store.locate import open_source, stored_rows
from schemas.events import GpuSlot


def _log(home: Path) -> str:
    """A SHA-256 over every stored record, in log order."""
    digest = hashlib.sha256()
    source = open_source(home)
    rows = stored_rows(source)
    try:
        after, n = 0, 0
        while batch := rows.read(after, 10_000):
            for record in batch:
                digest.update(repr(record).encode())
            after += len(batch)
            n += len(batch)
    finally:
        source.close()
    assert n > 100
    return digest.hexdigest()


def _run(tmp: Path, policy: str, carried: bool, monkeypatch: pytest.MonkeyPatch) -> str:
    if not carried:  # every cycle from nothing: what `decide` and `snapshot_from_state` do
        kept = dispatcher.snapshot_kept
        monkeypatch.setattr(
            dispatcher, "decide_carried", lambda s, p, n, c: decide_carried(s, p, n, None)
        )
        monkeypatch.setattr(
            dispatcher, "snapshot_kept", lambda st, r, n, k, **kw: kept(st, r, n, None, **kw)
        )
    # large gang jobs on a small cluster: reservations are made most cycles
    work = family(Family(gpus=256, days=1.5, mix=(("medium", 1.0), ("large", 2.0)), seed=3))
    home = tmp / f"{policy}-{carried}"
    simulate(work, SimConfig(policy=policy, cluster=Cluster(nodes=32), days=1.5, seed=3), home)
    monkeypatch.undo()
    return _log(home)


@pytest.mark.parametrize("policy", ["fairshare", "fairshare-12", "slurm-lab"])
def test_a_carrying_dispatcher_writes_the_log_of_one_that_starts_from_nothing(
    tmp_path: Path, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _run(tmp_path, policy, True, monkeypatch) == _run(tmp_path, policy, False, monkeypatch)


def _view(job_id: int, nodes: list[str]) -> RunningJob:
    slots = tuple(GpuSlot(node=n, gpu_indices=tuple(range(8))) for n in nodes)
    return RunningJob(job_id=job_id, account="a", user="u", gpus=8 * len(nodes), slots=slots,
                      placed_at=0.0, min_runtime_s=600, time_limit_s=3_600)  # fmt: skip


def test_a_reservation_reads_a_moved_job_where_it_is_now() -> None:
    """A job requeued and placed again elsewhere (the same id, a new view) frees the nodes it
    holds now, not those the last cycle's reservation read."""
    nodes = tuple(NodeView(name=f"n{i}", cluster="c", gpu_type="h100", gpus=8) for i in range(4))
    index, kept_index = FreeIndex.of(nodes)
    first = Frees(100.0, index, declared_end)
    before = first.on([_view(1, ["n0", "n1"])], set(), None, {("c", "h100")}, True)
    assert set(before) == {"n0", "n1"}
    index, _ = FreeIndex.of(nodes, kept_index)  # the same nodes: the same node -> pool map
    again = Frees(100.0, index, declared_end, first.kept(None))
    moved = again.on([_view(1, ["n2", "n3"])], set(), None, {("c", "h100")}, True)
    assert moved == Frees(100.0, index, declared_end).on(
        [_view(1, ["n2", "n3"])], set(), None, {("c", "h100")}, True
    )
    assert set(moved) == {"n2", "n3"}


def _old_order(policy: FairShare2, snap: Snapshot) -> list[tuple[SortKey, PendingJob]]:
    """Fair share's order as every cycle built it before it was kept: each job's whole key,
    one sort (the ladder of `FairShare2.order`)."""
    places = team_places(snap, policy.team_depth) if policy.whole_tree else {}
    keyed = []
    for j in snap.pending:
        name = team_of(j.account, policy.team_depth)
        rank = snap.ranks.get(name, snap.ranks.get(j.account, UNRANKED))
        team = places.get(name, len(places) + rank) if places else rank
        leaf = snap.ranks.get(f"{j.account}/{j.user}", rank)
        funded = j.min_runtime_s > 0
        if policy.free_oldest and not funded:  # fairshare-17: the free tier by submit time
            keyed.append(((*FREE_HEAD, j.submitted_at, j.job_id), j))
            continue
        ran = policy.ran_first  # fairshare-16's requeued_first: the step turned round
        fresh = (0 if funded or (j.runs == 0) != ran else 1,) if policy.fresh_first else ()
        head = (0 if policy.debug_lane and funded and j.debug else 1, 0 if funded else 1,
                *fresh, team, -j.priority, leaf)  # fmt: skip
        keyed.append(((*head, j.submitted_at, j.job_id), j))
    keyed.sort(key=lambda kj: kj[0])
    return keyed


def _job(rng: random.Random, job_id: int) -> PendingJob:
    team = rng.choice(["lab/a", "lab/b", "lab/c", "lab/d"])
    funded = rng.random() < 0.7
    debug = funded and rng.random() < 0.2
    return PendingJob(
        job_id=job_id, account=team, user=rng.choice(["u", "v", "w"]), gpus=rng.choice([1, 8]),
        min_runtime_s=(600 if debug else 3600) if funded else 0,
        submitted_at=float(rng.choice([0, 10, 20, job_id])), priority=rng.choice([0, 0, 1, -1]),
        debug=debug, runs=rng.choice([0, 0, 1]),
    )  # fmt: skip


@pytest.mark.parametrize("keep_from", [0, 60])
@pytest.mark.parametrize("version", ["fairshare-7", "fairshare-3", "fairshare-2", "fairshare-17"])
def test_a_kept_order_is_the_order_made_afresh(
    version: str, keep_from: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fair share's order carried between cycles (`order_kept`: jobs kept in classes, only those
    that came or went classed again) equals the order of every job's key sorted, cycle after
    cycle: jobs placed, submitted, requeued (a new view of the same job), ranks and shares that
    move, two users of a team unranked alike (one head, two classes), many changes in one class,
    most of the queue changed at once, nothing changed; kept from any length of queue, and
    from 60 jobs (shorter queues ordered afresh in between)."""
    monkeypatch.setattr(fairshare2, "KEEP_FROM", keep_from)
    config = default_config(version)
    if version == "fairshare-17":  # built today orders its free tier afresh by share (s63-policy3)
        config = with_knobs(config, {"free_order": "oldest"})
    policy = policy_from_config(config)
    assert isinstance(policy, FairShare2)
    rng = random.Random(7)
    pending = {i: _job(rng, i) for i in range(1, 120)}
    next_id, kept, shares = 120, None, {}
    ranked = ["lab/a/u", "lab/a/v", "lab/b/u", "lab/b/v", "lab/c/u", "lab/d/w"]  # not lab/*/w
    for step in range(60):
        if step % 7 == 3:  # nothing changed
            pass
        elif step % 11 == 5:  # most of the queue at once
            for i in rng.sample(sorted(pending), len(pending) * 2 // 3):
                del pending[i]
        else:
            for i in rng.sample(sorted(pending), min(len(pending), rng.randint(0, 12))):
                if rng.random() < 0.3:  # requeued: a new view of the same job
                    pending[i] = msgspec.structs.replace(pending[i], runs=pending[i].runs + 1)
                else:
                    del pending[i]
            for _ in range(rng.choice([0, 1, 3, 20])):
                pending[next_id] = _job(rng, next_id)
                next_id += 1
        if step % 3 == 0:  # ranks and shares move (else the heads are the last ones)
            rng.shuffle(ranked)
        if step % 4 == 0:
            shares = {"lab/a": 4.0, "lab/b": rng.uniform(0.5, 5), "lab/c": 0.5, "lab/d": 1.0}
        snap = Snapshot(position=step, taken_at=100_000.0, nodes=(), running=(),
                        pending=tuple(pending[i] for i in sorted(pending)),
                        ranks=complete_ranks({p: r for r, p in enumerate(ranked)}),
                        level_fs=shares)  # fmt: skip
        ordered, kept = policy.order_kept(snap, kept)
        assert list(ordered) == _old_order(policy, snap), step
        assert list(policy.order(snap)) == list(ordered)
