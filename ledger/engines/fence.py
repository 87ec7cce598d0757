"""Fenced launches: a job never runs in two launches at once, and never again while an earlier
launch of it may be alive.

Pure bookkeeping for the node agents' executor (`ledger.engines.agents`): `now` and versions are
parameters. Every launch of a job has a generation, its run number (0, 1, ... : the job's
placements so far). When the ledger stops a run (a preemption, a cancel, a requeue, the end of a
gang whose part failed), each node that had a part of it is a *blocker* of the job until either

- that node's agent reports, as of a version of its list that no longer names the run (the list
  published when the run was stopped, or a later one), that it no longer has it: its processes
  are gone (a report is what the agent has, not what it was told: a part still in its grace is
  still listed); or
- the node is lost and its fence has passed (`lost + fence_s + grace`): by then the node's own
  lease has run out and its parts have stopped themselves (`supervise.wait_leader`).

A new run of the job is handed to its nodes only when it has no blocker. After a server restart
nothing is known of earlier runs, so every node then registered blocks the jobs that had earlier
runs until it reports once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ANY_RUN = -1
"""A blocker about any earlier run of the job (after a restart)."""


@dataclass
class Blocker:
    run: int
    """The stopped run (`ANY_RUN`: any run older than the one to launch)."""
    version: int
    """The node's list version that no longer names the run: a report must be at least this
    new to count."""
    grace_s: float
    release_at: float | None = None
    """Set once the node is lost: when its fence has passed."""
    gpus: tuple[int, ...] = ()
    """The GPUs the stopped run held there (none known for `ANY_RUN`)."""


def version_number(version: str, epoch: str) -> int | None:
    """Pure: the number of a list version `<epoch>.<n>` of this server process; None for
    another process's (a report written before a restart proves nothing now)."""
    head, _, n = version.rpartition(".")
    return int(n) if head == epoch and n.isdigit() else None


def reboot_honoured(
    claimed: str, holder: str, silent_s: float, uptime_s: float, margin_s: float
) -> bool:
    """Pure: whether a node agent's word that its host rebooted (`schemas.agent.REBOOTED_HEADER`)
    lets the server end the node's runs at once, gone with the boot, instead of waiting the
    node-lost timeout and the fence (~6.5 min by default). Believed only when

    - it names the node's holder as what it was on the boot before (`claimed`, the digest of
      its state directory's id bound to the boot id recorded there, equals `holder`); and
    - the holder has been silent since at least `margin_s` before this boot (`silent_s >=
      uptime_s + margin_s`, the uptime on the node's own clock): a holder alive on another
      machine (a copy of the state directory booted elsewhere, atk39-23 F4) reaches the server
      every heartbeat, so it is never that silent (the server's margin is half its node-lost
      timeout, which heartbeats stay well inside).

    Otherwise the agent is another agent as before, refused until the runs are surely gone."""
    if not claimed or claimed != holder or not math.isfinite(uptime_s) or uptime_s < 0:
        return False
    return silent_s >= uptime_s + margin_s


class Fence:
    """Which nodes may still run an earlier launch of each job (module doc)."""

    def __init__(self, epoch: str, fence_s: float) -> None:
        self.epoch = epoch
        self.fence_s = fence_s
        self.blockers: dict[int, dict[str, Blocker]] = {}
        self.lost_at: dict[str, float] = {}

    def stopped(
        self, job_id: int, run: int, nodes: Iterable[str], versions: Mapping[str, int],
        grace_s: float, now: float, gpus: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:  # fmt: skip
        """Run `run` of `job_id` was taken off `nodes` (their lists are now `versions`; the
        GPUs it held on each: `gpus`)."""
        for node in nodes:
            b = Blocker(run, versions.get(node, 0), grace_s, gpus=(gpus or {}).get(node, ()))
            if node in self.lost_at:
                b.release_at = max(now, self.lost_at[node] + self.fence_s + grace_s)
            self.blockers.setdefault(job_id, {})[node] = b

    def adopted(
        self, job_id: int, nodes: Iterable[str], versions: Mapping[str, int], grace_s: float
    ) -> None:
        """After a restart: any earlier run of `job_id` may live on any of `nodes`."""
        for node in nodes:
            self.blockers.setdefault(job_id, {}).setdefault(
                node, Blocker(ANY_RUN, versions.get(node, 0), grace_s)
            )

    def reported(
        self,
        node: str,
        version: str,
        running: Iterable[tuple[int, int]],
        current: Mapping[int, int],
    ) -> list[tuple[int, int]]:
        """An agent's report: what it has on `node` as of its list `version`; `current` is each
        job's current run (not an earlier one). Returns the (job, run) no longer blocked by it."""
        n = version_number(version, self.epoch)
        if n is None:
            return []
        have: dict[int, set[int]] = {}
        for job_id, run in running:
            have.setdefault(job_id, set()).add(run)
        freed = []
        for job_id, by_node in list(self.blockers.items()):
            b = by_node.get(node)
            if b is None or n < b.version:
                continue
            runs = have.get(job_id, set())
            if b.run == ANY_RUN:
                alive = {r for r in runs if r < current.get(job_id, 0)}
            else:
                alive = runs & {b.run}
            if not alive:
                del by_node[node]
                freed.append((job_id, b.run))
            if not by_node:
                del self.blockers[job_id]
        return freed

    def lost(self, node: str, at: float) -> None:
        """`node` is lost: its blockers go once its fence has passed."""
        self.lost_at[node] = at
        for by_node in self.blockers.values():
            b = by_node.get(node)
            if b is not None:
                b.release_at = at + self.fence_s + b.grace_s

    def returned(self, node: str) -> None:
        """`node` is back: its blockers wait for its reports again."""
        self.lost_at.pop(node, None)
        for by_node in self.blockers.values():
            b = by_node.get(node)
            if b is not None:
                b.release_at = None

    def holding(self, now: float) -> dict[str, frozenset[int]]:
        """The GPUs (node -> indices) of stopped runs that may still live there at `now` (their
        grace: the agent starts nothing on them until they are gone), as `node list` shows."""
        out: dict[str, set[int]] = {}
        for by_node in self.blockers.values():
            for node, b in by_node.items():
                if b.gpus and (b.release_at is None or now < b.release_at):
                    out.setdefault(node, set()).update(b.gpus)
        return {n: frozenset(i) for n, i in out.items()}

    def stopping_on(self, node: str, now: float) -> dict[int, float]:
        """The jobs whose stopped run may still live on `node` at `now`, with their grace."""
        out = {}
        for job_id, by_node in self.blockers.items():
            b = by_node.get(node)
            if b is not None and (b.release_at is None or now < b.release_at):
                out[job_id] = b.grace_s
        return out

    def blocking(self, job_id: int, now: float) -> list[str]:
        """The nodes that may still run an earlier launch of `job_id` at `now` (those whose
        fence has passed are let go)."""
        by_node = self.blockers.get(job_id)
        if not by_node:
            return []
        for node, b in list(by_node.items()):
            if b.release_at is not None and now >= b.release_at:
                del by_node[node]
        if not by_node:
            del self.blockers[job_id]
            return []
        return sorted(by_node)
