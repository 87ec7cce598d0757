"""The event vocabulary: frozen msgspec Structs, tagged, past tense.

Every event carries `event_id`, `at` (seconds since the Unix epoch, from the ledger's clock, passed
in), `actor` (who caused it; system actors start with "@") and `prev_hash` (the hash chain).
Schema evolution rules: new fields get defaults; a field's type never changes; unknown fields are
ignored on decode; a change that breaks these rules is a new tag (`.v2`).

Every field is bounded (`schemas.bounds`); the bounds are the commands' bounds, so every event the
ledger writes is inside them. An event stored before the bounds existed and outside them still
decodes: `codec.decode` clamps it into them (see `codec.clamp`).
"""

from __future__ import annotations

import typing
from typing import Annotated, Literal

import msgspec

from schemas.bounds import (
    AccountPath,
    Actor,
    ArrayIndex,
    ArrayLimit,
    CommandLine,
    Count,
    Environment,
    Epoch,
    ExitCode,
    FloatSeconds,
    GpuIndices,
    GraceSeconds,
    JobGpus,
    JobId,
    JobName,
    Labels,
    LogPaths,
    Name,
    NodeGpus,
    Path,
    Position,
    PositiveInterval,
    PositiveSeconds,
    Priority,
    Seconds,
    Sha256Hex,
    Shares,
    Text,
    Token,
    TokenId,
    Ulimits,
    Umask,
    Utilisation,
)
from schemas.decisions import Considered as Considered
from schemas.decisions import CycleDecided as CycleDecided
from schemas.decisions import CycleDecidedV1 as CycleDecidedV1
from schemas.decisions import CycleDecidedV2 as CycleDecidedV2
from schemas.decisions import CycleDecidedV3 as CycleDecidedV3
from schemas.decisions import Placement as Placement
from schemas.decisions import Preemption as Preemption
from schemas.decisions import PreemptReason as PreemptReason
from schemas.decisions import RankInputs as RankInputs
from schemas.decisions import UsageSettings as UsageSettings
from schemas.decisions import WaitCount as WaitCount
from schemas.decisions import Waiting as Waiting
from schemas.decisions import WaitingJob as WaitingJob
from schemas.decisions import WaitSummary as WaitSummary
from schemas.event_base import LISTED, ManagerEvent, Many, MemberEvent, NodeEvent, Slots
from schemas.event_base import Event as Event
from schemas.event_base import GpuSlot as GpuSlot
from schemas.event_base import JobEvent as JobEvent
from schemas.policy import AnyPolicyConfig

AccountKind = Literal["program", "project", "user"]
FinishOutcome = Literal["completed", "failed", "cancelled", "preempted"]
EndReason = Literal["exited", "time_limit", "node_failure", "cancelled", "out_of_memory", "lost"]
"""Why an execution engine says a job's run ended: its own exit, the engine's time limit, a node
failure, a cancel from outside the ledger, the memory limit, or no trace of it in the engine."""
FinishReason = Literal[
    "completed",
    "failed",
    "cancelled",
    "time_limit",
    "preempted",
    "node_lost",
    "dependency_never_satisfied",
    "launch_failed",
]
"""Why a job ended, the ledger's word (`JobFinished.reason`; `jobs` shows it as `finish_reason`):
`completed` it exited 0 by itself; `failed` it exited otherwise (or its run vanished);
`cancelled` by its owner, a manager or an admin (or outside the ledger, in the engine);
`time_limit` stopped at its time limit; `preempted` preempted and not resumable; `node_lost` its
node was lost and it was not resumable; `dependency_never_satisfied` a job it depends on ended so
that it can never run (Slurm's DependencyNeverSatisfied); `launch_failed` it could not be started
(no OS account to run it as, a command the engine cannot start)."""
FINISH_REASONS: tuple[str, ...] = typing.get_args(FinishReason)
DependencyKind = Literal["afterok", "afterany", "afternotok", "singleton"]
"""Slurm's `--dependency` kinds: start after the named jobs completed (exit 0), ended in any way,
ended other than completed; `singleton`: after every earlier job of the same user and name."""


# --- ledger -------------------------------------------------------------------------------------


class LedgerInitialised(Event, frozen=True, kw_only=True, tag="ledger.initialised.v1"):
    """The first event of every ledger: names the first admin and the contract cap."""

    admin: Name
    min_runtime_cap_s: PositiveSeconds = 8 * 3600
    cluster: Name = "default"


class AdminGranted(Event, frozen=True, kw_only=True, tag="admin.granted.v1"):
    user: Name


class AdminRevoked(Event, frozen=True, kw_only=True, tag="admin.revoked.v1"):
    user: Name


# --- accounts and budgets -----------------------------------------------------------------------


class AccountOpened(Event, frozen=True, kw_only=True, tag="account.opened.v1"):
    """A node of the budget tree. `path` is `parent/name`; programs may have no parent."""

    path: AccountPath
    parent: AccountPath | None
    kind: AccountKind


class AccountClosed(Event, frozen=True, kw_only=True, tag="account.closed.v1"):
    path: AccountPath
    reason: Text = ""


class SharesSet(Event, frozen=True, kw_only=True, tag="account.shares_set.v1"):
    """An account's share of its parent's budget (relative to its open siblings)."""

    account: AccountPath
    shares: Shares
    reason: Text = ""


class MemberAdded(MemberEvent, frozen=True, kw_only=True, tag="member.added.v1"):
    """`user` becomes a member of `project`: may submit there."""


class MemberRemoved(MemberEvent, frozen=True, kw_only=True, tag="member.removed.v1"):
    """`user` is no longer a member of `project`."""


class ManagerGranted(ManagerEvent, frozen=True, kw_only=True, tag="manager.granted.v1"):
    """`user` may manage the subtree rooted at `account`."""


class ManagerRevoked(ManagerEvent, frozen=True, kw_only=True, tag="manager.revoked.v1"):
    """`user` no longer manages the subtree rooted at `account`."""


# --- cluster ------------------------------------------------------------------------------------


class NodeRegistered(Event, frozen=True, kw_only=True, tag="node.registered.v1"):
    cluster: Name
    node: Name
    gpu_type: Name
    gpus: NodeGpus


class NodeDrainRequested(NodeEvent, frozen=True, kw_only=True, tag="node.drain_requested.v1"):
    reason: Text


class NodeDrained(NodeEvent, frozen=True, kw_only=True, tag="node.drained.v1"):
    """A draining node holds no more work: it is out of service."""


class NodeReturned(NodeEvent, frozen=True, kw_only=True, tag="node.returned.v1"):
    """A drained or lost node is back in service."""


class NodeRemoved(NodeEvent, frozen=True, kw_only=True, tag="node.removed.v1"):
    reason: Text = ""


class NodeAgentChanged(NodeEvent, frozen=True, kw_only=True, tag="node.agent_changed.v1"):
    """Another node agent holds the node from now on (`ledger.engines.agents.AgentExecutor.take`):
    `agent` is a digest of the id the agent keeps in its state directory (never the id itself).
    Recorded only when the holder changes, so a restarted server (or a new leader) still knows
    which agent holds each node and refuses another while the old one's runs may be alive."""

    agent: Text


class NodeLost(NodeEvent, frozen=True, kw_only=True, tag="node.lost.v1"):
    """The node stopped answering (an engine marks it down, or its heartbeats stopped): it takes
    no work until returned. With `fence_s` 0 it is recorded with the endings of the jobs it held
    (resumable ones requeued, the others failed). Otherwise its runs are *in doubt* until
    `at + fence_s` plus each job's grace: they may still be alive (a partitioned node), so
    nothing is ended, requeued or relaunched until its agent says how each ended (recorded as it
    happened, with its real time) or the fence passes (by then the node's own fence has
    stopped them: they end `node_failure`); a node that returns meanwhile keeps them."""

    reason: Text
    fence_s: Seconds = 0


# --- jobs ---------------------------------------------------------------------------------------


class Dependency(msgspec.Struct, frozen=True, kw_only=True):
    """One term of a job's dependency (all terms must hold): `kind` over `job_ids` (a job id
    that names a job array stands for every task of it); `singleton` names no jobs."""

    kind: DependencyKind
    job_ids: Annotated[tuple[JobId, ...], LISTED] = ()


class _Submitted(JobEvent, frozen=True, kw_only=True):
    """The fields of a submission since v1. Not an event itself."""

    account: AccountPath
    user: Name
    gpus: JobGpus
    gpu_type: Name | None = None
    cluster: Name | None = None
    min_runtime_s: Seconds
    resumable: bool = False
    priority: Priority = 0
    time_limit_s: PositiveSeconds | None = None
    debug: bool = False
    command: CommandLine = ()
    labels: Labels = {}  # noqa: RUF012 (a Struct field: msgspec copies an empty default)
    duration_s: FloatSeconds | None = None
    """Known run time for simulated execution; ignored by real executors."""
    grace_s: GraceSeconds | None = None
    """SIGTERM-to-SIGKILL grace when the job is stopped; None: the executor's default (30 s)."""


class JobSubmittedV1(_Submitted, frozen=True, kw_only=True, tag="job.submitted.v1"):
    """The first submission record: the contract without the job's world (working directory,
    environment, output files, name, array, dependency). Still read: `schemas.codec` upcasts it
    to `JobSubmitted` (v2) with those fields empty (the engine's defaults)."""


class JobSubmitted(_Submitted, frozen=True, kw_only=True, tag="job.submitted.v2"):
    """A job, its scheduling contract and its world.

    `min_runtime_s` is the time it may not be preempted once placed; 0 means unfunded (free,
    always preemptible). `time_limit_s` is the declared wall time; a job declaring <= 15 min that
    fits on one node is the debug class (`debug`).

    The job's world, as sbatch takes it: it starts in `workdir` (absolute; "" the engine's
    default) with `env` (the submitter's environment after `--export`, secrets stripped) plus the
    ledger's own variables, writes its output to `stdout` and its errors to `stderr` (patterns
    with `%j %u %x %a %A`, relative to `workdir`; "" for stderr is stdout). A job array's tasks are
    one job each, `array_job_id` the first task's job id, at most `array_limit` of them holding
    GPUs at once; `dependency` holds it until the jobs it names end as it asks.
    """

    workdir: Path = ""
    env: Environment = {}  # noqa: RUF012 (a Struct field: msgspec copies an empty default)
    stdout: Path = ""
    stderr: Path = ""
    job_name: JobName = ""
    array_job_id: JobId | None = None
    array_task_id: ArrayIndex | None = None
    array_limit: ArrayLimit | None = None
    dependency: Annotated[tuple[Dependency, ...], LISTED] = ()
    umask: Umask | None = None
    """The submitter's umask (sbatch keeps it too): the job runs with it, and the output files
    it names are made with it. None (a submission recorded before the field, or over HTTP
    without one): the engine's old rule, the files the user's alone (0600) and the job with
    the service's umask."""
    ulimits: Ulimits | None = None
    """The submitter's soft resource limits (`bounds.LIMIT_NAMES`; -1 unlimited), as Slurm's
    PropagateResourceLimits=ALL carries them to the job: the job starts with each, never above
    its node's hard limit (then at that hard limit, and its error file says so). None (recorded
    before the field, or over HTTP without one) or empty (`submit --propagate=NONE`): the job
    keeps the limits its engine gives it."""
    max_time_s: PositiveSeconds | None = None
    """The engine's longest time limit (Slurm's partition MaxTime) as the service last
    recorded it (`ServiceConfigured.max_time_s`) when the job was submitted without a time
    limit of its own: `time_limit_s` was taken from it (`ledger.core.jobs.taken_limit`: MaxTime
    less the job's grace and a minute, so the ledger stops it itself before Slurm's TIMEOUT
    would, as Slurm gives a job without `--time` its partition's limit). None: `time_limit_s`
    is the job's own (or none, on an engine without a MaxTime)."""


class JobPlaced(JobEvent, frozen=True, kw_only=True, tag="job.placed.v1"):
    slots: Slots
    cycle_id: Token
    based_on: Position


class JobStarted(JobEvent, frozen=True, kw_only=True, tag="job.started.v1"):
    """Every part of the job has started."""

    logs: LogPaths = ()
    """Where its parts' output goes (one log per part, on the part's node)."""
    started_at: Epoch | None = None
    """When the engine says the run really started (its last part's process, Slurm's StartTime),
    when it says; never before the placement nor after this event. None: at this event."""


class JobPreempted(JobEvent, frozen=True, kw_only=True, tag="job.preempted.v1"):
    reason: PreemptReason
    for_job: JobId | None = None
    cycle_id: Token | None = None
    note: Text = ""


class JobRequeued(JobEvent, frozen=True, kw_only=True, tag="job.requeued.v1"):
    """A resumable job goes back to the queue (after a preemption or a lost node)."""


class JobUnplaced(JobEvent, frozen=True, kw_only=True, tag="job.unplaced.v1"):
    """Its engine took a placed run that never started back (Slurm would not start it: the
    partition an admin paused, a leaked GPU, a node the partition does not list): the job is
    pending again, same id, its GPUs free, and its next placement is a new run. Not a
    preemption: no contract of its was cut, and nothing ran to charge (docs/slurm.md)."""

    run: Count
    """The run taken back (0 for the first): as `JobRunEnded.run`."""
    reason: Text = ""
    """Why its engine could not start it, in words."""


class JobHeld(JobEvent, frozen=True, kw_only=True, tag="job.held.v1"):
    """A pending job is held (like `scontrol hold`): the dispatcher skips it until released."""

    reason: Text = ""


class JobReleased(JobEvent, frozen=True, kw_only=True, tag="job.released.v1"):
    """A held job may be scheduled again."""


class _Finished(JobEvent, frozen=True, kw_only=True):
    """The fields of a job's end since v1. Not an event itself."""

    outcome: FinishOutcome
    exit_code: ExitCode | None = None


class RunPart(msgspec.Struct, frozen=True, kw_only=True):
    """One part of a run as its engine observed it: where it runs, the GPUs it was given, its
    leader's pid and what holds its processes (a cgroup, or the session of the fallback)."""

    node: Name
    gpu_indices: GpuIndices = ()
    pid: Count = 0
    tree: Text = ""


class JobFinishedV1(_Finished, frozen=True, kw_only=True, tag="job.finished.v1"):
    """The first end record: an outcome without the reason. Still read: `schemas.codec` upcasts
    it to `JobFinished` (v2) with the reason its outcome says."""


class JobFinished(_Finished, frozen=True, kw_only=True, tag="job.finished.v2"):
    """A job ended: its outcome (completed, failed, cancelled, preempted), why (`reason`, one of
    `FinishReason`), in words when there is more to say (`note`), and when its run really ended
    when the engine says (`ended_at`: an exit recorded later, e.g. while the service was down;
    None: at `at`)."""

    reason: FinishReason
    note: Text = ""
    ended_at: Epoch | None = None


class JobEngineLinked(JobEvent, frozen=True, kw_only=True, tag="job.engine_linked.v1"):
    """A run of the job is the execution engine's job `engine_job_id` (e.g. a Slurm job id).
    Recorded with the run's JobStarted; a requeued job's next run links a new engine job."""

    engine: Name
    engine_job_id: Name
    run: Count = 0
    """Which placement of the job this is (0 first, 1 after the first preemption, ...): the
    run's generation. A report about an older run is never taken for the current one."""
    gpus: Many[GpuSlot] = ()
    """The GPUs the engine says the run got (Slurm: `scontrol -d`'s GRES IDX, or a pinned
    node's JOB_GRES; node agents: the devices each part was given); when it cannot say (Slurm,
    a run first seen after it ended on a node whose GPUs are not pinned), the placement's: the
    engine was asked for exactly those. Empty only in records made before that rule."""
    started_at: Epoch | None = None
    """When the engine says the run started (as in its JobStarted)."""
    parts: Annotated[tuple[RunPart, ...], LISTED] = ()
    """What the engine observed of each part (node agents: leader pid and cgroup)."""


FENCED_STATE = "FENCED"
"""`JobEngineEnded.engine_state` of a run ended at its lost node's fence, with no word from the
node: a presumption, not the run's real end. Every usage fold (the SQL projection, the
in-memory fold, the reference, the audit) waits for the real end its node's agent reports on
its return (`JobRunEnded`), charged to the release (the fence) until then (atk46-23 F5)."""


def fenced(ev: JobEngineEnded) -> bool:
    """Pure: the end is the fence's presumption (`FENCED_STATE`), not the engine's word."""
    return ev.engine_state == FENCED_STATE


class _EngineEnded(JobEvent, frozen=True, kw_only=True):
    """How the execution engine says a run ended, recorded with the run's JobFinished."""

    engine: Name
    engine_job_id: Name
    reason: EndReason
    engine_state: Name = ""
    """The engine's own word for the ending (Slurm: COMPLETED, FAILED, TIMEOUT, NODE_FAIL, ...);
    `FENCED` (`FENCED_STATE`): no engine's word, the ledger's when its node's fence passed."""
    exit_code: ExitCode | None = None
    ended_at: Epoch | None = None
    """When the run really ended (as in its JobFinished); for a `FENCED` end, the fence's time,
    which the run's real end wins over once its node reports it (`JobRunEnded`)."""
    note: Text = ""
    """What else the engine says: why a launch failed, processes the leader left behind that
    had to be killed after the grace."""


class JobEngineEndedV1(_EngineEnded, frozen=True, kw_only=True, tag="job.engine_ended.v1"):
    """The first record of how the engine says a run ended, without whether it was killed.
    Still read: `schemas.codec` upcasts it to `JobEngineEnded` (v2) with `killed` None (not
    said)."""


class JobEngineEnded(_EngineEnded, frozen=True, kw_only=True, tag="job.engine_ended.v2"):
    """How the execution engine says a run ended, recorded with the run's JobFinished, and
    whether its processes outlived their grace and were killed."""

    killed: bool | None = None
    """Its processes outlived their grace and were killed (the engine's SIGKILL, or the
    executor's), as `JobRunEnded.killed` says of a stopped run; False: they ended within it;
    None: the engine does not say (every v1 record; engines that do not know)."""


class _RunEnded(JobEvent, frozen=True, kw_only=True):
    """A run the ledger had stopped (preempted, cancelled, requeued, its node lost) has really
    ended: its engine says every process of it is gone, and when. The end of a job's current
    run is `JobEngineEnded`'s `ended_at`; together they bound every run, which the audit checks
    (no GPU held by two live runs, no job with two live runs)."""

    engine: Name
    engine_job_id: Name
    run: Count = 0
    ended_at: Epoch | None = None
    exit_code: ExitCode | None = None
    killed: bool = False
    """It outlived its grace and was killed."""
    note: Text = ""
    by_itself: bool = False
    """Its command ended by itself before the stop's signal reached it (the engine's word;
    False in every record made before the field): exit 0 then completes the job, if it has
    not run again since (`job.finished.v2` `completed` follows)."""


class JobRunEndedV1(_RunEnded, frozen=True, kw_only=True, tag="job.run_ended.v1"):
    """The first record of a stopped run's end, without the run's own start. Still read:
    `schemas.codec` upcasts it to `JobRunEnded` (v2) with `started_at` None (its run was
    charged from its `JobStarted`, or not at all, as before)."""


class JobRunEnded(_RunEnded, frozen=True, kw_only=True, tag="job.run_ended.v2"):
    """A run the ledger had stopped (preempted, cancelled, requeued, its node lost) has really
    ended: its engine says every process of it is gone, and when, and, where no `JobStarted`
    said it, when it started. The end of a job's current run is `JobEngineEnded`'s `ended_at`;
    together they bound every run, which the audit checks (no GPU held by two live runs, no
    job with two live runs)."""

    exit_decides: bool = False
    """Recorded under the rule that its exit, whatever its code, is its job's outcome when it
    ended by itself (`ConfirmRunEnded.exit_decides`, s54): a non-zero one then fails the job
    (`job.finished.v2` `failed`). False in every record made before: only exit 0 ended it."""
    started_at: Epoch | None = None
    """When the run really started, where no `JobStarted` recorded it (the ledger stopped it
    while placed, before any read saw it start, and its command ran: Slurm's launch mark,
    atk44s F3); None otherwise. Kept between the run's placement and its end: under
    `fairtree-3` the run is charged from it to `ended_at` (docs/projections.md)."""


class JobKillOrdered(JobEvent, frozen=True, kw_only=True, tag="job.kill_ordered.v1"):
    """A run the ledger had stopped (cancelled, preempted), still in its grace (its end not
    recorded), is to be killed now: its job was cancelled again, as a second `scancel` (or
    `scancel --signal=KILL`) ends a job Slurm is stopping (atk46-23 F7: a cancel could not cut
    a grace short). Its engine sends SIGKILL at once; its end is recorded as any stopped run's
    (`JobRunEnded`)."""

    run: Count = 0


class UtilisationSampled(JobEvent, frozen=True, kw_only=True, tag="job.utilisation_sampled.v1"):
    gpu_utilisation: Utilisation


class CheckpointReported(JobEvent, frozen=True, kw_only=True, tag="job.checkpointed.v1"):
    """A resumable job saved its progress: work before `at` survives a preemption."""


class LeaderEnded(JobEvent, frozen=True, kw_only=True, tag="job.leader_ended.v1"):
    """A running job's command has exited (on every node of run `run`) and left processes its
    engine is reaping: SIGTERM at `leader_ended_at`, SIGKILL at `kill_at` at the latest, its
    end recorded once they are gone (`JobFinished`). Every read shows the job `stopping` from
    then (Slurm's CG once the batch script has exited: atk49-23 F4). A cancel reads its
    `exit_code` (below); nothing else decides by it."""

    run: Count = 0
    leader_ended_at: Epoch
    left: Count = 0
    kill_at: Epoch
    exit_code: ExitCode | None = None
    """Its command's exit code (a gang's: its first non-zero part's). 0: the job completed
    (its command exited 0 before any stop): a cancel then records it `completed`, as Slurm
    keeps a job COMPLETED whose batch script ended (atk52-23 F2). None: not said (every record
    made before it), and a cancel ends the job `cancelled`, as it always did."""


# --- identity -----------------------------------------------------------------------------------

TokenScope = Literal["user", "node", "job"]


class TokenIssued(Event, frozen=True, kw_only=True, tag="token.issued.v1"):
    """A bearer token for `user`. Only the SHA-256 of its secret is kept, never the secret.

    `scope` narrows it: "user" acts as `user` with all their roles; "node" only reports for
    `node`; "job" only reports checkpoints of `job`."""

    token_id: TokenId
    user: Actor
    name: Name = ""
    secret_sha256: Sha256Hex
    expires_at: Epoch | None = None
    scope: TokenScope = "user"
    scope_node: Name | None = None
    scope_job: JobId | None = None


class TokenRevoked(Event, frozen=True, kw_only=True, tag="token.revoked.v1"):
    token_id: TokenId


class _Configured(Event, frozen=True, kw_only=True):
    policy: AnyPolicyConfig
    interval_s: PositiveInterval
    executor: Name


class ServiceConfiguredV1(_Configured, frozen=True, kw_only=True, tag="service.configured.v1"):
    """The service's settings without its grace; read upcast to v2 with `grace_s` None."""


class ServiceConfigured(_Configured, frozen=True, kw_only=True, tag="service.configured.v2"):
    """What the service runs with, recorded when it starts with (or changes to) other settings:
    the policy version and its settings, the cycle interval, the executor, its grace. `queue`
    and `explain` preview with the recorded policy."""

    grace_s: Seconds | None = None
    """`serve`/`up --grace`: the grace of a job stopped without its own, which every read counts
    its SIGKILL with (atk48-23 F4); None (upcast from v1): `bounds.DEFAULT_GRACE_S`."""
    max_time_s: PositiveSeconds | None = None
    """The longest time limit its engine starts (Slurm's partition MaxTime), as the service last
    observed it; recorded again whenever it changes. A job submitted without a time limit of its
    own takes its limit from it (`JobSubmitted.max_time_s`). None: no limit (MaxTime=UNLIMITED,
    an engine without one), or recorded before the field."""


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
    | NodeLost
    | NodeAgentChanged
    | JobSubmitted
    | JobPlaced
    | JobStarted
    | JobPreempted
    | JobRequeued
    | JobUnplaced
    | JobHeld
    | JobReleased
    | JobFinished
    | JobEngineLinked
    | JobEngineEnded
    | JobRunEnded
    | JobKillOrdered
    | UtilisationSampled
    | CheckpointReported
    | LeaderEnded
    | CycleDecided
    | TokenIssued
    | TokenRevoked
    | ServiceConfigured
)

EVENT_TYPES: tuple[type[Event], ...] = AnyEvent.__args__
"""The latest version of every event: what `schemas.codec.decode` returns."""

StoredEvent = (
    AnyEvent
    | CycleDecidedV3
    | CycleDecidedV2
    | CycleDecidedV1
    | JobSubmittedV1
    | JobFinishedV1
    | JobRunEndedV1
    | JobEngineEndedV1
    | ServiceConfiguredV1
)
"""Every version that may be stored; `schemas.codec` upcasts the older ones."""

OLDER_TYPES: tuple[type[Event], ...] = tuple(
    t for t in StoredEvent.__args__ if t not in EVENT_TYPES
)
"""The older versions `StoredEvent` names, in its order."""


def tag_of(cls: type[Event]) -> str:
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


TAGS: frozenset[str] = frozenset(tag_of(t) for t in EVENT_TYPES + OLDER_TYPES)
