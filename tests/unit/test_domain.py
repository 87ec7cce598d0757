"""Table tests for the invariants that `ledger.core.decide.decide` enforces and `evolve` keeps.

Every case starts from the `org_state` fixture (see tests/conftest.py): root is admin; ai2 is a
program managed by pm; ai2/olmo a project managed by mgr with members alice and bob; ai2/tulu a
project with member carol; nodes n1, n2 (8 x h100) and a1 (4 x a100). `setup` commands run at T0
(or at the time given with `at(...)`), then `cmd` runs at `Case.at`.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from ledger.core.authz import authorisation_failure
from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from schemas import commands as c
from schemas import events as e
from schemas.errors import (
    ContractViolation,
    InvalidCommand,
    InvalidTransition,
    LedgerError,
    NotAuthorised,
    UnknownEntity,
)

T0 = 1_000.0
CONTRACT_S = 3_600
END1 = T0 + CONTRACT_S
"""When job 1 (placed at T0 with the default test contract) becomes preemptible."""
CAP_S = 8 * 3600

Step = c.AnyCommand | tuple[float, c.AnyCommand]


def at(t: float, cmd: c.AnyCommand) -> tuple[float, c.AnyCommand]:
    """A setup step that runs at time `t` instead of T0."""
    return (t, cmd)


# --- command builders ---------------------------------------------------------------------------


def submit(user: str = "alice", *, actor: str | None = None, **kw: Any) -> c.SubmitJob:
    """alice submits 4 GPUs to ai2/olmo with a 1 h contract unless told otherwise."""
    kw.setdefault("account", "ai2/olmo")
    kw.setdefault("gpus", 4)
    kw.setdefault("min_runtime_s", CONTRACT_S)
    if actor is None:
        return c.SubmitJob(actor=user, **kw)
    return c.SubmitJob(actor=actor, user=user, **kw)


def slot(node: str, *gpus: int) -> e.GpuSlot:
    return e.GpuSlot(node=node, gpu_indices=gpus)


def decision(
    places: tuple[tuple[int, tuple[e.GpuSlot, ...]], ...] = (),
    preempts: tuple[c.Preemption, ...] = (),
    actor: str = "@dispatcher",
) -> c.ApplyDecision:
    return c.ApplyDecision(
        actor=actor,
        decision=c.DecisionBody(
            cycle_id="cycle",
            based_on=0,
            policy_version="test",
            placements=tuple(c.Placement(job_id=j, slots=s) for j, s in places),
            preemptions=preempts,
        ),
    )


def place(job_id: int, *slots: e.GpuSlot, actor: str = "@dispatcher") -> c.ApplyDecision:
    return decision(((job_id, slots),), actor=actor)


def preempt(job_id: int, reason: e.PreemptReason = "fairness") -> c.ApplyDecision:
    return decision(preempts=(c.Preemption(job_id=job_id, reason=reason),))


def start(job_id: int, actor: str = "@executor") -> c.StartJob:
    return c.StartJob(actor=actor, job_id=job_id)


def finish(job_id: int, exit_code: int = 0, actor: str = "@executor") -> c.FinishJob:
    return c.FinishJob(actor=actor, job_id=job_id, exit_code=exit_code)


def cancel(job_id: int, actor: str = "alice") -> c.CancelJob:
    return c.CancelJob(actor=actor, job_id=job_id)


def drain(node: str, actor: str = "root", reason: str = "maintenance") -> c.DrainNode:
    return c.DrainNode(actor=actor, node=node, reason=reason)


def open_(
    path: str, kind: e.AccountKind = "project", actor: str = "root", **kw: Any
) -> c.OpenAccount:
    return c.OpenAccount(actor=actor, path=path, kind=kind, **kw)


def close(path: str, actor: str = "root") -> c.CloseAccount:
    return c.CloseAccount(actor=actor, path=path)


S1 = submit()  # job 1: alice, 4 GPUs, 1 h contract
S1R = submit(resumable=True)  # job 1, resumable
S1U = submit(min_runtime_s=0)  # job 1, unfunded
S2 = submit("bob")  # job 2: bob, 4 GPUs
P1 = place(1, slot("n1", 0, 1, 2, 3))
P2_HIGH = place(2, slot("n1", 4, 5, 6, 7))
S12 = submit(gpus=12)  # job 1 spanning two nodes
P12 = place(1, slot("n1", *range(8)), slot("n2", 0, 1, 2, 3))
START1 = start(1)
OLD = (open_("ai2/old"), close("ai2/old"))  # a closed, empty project


# --- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    cmd: c.AnyCommand
    setup: tuple[Step, ...] = ()
    at: float = T0
    want_error: type[LedgerError] | None = None
    want_message: str = ""
    """A fragment of the error message (errors), or nothing."""
    want_fields: dict[str, object] = field(default_factory=dict)
    """Typed fields on the error."""
    want_events: tuple[type[e.Event], ...] = ()
    want_attrs: dict[type[e.Event], dict[str, object]] = field(default_factory=dict)
    """Attributes of the first event of each type."""
    want_nodes: dict[str, str] = field(default_factory=dict)
    """Node states after the events are folded."""
    want_held: int | None = None
    """How many GPUs are held after the events are folded."""


def ok(id: str, cmd: c.AnyCommand, *events: type[e.Event], **kw: Any) -> Case:
    return Case(id=id, cmd=cmd, want_events=events, **kw)


def err(id: str, cmd: c.AnyCommand, error: type[LedgerError], message: str, **kw: Any) -> Case:
    return Case(id=id, cmd=cmd, want_error=error, want_message=message, **kw)


Opened, Shares, Closed = e.AccountOpened, e.SharesSet, e.AccountClosed

# fmt: off

ACCOUNT_TREE = [
    ok("a program opens at the root", open_("lab", "program"), Opened, Shares,
       want_attrs={Opened: {"path": "lab", "parent": None, "kind": "program"},
                   Shares: {"shares": 1}}),
    ok("a program opens under a program", open_("ai2/sub", "program"), Opened, Shares),
    ok("a project opens under a program", open_("ai2/new", shares=2), Opened, Shares,
       want_attrs={Opened: {"parent": "ai2"}, Shares: {"account": "ai2/new", "shares": 2}}),
    ok("a project opens under a project", open_("ai2/olmo/sub"), Opened, Shares),
    ok("a user leaf opens under a project", open_("ai2/olmo/zed", "user"), Opened, Shares),
    err("a path opened twice is rejected", open_("ai2/olmo"), InvalidTransition,
        "account 'ai2/olmo' is already open", want_fields={"account": "ai2/olmo"}),
    err("a member's leaf cannot be opened again", open_("ai2/olmo/alice", "user"),
        InvalidTransition, "'ai2/olmo/alice' is already open"),
    err("a child of a missing parent is rejected", open_("nope/x"), UnknownEntity,
        "unknown account 'nope'", want_fields={"account": "nope"}),
    err("a child of a closed parent is rejected", open_("ai2/old/x"), UnknownEntity,
        "unknown account 'ai2/old'", setup=OLD),
    err("a project at the root is rejected", open_("solo"), InvalidCommand,
        "a project cannot sit under the root", want_fields={"account": "solo"}),
    err("a user at the root is rejected", open_("zed", "user"), InvalidCommand,
        "a user cannot sit under the root"),
    err("a user under a program is rejected", open_("ai2/zed", "user"), InvalidCommand,
        "a user cannot sit under program"),
    err("a program under a project is rejected", open_("ai2/olmo/p", "program"), InvalidCommand,
        "a program cannot sit under project"),
    err("nothing opens under a user leaf", open_("ai2/olmo/alice/x"), InvalidCommand,
        "a project cannot sit under user"),
    err("an empty path segment is rejected", open_("ai2//x"), InvalidCommand,
        "invalid account name ''", want_fields={"value": ""}),
    err("a trailing slash is rejected", open_("ai2/"), InvalidCommand, "invalid account name ''"),
    err("a space in a name is rejected", open_("ai2/bad name"), InvalidCommand,
        "invalid account name 'bad name'"),
    err("a name of 64 characters is rejected", open_("ai2/" + "x" * 64), InvalidCommand,
        "invalid account name"),
    ok("a name of 63 characters is accepted", open_("ai2/" + "x" * 63), Opened, Shares),
    ok("a closed account opens again", open_("ai2/old", shares=2), Opened, Shares, setup=OLD,
       want_attrs={Shares: {"shares": 2}}),
    err("an account with open children cannot close", close("ai2"), InvalidTransition,
        "'ai2' still has open accounts below it: ai2/olmo, ai2/tulu"),
    err("a project with open member leaves cannot close", close("ai2/tulu"), InvalidTransition,
        "still has open accounts below it: ai2/tulu/carol"),
    ok("an empty project closes", close("ai2/new"), Closed, setup=(open_("ai2/new"),)),
    err("an unknown account cannot close", close("ai2/nope"), UnknownEntity,
        "unknown account 'ai2/nope'"),
    err("a closed account cannot close again", close("ai2/old"), UnknownEntity,
        "unknown account 'ai2/old'", setup=OLD),
]

SHARES = [
    err("negative shares at opening are rejected", open_("ai2/neg", shares=-1), InvalidCommand,
        "`shares` must be int >= 0, got -1", want_fields={"shares": -1}),
    err("negative shares are rejected", c.SetShares(actor="root", account="ai2/olmo", shares=-1),
        InvalidCommand, "`shares` must be int >= 0, got -1", want_fields={"shares": -1}),
    ok("zero shares are allowed", c.SetShares(actor="root", account="ai2/olmo", shares=0), Shares,
       want_attrs={Shares: {"account": "ai2/olmo", "shares": 0}}),
    err("negative member shares are rejected",
        c.AddMember(actor="root", user="dave", project="ai2/olmo", shares=-2), InvalidCommand,
        "`shares` must be int >= 0, got -2"),
    ok("a member's shares go to their leaf",
       c.AddMember(actor="root", user="dave", project="ai2/olmo", shares=5),
       e.MemberAdded, Opened, Shares,
       want_attrs={Opened: {"path": "ai2/olmo/dave", "kind": "user", "parent": "ai2/olmo"},
                   Shares: {"account": "ai2/olmo/dave", "shares": 5}}),
    err("shares of a closed account cannot be set",
        c.SetShares(actor="root", account="ai2/old", shares=1), UnknownEntity, "'ai2/old'",
        setup=OLD),
]

SUBMISSION = [
    ok("a member submits to their project", S1, e.JobSubmitted,
       want_attrs={e.JobSubmitted: {"job_id": 1, "user": "alice", "account": "ai2/olmo", "gpus": 4,
                                    "min_runtime_s": CONTRACT_S, "actor": "alice", "at": T0}}),
    ok("job ids count up", S2, e.JobSubmitted, setup=(S1,),
       want_attrs={e.JobSubmitted: {"job_id": 2, "user": "bob"}}),
    err("a non-member is refused", submit("carol"), NotAuthorised,
        "'carol' is not a member of 'ai2/olmo'"),
    err("the project's manager who is not a member is refused", submit("mgr"), NotAuthorised,
        "'mgr' is not a member of 'ai2/olmo'"),
    err("a program is not a project", submit(account="ai2"), InvalidCommand,
        "'ai2' is a program, not a project", want_fields={"account": "ai2"}),
    err("a user leaf is not a project", submit(account="ai2/olmo/alice"), InvalidCommand,
        "'ai2/olmo/alice' is a user, not a project"),
    err("an unknown project is refused", submit(account="ai2/nope"), UnknownEntity,
        "unknown account 'ai2/nope'"),
    err("a closed project is refused", submit(account="ai2/old"), UnknownEntity,
        "unknown account 'ai2/old'", setup=OLD),
    err("a removed member is refused", S2, NotAuthorised, "'bob' is not a member of 'ai2/olmo'",
        setup=(c.RemoveMember(actor="root", user="bob", project="ai2/olmo"),)),
    ok("a manager submits on behalf of a member", submit("alice", actor="mgr"), e.JobSubmitted,
       want_attrs={e.JobSubmitted: {"user": "alice", "actor": "mgr"}}),
    ok("the simulator submits on behalf of a member", submit("alice", actor="@sim"),
       e.JobSubmitted, want_attrs={e.JobSubmitted: {"user": "alice", "actor": "@sim"}}),
    err("a member may not submit on behalf of another", submit("alice", actor="bob"),
        NotAuthorised, "'bob' may not submit on behalf of 'alice'"),
    err("nobody submits on behalf of a non-member", submit("carol", actor="root"),
        NotAuthorised, "'carol' is not a member of 'ai2/olmo'"),
    # atk46-23 F15: a priority above 0 goes ahead of every teammate (Slurm: operators' alone)
    err("a member may not raise her own job's priority", submit(priority=10**9), NotAuthorised,
        "'alice' may not raise a job's priority above 0 in 'ai2/olmo': only its managers and "
        "admins may (a member may lower it, a negative --priority)",
        want_fields={"actor": "alice", "account": "ai2/olmo"}),
    err("nor by 1", submit(priority=1), NotAuthorised, "may not raise a job's priority"),
    ok("a member may lower hers", submit(priority=-5), e.JobSubmitted,
       want_attrs={e.JobSubmitted: {"priority": -5, "user": "alice"}}),
    ok("the project's manager may raise a member's", submit("alice", actor="mgr", priority=7),
       e.JobSubmitted, want_attrs={e.JobSubmitted: {"priority": 7, "actor": "mgr"}}),
    ok("the program's manager may too", submit("alice", actor="pm", priority=7), e.JobSubmitted),
    ok("an admin may", submit("alice", actor="root", priority=10**9), e.JobSubmitted),
    err("another project's manager may not", submit("carol", actor="mgr", account="ai2/tulu",
        priority=7), NotAuthorised, "'mgr' may not submit on behalf of 'carol'"),
]

GPU_COUNT = [
    err("a job needs at least one GPU", submit(gpus=0), InvalidCommand,
        "`gpus` must be int >= 1, got 0"),
    err("a negative GPU count is refused", submit(gpus=-3), InvalidCommand, "got -3"),
    ok("a job may ask for every GPU of the cluster", submit(gpus=20), e.JobSubmitted),
    err("a job may not ask for more than the cluster has", submit(gpus=21), InvalidCommand,
        "21 GPUs requested but the cluster has 20 GPUs", want_fields={"gpus": 21, "capacity": 20}),
    ok("a typed job may ask for every GPU of its type", submit(gpus=16, gpu_type="h100"),
       e.JobSubmitted),
    err("a typed job may not exceed its type", submit(gpus=5, gpu_type="a100"), InvalidCommand,
        "5 GPUs requested but the cluster has 4 a100 GPUs", want_fields={"capacity": 4}),
    err("an unknown GPU type has no capacity", submit(gpus=1, gpu_type="tpu"), InvalidCommand,
        "has 0 tpu GPUs", want_fields={"capacity": 0}),
    err("a missing cluster has no capacity", submit(gpus=1, cluster="other"), InvalidCommand,
        "cluster 'other' has 0 GPUs", want_fields={"capacity": 0}),
    err("removed nodes do not count", submit(gpus=17), InvalidCommand, "the cluster has 16 GPUs",
        setup=(c.RemoveNode(actor="root", node="a1"),), want_fields={"capacity": 16}),
]

CONTRACT_CAP = [
    ok("no min runtime takes the cap", submit(min_runtime_s=None), e.JobSubmitted,
       want_attrs={e.JobSubmitted: {"min_runtime_s": CAP_S}}),
    ok("a zero min runtime runs unfunded", submit(min_runtime_s=0), e.JobSubmitted,
       want_attrs={e.JobSubmitted: {"min_runtime_s": 0}}),
    ok("the cap itself is allowed", submit(min_runtime_s=CAP_S), e.JobSubmitted),
    err("one second over the cap is refused", submit(min_runtime_s=CAP_S + 1), ContractViolation,
        f"min runtime {CAP_S + 1}s is outside 0..{CAP_S}s",
        want_fields={"min_runtime_s": CAP_S + 1}),
    err("a negative min runtime is refused", submit(min_runtime_s=-1), InvalidCommand,
        "`min_runtime_s` must be int >= 0, got -1"),
    ok("a short time limit clips the contract and marks debug", submit(time_limit_s=600),
       e.JobSubmitted, want_attrs={e.JobSubmitted: {"min_runtime_s": 600, "debug": True}}),
    ok("a debug job must fit on one node", submit(gpus=16, time_limit_s=600), e.JobSubmitted,
       want_attrs={e.JobSubmitted: {"debug": False}}),
    ok("a 16 minute limit is not debug", submit(time_limit_s=960), e.JobSubmitted,
       want_attrs={e.JobSubmitted: {"debug": False, "min_runtime_s": 960}}),
    err("a zero time limit is refused", submit(time_limit_s=0), InvalidCommand,
        "`time_limit_s` must be int >= 1, got 0"),
    err("a negative duration is refused", submit(duration_s=-1.0), InvalidCommand,
        "`duration_s` must be float >= 0.0, got -1.0"),
]

LIFECYCLE = [
    err("a pending job cannot start", START1, InvalidTransition, "job 1 is pending, not placed",
        setup=(S1,)),
    ok("a placed job starts", START1, e.JobStarted, setup=(S1, P1)),
    err("a running job cannot start again", START1, InvalidTransition,
        "job 1 is running, not placed", setup=(S1, P1, START1)),
    err("a pending job cannot finish", finish(1), InvalidTransition,
        "job 1 is pending, not running", setup=(S1,)),
    ok("a running job completes on exit code 0", finish(1), e.JobFinished, setup=(S1, P1, START1),
       want_attrs={e.JobFinished: {"outcome": "completed", "exit_code": 0}}, want_held=0),
    ok("a placed job fails on a non-zero exit code", finish(1, 3), e.JobFinished, setup=(S1, P1),
       want_attrs={e.JobFinished: {"outcome": "failed", "exit_code": 3}}, want_held=0),
    err("a finished job cannot finish again", finish(1), InvalidTransition,
        "job 1 is finished, not running", setup=(S1, P1, finish(1))),
    err("a finished job cannot be placed", place(1, slot("n1", 4, 5, 6, 7)), InvalidTransition,
        "job 1 is finished, not pending", setup=(S1, P1, finish(1)), want_fields={"job_id": 1}),
    err("a cancelled job cannot be placed", P1, InvalidTransition,
        "job 1 is finished, not pending", setup=(S1, cancel(1))),
    err("a running job cannot be placed again", place(1, slot("n2", 0, 1, 2, 3)),
        InvalidTransition, "job 1 is running, not pending", setup=(S1, P1, START1)),
    err("a job placed twice in one decision is rejected",
        decision(((1, (slot("n1", 0, 1, 2, 3),)), (1, (slot("n2", 0, 1, 2, 3),)))),
        InvalidTransition, "job 1", setup=(S1,), want_fields={"job_id": 1}),
    ok("a pending job is cancelled", cancel(1), e.JobFinished, setup=(S1,),
       want_attrs={e.JobFinished: {"outcome": "cancelled", "exit_code": None}}),
    ok("a running job is cancelled and frees its GPUs", cancel(1), e.JobFinished,
       setup=(S1, P1, START1), want_held=0),
    err("a job cannot be cancelled twice", cancel(1), InvalidTransition,
        "job 1 already cancelled", setup=(S1, cancel(1))),
    err("a completed job cannot be cancelled", cancel(1), InvalidTransition,
        "job 1 already completed", setup=(S1, P1, finish(1))),
    err("utilisation of a placed job is refused",
        c.SampleUtilisation(actor="@executor", job_id=1, gpu_utilisation=(1.0,) * 4),
        InvalidTransition, "job 1 is placed, not running", setup=(S1, P1)),
    err("utilisation needs one value per GPU",
        c.SampleUtilisation(actor="@executor", job_id=1, gpu_utilisation=(50.0,)),
        InvalidCommand, "job 1 needs 4 utilisation values in 0..100", setup=(S1, P1, START1)),
    err("utilisation above 100 is refused",
        c.SampleUtilisation(actor="@executor", job_id=1, gpu_utilisation=(50.0, 50.0, 50.0, 100.5)),
        InvalidCommand, "`gpu_utilisation[3]` must be float <= 100.0, got 100.5",
        setup=(S1, P1, START1)),
    ok("utilisation of a running job is recorded",
       c.SampleUtilisation(actor="@executor", job_id=1, gpu_utilisation=(0.0, 10.0, 99.0, 100.0)),
       e.UtilisationSampled, setup=(S1, P1, START1)),
    err("a job that is not resumable cannot checkpoint",
        c.ReportCheckpoint(actor="alice", job_id=1),
        InvalidCommand, "job 1 is not resumable", setup=(S1, P1, START1)),
    err("another user cannot report a checkpoint", c.ReportCheckpoint(actor="bob", job_id=1),
        NotAuthorised, "'bob' may not report checkpoints of job 1", setup=(S1R, P1, START1)),
    ok("a running resumable job checkpoints", c.ReportCheckpoint(actor="alice", job_id=1),
       e.CheckpointReported, setup=(S1R, P1, START1)),
    err("an unknown job is refused", start(99), UnknownEntity, "unknown job 99",
        want_fields={"job_id": 99}),
    err("a pending job cannot be preempted", preempt(1), InvalidTransition,
        "job 1 is pending, not running", setup=(S1,), at=END1),
    err("a finished job cannot be preempted", preempt(1), InvalidTransition,
        "job 1 is finished, not running", setup=(S1, P1, finish(1)), at=END1),
]

GPU_HOLDING = [
    err("GPUs another job holds cannot be placed on", place(2, slot("n1", 3, 4, 5, 6)),
        InvalidTransition, "GPU 3 of node 'n1' is already held", setup=(S1, S2, P1),
        want_fields={"node": "n1", "gpu": 3}),
    err("two placements on one GPU in one decision are rejected",
        decision(((1, (slot("n1", 0, 1, 2, 3),)), (2, (slot("n1", 3, 4, 5, 6),)))),
        InvalidTransition, "GPU 3 of node 'n1' is already held", setup=(S1, S2),
        want_fields={"node": "n1", "gpu": 3}),
    err("a GPU listed twice in one slot is rejected", place(1, slot("n1", 0, 0, 1, 2)),
        InvalidTransition, "GPU 0 of node 'n1' is already held", setup=(S1,)),
    err("a node listed twice with overlapping GPUs is rejected",
        place(1, slot("n1", 0, 1), slot("n1", 1, 2)), InvalidCommand,
        "placement of job 1 names node 'n1' in two slots", setup=(S1,)),
    err("a node listed twice with distinct GPUs is rejected (one slot per node)",
        place(1, slot("n1", 0, 1), slot("n1", 2, 3)), InvalidCommand,
        "placement of job 1 names node 'n1' in two slots", setup=(S1,)),
    err("a placement with too few GPUs is rejected", place(1, slot("n1", 0, 1, 2)),
        InvalidCommand, "placement of job 1 does not give it 4 GPUs", setup=(S1,)),
    err("a placement with too many GPUs is rejected", place(1, slot("n1", 0, 1, 2, 3, 4)),
        InvalidCommand, "does not give it 4 GPUs", setup=(S1,)),
    err("a GPU index past the node is rejected", place(1, slot("a1", 1, 2, 3, 4)),
        InvalidCommand, "node 'a1' has no GPU 4", setup=(S1,)),
    err("a negative GPU index is rejected", place(1, slot("n1", -1, 0, 1, 2)),
        InvalidCommand,
        "`decision.placements[0].slots[0].gpu_indices[0]` must be int >= 0, got -1",
        setup=(S1,)),
    err("a draining node takes no new work", place(1, slot("n1", 4, 5, 6, 7)), InvalidTransition,
        "node 'n1' is draining", setup=(S1, S2, place(2, slot("n1", 0, 1, 2, 3)), drain("n1"))),
    err("a drained node takes no new work", P1, InvalidTransition, "node 'n1' is drained",
        setup=(S1, drain("n1"))),
    err("a removed node takes no new work", place(1, slot("n2", 0, 1, 2, 3)), UnknownEntity,
        "unknown node 'n2'", setup=(c.RemoveNode(actor="root", node="n2"), S1)),
    err("an unknown node takes no work", place(1, slot("x9", 0, 1, 2, 3)), UnknownEntity,
        "unknown node 'x9'", setup=(S1,), want_fields={"node": "x9"}),
    err("a typed job cannot land on another type", place(1, slot("a1", 0, 1, 2, 3)),
        InvalidCommand, "node 'a1' has a100, job 1 needs h100", setup=(submit(gpu_type="h100"),)),
    ok("a placement may span nodes", place(1, slot("n1", *range(8)), slot("n2", 0, 1, 2, 3)),
       e.CycleDecided, e.JobPlaced, setup=(submit(gpus=12),), want_held=12),
    ok("a preemption frees GPUs for a placement in the same decision",
       decision(((2, (slot("n1", 0, 1, 2, 3),)),), (c.Preemption(job_id=1, reason="fairness"),)),
       e.CycleDecided, e.JobPreempted, e.JobFinished, e.JobPlaced, setup=(S1, S2, P1), at=END1,
       want_held=4, want_attrs={e.JobPlaced: {"job_id": 2, "cycle_id": "cycle"}}),
]

CONTRACTS = [
    err("a decision cannot preempt inside the contract", preempt(1), ContractViolation,
        f"job 1 is inside its contract until t={END1}", setup=(S1, P1), at=END1 - 1,
        want_fields={"job_id": 1}),
    err("a decision cannot preempt inside the contract even saying admin", preempt(1, "admin"),
        ContractViolation, "inside its contract", setup=(S1, P1), at=END1 - 1),
    err("a decision cannot preempt inside the contract for maintenance", preempt(1, "maintenance"),
        ContractViolation, "inside its contract", setup=(S1, P1, drain("n1")), at=T0 + 1),
    ok("a decision preempts at the contract end", preempt(1), e.CycleDecided, e.JobPreempted,
       e.JobFinished, setup=(S1, P1), at=END1, want_held=0,
       want_attrs={e.JobPreempted: {"reason": "fairness", "cycle_id": "cycle"},
                   e.JobFinished: {"outcome": "preempted"}}),
    ok("a preempted resumable job is requeued", preempt(1), e.CycleDecided, e.JobPreempted,
       e.JobRequeued, setup=(S1R, P1, START1), at=END1, want_held=0),
    ok("an unfunded job is preemptible at once", preempt(1), e.CycleDecided, e.JobPreempted,
       e.JobFinished, setup=(S1U, P1)),
    err("the contract restarts when a requeued job is placed again", preempt(1),
        ContractViolation, f"until t={END1 + CONTRACT_S}", at=END1 + CONTRACT_S - 1,
        setup=(S1R, P1, at(END1, preempt(1)), at(END1, P1))),
    ok("an admin preempts inside the contract with a reason",
       c.PreemptJob(actor="root", job_id=1, note="bad node"), e.JobPreempted, e.JobFinished,
       setup=(S1, P1), at=T0 + 1, want_held=0,
       want_attrs={e.JobPreempted: {"reason": "admin", "note": "bad node", "cycle_id": None,
                                    "actor": "root"},
                   e.JobFinished: {"outcome": "preempted"}}),
    err("an admin preemption needs a reason", c.PreemptJob(actor="root", job_id=1, note="  "),
        InvalidCommand, "an admin preemption needs a reason", setup=(S1, P1)),
    err("a manager cannot preempt by hand", c.PreemptJob(actor="mgr", job_id=1, note="x"),
        NotAuthorised, "'mgr' may not preempt jobs by hand: only admins may", setup=(S1, P1)),
    err("the dispatcher cannot preempt by hand",
        c.PreemptJob(actor="@dispatcher", job_id=1, note="x"),
        NotAuthorised, "may not preempt jobs by hand", setup=(S1, P1)),
    err("an admin cannot preempt a pending job", c.PreemptJob(actor="root", job_id=1, note="x"),
        InvalidTransition, "job 1 is pending, not running", setup=(S1,)),
    err("a job is preempted once per decision",
        decision(preempts=(c.Preemption(job_id=1, reason="fairness"),) * 2), InvalidCommand,
        "job 1 is preempted twice", setup=(S1U, P1)),
]

AUTHORISATION = [
    *[
        err(f"{who} may not {what}", cmd, NotAuthorised, f"{who!r} may not {what}: only admins may",
            want_fields={"actor": who})
        for who, what, cmd in list[tuple[str, str, c.AnyCommand]]([
            ("mgr", "register nodes",
             c.RegisterNode(actor="mgr", node="n9", gpu_type="h100", gpus=8)),
            ("@dispatcher", "register nodes",
             c.RegisterNode(actor="@dispatcher", node="n9", gpu_type="h100", gpus=8)),
            ("pm", "drain nodes", drain("n1", actor="pm")),
            ("alice", "return nodes", c.ReturnNode(actor="alice", node="n1")),
            ("mgr", "remove nodes", c.RemoveNode(actor="mgr", node="n1")),
            ("pm", "grant managers", c.GrantManager(actor="pm", user="bob", account="ai2/olmo")),
            ("mgr", "revoke managers",
             c.RevokeManager(actor="mgr", user="mgr", account="ai2/olmo")),
            ("alice", "grant admin", c.GrantAdmin(actor="alice", user="alice")),
            ("pm", "open 'lab'", open_("lab", "program", actor="pm")),
        ])
    ],
    ok("an admin grants a manager", c.GrantManager(actor="root", user="bob", account="ai2/tulu"),
       e.ManagerGranted),
    ok("a manager opens below their account", open_("ai2/olmo/sub", actor="mgr"), Opened, Shares),
    ok("a program's manager opens below its projects", open_("ai2/olmo/sub", actor="pm"),
       Opened, Shares),
    err("a manager cannot open beside their account", open_("ai2/new", actor="mgr"),
        NotAuthorised, "'mgr' may not open 'ai2/new': it needs a manager of 'ai2' or an admin",
        want_fields={"actor": "mgr", "account": "ai2"}),
    err("a manager cannot open under a sibling", open_("ai2/tulu/x", actor="mgr"), NotAuthorised,
        "it needs a manager of 'ai2/tulu'"),
    err("managing ai2/olmo is not managing ai2/olmo2",
        c.AddMember(actor="mgr", user="dave", project="ai2/olmo2"), NotAuthorised,
        "'mgr' may not add members to 'ai2/olmo2'", setup=(open_("ai2/olmo2"),)),
    err("a user cannot open accounts", open_("ai2/olmo/x", actor="alice"), NotAuthorised,
        "'alice' may not open 'ai2/olmo/x'"),
    ok("a manager closes a child", close("ai2/olmo/sub", actor="mgr"), Closed,
       setup=(open_("ai2/olmo/sub"),)),
    err("a manager cannot close their own account", close("ai2/olmo", actor="mgr"), NotAuthorised,
        "'mgr' may not close 'ai2/olmo'"),
    ok("a manager sets the shares of a child",
       c.SetShares(actor="mgr", account="ai2/olmo/alice", shares=5), Shares),
    err("a manager cannot set their own account's shares",
        c.SetShares(actor="mgr", account="ai2/olmo", shares=5), NotAuthorised,
        "'mgr' may not set the shares of 'ai2/olmo'"),
    ok("a program's manager sets the shares of its projects",
       c.SetShares(actor="pm", account="ai2/olmo", shares=5), Shares),
    err("a program's manager cannot set the program's shares",
        c.SetShares(actor="pm", account="ai2", shares=5), NotAuthorised,
        "'pm' may not set the shares of 'ai2': only admins may"),
    err("a user cannot set shares", c.SetShares(actor="alice", account="ai2/olmo/alice", shares=9),
        NotAuthorised, "'alice' may not set the shares"),
    ok("a manager adds a member", c.AddMember(actor="mgr", user="dave", project="ai2/olmo"),
       e.MemberAdded, Opened, Shares),
    err("a user cannot add members", c.AddMember(actor="alice", user="dave", project="ai2/olmo"),
        NotAuthorised, "'alice' may not add members to 'ai2/olmo'"),
    err("a manager cannot add members to a sibling",
        c.AddMember(actor="mgr", user="dave", project="ai2/tulu"), NotAuthorised,
        "'mgr' may not add members to 'ai2/tulu'"),
    err("a member cannot be added twice",
        c.AddMember(actor="root", user="alice", project="ai2/olmo"),
        InvalidTransition, "'alice' is already a member of 'ai2/olmo'"),
    ok("a manager removes a member", c.RemoveMember(actor="mgr", user="bob", project="ai2/olmo"),
       e.MemberRemoved, Closed, want_attrs={Closed: {"path": "ai2/olmo/bob"}}),
    err("a user cannot remove members",
        c.RemoveMember(actor="alice", user="bob", project="ai2/olmo"),
        NotAuthorised, "'alice' may not remove members from 'ai2/olmo'"),
    err("a member with unfinished jobs cannot be removed",
        c.RemoveMember(actor="root", user="alice", project="ai2/olmo"), InvalidTransition,
        "'alice' has 1 unfinished jobs in 'ai2/olmo'", setup=(S1,)),
    ok("the owner cancels their job", cancel(1), e.JobFinished, setup=(S1,)),
    err("another member cannot cancel it", cancel(1, "bob"), NotAuthorised,
        "'bob' may not cancel job 1", setup=(S1,)),
    ok("the project's manager cancels it", cancel(1, "mgr"), e.JobFinished, setup=(S1,)),
    ok("the program's manager cancels it", cancel(1, "pm"), e.JobFinished, setup=(S1,)),
    ok("an admin cancels it", cancel(1, "root"), e.JobFinished, setup=(S1,)),
    err("a manager of another project cannot cancel it", cancel(1, "carol"), NotAuthorised,
        "'carol' may not cancel job 1",
        setup=(c.GrantManager(actor="root", user="carol", account="ai2/tulu"), S1)),
    err("users cannot apply decisions", place(1, slot("n1", 0, 1, 2, 3), actor="alice"),
        NotAuthorised, "'alice' may not apply dispatcher decisions", setup=(S1,)),
    err("managers cannot apply decisions", place(1, slot("n1", 0, 1, 2, 3), actor="pm"),
        NotAuthorised, "'pm' may not apply dispatcher decisions", setup=(S1,)),
    err("users cannot start jobs", start(1, "alice"), NotAuthorised, "'alice' may not start jobs",
        setup=(S1, P1)),
    err("users cannot finish jobs", finish(1, actor="alice"), NotAuthorised,
        "'alice' may not finish jobs", setup=(S1, P1)),
    err("a command needs an actor", submit(""), NotAuthorised, "no actor given"),
    err("the last admin cannot be revoked", c.RevokeAdmin(actor="root", user="root"),
        InvalidTransition, "the last admin cannot be revoked"),
    ok("an admin revokes another", c.RevokeAdmin(actor="root", user="ops"), e.AdminRevoked,
       setup=(c.GrantAdmin(actor="root", user="ops"),)),
]

DRAINS = [
    ok("draining an empty node drains it at once", drain("n1"), e.NodeDrainRequested,
       e.NodeDrained, want_nodes={"n1": "drained"},
       want_attrs={e.NodeDrainRequested: {"reason": "maintenance"}, e.NodeDrained: {"node": "n1"}}),
    ok("draining a busy node waits for its jobs", drain("n1"), e.NodeDrainRequested, setup=(S1, P1),
       want_nodes={"n1": "draining"}),
    ok("the last job finishing drains the node", finish(1), e.JobFinished, e.NodeDrained,
       setup=(S1, P1, drain("n1")), want_nodes={"n1": "drained"}, want_held=0),
    ok("a job finishing while another stays does not drain", finish(1), e.JobFinished,
       setup=(S1, S2, P1, P2_HIGH, drain("n1")), want_nodes={"n1": "draining"}, want_held=4),
    ok("cancelling the last job drains the node", cancel(1), e.JobFinished, e.NodeDrained,
       setup=(S1, P1, drain("n1")), want_nodes={"n1": "drained"}),
    ok("a decision preempting the last job drains the node", preempt(1), e.CycleDecided,
       e.JobPreempted, e.JobFinished, e.NodeDrained, setup=(S1, P1, drain("n1")), at=END1,
       want_nodes={"n1": "drained"}),
    ok("a requeued job leaving drains the node", preempt(1, "maintenance"), e.CycleDecided,
       e.JobPreempted, e.JobRequeued, e.NodeDrained, setup=(S1R, P1, drain("n1")), at=END1,
       want_nodes={"n1": "drained"}),
    ok("an admin preemption of the last job drains the node",
       c.PreemptJob(actor="root", job_id=1, note="now"), e.JobPreempted, e.JobFinished,
       e.NodeDrained, setup=(S1, P1, drain("n1")), want_nodes={"n1": "drained"}),
    ok("a job spanning two draining nodes drains both", finish(1), e.JobFinished, e.NodeDrained,
       e.NodeDrained, setup=(S12, P12, drain("n1"), drain("n2")),
       want_nodes={"n1": "drained", "n2": "drained"}),
    ok("only the draining node of a spanning job drains", finish(1), e.JobFinished, e.NodeDrained,
       setup=(S12, P12, drain("n2")),
       want_nodes={"n1": "active", "n2": "drained"}, want_attrs={e.NodeDrained: {"node": "n2"}}),
    err("a drain needs a reason", drain("n1", reason=" "), InvalidCommand,
        "a drain needs a reason"),
    err("a draining node cannot drain again", drain("n1"), InvalidTransition,
        "node 'n1' is already draining", setup=(S1, P1, drain("n1"))),
    ok("a drained node returns to service", c.ReturnNode(actor="root", node="n1"),
       e.NodeReturned, setup=(drain("n1"),), want_nodes={"n1": "active"}),
    ok("a draining node returns to service", c.ReturnNode(actor="root", node="n1"),
       e.NodeReturned, setup=(S1, P1, drain("n1")), want_nodes={"n1": "active"}),
    err("an active node cannot return", c.ReturnNode(actor="root", node="n1"), InvalidTransition,
        "node 'n1' is active, not draining, drained or lost"),
    err("a busy node cannot be removed", c.RemoveNode(actor="root", node="n1"), InvalidTransition,
        "node 'n1' still runs 1 jobs", setup=(S1, P1)),
    ok("an empty node is removed", c.RemoveNode(actor="root", node="n2"), e.NodeRemoved,
       want_nodes={"n2": "removed"}),
    err("a removed node is unknown", drain("n2"), UnknownEntity, "unknown node 'n2'",
        setup=(c.RemoveNode(actor="root", node="n2"),)),
    err("a node cannot register twice",
        c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8), InvalidTransition,
        "node 'n1' is already registered"),
    ok("a removed node registers again",
       c.RegisterNode(actor="root", node="n2", gpu_type="a100", gpus=2), e.NodeRegistered,
       setup=(c.RemoveNode(actor="root", node="n2"),), want_nodes={"n2": "active"}),
    err("a node needs at least one GPU",
        c.RegisterNode(actor="root", node="n9", gpu_type="h100", gpus=0), InvalidCommand,
        "`gpus` must be int >= 1, got 0"),
    err("a node has at most 64 GPUs",
        c.RegisterNode(actor="root", node="n9", gpu_type="h100", gpus=65), InvalidCommand,
        "`gpus` must be int <= 64, got 65"),
]

def lost(node: str, actor: str = "@slurm", reason: str = "slurm: DOWN") -> c.MarkNodeLost:
    return c.MarkNodeLost(actor=actor, node=node, reason=reason)


LINK1 = c.StartJob(actor="@slurm", job_id=1, engine="slurm", engine_job_id="42")
S2R = submit("bob", resumable=True)  # job 2: bob, 4 GPUs, resumable
P2_N2 = place(2, slot("n2", 0, 1, 2, 3))
Lost, Preempted, Requeued, Finished, Ended = (
    e.NodeLost, e.JobPreempted, e.JobRequeued, e.JobFinished, e.JobEngineEnded
)

NODE_LOST = [
    ok("an engine marks an empty node lost", lost("n1"), Lost, want_nodes={"n1": "lost"},
       want_attrs={Lost: {"node": "n1", "reason": "slurm: DOWN"}}),
    ok("an admin marks a node lost", lost("n1", actor="root"), Lost, want_nodes={"n1": "lost"}),
    err("a manager may not mark a node lost", lost("n1", actor="pm"), NotAuthorised,
        "'pm' may not mark nodes lost: only the dispatcher, executors and admins may"),
    err("a node token may not mark its node lost", lost("n1", actor="@node:n1"), NotAuthorised,
        "may only report for its node"),
    err("a lost node needs a reason", lost("n1", reason=" "), InvalidCommand,
        "a lost node needs a reason"),
    err("a lost node cannot be lost again", lost("n1"), InvalidTransition,
        "node 'n1' is already lost", setup=(lost("n1"),), want_fields={"node": "n1"}),
    err("an unknown node cannot be lost", lost("n9"), UnknownEntity, "unknown node 'n9'"),
    ok("a running job without an engine fails", lost("n1"), Lost, Finished, setup=(S1, P1, START1),
       want_attrs={Finished: {"job_id": 1, "outcome": "failed", "exit_code": None}},
       want_nodes={"n1": "lost"}, want_held=0),
    ok("a Slurm run fails with the engine's node_failure ending", lost("n1"), Lost, Finished,
       Ended, setup=(S1, P1, LINK1), want_held=0,
       want_attrs={Ended: {"job_id": 1, "engine": "slurm", "engine_job_id": "42",
                           "reason": "node_failure", "exit_code": None}}),
    ok("a resumable job is requeued, same id, inside its contract too", lost("n1"), Lost,
       Preempted, Requeued, setup=(S1R, P1, START1), at=T0 + 1, want_held=0,
       want_attrs={Preempted: {"job_id": 1, "reason": "node_failure",
                               "note": "node n1 lost: slurm: DOWN"}, Requeued: {"job_id": 1}}),
    ok("a placed job not yet started ends too", lost("n1"), Lost, Finished, setup=(S1, P1),
       want_held=0),
    ok("every job on the node ends, in id order", lost("n1"), Lost, Finished, Preempted,
       Requeued, setup=(S1, S2R, P1, P2_HIGH), want_held=0),
    ok("jobs on other nodes keep running", lost("n1"), Lost, Finished,
       setup=(S1, S2, P1, P2_N2), want_held=4, want_nodes={"n1": "lost", "n2": "active"}),
    ok("a gang spanning the node frees its other node", lost("n1"), Lost, Finished,
       setup=(S12, P12), want_held=0, want_nodes={"n1": "lost", "n2": "active"}),
    ok("a gang leaving a draining node drains it", lost("n1"), Lost, Finished, e.NodeDrained,
       setup=(S12, P12, drain("n2")), want_nodes={"n1": "lost", "n2": "drained"}),
    ok("a draining node is lost", lost("n1"), Lost, Finished, setup=(S1, P1, drain("n1")),
       want_nodes={"n1": "lost"}),
    ok("a drained node is lost", lost("n1"), Lost, setup=(drain("n1"),),
       want_nodes={"n1": "lost"}),
    err("a lost node takes no work", P1, InvalidTransition, "node 'n1' is lost",
        setup=(S1, lost("n1"))),
    err("a lost node cannot drain", drain("n1"), InvalidTransition, "node 'n1' is already lost",
        setup=(lost("n1"),)),
    ok("a lost node returns to service", c.ReturnNode(actor="@slurm", node="n1"),
       e.NodeReturned, setup=(S1, P1, lost("n1")), want_nodes={"n1": "active"}),
    err("a node lost while a job was placed there is not removed (its launch may live)",
        c.RemoveNode(actor="root", node="n1"), InvalidTransition,
        "job 1 (run 0, placed when the node was lost)", setup=(S1, P1, lost("n1"))),
    ok("a lost node is removed by force", c.RemoveNode(actor="root", node="n1", force=True),
       e.NodeRemoved, setup=(S1, P1, lost("n1")), want_nodes={"n1": "removed"}),
    ok("a lost node that held no placed job is removed", c.RemoveNode(actor="root", node="n1"),
       e.NodeRemoved, setup=(S1, lost("n1")), want_nodes={"n1": "removed"}),
    ok("a requeued job is placed again elsewhere", place(1, slot("n2", 0, 1, 2, 3)), e.CycleDecided,
       e.JobPlaced, setup=(S1R, P1, lost("n1")), want_held=4),
    ok("an engine ending other than an exit fails even with code 0",
       c.FinishJob(actor="@slurm", job_id=1, exit_code=0, engine="slurm", engine_job_id="42",
                   reason="node_failure", engine_state="NODE_FAIL"), Finished, Ended,
       setup=(S1, P1, LINK1), want_attrs={Finished: {"outcome": "failed", "exit_code": 0}}),
    ok("a resumable run the engine ended with its node is requeued",
       c.FinishJob(actor="@slurm", job_id=1, exit_code=0, engine="slurm", engine_job_id="42",
                   reason="node_failure", engine_state="NODE_FAIL"), Preempted, Requeued, Ended,
       setup=(S1R, P1, LINK1), want_held=0,
       want_attrs={Preempted: {"reason": "node_failure",
                               "note": "its run ended with its node (NODE_FAIL)"}}),
    ok("a run the engine ended at its time limit fails",
       c.FinishJob(actor="@slurm", job_id=1, exit_code=0, engine="slurm", reason="time_limit"),
       Finished, Ended, setup=(S1R, P1, LINK1), want_attrs={Finished: {"outcome": "failed"}}),
    err("an admin preemption cannot claim a node failure",
        c.PreemptJob(actor="root", job_id=1, reason="node_failure", note="x"), InvalidCommand,
        "a node failure is recorded on the node", setup=(S1, P1)),
]

ALL_CASES = [
    *ACCOUNT_TREE, *SHARES, *SUBMISSION, *GPU_COUNT, *CONTRACT_CAP, *LIFECYCLE, *GPU_HOLDING,
    *CONTRACTS, *AUTHORISATION, *DRAINS, *NODE_LOST,
]
# fmt: on


def _apply(state: State, cmd: c.AnyCommand, now: float, ids: Callable[[], str]) -> list[e.AnyEvent]:
    events = decide(state, cmd, now, ids)
    for ev in events:
        evolve(state, ev)
    return events


def test_case_ids_are_unique() -> None:
    ids = [case.id for case in ALL_CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda case: case.id)
def test_decide(case: Case, org_state: State, counter_ids: Callable[[], str]) -> None:
    state = org_state
    for step in case.setup:
        when, cmd = step if isinstance(step, tuple) else (T0, step)
        _apply(state, cmd, when, counter_ids)
    before = copy.deepcopy(state)

    if case.want_error is not None:
        with pytest.raises(LedgerError) as info:
            decide(state, case.cmd, case.at, counter_ids)
        error = info.value
        assert type(error) is case.want_error, error.line()
        assert case.want_message in error.message
        for key, want in case.want_fields.items():
            assert error.fields.get(key) == want, (key, error.fields)
        assert state == before, "a rejected command must not touch the state"
        return

    events = decide(state, case.cmd, case.at, counter_ids)
    assert state == before, "decide must not touch the state"
    assert [type(ev) for ev in events] == list(case.want_events)
    assert all(ev.at == case.at and ev.actor == case.cmd.actor for ev in events)
    assert len({ev.event_id for ev in events}) == len(events)
    for cls, attrs in case.want_attrs.items():
        first = next(ev for ev in events if isinstance(ev, cls))
        for key, want in attrs.items():
            assert getattr(first, key) == want, (cls.__name__, key)
    for ev in events:
        # what decide allows, the audit's rules (the same ones, judged per event) allow too
        assert authorisation_failure(state, ev) is None, ev
        evolve(state, ev)
    for node, want_state in case.want_nodes.items():
        assert state.nodes[node].state == want_state, node
    if case.want_held is not None:
        assert len(state.holders) == case.want_held


# --- the contract cap is set when the ledger is initialised --------------------------------------


@pytest.mark.parametrize(
    ("min_runtime_s", "want_min_runtime_s", "want_error"),
    [
        pytest.param(None, 3600, None, id="no min runtime takes the configured cap"),
        pytest.param(3600, 3600, None, id="the configured cap is allowed"),
        pytest.param(3601, None, ContractViolation, id="over the configured cap is refused"),
        pytest.param(CAP_S, None, ContractViolation, id="the default cap no longer applies"),
    ],
)
def test_the_contract_cap_is_configurable(
    min_runtime_s: int | None,
    want_min_runtime_s: int | None,
    want_error: type[LedgerError] | None,
    counter_ids: Callable[[], str],
) -> None:
    state = State()
    setup: list[c.AnyCommand] = [
        c.InitLedger(actor="root", admin="root", min_runtime_cap_s=3600),
        open_("ai2", "program"),
        open_("ai2/olmo"),
        c.AddMember(actor="root", user="alice", project="ai2/olmo"),
        c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
    ]
    for step in setup:
        _apply(state, step, T0, counter_ids)
    assert state.min_runtime_cap_s == 3600
    cmd = submit(min_runtime_s=min_runtime_s)
    if want_error is not None:
        with pytest.raises(want_error, match=r"is outside 0\.\.3600s"):
            decide(state, cmd, T0, counter_ids)
        return
    (ev,) = decide(state, cmd, T0, counter_ids)
    assert isinstance(ev, e.JobSubmitted)
    assert ev.min_runtime_s == want_min_runtime_s


@pytest.mark.parametrize(
    ("cmd", "want_error", "want_message"),
    [
        pytest.param(c.InitLedger(actor="root", admin="root", min_runtime_cap_s=0), InvalidCommand,
                     "`min_runtime_cap_s` must be int >= 1, got 0", id="a zero cap is refused"),
        pytest.param(c.InitLedger(actor="root", admin="bad name"), InvalidCommand,
                     "invalid user name 'bad name'", id="an invalid admin name is refused"),
        pytest.param(S1, InvalidCommand, "the ledger is not initialised",
                     id="nothing runs before init"),
    ],
)  # fmt: skip
def test_initialisation(
    cmd: c.AnyCommand,
    want_error: type[LedgerError],
    want_message: str,
    counter_ids: Callable[[], str],
) -> None:
    with pytest.raises(LedgerError) as info:
        decide(State(), cmd, T0, counter_ids)
    assert type(info.value) is want_error
    assert want_message in info.value.message


def test_a_ledger_initialises_once(org_state: State, counter_ids: Callable[[], str]) -> None:
    with pytest.raises(InvalidTransition, match="already initialised"):
        decide(org_state, c.InitLedger(actor="root", admin="root"), T0, counter_ids)


def test_a_batch_fold_equals_folding_one_by_one(
    org_state: State, counter_ids: Callable[[], str]
) -> None:
    from ledger.core.evolve import fold

    events: list[e.AnyEvent] = []
    state = State()
    cmds: list[c.AnyCommand] = [
        c.InitLedger(actor="root", admin="root"),
        open_("ai2", "program"),
        open_("ai2/p"),
    ]
    for cmd in cmds:
        events += _apply(state, cmd, T0, counter_ids)
    assert fold(events) == state
    assert fold(events[1:], fold(events[:1])) == state


# --- every member's usage has an open user leaf to go to -----------------------------------------


def member_leaf_problems(state: State) -> list[str]:
    """Members of open projects whose `<project>/<user>` leaf is not an open user account."""
    problems = []
    for project, users in sorted(state.members.items()):
        acct = state.accounts.get(project)
        if acct is None or not acct.open:
            continue
        for user in sorted(users):
            leaf = state.accounts.get(f"{project}/{user}")
            if leaf is None or not leaf.open or leaf.kind != "user":
                problems.append(f"{project}/{user}")
    return problems


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param((close("ai2/olmo/alice"), S1), id="closing a member's leaf"),
        pytest.param(
            (close("ai2/tulu/carol"), close("ai2/tulu"), open_("ai2/tulu"),
             submit("carol", account="ai2/tulu")),
            id="closing and reopening a project with members",
        ),
        pytest.param(
            (open_("ai2/olmo/dave"), c.AddMember(actor="root", user="dave", project="ai2/olmo")),
            id="adding a member whose leaf name is taken by a project",
        ),
    ],
)  # fmt: skip
def test_every_member_keeps_an_open_user_leaf(
    steps: tuple[c.AnyCommand, ...], org_state: State, counter_ids: Callable[[], str]
) -> None:
    """Usage is charged to `<project>/<user>`: a member must never be left without that leaf.

    Either command that would break this must be rejected (or remove the membership too).
    """
    for cmd in steps:
        with contextlib.suppress(LedgerError):
            _apply(org_state, cmd, T0, counter_ids)
        assert member_leaf_problems(org_state) == [], f"after {type(cmd).__name__} {cmd}"


# --- the domain is pure --------------------------------------------------------------------------


def test_decide_is_deterministic(org_state: State) -> None:
    cmds: list[c.AnyCommand] = [S1, S2, P1, START1, drain("n1"), finish(1)]
    runs = []
    for _ in range(2):
        state = copy.deepcopy(org_state)
        n = itertools.count()
        ids = lambda n=n: f"x{next(n)}"  # noqa: E731
        runs.append([ev for cmd in cmds for ev in _apply(state, cmd, T0, ids)])
    assert runs[0] == runs[1]
