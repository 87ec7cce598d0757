"""What one cycle hands the next (`snapshot_kept`'s `Views`, `decide_carried`'s `Carry`: the
free-GPU index, the completed ranks, the running jobs' slots a reservation read) changes no
decision: a simulation whose dispatcher carries them writes the same log, byte for byte, as one
whose every cycle starts from nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ledger.cycle import dispatcher
from ledger.dispatch.engine import decide_carried
from ledger.dispatch.placement import FreeIndex
from ledger.dispatch.policy import declared_end
from ledger.dispatch.reservation import Frees
from ledger.dispatch.snapshot import NodeView, RunningJob
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
