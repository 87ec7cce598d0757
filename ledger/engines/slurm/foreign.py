"""Slurm jobs the ledger does not run now, read once per cycle (docs/slurm.md, "Foreign jobs"):
jobs that did not come through this ledger, on any partition sharing its nodes, whose GPUs
count busy and are never touched; and runs of this ledger it no longer runs (after a restart:
cancelled, preempted meanwhile), which the executor stops. Pure: the executor reads and acts."""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field

from ledger.engines.slurm.words import SlurmJob, held_gpus


@dataclass(frozen=True)
class Others:
    """What the jobs the ledger does not run now say: the GPUs foreign work holds (node ->
    indices), each foreign job holding some (for the log), and our runs left to stop."""

    foreign: Mapping[str, frozenset[int]] = field(default_factory=dict)
    holders: tuple[tuple[SlurmJob, Mapping[str, tuple[int, ...]]], ...] = ()
    strays: tuple[SlurmJob, ...] = ()


def others(
    view: Iterable[SlurmJob],
    ours: Container[str],
    ledger_id: str,
    partition: str,
    pinned: Mapping[str, tuple[str, ...]],
) -> Others:
    """Pure: the jobs of `view` not in `ours` (our runs and stops, by Slurm id): a run tagged
    with this ledger on its partition that has not ended is a stray to stop; one that did not
    come through it holds its GPUs (running, configuring, completing, ...)."""
    foreign: dict[str, set[int]] = {}
    holders: list[tuple[SlurmJob, Mapping[str, tuple[int, ...]]]] = []
    strays: list[SlurmJob] = []
    for j in view:
        if j.slurm_id in ours:
            continue
        if j.tag(ledger_id) is not None:
            if j.partition == partition and not j.ended:
                strays.append(j)
            continue
        holds = held_gpus(j, pinned)
        for node, idx in holds.items():
            foreign.setdefault(node, set()).update(idx)
        if holds:
            holders.append((j, holds))
    return Others({n: frozenset(i) for n, i in foreign.items()}, tuple(holders), tuple(strays))
