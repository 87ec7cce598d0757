"""Commands: imperative requests to the ledger. Each names its actor; the ledger decides.

`expected_position`, when set, is the log position the caller based the command on; the ledger
rejects the command if a change since then touches the same jobs, nodes or accounts.
"""

from __future__ import annotations

import msgspec

from schemas.events import (
    AccountKind,
    Considered,
    FinishReason,
    GpuSlot,
    Placement,
    Preemption,
    PreemptReason,
)


class Command(msgspec.Struct, frozen=True, kw_only=True, tag_field="op"):
    actor: str
    expected_position: int | None = None


class InitLedger(Command, frozen=True, kw_only=True, tag="init"):
    admin: str
    min_runtime_cap_s: int = 8 * 3600
    cluster: str = "default"


class GrantAdmin(Command, frozen=True, kw_only=True, tag="admin.grant"):
    user: str


class RevokeAdmin(Command, frozen=True, kw_only=True, tag="admin.revoke"):
    user: str


class OpenAccount(Command, frozen=True, kw_only=True, tag="account.open"):
    path: str
    kind: AccountKind
    shares: int = 1
    reason: str = ""


class CloseAccount(Command, frozen=True, kw_only=True, tag="account.close"):
    path: str
    reason: str = ""


class SetShares(Command, frozen=True, kw_only=True, tag="share.set"):
    account: str
    shares: int
    reason: str = ""


class AddMember(Command, frozen=True, kw_only=True, tag="member.add"):
    user: str
    project: str
    shares: int = 1


class RemoveMember(Command, frozen=True, kw_only=True, tag="member.remove"):
    user: str
    project: str


class GrantManager(Command, frozen=True, kw_only=True, tag="manager.grant"):
    user: str
    account: str


class RevokeManager(Command, frozen=True, kw_only=True, tag="manager.revoke"):
    user: str
    account: str


class RegisterNode(Command, frozen=True, kw_only=True, tag="node.add"):
    node: str
    gpu_type: str
    gpus: int
    cluster: str | None = None


class DrainNode(Command, frozen=True, kw_only=True, tag="node.drain"):
    node: str
    reason: str


class ReturnNode(Command, frozen=True, kw_only=True, tag="node.return"):
    node: str


class RemoveNode(Command, frozen=True, kw_only=True, tag="node.remove"):
    node: str
    reason: str = ""


class SubmitJob(Command, frozen=True, kw_only=True, tag="submit"):
    account: str
    gpus: int
    min_runtime_s: int | None = None
    """None takes the cap (the default contract); 0 is unfunded."""
    resumable: bool = False
    priority: int = 0
    gpu_type: str | None = None
    cluster: str | None = None
    time_limit_s: int | None = None
    command: tuple[str, ...] = ()
    labels: dict[str, str] = {}
    duration_s: float | None = None
    user: str | None = None
    """Submit on behalf of `user` (admins and the simulator); defaults to the actor."""
    grace_s: int | None = None
    """SIGTERM-to-SIGKILL grace when the job is stopped; None: the executor's default."""


class CancelJob(Command, frozen=True, kw_only=True, tag="cancel"):
    job_id: int


class ApplyDecision(Command, frozen=True, kw_only=True, tag="decision.apply"):
    """A dispatcher cycle's outcome: the decision record plus its placements and preemptions."""

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


class PreemptJob(Command, frozen=True, kw_only=True, tag="preempt"):
    """An admin preemption; the only way to preempt inside a contract, and it needs a reason."""

    job_id: int
    reason: PreemptReason = "admin"
    note: str


class StartJob(Command, frozen=True, kw_only=True, tag="job.start"):
    job_id: int
    logs: tuple[str, ...] = ()


class FinishJob(Command, frozen=True, kw_only=True, tag="job.finish"):
    job_id: int
    exit_code: int
    reason: FinishReason = "exit"


class SampleUtilisation(Command, frozen=True, kw_only=True, tag="job.sample"):
    job_id: int
    gpu_utilisation: tuple[float, ...]


class ReportCheckpoint(Command, frozen=True, kw_only=True, tag="job.checkpoint"):
    job_id: int


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
    | SubmitJob
    | CancelJob
    | ApplyDecision
    | PreemptJob
    | StartJob
    | FinishJob
    | SampleUtilisation
    | ReportCheckpoint
)

COMMAND_TYPES: tuple[type[Command], ...] = AnyCommand.__args__

__all__ = ["AnyCommand", "GpuSlot", "Placement", "Preemption"]
