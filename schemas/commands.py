"""Commands: imperative requests to the ledger. Each names its actor; the ledger decides.

`expected_position`, when set, is the log position the caller based the command on; the ledger
rejects the command if a change since then touches the same jobs, nodes or accounts, or if it
is more than 1,000 events behind the log's head (`ledger.core.conflicts.LOOKBACK`: read
again and retry).

Every field is bounded (`schemas.bounds`): build commands from outside data with
`msgspec.convert` (the CLI, the TOML loader) or decode them (the HTTP API); the domain re-checks
each command it executes, so a value outside its bounds is one `InvalidCommand`, never stored.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from schemas.bounds import (
    AccountPath,
    Actor,
    ArrayLimit,
    ArrayTasks,
    CommandLine,
    Count,
    Environment,
    Epoch,
    ExitCode,
    FloatSeconds,
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
    SubmitGraceSeconds,
    Text,
    Token,
    TokenId,
    Ulimits,
    Umask,
    Utilisation,
)
from schemas.decisions import Placement, Preemption, PreemptReason, RankInputs, Waiting
from schemas.event_base import LISTED, GpuSlot, Many
from schemas.events import AccountKind, Dependency, EndReason, RunPart, TokenScope
from schemas.policy import AnyPolicyConfig


class Command(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="op", forbid_unknown_fields=True
):
    """Base of every command. A field it does not know is refused wherever one is decoded (the
    API, batches, budget files): a misspelt option never passes for its default."""

    actor: Actor
    expected_position: Position | None = None
    real_actor: Actor | None = None
    """Set by the edge that authenticated the caller when an admin acts as `actor`; never taken
    from a caller."""


class JobCommand(Command, frozen=True, kw_only=True):
    """Base of the commands about one job (its id first). Not a command itself."""

    job_id: JobId


class NodeCommand(Command, frozen=True, kw_only=True):
    """Base of the commands about one node (its name first). Not a command itself."""

    node: Name


class MemberCommand(Command, frozen=True, kw_only=True):
    """Base of the commands about a project's member. Not a command itself."""

    user: Name
    project: AccountPath


class ManagerCommand(Command, frozen=True, kw_only=True):
    """Base of the commands about who manages a subtree. Not a command itself."""

    user: Name
    account: AccountPath


class InitLedger(Command, frozen=True, kw_only=True, tag="init"):
    admin: Name
    min_runtime_cap_s: PositiveSeconds = 8 * 3600
    cluster: Name = "default"


class GrantAdmin(Command, frozen=True, kw_only=True, tag="admin.grant"):
    user: Name


class RevokeAdmin(Command, frozen=True, kw_only=True, tag="admin.revoke"):
    user: Name


class OpenAccount(Command, frozen=True, kw_only=True, tag="account.open"):
    path: AccountPath
    kind: AccountKind
    shares: Shares = 1
    reason: Text = ""


class CloseAccount(Command, frozen=True, kw_only=True, tag="account.close"):
    path: AccountPath
    reason: Text = ""


class SetShares(Command, frozen=True, kw_only=True, tag="share.set"):
    account: AccountPath
    shares: Shares
    reason: Text = ""


class AddMember(MemberCommand, frozen=True, kw_only=True, tag="member.add"):
    shares: Shares = 1


class RemoveMember(MemberCommand, frozen=True, kw_only=True, tag="member.remove"):
    """Remove `user` from `project`'s members."""


class GrantManager(ManagerCommand, frozen=True, kw_only=True, tag="manager.grant"):
    """Let `user` manage the subtree rooted at `account` (its shares and members)."""


class RevokeManager(ManagerCommand, frozen=True, kw_only=True, tag="manager.revoke"):
    """`user` no longer manages the subtree rooted at `account`."""


class RegisterNode(NodeCommand, frozen=True, kw_only=True, tag="node.add"):
    gpu_type: Name
    gpus: NodeGpus
    cluster: Name | None = None


class DrainNode(NodeCommand, frozen=True, kw_only=True, tag="node.drain"):
    reason: Text


class ReturnNode(NodeCommand, frozen=True, kw_only=True, tag="node.return"):
    """Put a drained or lost node back in service."""


class RemoveNode(NodeCommand, frozen=True, kw_only=True, tag="node.remove"):
    """Remove a node for good: refused while it runs jobs, or while runs the ledger stopped
    there (a cancel, a `node lost`) are not reported gone, unless `force`."""

    reason: Text = ""
    force: bool = False
    """The admin says the machine is gone for good: runs still stopping there are forgotten
    (nothing will kill their processes if it is in fact alive)."""


class MarkNodeLost(NodeCommand, frozen=True, kw_only=True, tag="node.lost"):
    """Record that a node is lost (the execution engine or the node-lost timeout; admins too):
    with `fence_s` 0 its jobs end at once, resumable ones requeued, the others failed
    (`node_failure`); otherwise they are in doubt until the fence passes (`NodeLost`)."""

    reason: Text
    fence_s: Seconds = 0


class RecordNodeAgent(NodeCommand, frozen=True, kw_only=True, tag="node.agent"):
    """Record which node agent holds the node now (the agents' executor, when another agent
    takes it: `NodeAgentChanged`)."""

    agent: Text


class SubmitJob(Command, frozen=True, kw_only=True, tag="submit"):
    account: AccountPath
    gpus: JobGpus
    min_runtime_s: Seconds | None = None
    """None takes the cap (the default contract); 0 is unfunded; whole seconds, so any other
    contract is at least 1 s."""
    resumable: bool = False
    priority: Priority = 0
    gpu_type: Name | None = None
    cluster: Name | None = None
    time_limit_s: PositiveSeconds | None = None
    unlimited: bool = False
    """It asked for no time limit (`-t 0`, `UNLIMITED`, `INFINITE`; `time_limit_s` None): as
    sbatch would leave it pending for good on a partition with a MaxTime, it is refused there;
    without a MaxTime recorded it has none (False: none given, it takes MaxTime's)."""
    command: CommandLine = ()
    labels: Labels = {}
    duration_s: FloatSeconds | None = None
    user: Name | None = None
    """Submit on behalf of `user` (admins and the simulator); defaults to the actor."""
    grace_s: SubmitGraceSeconds | None = None
    """SIGTERM-to-SIGKILL grace when the job is stopped; None: the executor's default."""
    workdir: Path = ""
    """The absolute directory the job starts in (the CLI sends its own working directory, as
    sbatch does; `-D/--chdir`); "" the engine's default."""
    env: Environment = {}
    """The job's environment (the CLI sends its own after `--export`); names matching the
    service's secret pattern are stripped before it is recorded."""
    stdout: Path = ""
    """Output file pattern (`-o`: `%j` job id, `%u` user, `%x` job name, `%a` array task,
    `%A` array job id), relative to `workdir`; "" is `gpuledger-%j.out` when `workdir` is set."""
    stderr: Path = ""
    """Error file pattern (`-e`); "" writes errors to the output file."""
    job_name: JobName = ""
    array: ArrayTasks = ()
    """A job array's task indices (`--array=0-15`): one job each, consecutive job ids."""
    array_limit: ArrayLimit | None = None
    """At most this many of the array's tasks hold GPUs at once (`--array=0-15%4`)."""
    dependency: Annotated[tuple[Dependency, ...], LISTED] = ()
    """`--dependency`: every term must hold before the job may be placed."""
    umask: Umask | None = None
    """The submitter's umask (the CLI sends its own, as sbatch records it); None: the
    engine's rule (`JobSubmitted.umask`)."""
    ulimits: Ulimits | None = None
    """The submitter's soft resource limits (the CLI sends its own unless `--propagate=NONE`,
    as sbatch propagates them); None: none recorded (`JobSubmitted.ulimits`)."""


class CancelJob(JobCommand, frozen=True, kw_only=True, tag="cancel"):
    """Cancel a pending, placed or running job (its owner, the managers above it, admins)."""

    whole_array: bool = False
    """`job_id` names a job array (its first task's id): cancel every unfinished task of it,
    as `scancel ARRAY_ID` does (a job that is no array is cancelled alone)."""


class HoldJob(JobCommand, frozen=True, kw_only=True, tag="hold"):
    """Keep a pending job out of scheduling (like `scontrol hold`); who may cancel it may."""

    reason: Text = ""


class ReleaseJob(JobCommand, frozen=True, kw_only=True, tag="release"):
    """Let a held job be scheduled again (like `scontrol release`)."""


class RequeueJob(JobCommand, frozen=True, kw_only=True, tag="requeue"):
    """Stop a placed or running job and put it back in the queue, same job id (like `scontrol
    requeue`); who may cancel it may, inside its contract too (it is their own work)."""

    reason: Text = ""


class UnplaceJob(JobCommand, frozen=True, kw_only=True, tag="job.unplace"):
    """An engine takes back a placed run it never started and cannot start (`JobUnplaced`):
    the job goes back to the queue, same id. An engine's report (or an admin's, as every
    engine report may be)."""

    run: Count
    reason: Text = ""


class DecisionBody(msgspec.Struct, frozen=True, kw_only=True):
    """What one dispatcher cycle decided, as it hands it to the ledger: the decision record's
    fields (`events.CycleDecided`, which keeps the outcomes by reference) with the placements and
    preemptions in full (they become `JobPlaced` and `JobPreempted` events)."""

    cycle_id: Token
    based_on: Position
    policy_version: Token
    policy: AnyPolicyConfig | None = None
    decided_at: Epoch | None = None
    ranks: RankInputs | None = None
    placements: Many[Placement] = ()
    preemptions: Many[Preemption] = ()
    waiting: Waiting = Waiting()
    fragmentation_gpus: Count = 0
    wake_at: Epoch | None = None
    skipped_cycles: Count = 0
    stopping_held: bool = False
    """The snapshot held the GPUs of stopped runs in their grace (`CycleDecided.stopping_held`)."""
    lost_held: bool = False
    """It also held the runs a `node lost` ended whose end was not recorded
    (`CycleDecided.lost_held`)."""
    placed_held: bool = False
    """It also held the runs stopped while `placed` whose end was not recorded
    (`CycleDecided.placed_held`)."""
    grace_held: bool = False
    """It left out the jobs whose limit, grace and a minute MaxTime does not hold
    (`CycleDecided.grace_held`)."""


class ApplyDecision(Command, frozen=True, kw_only=True, tag="decision.apply"):
    """Apply a dispatcher cycle's decision: record it (`CycleDecided`) and carry out its
    placements and preemptions."""

    decision: DecisionBody


class PreemptJob(JobCommand, frozen=True, kw_only=True, tag="preempt"):
    """An admin preemption; the only way to preempt inside a contract, and it needs a reason."""

    reason: PreemptReason = "admin"
    note: Text


class StartJob(JobCommand, frozen=True, kw_only=True, tag="job.start"):
    logs: LogPaths = ()
    engine: Name = ""
    """Set by an execution engine that names its runs (Slurm): links the run to `engine_job_id`."""
    engine_job_id: Name = ""
    run: Count = 0
    gpus: Many[GpuSlot] = ()
    """The GPUs the engine says the run got; none: the placement's (`JobEngineLinked.gpus`)."""
    started_at: Epoch | None = None
    """When the run really started, as the engine says (kept between the placement and now)."""
    parts: Annotated[tuple[RunPart, ...], LISTED] = ()


RunEnd = EndReason | Literal["launch_failed", "drained"]
"""How a run ended as an executor reports it: an engine's `EndReason`; `launch_failed` (the run
could not be started: no OS account to run it as, a command the engine cannot start); or
`drained` (its node's agent stopped it on the way out, `gpuledger agent --drain`: the ledger
requeues it when resumable, a maintenance preemption, and ends the others `preempted` as a
drained node's jobs end, at the run's real end, with no preemption recorded: none was decided)."""


class FinishJob(JobCommand, frozen=True, kw_only=True, tag="job.finish"):
    exit_code: ExitCode
    engine: Name = ""
    """Set by an execution engine: records how it says the run ended (JobEngineEnded)."""
    engine_job_id: Name = ""
    reason: RunEnd = "exited"
    engine_state: Name = ""
    note: Text = ""
    """What more there is to say, in words (a launch that failed: why)."""
    ended_at: Epoch | None = None
    """When the run really ended, when the engine knows (its exit file, Slurm's End); recorded
    as the job's end and charged to it (kept between its placement and the command's time)."""
    killed: bool | None = None
    """Its processes outlived their grace and were killed, as the engine knows (None: it does
    not say); recorded in its JobEngineEnded."""


class ConfirmRunEnded(JobCommand, frozen=True, kw_only=True, tag="job.run_ended"):
    """An engine says a run the ledger had stopped has really ended (`JobRunEnded`)."""

    engine: Name
    engine_job_id: Name
    run: Count = 0
    ended_at: Epoch | None = None
    exit_code: ExitCode | None = None
    killed: bool = False
    note: Text = ""
    by_itself: bool = False
    """The engine knows the command ended by itself, before any signal of the stop reached it
    (its own end record, unsignalled; an agent's exit of a run it was not stopping): with
    exit code 0 the job completed, never to be run again (`runs.confirm_run_ended`). False:
    not known (and every report made before the field)."""
    exit_decides: bool = False
    """The reporter's rule (s54, atk53-23 F3): the exit of a run that ended by itself, whatever
    its code, is its job's outcome: a non-zero one (or a signal of its own) fails the job, which
    is not run again. False in every report made before the field: only exit 0 completed it."""
    started_at: Epoch | None = None
    """When the run really started, where the ledger recorded no start of it (stopped while
    placed, before the engine saw it start, though its command ran: atk44s F3); None when
    the engine knows of none, or the ledger recorded it (`JobRunEnded.started_at`)."""


class SampleUtilisation(JobCommand, frozen=True, kw_only=True, tag="job.sample"):
    gpu_utilisation: Utilisation


class ReportCheckpoint(JobCommand, frozen=True, kw_only=True, tag="job.checkpoint"):
    """A resumable job checkpointed (its own token, its supervisor, or its owner)."""


class ReportLeaderEnded(JobCommand, frozen=True, kw_only=True, tag="job.leader_ended"):
    """A running job's command (its leader, on every node of its run) has exited, leaving
    processes its engine is reaping: SIGTERM now, SIGKILL at `kill_at` at the latest (its
    supervisor's, atk49-23 F4). Only the executor reports it."""

    run: Count = 0
    leader_ended_at: Epoch
    left: Count = 0
    """How many processes its leader left behind (its part's that left the most)."""
    kill_at: Epoch
    exit_code: ExitCode | None = None
    """Its command's exit code (`LeaderEnded.exit_code`); None: not said."""


class IssueToken(Command, frozen=True, kw_only=True, tag="token.issue"):
    """Record a token the edge made: its id and the SHA-256 of its secret (never the secret)."""

    token_id: TokenId
    user: Actor
    secret_sha256: Sha256Hex
    name: Name = ""
    expires_at: Epoch | None = None
    scope: TokenScope = "user"
    scope_node: Name | None = None
    scope_job: JobId | None = None


class RevokeToken(Command, frozen=True, kw_only=True, tag="token.revoke"):
    token_id: TokenId


class ConfigureService(Command, frozen=True, kw_only=True, tag="service.configure"):
    """Record the settings the service runs with (the service itself, or an admin)."""

    policy: AnyPolicyConfig
    interval_s: PositiveInterval
    executor: Name
    grace_s: Seconds | None = None
    """The grace it gives a job stopped without one of its own (`serve`/`up --grace`)."""
    max_time_s: PositiveSeconds | None = None
    """The longest time limit its engine starts (Slurm's partition MaxTime; None: no limit),
    as the service observed it (`ServiceConfigured.max_time_s`)."""


AnyCommand = (
    InitLedger
    | GrantAdmin
    | RevokeAdmin
    | OpenAccount
    | CloseAccount
    | SetShares
    | AddMember
    | RemoveMember
    | GrantManager
    | RevokeManager
    | RegisterNode
    | DrainNode
    | ReturnNode
    | RemoveNode
    | MarkNodeLost
    | RecordNodeAgent
    | SubmitJob
    | CancelJob
    | HoldJob
    | ReleaseJob
    | RequeueJob
    | UnplaceJob
    | ApplyDecision
    | PreemptJob
    | StartJob
    | FinishJob
    | ConfirmRunEnded
    | SampleUtilisation
    | ReportCheckpoint
    | ReportLeaderEnded
    | IssueToken
    | RevokeToken
    | ConfigureService
)

COMMAND_TYPES: tuple[type[Command], ...] = AnyCommand.__args__

__all__ = ["AnyCommand", "GpuSlot", "Placement", "Preemption"]
