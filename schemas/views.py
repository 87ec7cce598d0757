"""The output contract: the shape of every read, as frozen msgspec Structs.

`ledger/reads/layer.py` returns these; the CLI prints them (`--json` encodes them, tables format
them) and the HTTP API returns the same values. Rules every view follows:

- strict JSON: no NaN or infinity anywhere. A level fair share that is infinite (no recent usage)
  is `null` with `level_fs_infinite: true`;
- units live in key names: `*_s` seconds, `*_at` seconds since the Unix epoch (UTC),
  `*_gpu_hours` GPU-hours, `*_gpu_s` GPU-seconds;
- a value that is not known is `null`, never a sentinel number.

Filters (`JobFilter`, `QueueFilter`, ...) are Structs too, so the CLI and the HTTP API validate
them through the same types. Exported as JSON Schema beside the events (`schemas/json/views/`).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from schemas.events import AnyEvent, FinishReason, GpuSlot

JobStatusWord = Literal["pending", "held", "placed", "running", "stopping", "finished"]
Limit = Annotated[int, msgspec.Meta(ge=1, le=100_000)]
Epoch = Annotated[float, msgspec.Meta(ge=0.0, le=32_503_680_000.0)]
"""A time in seconds since the Unix epoch, before the year 3000."""


class _View(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


# --- filters --------------------------------------------------------------------------------


class JobFilter(_View, frozen=True, kw_only=True):
    """Which jobs `jobs` lists: all filters combine; newest first."""

    status: Literal["pending", "held", "placed", "running", "finished", "active"] | None = None
    """`running` takes the jobs whose processes run, `stopping` ones (past their limit) too."""
    user: str | None = None
    account: str | None = None
    """This account and everything below it."""
    since: Epoch | None = None
    """Jobs that were submitted, or ended, at or after this time (sacct's -S)."""
    until: Epoch | None = None
    """Jobs submitted at or before this time (sacct's -E)."""
    limit: Limit = 200
    at: Epoch | None = None
    """The ledger as it was at this moment (default now): jobs submitted later are not listed,
    the others are as they were then, running jobs' elapsed time measured then."""
    job_ids: (
        Annotated[
            tuple[Annotated[int, msgspec.Meta(ge=1, le=2**53)], ...],
            msgspec.Meta(max_length=1_000),
        ]
        | None
    ) = None
    """Only these jobs, and every task of an array whose id is among them (sacct's -j)."""
    before_id: Annotated[int, msgspec.Meta(ge=1, le=2**53)] | None = None
    """Only jobs with a smaller id: the page after one whose last row is this job (a page is
    newest first by job id, which no two jobs share; a page cut at its bytes says so)."""
    reasons: Annotated[tuple[FinishReason, ...], msgspec.Meta(max_length=8)] | None = None
    """Only finished jobs that ended for one of these reasons (`finish_reason`; sacct's
    `-s CD,F,TO,...`, read by `jobs --status`)."""


class QueueFilter(_View, frozen=True, kw_only=True):
    """Which pending jobs `queue` and `priority` show (like squeue's -u, -A, --state)."""

    user: str | None = None
    account: str | None = None
    """This account and everything below it."""
    state: Literal["pending", "held", "running", "queued", "all"] = "queued"
    """`queued` (the default): pending and held; `running`: the jobs that hold GPUs; `all`:
    every one of those (like squeue's default)."""
    limit: Limit = 50


class LogFilter(_View, frozen=True, kw_only=True):
    after: Annotated[int, msgspec.Meta(ge=0, le=2**62)] = 0
    """Events after this position."""
    limit: Limit = 100
    tail: Annotated[int, msgspec.Meta(ge=1, le=100_000)] | None = None
    """Only the last `tail` events (after `after`)."""


# --- budget tree and nodes (current state) ---------------------------------------------------


class AccountNode(_View, frozen=True, kw_only=True):
    """One open account of the budget tree, depth first."""

    path: str
    kind: Literal["program", "project", "user"]
    depth: int
    shares: int
    norm_shares: float
    """shares / the open siblings' shares (0 when they sum to 0)."""
    members: list[str] = []
    managers: list[str] = []


class NodeRow(_View, frozen=True, kw_only=True):
    node: str
    cluster: str
    gpu_type: str
    gpus: int
    free_gpus: int
    state: Literal["active", "draining", "drained", "removed", "lost"]
    jobs: list[int] = []
    drain_reason: str = ""
    lost_reason: str = ""
    foreign_gpus: list[int] = []
    """GPUs that work outside the ledger holds (Slurm jobs it did not submit, on any partition),
    as the service last observed them: not free (empty where no service observes an engine)."""
    stopping_gpus: list[int] = []
    """GPUs of runs the ledger stopped (cancel, preemption, requeue) whose processes are not all
    gone yet (their grace), as the service last observed them: not free; the next job starts on
    them once they are."""
    stopping_jobs: list[int] = []
    """The jobs stopping on it (`ledger.reads.stopping`): past their time limit in their grace
    (among `jobs`), or a run the ledger stopped whose processes are not gone yet (no longer
    among `jobs`: their GPUs are `stopping_gpus` while observed so)."""
    heard_from: float | None = None
    """When the service last heard from the node (its agent's last request; on Slurm, slurmd's
    last answer), epoch seconds, as its engine knows it at the read (None where no service
    observes one, or it has not heard from the node since it started): a kill the ledger
    ordered for a run on a node not heard from is sent once its agent is back (atk52-23 F6)."""


# --- jobs (history, from the projection) ------------------------------------------------------


class JobRow(_View, frozen=True, kw_only=True):
    """One job like sacct shows it."""

    job_id: int
    account: str
    user: str
    gpus: int
    gpu_type: str | None
    cluster: str | None
    status: JobStatusWord
    outcome: Literal["completed", "failed", "cancelled", "preempted"] | None
    exit_code: int | None
    funded: bool
    min_runtime_s: int
    resumable: bool
    priority: int
    debug: bool
    time_limit_s: int | None
    submitted_at: float
    placed_at: float | None
    """The current placement (null when it holds no GPUs)."""
    started_at: float | None
    """When it last started running."""
    finished_at: float | None
    """When it ended: its last run's real end once recorded; null while it runs, and while a
    job cancelled or preempted is `stopping` (its processes in their grace)."""
    elapsed_s: float | None
    """Run time of its last run: from start (or placement) to its end, or to `now` if running."""
    nodes: list[str]
    """The nodes it holds, or its last run held (finished); [] while it waits."""
    placements: int
    preemptions: int
    command: list[str] = []
    logs: list[str] = []
    """Where its last run's output goes: one log per part, on the part's node."""
    finish_reason: FinishReason | None = None
    """Why it ended (`schemas.events.FinishReason`: completed, failed, cancelled, time_limit,
    preempted, node_lost, dependency_never_satisfied, launch_failed); null until its record
    ends (a cancelled job still `stopping` in its grace has it)."""
    finish_note: str = ""
    """More about its end, in words (why a launch failed, which dependency can never hold)."""
    slots: list[GpuSlot] = []
    """The GPUs it holds, or its last run held (finished), node by node."""
    engine_job_id: str | None = None
    """The execution engine's id of its last run (a Slurm job id); null where the engine names
    no runs."""
    kill_at: float | None = None
    """A `stopping` job (past its time limit, or cancelled or preempted: SIGTERM sent, its
    processes in their grace): when it is SIGKILLed at the latest, its limit or its stop plus
    its grace (`ledger.reads.stopping`); null otherwise."""
    job_name: str = ""
    workdir: str = ""
    """The directory it starts in ("" the engine's default)."""
    array_job_id: int | None = None
    """A job array's first task id (`%A`); null for a job that is no array."""
    array_task_id: int | None = None
    redacted: Annotated[
        bool,
        msgspec.Meta(
            description="True: this viewer may not see the job's command and logs (only its "
            "owner, the managers of its account or of one above it, and admins may); `command` "
            "and `logs` are then empty."
        ),
    ] = False


# --- the log ------------------------------------------------------------------------------------


class LogEntry(_View, frozen=True, kw_only=True):
    position: int
    tag: str
    """The event's tag as it is read: the latest version of its type (an event stored as an older
    version is read upcast, and `tag` names that version, as `event.type` does); an unknown
    type's stored tag. The stored tag is the projection's `events.tag` (`audit sql`)."""
    at: float | None
    actor: str | None
    event: AnyEvent | None
    """The event; null for an event type this version does not know (`tag` still names it)."""
    redacted: Annotated[
        bool,
        msgspec.Meta(
            description="True: the event belongs to a job whose command, labels and logs this "
            "viewer may not see (only its owner, the managers of its account or of one above "
            "it, and admins may): in `event` they are empty (`command`, `labels` and `env` of "
            "`job.submitted.v2`, `logs` of `job.started.v1`)."
        ),
    ] = False


# --- queue, priority, explain --------------------------------------------------------------------


class KeyPart(_View, frozen=True, kw_only=True):
    """One named part of a job's sort key (like a column of sprio)."""

    name: str
    value: float | int | str
    meaning: str


class QueueRow(_View, frozen=True, kw_only=True):
    order: int | None
    """1-based place in dispatch order; null for a held job (it is not considered)."""
    job_id: int
    account: str
    user: str
    gpus: int
    funded: bool
    debug: bool
    state: Literal["pending", "held", "placed", "running", "stopping"]
    """`stopping`: past its time limit in its grace, or a run the ledger stopped (cancelled,
    preempted, requeued) whose processes are not gone yet, like squeue's `CG`
    (`ledger.reads.stopping`)."""
    sort_key: list[float | int | str]
    code: str
    """NEXT_CYCLE (placed in the next cycle), HELD, WAIT_DEPENDENCY, WAIT_ARRAY_LIMIT,
    PARTITION_TIME_LIMIT (its time limit over the engine's longest: Slurm's partition MaxTime),
    the dispatcher's WAIT_* code; PLACED or RUNNING for a job that holds GPUs (`--state
    running`)."""
    reason: str
    submitted_at: float
    waiting_s: float
    estimated_start_at: float | None
    """An estimate from the jobs ahead and the running jobs' time limits and contracts (for a
    job that holds GPUs, when it started); null when it cannot be known."""
    nodes: list[str] = []
    """The nodes a placed or running job holds."""
    started_at: float | None = None
    """When a running job's current run started (its engine's start); null otherwise."""
    time_limit_s: int | None = None
    """The job's time limit (null: none)."""
    elapsed_s: float | None = None
    """A running job's run time at the moment read (from `started_at`, as `jobs` says it);
    null otherwise. `waiting_s` of a job that holds GPUs is the wait it had, not this."""
    remaining_s: float | None = None
    """A running job's time limit less `elapsed_s` (0 once passed); null without a limit."""
    kill_at: float | None = None
    """A `stopping` job's SIGKILL at the latest (its limit, or its stop, plus its grace; the
    stop itself after a second cancel); null otherwise."""


class PriorityRow(_View, frozen=True, kw_only=True):
    """A pending job's sort key with each part named (like sprio)."""

    order: int
    job_id: int
    account: str
    user: str
    policy: str
    parts: list[KeyPart]


class ExplainEvent(_View, frozen=True, kw_only=True):
    at: float
    tag: str
    text: str


class ExplainView(_View, frozen=True, kw_only=True):
    """Why a job is where it is: structured fields plus the same in sentences (`lines`)."""

    job_id: int
    status: JobStatusWord
    outcome: str | None
    code: str | None
    """Pending: NEXT_CYCLE, HELD or the WAIT_* code; otherwise null."""
    reason: str | None
    position: int | None
    """1-based place in dispatch order (pending only)."""
    queue_length: int | None
    blocking_jobs: list[int]
    """Pending jobs ahead of it in dispatch order (at most 50), or the running jobs whose
    contracts it waits for."""
    sort_key: list[float | int | str] | None
    estimated_start_at: float | None
    contract_ends_at: float | None
    history: list[ExplainEvent]
    lines: list[str]


# --- fair share, usage, delivered ---------------------------------------------------------------


class ShareRow(_View, frozen=True, kw_only=True):
    """One account as Slurm's `sshare -l` shows it under Fair Tree (same names, same math)."""

    account: str
    parent: str | None
    kind: str
    depth: int
    raw_shares: int
    norm_shares: float
    """NormShares: shares / the open siblings' shares."""
    raw_usage_gpu_s: float
    """RawUsage: funded (weighted) GPU-seconds in the window, or decayed GPU-seconds."""
    norm_usage: float
    """NormUsage: RawUsage / the whole tree's usage."""
    effectv_usage: float
    """EffectvUsage: RawUsage / the parent's usage (the open siblings' usage)."""
    level_fs: float | None
    """LevelFS: NormShares / EffectvUsage; null when infinite (see `level_fs_infinite`)."""
    level_fs_infinite: bool
    """True when LevelFS is infinite: no usage in the window, so it ranks first."""
    rank: int | None
    """User leaves: Fair Tree rank, 1 the best."""
    fair_share: float | None
    """FairShare: user leaves, (N - rank + 1) / N."""


class UsageRow(_View, frozen=True, kw_only=True):
    name: str
    usage_gpu_hours: float


class TeamDelivered(_View, frozen=True, kw_only=True):
    team: str
    owed_gpu_hours: float
    delivered_gpu_hours: float
    by_period: float | None
    hour_by_hour: float | None


class DeliveredView(_View, frozen=True, kw_only=True):
    start_at: float
    end_at: float
    team_depth: int
    teams: list[TeamDelivered]
    by_period: float | None
    """Sum over teams of min(delivered, owed) / sum of owed."""
    hour_by_hour: float | None
    """Sum over teams and hours of min(delivered, owed) / sum of owed."""
    teams_at_95: int
    teams_owed: int
    worst_team: str | None
    worst: float | None


class SquatterRow(_View, frozen=True, kw_only=True):
    job_id: int
    account: str
    user: str
    gpus: int
    idle_since_at: float
    past_contract: bool
    managers: list[str]


class ProjectionStatusView(_View, frozen=True, kw_only=True):
    position: int
    events: int
    unknown_events: int
    unknown_tags: dict[str, int]


# --- audit -----------------------------------------------------------------------------------


class CheckItem(_View, frozen=True, kw_only=True):
    position: int
    at: float
    code: str
    message: str
    job_id: int | None = None


class CheckView(_View, frozen=True, kw_only=True):
    """`audit check`: the invariants over the whole log."""

    events: int
    violations: list[CheckItem]
    noted: list[CheckItem]
    """Allowed exceptions: admin preemptions inside a contract, with a reason."""


class AuditJobRow(_View, frozen=True, kw_only=True):
    """One line of a job's history (`audit job`): an event, or a run of cycles it waited in."""

    position: int
    occurred_at: float
    event: str
    actor: str
    detail: str
    until_at: float | None = None


class PreemptionRow(_View, frozen=True, kw_only=True):
    position: int
    preempted_at: float
    job_id: int
    account: str | None
    user_name: str | None
    gpus: int | None
    reason: str
    for_job: int | None
    note: str | None
    actor: str
    cycle_id: str | None
    funded: bool | None
    resumable: bool | None
    placed_at: float | None
    held_s: float | None
    min_runtime_s: int | None
    inside_contract: bool


class PreemptionReportRow(_View, frozen=True, kw_only=True):
    """One preemption in `report preemptions`: the victim, why, for whom, the work lost."""

    position: int
    preempted_at: float
    side: Literal["suffered", "caused", "both", "all"]
    """For the account asked about: its job was the victim, its waiting job the cause, or both
    (victim and beneficiary in its subtree); "all" when no account was asked about."""
    job_id: int
    account: str | None
    user_name: str | None
    gpus: int | None
    reason: str
    rule: str
    """The victim rule the policy noted (why this job, e.g. "unfunded first")."""
    for_job: int | None
    for_account: str | None
    for_user: str | None
    actor: str
    cycle_id: str | None
    resumable: bool | None
    placed_at: float | None
    held_s: float | None
    lost_gpu_hours: float
    """GPUs x the time since the placement (a resumable job: since its last checkpoint)."""


class PreemptionReportView(_View, frozen=True, kw_only=True):
    account: str | None
    side: Literal["of", "by", "both"]
    start: float | None
    end: float | None
    suffered: int
    """Preemptions of the subtree's jobs (with no account: every preemption)."""
    caused: int
    """Preemptions for the subtree's waiting jobs, those inside the subtree too (with no account:
    every preemption that was for a waiting job)."""
    lost_gpu_hours: float
    """Lost by the account's own jobs (suffered), or by every job with no account."""
    caused_lost_gpu_hours: float = 0.0
    """Lost by the jobs preempted for the account's waiting jobs (caused; with no account: for
    every waiting job)."""
    rows: list[PreemptionReportRow]


class BudgetChangeRow(_View, frozen=True, kw_only=True):
    position: int
    changed_at: float
    who: str
    change: str
    account: str | None
    user_name: str | None
    kind: str | None
    shares_before: int | None
    shares_after: int | None
    reason: str


# --- dashboard (series and maps the web pages draw) -------------------------------------------


class TeamPoint(_View, frozen=True, kw_only=True):
    at: float
    """Start of the bucket."""
    owed_gpu_hours: float
    delivered_gpu_hours: float


class TeamSeries(_View, frozen=True, kw_only=True):
    team: str
    points: list[TeamPoint]


class DeliveredSeriesView(_View, frozen=True, kw_only=True):
    """Owed against delivered GPU-hours per team, bucket by bucket (burst: delivered above
    owed)."""

    start_at: float
    end_at: float
    bucket_s: float
    teams: list[TeamSeries]


class GpuRow(_View, frozen=True, kw_only=True):
    """One GPU of a node in service and the job holding it (null: free)."""

    node: str
    gpu: int
    node_state: str
    job_id: int | None = None
    user: str | None = None
    account: str | None = None
    utilisation_pct: float | None = None
    """The holding job's last utilisation sample (null: none reported)."""


class DecisionRow(_View, frozen=True, kw_only=True):
    """One recorded dispatcher cycle with its counts."""

    position: int
    cycle_id: str
    decided_at: float
    based_on: int
    policy_version: str
    placed: list[int]
    preempted: list[int]
    considered: int
    fragmentation_gpus: int


class CountRow(_View, frozen=True, kw_only=True):
    name: str
    count: int


VIEW_TYPES: tuple[type[msgspec.Struct], ...] = (
    JobFilter,
    QueueFilter,
    LogFilter,
    AccountNode,
    NodeRow,
    JobRow,
    LogEntry,
    KeyPart,
    QueueRow,
    PriorityRow,
    ExplainEvent,
    ExplainView,
    ShareRow,
    UsageRow,
    TeamDelivered,
    DeliveredView,
    SquatterRow,
    ProjectionStatusView,
    CheckItem,
    CheckView,
    AuditJobRow,
    PreemptionRow,
    PreemptionReportRow,
    PreemptionReportView,
    BudgetChangeRow,
    TeamPoint,
    TeamSeries,
    DeliveredSeriesView,
    GpuRow,
    DecisionRow,
    CountRow,
)
"""Every view and filter, exported as `schemas/json/views/<Name>.json`."""
