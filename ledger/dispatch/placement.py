"""Where jobs go: a free-capacity index and the placement rules.

Pure: the index is a scratch value owned by one `decide()` call; nothing here reads a clock.

Rules:

- Only `active` nodes take work; draining and drained nodes are not in the index at all.
- A *pool* is the nodes of one (cluster, GPU type). A job's GPU-type and cluster constraints pick
  its pools; a job without a constraint may use any pool.
- A job needing more GPUs than the largest node of its pools (counting every registered node,
  whatever its state, so a drain does not change a job's shape) is a *gang* job: it gets whole free
  nodes of one pool, all or nothing, largest nodes first, then by name. When its size is not a
  multiple of the node size, the last node's remaining GPUs stay free for others.
- Any other job goes on one node, best fit: the node with the fewest free GPUs that still fits
  (ties: node name), so whole nodes stay free for gang jobs.

Speed: nodes sit in buckets by free-GPU count per pool (lazy heaps of names), so best fit looks at
no more buckets than the largest node has GPUs, never at every node. While the cycle only takes
GPUs, a job of a constraint and shape that failed makes every later job of the same constraint and
shape at least as large fail without a lookup (`_failed`); a release clears that memo.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field

from ledger.dispatch.snapshot import NodeView, PendingJob
from schemas.events import GpuSlot

PoolKey = tuple[str, str]
"""(cluster, GPU type)."""


@dataclass
class Pool:
    """The active nodes of one (cluster, GPU type), bucketed by free-GPU count."""

    key: PoolKey
    largest: int = 0
    """Largest node of the pool, any state (decides whether a job is a gang job)."""
    buckets: list[list[str]] = field(default_factory=list)
    """buckets[k]: heap of names of nodes with k free GPUs (lazy: entries may be stale)."""
    count: list[int] = field(default_factory=list)
    """count[k]: how many active nodes have exactly k free GPUs (exact)."""
    whole: set[str] = field(default_factory=set)
    """Active nodes with every GPU free."""
    whole_heap: list[tuple[int, str]] = field(default_factory=list)
    """(-size, name) of whole free nodes, largest first (lazy: entries may be stale)."""
    whole_gpus: int = 0
    nodes: list[str] = field(default_factory=list)
    """The active nodes, by name."""


@dataclass
class Capacity:
    """The free capacity of a pool set at some moment: for `fits`-style questions."""

    max_free: int
    whole_gpus: int


class FreeIndex:
    """Free GPUs of active nodes, indexed for best-fit and whole-node placement."""

    def __init__(self, nodes: Iterable[NodeView]) -> None:
        self.size: dict[str, int] = {}
        self.pool_of: dict[str, PoolKey] = {}
        self.free: dict[str, list[int]] = {}
        """Free GPU indices (ascending) of the active nodes; other nodes are absent."""
        self.pools: dict[PoolKey, Pool] = {}
        self._scratch()
        active = []
        for n in nodes:
            key = (n.cluster, n.gpu_type)
            pool = self.pools.setdefault(key, Pool(key=key))
            pool.largest = max(pool.largest, n.gpus)
            self.size[n.name] = n.gpus
            self.pool_of[n.name] = key
            if n.state == "active":
                active.append(n)
        for pool in self.pools.values():
            pool.buckets = [[] for _ in range(pool.largest + 1)]
            pool.count = [0] * (pool.largest + 1)
        # by name: each bucket is appended to in name order, so it is sorted, hence a heap
        for n in sorted(active, key=lambda n: n.name):
            self.free[n.name] = sorted(n.free)
            self.pools[self.pool_of[n.name]].nodes.append(n.name)
            self._enter(n.name, push=False)
        for pool in self.pools.values():
            heapq.heapify(pool.whole_heap)
        self.start = {k: self.capacity([p]) for k, p in self.pools.items()}

    def _scratch(self) -> None:
        """The memos and counters of one cycle's use, empty."""
        self._pools_for: dict[tuple[str | None, str | None], list[Pool]] = {}
        self._largest: dict[tuple[str | None, str | None], int] = {}
        self._shortfall: dict[tuple[str | None, str | None, int], str] = {}
        self._fitted: dict[tuple[str | None, str | None, int], bool] = {}
        self._failed: dict[tuple[str | None, str | None, bool], int] = {}
        self.moves = 0
        """How many times GPUs were taken or given back (a cycle's memo of answers checks it)."""

    @classmethod
    def of(
        cls, nodes: Sequence[NodeView], last: KeptIndex | None = None
    ) -> tuple[FreeIndex, KeptIndex]:
        """Pure: the index of `nodes`, equal in every answer to `FreeIndex(nodes)`, and what to
        hand the next call as `last`. When `last` (the previous call's) indexed the same nodes
        (by name, in the same order, of the same pools, sizes and states) and only their free
        GPUs changed, the nodes whose views changed (`snapshot_from_state` hands back the same
        view for a node that did not) are entered again in a copy of its index instead of
        indexing every node. The index handed out is a copy: the one kept is never changed, so
        a caller may use its copy as scratch. The caller (the cycle's owner) keeps `last`:
        nothing is kept here."""
        base: FreeIndex | None = None
        if last is not None and len(last[0]) == len(nodes):
            views, kept = last
            changed = [(i, n) for i, n in enumerate(nodes) if views[i] is not n]
            if all(_same_node(views[i], n) for i, n in changed):
                base = kept._copy()
                for i, n in changed:
                    if n.state == "active" and n.free != views[i].free:
                        base._leave(n.name)
                        base.free[n.name] = sorted(n.free)
                        base._enter(n.name)
                if base._stale() > 2 * len(base.free) + 64:
                    base = None  # too many stale heap entries: index afresh
                else:
                    base.start = {k: base.capacity([p]) for k, p in base.pools.items()}
        if base is None:
            base = cls(nodes)
        return base._copy(), (tuple(nodes), base)

    def _copy(self) -> FreeIndex:
        """An independent copy (sizes and pools of nodes, never changed after indexing, are
        shared; the memos start empty)."""
        new = FreeIndex.__new__(FreeIndex)
        new.size, new.pool_of = self.size, self.pool_of
        new.free = dict(self.free)  # lists are replaced, never changed in place
        new.pools = {
            k: Pool(
                key=k,
                largest=p.largest,
                buckets=[b[:] for b in p.buckets],
                count=p.count[:],
                whole=set(p.whole),
                whole_heap=p.whole_heap[:],
                whole_gpus=p.whole_gpus,
                nodes=p.nodes,
            )
            for k, p in self.pools.items()
        }
        new._scratch()
        new.start = self.start
        return new

    def _stale(self) -> int:
        """Heap entries in all (valid or not)."""
        return sum(len(b) for p in self.pools.values() for b in p.buckets) + sum(
            len(p.whole_heap) for p in self.pools.values()
        )

    # --- bookkeeping ----------------------------------------------------------------------------

    def _enter(self, name: str, push: bool = True) -> None:
        """Count node `name` under its free GPUs (`push` False: append to the heaps, which
        the caller keeps heaps)."""
        pool = self.pools[self.pool_of[name]]
        k = len(self.free[name])
        pool.count[k] += 1
        if k:
            if push:
                heapq.heappush(pool.buckets[k], name)
            else:
                pool.buckets[k].append(name)
        if k == self.size[name]:
            pool.whole.add(name)
            pool.whole_gpus += k
            if push:
                heapq.heappush(pool.whole_heap, (-k, name))
            else:
                pool.whole_heap.append((-k, name))

    def _leave(self, name: str) -> None:
        pool = self.pools[self.pool_of[name]]
        pool.count[len(self.free[name])] -= 1
        if name in pool.whole:
            pool.whole.discard(name)
            pool.whole_gpus -= self.size[name]

    def take(self, name: str, gpus: int) -> GpuSlot:
        """Take the `gpus` lowest free indices of node `name`."""
        self.moves += 1
        self._shortfall.clear()
        self._leave(name)
        have = self.free[name]
        taken, self.free[name] = tuple(have[:gpus]), have[gpus:]
        self._enter(name)
        return GpuSlot(node=name, gpu_indices=taken)

    def release(self, slots: Iterable[GpuSlot]) -> None:
        """Give GPUs back (a preemption). GPUs of inactive nodes stay out of the index."""
        self.moves += 1
        for sl in slots:
            if sl.node not in self.free:
                continue
            self._leave(sl.node)
            self.free[sl.node] = sorted((*self.free[sl.node], *sl.gpu_indices))
            self._enter(sl.node)
        self._failed.clear()
        self._shortfall.clear()

    # --- queries --------------------------------------------------------------------------------

    def pools_for(self, gpu_type: str | None, cluster: str | None) -> list[Pool]:
        key = (gpu_type, cluster)
        found = self._pools_for.get(key)
        if found is None:
            found = [
                p
                for k, p in sorted(self.pools.items())
                if (cluster is None or k[0] == cluster) and (gpu_type is None or k[1] == gpu_type)
            ]
            self._pools_for[key] = found
        return found

    def largest(self, gpu_type: str | None, cluster: str | None) -> int:
        """The largest node (any state) a job of these constraints may use; 0 if none."""
        key = (gpu_type, cluster)
        found = self._largest.get(key)
        if found is None:
            found = max((p.largest for p in self.pools_for(gpu_type, cluster)), default=0)
            self._largest[key] = found
        return found

    def is_gang(self, job: PendingJob) -> bool:
        return job.gpus > self.largest(job.gpu_type, job.cluster)

    def capacity(self, pools: Sequence[Pool]) -> Capacity:
        max_free = 0
        for p in pools:
            for k in range(len(p.count) - 1, max_free, -1):
                if p.count[k]:
                    max_free = k
                    break
        return Capacity(max_free=max_free, whole_gpus=max((p.whole_gpus for p in pools), default=0))

    def fitted_at_start(self, job: PendingJob, gang: bool) -> bool:
        """Whether the job would have fitted in the free capacity the cycle started with."""
        key = (job.gpu_type, job.cluster, job.gpus)
        found = self._fitted.get(key)
        if found is None:
            pools = self.pools_for(job.gpu_type, job.cluster)
            if gang:
                found = any(self.start[p.key].whole_gpus >= job.gpus for p in pools)
            else:
                found = any(self.start[p.key].max_free >= job.gpus for p in pools)
            self._fitted[key] = found
        return found

    def _peek(self, pool: Pool, k: int) -> str | None:
        heap = pool.buckets[k]
        free = self.free
        while heap:
            name = heap[0]
            if len(free[name]) == k:
                return name
            heapq.heappop(heap)
        return None

    def best_fit(self, gpus: int, pools: Sequence[Pool]) -> str | None:
        """The node with the fewest free GPUs >= `gpus` (ties: name), or None."""
        best: tuple[int, str] | None = None
        for pool in pools:
            for k in range(gpus, len(pool.count)):
                if best is not None and k > best[0]:
                    break
                if pool.count[k]:
                    name = self._peek(pool, k)
                    if name is not None and (best is None or (k, name) < best):
                        best = (k, name)
                    break
        return best[1] if best else None

    def _take_whole_nodes(self, gpus: int, pools: Sequence[Pool]) -> tuple[GpuSlot, ...] | None:
        """Take `gpus` GPUs on whole free nodes of one pool, or None.

        The pool with the fewest whole free GPUs that suffices (best fit); in it the largest
        nodes first, then by name.
        """
        fits = [p for p in pools if p.whole_gpus >= gpus]
        if not fits:
            return None
        pool = min(fits, key=lambda p: (p.whole_gpus, p.key))
        chosen: list[str] = []
        got = 0
        heap = pool.whole_heap
        while got < gpus:
            _, name = heapq.heappop(heap)
            if name in pool.whole and name not in chosen:
                chosen.append(name)
                got += self.size[name]
        return self.take_whole(chosen, gpus)

    def take_whole(self, names: Sequence[str], gpus: int) -> tuple[GpuSlot, ...]:
        """Take `gpus` GPUs from the whole nodes `names`, in order."""
        slots = []
        need = gpus
        for name in names:
            n = min(need, len(self.free[name]))
            slots.append(self.take(name, n))
            need -= n
        assert need == 0, "take_whole was given too few GPUs"
        return tuple(slots)

    def place(self, job: PendingJob, gang: bool) -> tuple[GpuSlot, ...] | None:
        """Place `job` (`gang`: `is_gang(job)`) by the rules above and take its GPUs, or
        return None."""
        memo = (job.gpu_type, job.cluster, gang)
        failed = self._failed.get(memo)
        if failed is not None and job.gpus >= failed:
            return None
        pools = self.pools_for(job.gpu_type, job.cluster)
        if gang:
            slots = self._take_whole_nodes(job.gpus, pools)
            if slots is not None:
                return slots
        else:
            name = self.best_fit(job.gpus, pools)
            if name is not None:
                return (self.take(name, job.gpus),)
        self._failed[memo] = job.gpus if failed is None else min(failed, job.gpus)
        return None

    def shortfall(self, job: PendingJob, gang: bool) -> str:
        """Why `job` does not fit now, in words."""
        key = (job.gpu_type, job.cluster, job.gpus)
        text = self._shortfall.get(key)
        if text is None:
            text = self._shortfall[key] = self._explain(job, gang)
        return text

    def _explain(self, job: PendingJob, gang: bool) -> str:
        what = " ".join(x for x in (job.gpu_type, "GPUs") if x)
        where = f" in cluster {job.cluster}" if job.cluster else ""
        pools = self.pools_for(job.gpu_type, job.cluster)
        if not pools:
            return f"no {what}{where} registered"
        cap = self.capacity(pools)
        if gang:
            return (
                f"needs {job.gpus} {what}{where} on whole free nodes of one pool; "
                f"{cap.whole_gpus} on whole free nodes"
            )
        return (
            f"no node with {job.gpus} free {what}{where}; at most {cap.max_free} free on one node"
        )


def _same_node(a: NodeView, b: NodeView) -> bool:
    """Whether two views of a node differ at most in their free GPUs."""
    return (a.name, a.cluster, a.gpu_type, a.gpus, a.state) == (
        b.name, b.cluster, b.gpu_type, b.gpus, b.state)  # fmt: skip


KeptIndex = tuple[tuple[NodeView, ...], FreeIndex]
"""The nodes `FreeIndex.of` indexed and their index (never changed after): its next call's
`last`."""


Shape = tuple[str | None, str | None, bool]
"""(GPU type constraint, cluster constraint, gang?) of a job."""


def smallest_requests(index: FreeIndex, jobs: Iterable[PendingJob]) -> dict[Shape, int]:
    """Pure: the fewest GPUs any of `jobs` asks for, per shape."""
    out: dict[Shape, int] = {}
    for job in jobs:
        shape = (job.gpu_type, job.cluster, index.is_gang(job))
        if job.gpus < out.get(shape, job.gpus + 1):
            out[shape] = job.gpus
    return out


def fragmentation(
    index: FreeIndex, smallest: Mapping[Shape, int], skip: Set[str] = frozenset()
) -> int:
    """Pure: free GPUs that the jobs still waiting cannot use.

    `smallest` is the fewest GPUs a waiting job of each shape asks for (`smallest_requests`).
    Precisely: the sum of the free GPUs of each active node such that at least one waiting job
    may run on the node's pool (GPU type and cluster), and no waiting job can use the node: a
    single-node job needs more GPUs than the node has free, and a gang job needs whole nodes
    while the node is partly held. Idle GPUs with no waiting job for their pool are idle, not
    fragmented, and count 0. Nodes in `skip` are left out.
    """
    return fragmentation_split(index, smallest, skip)[1]


def fragmentation_split(
    index: FreeIndex, smallest: Mapping[Shape, int], skip: Set[str] = frozenset()
) -> tuple[int, int]:
    """Pure: `fragmentation` of every node and of the nodes not in `skip`, in one pass."""
    fewest: dict[PoolKey, int] = {}
    gang: set[PoolKey] = set()
    wanted: set[PoolKey] = set()
    for (gpu_type, cluster, is_gang), gpus in smallest.items():
        for p in index.pools_for(gpu_type, cluster):
            wanted.add(p.key)
            if is_gang:
                gang.add(p.key)
            elif gpus < fewest.get(p.key, gpus + 1):
                fewest[p.key] = gpus
    total = kept = 0
    if not wanted:
        return 0, 0
    pool_of, size = index.pool_of, index.size
    for name, free in index.free.items():
        k = len(free)
        if not k:
            continue
        key = pool_of[name]
        if key not in wanted:
            continue
        if (key in fewest and k >= fewest[key]) or (k == size[name] and key in gang):
            continue  # usable
        total += k
        if name not in skip:
            kept += k
    return total, kept
