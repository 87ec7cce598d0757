"""What one dispatcher cycle sees: a plain value taken at one log position.

Pure: the snapshot is data. `ledger.cycle.inputs.snapshot_from_state` builds it from the write
side's `State`; this core never sees the State.
`decide()` is fed a snapshot alike by the service, a test, the simulator and a replay.

Ranks: `ranks` maps account paths to the fair-share rank (0 = best). The fair-share projection
ranks user leaves depth-first (Slurm Fair Tree); an interior account (a project or program) sorts
with its best leaf, so its rank is the smallest rank below it. `complete_ranks` fills the interior
ranks from the leaf ranks when a reader only gives leaves. `level_fs` maps account paths to their
level fair share (budget share / window usage share among siblings; `inf` when unused): the
preemption margin compares it and decision notes quote it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from schemas.events import GpuSlot

NodeState = Literal["active", "draining", "drained", "lost"]

UNRANKED = 1_000_000_000
"""The rank of an account the fair-share reader does not know yet (sorts after every ranked one)."""


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    """A node as the cycle sees it. Only `active` nodes take work."""

    name: str
    cluster: str
    gpu_type: str
    gpus: int
    state: NodeState = "active"
    free: tuple[int, ...] = ()
    """Indices of the GPUs nobody holds, ascending."""


class RunningJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job that holds GPUs (placed or running)."""

    job_id: int
    account: str
    user: str
    gpus: int
    slots: tuple[GpuSlot, ...]
    placed_at: float
    min_runtime_s: int
    """The contract: never preempted (by the dispatcher) before `placed_at + min_runtime_s`."""
    resumable: bool = False
    checkpoint_at: float | None = None
    """The last checkpoint (a placement counts as one); work after it is lost on preemption."""
    debug: bool = False
    low_util_since: float | None = None
    """Since when the job has used its GPUs below the squat threshold, or None."""
    time_limit_s: int | None = None
    """The wall time it declared (None: none; a reservation cannot count on it ending)."""
    runs: int = 0
    """How many times the job was placed and preempted before this run (0: its first run);
    `fairshare-16` prices taking it back again by it."""
    submitted_at: float = 0.0
    """When the job was submitted (a requeue keeps it; a resubmission is a new job):
    `fairshare-17` takes the free tier's newest arrivals back first."""
    takebacks: tuple[tuple[str, float], ...] = ()
    """Its preemptions for funded non-debug jobs: (that job's account, when) (`Job.takebacks`);
    `fairshare-17` counts those of another team's work."""
    ran_s: float = 0.0
    """Seconds its earlier runs held GPUs (`Job.ran_s`): it queued `placed_at - submitted_at -
    ran_s` before this run."""

    @property
    def queued_s(self) -> float:
        """Seconds it queued before this run, every wait counted (its runs' held time left out)."""
        return max(0.0, self.placed_at - self.submitted_at - self.ran_s)

    @property
    def funded(self) -> bool:
        return self.min_runtime_s > 0

    @property
    def contract_ends_at(self) -> float:
        return self.placed_at + self.min_runtime_s

    def in_contract(self, now: float) -> bool:
        return now < self.placed_at + self.min_runtime_s

    def work_lost_s(self, now: float) -> float:
        """Seconds of work a preemption at `now` throws away."""
        since = (
            self.checkpoint_at
            if self.resumable and self.checkpoint_at is not None
            else self.placed_at
        )
        return max(0.0, now - since)


class PendingJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job waiting for GPUs (submitted, or requeued after a preemption)."""

    job_id: int
    account: str
    """The project the job runs in (its team)."""
    user: str
    gpus: int
    min_runtime_s: int
    submitted_at: float
    gpu_type: str | None = None
    cluster: str | None = None
    resumable: bool = False
    priority: int = 0
    debug: bool = False
    time_limit_s: int | None = None
    runs: int = 0
    """How many times the job was placed and preempted before (0: it never ran)."""
    ran_s: float = 0.0
    """Seconds its earlier runs held GPUs (`Job.ran_s`): it has queued `now - submitted_at -
    ran_s` so far, every wait counted."""

    @property
    def funded(self) -> bool:
        return self.min_runtime_s > 0

    @property
    def leaf(self) -> str:
        return f"{self.account}/{self.user}"


@dataclass(frozen=True, slots=True)
class PendingDelta:
    """How a snapshot's pending views differ from those of the snapshot made before it by the
    same loop (`snapshot_kept`): `token` names this snapshot's pending views, `base` the last
    one's; `gone` and `came` are views (by identity: an unchanged job keeps its view). A reader
    that kept something of the `base` snapshot (fair share's order) may apply the difference
    instead of comparing every view; any other reader ignores it."""

    token: object
    base: object
    gone: tuple[PendingJob, ...]
    came: tuple[PendingJob, ...]


class Snapshot(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    """Everything `decide()` reads, taken at log position `position`."""

    position: int
    """The log position the snapshot reflects; the decision is based on it."""
    taken_at: float = 0.0
    nodes: tuple[NodeView, ...] = ()
    running: tuple[RunningJob, ...] = ()
    pending: tuple[PendingJob, ...] = ()
    ranks: dict[str, int] = msgspec.field(default_factory=dict)
    level_fs: dict[str, float] = msgspec.field(default_factory=dict)
    usage: dict[str, float] = msgspec.field(default_factory=dict)
    """Account path -> its usage (GPU-seconds, summed over the leaves below it) as the ranks
    counted it; empty unless the policy reads it (`usage_shares`): `fairshare-10` charges
    placements against it inside a cycle."""
    shares: dict[str, float] = msgspec.field(default_factory=dict)
    """Account path -> its share of its parent's (norm shares), alongside `usage`."""

    @property
    def memo(self) -> dict[Hashable, Any]:
        """Answers worked out from this snapshot alone (a policy's pool sizes, team places),
        kept with it so a cycle that asks once per waiting job works each out once: never
        part of the snapshot's value (not encoded, not compared), gone with it, and empty in
        a copy (`msgspec.structs.replace`)."""
        memo: dict[Hashable, Any] = self.__dict__.setdefault("memo_", {})
        return memo

    @property
    def delta(self) -> PendingDelta | None:
        """The pending views that went and came since the snapshot `snapshot_kept` made before
        it (`ledger.cycle.inputs`), if it knows them; like `memo`, never part of the value and
        gone in a copy."""
        found: PendingDelta | None = self.__dict__.get("delta_")
        return found

    def with_delta(self, delta: PendingDelta) -> Snapshot:
        """This snapshot, told its `delta` (set once, by the call that made it)."""
        self.__dict__["delta_"] = delta
        return self

    def rank_key(self, account: str, user: str) -> str:
        """The account whose rank orders a job: the user leaf if ranked, else the project."""
        leaf = f"{account}/{user}"
        return leaf if leaf in self.ranks else account


def complete_ranks(leaf_ranks: Mapping[str, int]) -> dict[str, int]:
    """Pure: add every ancestor of the ranked paths, ranked as its best descendant. Completing
    a completed mapping changes nothing."""
    out = dict(leaf_ranks)
    for path, rank in leaf_ranks.items():
        cut = path.find("/")
        while cut >= 0:  # the ancestors, top down
            anc = path[:cut]
            if anc not in leaf_ranks:
                have = out.get(anc)
                if have is None or rank < have:
                    out[anc] = rank
            cut = path.find("/", cut + 1)
    return out


KeptRanks = tuple[dict[str, int], dict[str, int]]
"""A copy of leaf ranks `complete_ranks_kept` completed and its answer (never changed by its
readers): its next call's `last`."""


def complete_ranks_kept(
    leaf_ranks: Mapping[str, int], last: KeptRanks | None
) -> tuple[dict[str, int], KeptRanks]:
    """Pure: `complete_ranks(leaf_ranks)`, and what to hand the next call as `last`. Leaf
    ranks equal to the last ones, in the same order, get the last answer again (compared in
    C, no walk of the paths), and so does that answer itself (completing it changes nothing):
    ranks are an order, which usage moves far less often than a cycle runs (a simulation asks
    ~7,000 times in 28 days), and a cycle completes its snapshot's ranks, then `decide()`
    asks again. The caller (the cycle's owner) keeps `last`: nothing is kept here."""
    if last is not None:
        if leaf_ranks is last[1]:
            return last[1], last
        if last[0] == leaf_ranks and list(last[0]) == list(leaf_ranks):
            return last[1], last
    out = complete_ranks(leaf_ranks)
    return out, (dict(leaf_ranks), out)


def fs_text(value: float) -> str:
    """A level fair share for a note: `inf` for unused budgets, else 3 significant digits."""
    return "inf" if math.isinf(value) else f"{value:.3g}"
