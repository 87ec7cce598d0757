"""The event vocabulary: frozen msgspec Structs, tagged, past tense.

Every event carries `event_id`, `at` (seconds since the Unix epoch, from the ledger's clock, passed
in), `actor` (who caused it; system actors start with "@") and `prev_hash` (the hash chain).
Schema evolution rules: new fields get defaults; a field's type never changes; unknown fields are
ignored on decode; a change that breaks these rules is a new tag (`.v2`).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from schemas.policy import AnyPolicyConfig

AccountKind = Literal["program", "project", "user"]
PreemptReason = Literal["fairness", "maintenance", "squatting", "admin", "debug"]
FinishOutcome = Literal["completed", "failed", "cancelled", "preempted"]


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every event. Not an event itself: it has no tag."""

    event_id: str
    at: float
    actor: str
    prev_hash: str = ""
    """SHA-256 (hex) of the previous event's stored bytes: the log is a hash chain, so an edited
    or removed event breaks the link after it. Empty for the first event. Set by the ledger."""


# --- ledger -------------------------------------------------------------------------------------


class LedgerInitialised(Event, frozen=True, kw_only=True, tag="ledger.initialised.v1"):
    """The first event of every ledger: names the first admin and the contract cap."""

    admin: str
    min_runtime_cap_s: int = 8 * 3600
    cluster: str = "default"


class AdminGranted(Event, frozen=True, kw_only=True, tag="admin.granted.v1"):
    user: str


class AdminRevoked(Event, frozen=True, kw_only=True, tag="admin.revoked.v1"):
    user: str


# --- accounts and budgets -----------------------------------------------------------------------


class AccountOpened(Event, frozen=True, kw_only=True, tag="account.opened.v1"):
    """A node of the budget tree. `path` is `parent/name`; programs may have no parent."""

    path: str
    parent: str | None
    kind: AccountKind


class AccountClosed(Event, frozen=True, kw_only=True, tag="account.closed.v1"):
    path: str
    reason: str = ""


class SharesSet(Event, frozen=True, kw_only=True, tag="account.shares_set.v1"):
    """An account's share of its parent's budget (relative to its open siblings)."""

    account: str
    shares: int
    reason: str = ""


class MemberAdded(Event, frozen=True, kw_only=True, tag="member.added.v1"):
    user: str
    project: str


class MemberRemoved(Event, frozen=True, kw_only=True, tag="member.removed.v1"):
    user: str
    project: str


class ManagerGranted(Event, frozen=True, kw_only=True, tag="manager.granted.v1"):
    """`user` may manage the subtree rooted at `account`."""

    user: str
    account: str


class ManagerRevoked(Event, frozen=True, kw_only=True, tag="manager.revoked.v1"):
    user: str
    account: str


# --- cluster ------------------------------------------------------------------------------------


class NodeRegistered(Event, frozen=True, kw_only=True, tag="node.registered.v1"):
    cluster: str
    node: str
    gpu_type: str
    gpus: int


class NodeDrainRequested(Event, frozen=True, kw_only=True, tag="node.drain_requested.v1"):
    node: str
    reason: str


class NodeDrained(Event, frozen=True, kw_only=True, tag="node.drained.v1"):
    node: str


class NodeReturned(Event, frozen=True, kw_only=True, tag="node.returned.v1"):
    node: str


class NodeRemoved(Event, frozen=True, kw_only=True, tag="node.removed.v1"):
    node: str
    reason: str = ""


# --- jobs ---------------------------------------------------------------------------------------


class GpuSlot(msgspec.Struct, frozen=True, kw_only=True):
    """The GPUs of one node that a placement holds."""

    node: str
    gpu_indices: tuple[int, ...]


class JobSubmitted(Event, frozen=True, kw_only=True, tag="job.submitted.v1"):
    """A job and its scheduling contract.

    `min_runtime_s` is the time it may not be preempted once placed; 0 means unfunded (free,
    always preemptible). `time_limit_s` is the declared wall time; a job declaring <= 15 min that
    fits on one node is the debug class (`debug`).
    """

    job_id: int
    account: str
    user: str
    gpus: int
    gpu_type: str | None = None
    cluster: str | None = None
    min_runtime_s: int
    resumable: bool = False
    priority: int = 0
    time_limit_s: int | None = None
    debug: bool = False
    command: tuple[str, ...] = ()
    labels: dict[str, str] = {}
    duration_s: float | None = None
    """Known run time for simulated execution; ignored by real executors."""


class JobPlaced(Event, frozen=True, kw_only=True, tag="job.placed.v1"):
    job_id: int
    slots: tuple[GpuSlot, ...]
    cycle_id: str
    based_on: int


class JobStarted(Event, frozen=True, kw_only=True, tag="job.started.v1"):
    job_id: int


class JobPreempted(Event, frozen=True, kw_only=True, tag="job.preempted.v1"):
    job_id: int
    reason: PreemptReason
    for_job: int | None = None
    cycle_id: str | None = None
    note: str = ""


class JobRequeued(Event, frozen=True, kw_only=True, tag="job.requeued.v1"):
    job_id: int


class JobFinished(Event, frozen=True, kw_only=True, tag="job.finished.v1"):
    job_id: int
    outcome: FinishOutcome
    exit_code: int | None = None


class UtilisationSampled(Event, frozen=True, kw_only=True, tag="job.utilisation_sampled.v1"):
    job_id: int
    gpu_utilisation: tuple[float, ...]


class CheckpointReported(Event, frozen=True, kw_only=True, tag="job.checkpointed.v1"):
    """A resumable job saved its progress: work before `at` survives a preemption."""

    job_id: int


# --- decisions ----------------------------------------------------------------------------------


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    slots: tuple[GpuSlot, ...]


class Preemption(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    reason: PreemptReason
    for_job: int | None = None
    note: str = ""


class Considered(msgspec.Struct, frozen=True, kw_only=True):
    """One pending job as the cycle saw it: its sort key and, if not placed, why."""

    job_id: int
    sort_key: tuple[float | int | str, ...]
    reason: str | None = None
    code: str | None = None
    """Why it waits, as a stable word (WAIT_RESOURCES, WAIT_PRIORITY, WAIT_CONTRACT)."""


class CycleDecidedV1(Event, frozen=True, kw_only=True, tag="cycle.decided.v1"):
    """The first decision record: it copied every placement, preemption and considered job (sort
    key and reason text), 1.9 MB at 10k pending. Still read: `schemas.codec` upcasts it to
    `CycleDecided` (v2), so readers see only the latest version."""

    cycle_id: str
    based_on: int
    policy_version: str
    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    considered: tuple[Considered, ...] = ()
    fragmentation_gpus: int = 0
    config: dict[str, str] = {}
    wake_at: float | None = None
    decided_at: float | None = None


class UsageSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the ranks a decision used counted usage (`projections.fairshare.UsagePolicy`)."""

    window_s: float
    half_life_s: float | None = None
    weights: dict[str, float] = {}


class RankInputs(msgspec.Struct, frozen=True, kw_only=True):
    """The fair-share ranks a decision ordered by, by reference: where they were read, a digest
    of what was read, the ranking code's version and the usage settings. Replay ranks at
    `position` (which trails `based_on` when a Kafka-fed projection lags) and names a digest
    mismatch as such."""

    position: int
    digest: str
    ranking_version: str
    usage: UsageSettings


class WaitingJob(msgspec.Struct, frozen=True, array_like=True):
    """A pending job that was not placed, and why (`WAIT_RESOURCES`, `WAIT_PRIORITY`,
    `WAIT_CONTRACT`): `[job_id, code]` on the wire."""

    job_id: int
    code: str


class WaitCount(msgspec.Struct, frozen=True, array_like=True):
    """How many jobs waited for one reason code: `[code, jobs]` on the wire."""

    code: str
    jobs: int


class WaitSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The pending jobs a cycle considered, compactly: the count, the first waiting jobs in
    order with their codes, the count per code, and a digest of the whole order (job ids, sort
    keys, codes and reason texts) that replay recomputes. Bounded whatever the queue's length."""

    considered: int = 0
    first: tuple[WaitingJob, ...] = ()
    counts: tuple[WaitCount, ...] = ()
    order_digest: str = ""

    def waiting(self) -> int:
        return sum(c.jobs for c in self.counts)


class CycleDecided(Event, frozen=True, kw_only=True, tag="cycle.decided.v2"):
    """One dispatcher cycle's decision: its inputs and its outcomes by reference.

    Placements and preemptions are the `JobPlaced`/`JobPreempted` events with this `cycle_id`
    that follow it in the same append; here only their job ids, in decision order. A cycle that
    decided nothing is recorded at a bounded rate, and `skipped_cycles` counts the empty cycles
    before this record that were not recorded on their own: together they answer "why did
    nothing start between t1 and t2"."""

    cycle_id: str
    based_on: int
    policy_version: str
    config: dict[str, str] = {}
    policy: AnyPolicyConfig | None = None
    """The policy's typed config (`schemas.policy`); None in records upcast from v1 (and for
    policies this build does not register), whose `config` strings say it."""
    decided_at: float | None = None
    """The `now` the pure decide() was given (replay re-runs it with the same value)."""
    ranks: RankInputs | None = None
    """None in records upcast from v1, which did not say."""
    placed: tuple[int, ...] = ()
    preempted: tuple[int, ...] = ()
    waiting: WaitSummary = WaitSummary()
    fragmentation_gpus: int = 0
    wake_at: float | None = None
    """When the decision could change without a new event (a contract ends)."""
    skipped_cycles: int = 0


AnyEvent = (
    LedgerInitialised
    | AdminGranted
    | AdminRevoked
    | AccountOpened
    | AccountClosed
    | SharesSet
    | MemberAdded
    | MemberRemoved
    | ManagerGranted
    | ManagerRevoked
    | NodeRegistered
    | NodeDrainRequested
    | NodeDrained
    | NodeReturned
    | NodeRemoved
    | JobSubmitted
    | JobPlaced
    | JobStarted
    | JobPreempted
    | JobRequeued
    | JobFinished
    | UtilisationSampled
    | CheckpointReported
    | CycleDecided
)

EVENT_TYPES: tuple[type[Event], ...] = AnyEvent.__args__
"""The latest version of every event: what `schemas.codec.decode` returns."""

StoredEvent = AnyEvent | CycleDecidedV1
"""Every version that may be stored; `schemas.codec` upcasts the older ones."""

OLDER_TYPES: tuple[type[Event], ...] = (CycleDecidedV1,)


def tag_of(cls: type[Event]) -> str:
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


TAGS: frozenset[str] = frozenset(tag_of(t) for t in EVENT_TYPES + OLDER_TYPES)
