"""GPUs Slurm counts allocated that no job holds (docs/slurm.md, "Foreign jobs").

Slurm 22.05 can leave a GPU so: after slurmctld restarts while a job it requeued itself runs, the
job's end fails to free it (`gres/gpu: job N dealloc of node vm bad node_offset`). Slurm then
starts nothing that asks for that GPU and, with `sched/builtin`, nothing queued behind such a
job either, until slurmctld restarts. The executor holds such GPUs as foreign work's, so the
ledger places nothing there. Pure: the executor reads, these decide.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ledger.engines.slurm.words import SlurmJob, expand_hostlist, held_gpus


def leaked_gpus(
    used: Mapping[str, Iterable[int]], held: Mapping[str, Iterable[int]]
) -> dict[str, frozenset[int]]:
    """Pure: the GPUs Slurm counts allocated on each node (`GresUsed`) that no job it lists
    holds (`held`: every job's, and the runs submitted but not yet started)."""
    out = {}
    for node, gpus in used.items():
        left = frozenset(gpus) - frozenset(held.get(node, ()))
        if left:
            out[node] = left
    return out


def unsure(jobs: Iterable[SlurmJob], pinned: Mapping[str, tuple[str, ...]]) -> frozenset[str]:
    """Pure: the nodes of the COMPLETING jobs whose GPUs Slurm no longer lists (`-d` drops a
    completing job's indices; `held_gpus` knows them only on nodes with pinned types). Their
    `GresUsed` counts those GPUs until the job is gone, so a read there cannot tell a leak from
    them (CI: the last test's job, ending, made the next run's GPU look leaked; the run was
    taken back)."""
    return frozenset(
        node
        for j in jobs
        if j.state == "COMPLETING" and not held_gpus(j, pinned)
        for node in expand_hostlist(j.nodes)
    )


def lasting(
    seen: Mapping[str, frozenset[int]], before: Mapping[str, frozenset[int]]
) -> dict[str, frozenset[int]]:
    """Pure: the leaks of this read that the read before showed too (one read may fall between
    a job's allocation or end and its listing)."""
    both = {n: g & before.get(n, frozenset()) for n, g in seen.items()}
    return {n: g for n, g in both.items() if g}


def held_with(
    foreign: Mapping[str, frozenset[int]], leaks: Mapping[str, frozenset[int]]
) -> dict[str, frozenset[int]]:
    """Pure: foreign work's GPUs and the leaked ones, by node."""
    return {n: foreign.get(n, frozenset()) | leaks.get(n, frozenset()) for n in {*foreign, *leaks}}


@dataclass
class Leaks:
    """The leaks the executor holds: those two reads in a row showed (`lasting`)."""

    seen: Mapping[str, frozenset[int]] = field(default_factory=dict)  # the last read's
    held: Mapping[str, frozenset[int]] = field(default_factory=dict)

    def read(
        self,
        used: Mapping[str, Iterable[int]],
        holding: Mapping[str, Iterable[int]],
        unsure: frozenset[str] = frozenset(),
    ) -> bool:
        """Take a read's leaks (`leaked_gpus` of `used`, `holding`); whether `held` changed. On an
        `unsure` node the leaks held stay while Slurm counts them and no new one is seen."""
        seen = leaked_gpus(used, holding)
        for node in unsure & {*seen, *self.held}:
            kept = seen.get(node, frozenset()) & self.held.get(node, frozenset())
            seen = {n: g for n, g in seen.items() if n != node} | ({node: kept} if kept else {})
        held, self.seen = lasting(seen, self.seen), seen
        changed, self.held = held != self.held, held
        return changed
