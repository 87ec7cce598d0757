"""The v1 event vocabulary: frozen msgspec Structs, tagged, past tense.

Every event carries `event_id`, `at` (seconds since the Unix epoch, from the ledger's clock, passed
in), `actor` (who caused it; system actors start with "@") and `prev_hash` (the hash chain).
Schema evolution rules: new fields get defaults; a field's type never changes; unknown fields are
ignored on decode; a change that breaks these rules is a new tag (`.v2`).
"""

from __future__ import annotations

from typing import Literal

import msgspec

AccountKind = Literal["program", "project", "user"]
PreemptReason = Literal["fairness", "maintenance", "squatting", "admin", "debug"]
FinishOutcome = Literal["completed", "failed", "cancelled", "preempted"]
FinishReason = Literal["exit", "time_limit", "lost"]
"""Why a job's process ended: by itself, stopped at its time limit, or lost (no exit code)."""


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
    grace_s: int | None = None
    """SIGTERM-to-SIGKILL grace when the job is stopped; None: the executor's default (30 s)."""


class JobPlaced(Event, frozen=True, kw_only=True, tag="job.placed.v1"):
    job_id: int
    slots: tuple[GpuSlot, ...]
    cycle_id: str
    based_on: int


class JobStarted(Event, frozen=True, kw_only=True, tag="job.started.v1"):
    """Every part of the job has started."""

    job_id: int
    logs: tuple[str, ...] = ()
    """Where its parts' output goes (one log per part, on the part's node)."""


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
    reason: FinishReason = "exit"


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


class CycleDecided(Event, frozen=True, kw_only=True, tag="cycle.decided.v1"):
    cycle_id: str
    based_on: int
    policy_version: str
    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    considered: tuple[Considered, ...] = ()
    fragmentation_gpus: int = 0
    config: dict[str, str] = {}
    wake_at: float | None = None
    """When the decision could change without a new event (a contract ends)."""
    decided_at: float | None = None
    """The `now` the pure decide() was given (replay re-runs it with the same value)."""


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


def tag_of(cls: type[Event]) -> str:
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


TAGS: frozenset[str] = frozenset(tag_of(t) for t in EVENT_TYPES)
