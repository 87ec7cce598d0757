"""The dispatcher's decision records (`cycle.decided.*`, every stored version) and what they are
made of: placements, preemptions and their reasons, the rank inputs, the waiting summary.
`schemas.events` names them among every event."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from schemas.bounds import (
    Config,
    Count,
    Epoch,
    FloatSeconds,
    JobId,
    LongText,
    Name,
    Position,
    SortKey,
    Text,
    Token,
)
from schemas.event_base import LISTED, Event, Many, Slots
from schemas.policy import AnyPolicyConfig

PreemptReason = Literal["fairness", "maintenance", "squatting", "admin", "debug", "node_failure"]
"""`node_failure`: the job's node was lost (`NodeLost`); a resumable job is requeued."""


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    job_id: JobId
    slots: Slots


class Preemption(msgspec.Struct, frozen=True, kw_only=True):
    job_id: JobId
    reason: PreemptReason
    for_job: JobId | None = None
    note: Text = ""


class Considered(msgspec.Struct, frozen=True, kw_only=True):
    """One pending job as the cycle saw it: its sort key and, if not placed, why."""

    job_id: JobId
    sort_key: SortKey
    reason: LongText | None = None
    code: Token | None = None
    """Why it waits, as a stable word (WAIT_RESOURCES, WAIT_PRIORITY, WAIT_CONTRACT)."""


class CycleDecidedV1(Event, frozen=True, kw_only=True, tag="cycle.decided.v1"):
    """The first decision record: it copied every placement, preemption and considered job (sort
    key and reason text), 1.9 MB at 10k pending. Still read: `schemas.codec` upcasts it to
    `CycleDecided` (v3, through v2), so readers see only the latest version."""

    cycle_id: Token
    based_on: Position
    policy_version: Token
    placements: Many[Placement] = ()
    preemptions: Many[Preemption] = ()
    considered: Many[Considered] = ()
    fragmentation_gpus: Count = 0
    config: Config = {}  # noqa: RUF012 (a Struct field: msgspec copies an empty default)
    wake_at: Epoch | None = None
    decided_at: Epoch | None = None


class UsageSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the ranks a decision used counted usage (`projections.fairshare.UsagePolicy`)."""

    window_s: FloatSeconds
    half_life_s: FloatSeconds | None = None
    weights: Annotated[dict[Name, Annotated[float, msgspec.Meta(ge=0, le=1e9)]], LISTED] = {}


class RankInputs(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The fair-share ranks a decision ordered by, by reference: where they were read, a digest
    of what was read, the ranking code's version and the usage settings. Replay ranks at
    `position` (which trails `based_on` when a Kafka-fed projection lags) and names a digest
    mismatch as such. Fields at their defaults are left out of the stored bytes, so records
    written before `computed_by` existed are stored as the code writes them now."""

    position: Position
    digest: Token = ""
    """"": not recorded (records upcast from v1, which said only how usage was counted)."""
    ranking_version: Token = ""
    usage: UsageSettings
    computed_by: Token = ""
    """How the ranks were computed from the log: "" the projection's SQL (the service's), "fold"
    the in-memory usage fold (`projections.usage.UsageFold`, the simulator's). Replay ranks
    with the same computation: the two differ in the last bits of half-life usage."""


class WaitingJob(msgspec.Struct, frozen=True, array_like=True):
    """A pending job that was not placed, and why (`WAIT_RESOURCES`, `WAIT_PRIORITY`,
    `WAIT_CONTRACT`): `[job_id, code]` on the wire."""

    job_id: JobId
    code: Token


class WaitCount(msgspec.Struct, frozen=True, array_like=True):
    """How many jobs waited for one reason code: `[code, jobs]` on the wire."""

    code: Token
    jobs: Count


class WaitSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The pending jobs a cycle considered, compactly: the count, the first waiting jobs in
    order with their codes, the count per code, and a digest of the whole order (job ids, sort
    keys, codes and reason texts) that replay recomputes. Bounded whatever the queue's length."""

    considered: Count = 0
    first: Annotated[tuple[WaitingJob, ...], LISTED] = ()
    counts: Annotated[tuple[WaitCount, ...], LISTED] = ()
    order_digest: Token = ""

    def waiting(self) -> int:
        return sum(c.jobs for c in self.counts)


DigestOf = Literal["jobs", "runs"]


class Waiting(WaitSummary, frozen=True, kw_only=True):
    """The waiting summary of `cycle.decided.v4`: v3's (`WaitSummary`) plus how many runs the
    waiting jobs formed and what the order digest was computed over.

    A run is a stretch of consecutive jobs of the order that waited for one reason (code and
    text); the dispatcher keeps one per stretch, never a record per job. Jobs of one shape and
    traits that wait for one reason sit together in the fair-share order, so runs are few:
    48,551 waiting jobs made 570 runs at 50,000 pending on 4,096 nodes."""

    runs: Count = 0
    """How many runs the waiting jobs formed (0 in a record upcast from v3 or older)."""
    digest_of: DigestOf = "runs"
    """What `order_digest` covers: "runs" (v4) the order's (job id, sort key) pairs and the runs
    (start, stop, code, reason text), `schemas.digest.runs_digest`; "jobs" (a record upcast from
    v3 or older) one (job id, sort key, code, reason text) per job, `schemas.digest.order_digest`.
    Both cover the same facts; replay recomputes the one the record names."""


class _Decided(Event, frozen=True, kw_only=True):
    """The fields of a decision record since v2 (`CycleDecided` is v4). Not an event itself."""

    cycle_id: Token
    based_on: Position
    policy_version: Token
    policy: AnyPolicyConfig | None = None
    """The policy's settings (`schemas.policy`), which replay rebuilds it from. None for a
    policy no version of this build registers, and in an upcast record whose string settings no
    code of this build wrote."""
    decided_at: Epoch | None = None
    """The `now` the pure decide() was given (replay re-runs it with the same value)."""
    ranks: RankInputs | None = None
    """How the ranks were read and counted (None: the policy reads none, or an upcast v1 record
    did not say)."""
    placed: Many[JobId] = ()
    preempted: Many[JobId] = ()
    waiting: WaitSummary = WaitSummary()
    fragmentation_gpus: Count = 0
    wake_at: Epoch | None = None
    """When the decision could change without a new event (a contract ends)."""
    skipped_cycles: Count = 0


class CycleDecidedV2(_Decided, frozen=True, kw_only=True, tag="cycle.decided.v2"):
    """The second decision record: v3's fields plus the policy's settings written again as
    strings (`config`). Still read: `schemas.codec` upcasts it to `CycleDecided` (v3)."""

    config: Config = {}  # noqa: RUF012 (a Struct field: msgspec copies an empty default)


class CycleDecidedV3(_Decided, frozen=True, kw_only=True, tag="cycle.decided.v3"):
    """The third decision record: v4's fields with v3's waiting summary (`WaitSummary`), whose
    order digest covers one (job id, sort key, code, reason) per job. Still read:
    `schemas.codec` upcasts it to `CycleDecided` (v4), its summary a `Waiting` with
    `digest_of="jobs"`."""


class CycleDecided(_Decided, frozen=True, kw_only=True, tag="cycle.decided.v4"):
    """One dispatcher cycle's decision: its inputs and its outcomes by reference.

    Placements and preemptions are the `JobPlaced`/`JobPreempted` events with this `cycle_id`
    that follow it in the same append; here only their job ids, in decision order. A cycle that
    decided nothing is recorded at a bounded rate, and `skipped_cycles` counts the empty cycles
    before this record that were not recorded on their own: together they answer "why did
    nothing start between t1 and t2".

    The dispatcher hands it in as `ApplyDecision.decision` (`schemas.commands.DecisionBody`, the
    same fields with the outcomes in full). Older versions (v1, v2, v3) are upcast to this one
    by `schemas.codec`, their string settings read as the typed `policy` there.

    v4 changes only the waiting summary (`Waiting`): the runs the waiting jobs formed are
    counted and the order digest is computed over the runs (one entry per stretch of jobs
    waiting for one reason) instead of over one record per job, so the dispatcher never builds
    a record per waiting job to write its decision."""

    waiting: Waiting = Waiting()
    stopping_held: bool = False
    """Its snapshot counted the GPUs of the runs the ledger had stopped whose end was not
    recorded yet (`State.stopped_runs`: a cancelled or preempted run in its grace) held, never
    free (atk47-23 F8). False in the records written before, whose snapshot counted them free:
    replay builds each decision's snapshot by the rule its record names."""
    lost_held: bool = False
    """It also held the runs an admin's `node lost` ended whose end was not recorded (s50)."""
    placed_held: bool = False
    """It also held the runs the ledger stopped (a cancel, a preemption) while their job was
    `placed` on node agents, whose launch may have run unheard (`StoppedRun.placed`, s52,
    atk51-23 F3). False in the records written before, whose snapshot counted them free (no
    such run was kept then)."""
    grace_held: bool = False
    """It left out the pending jobs whose time limit, grace and a minute are over the MaxTime
    recorded at its position (`jobs.over_max_time`, s63: atk62b G2). False in the records
    written before, which left out only those over it in Slurm's whole minutes."""
