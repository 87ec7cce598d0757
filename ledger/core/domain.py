"""The write side's domain: `decide(state, command, now, new_id) -> events` and `evolve`.

Pure: no I/O, no clock, no random ids. `now` and `new_id` are parameters. `decide` never mutates
the state; it validates the whole command first and raises a typed LedgerError, so a rejected
command produces nothing. `evolve` folds one event into the state *in place* and returns it:
copying a million-job state per event would make the fold O(n^2); callers that need the old state
keep a `State.copy()`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, TypedDict

import msgspec

from schemas import commands as c
from schemas import events as e
from schemas.bounds import NAME_PATTERN, describe, field_value, validate
from schemas.errors import (
    ContractViolation,
    InvalidCommand,
    InvalidTransition,
    NotAuthorised,
    UnknownEntity,
)

DEBUG_TIME_LIMIT_S = 15 * 60
_NAME = re.compile(NAME_PATTERN)

JobStatus = Literal["pending", "placed", "running", "finished"]
NodeState = Literal["active", "draining", "drained", "removed", "lost"]
"""`lost`: it stopped answering (`NodeLost`); no work is placed on it until it is returned."""


class Account(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    parent: str | None
    kind: e.AccountKind
    shares: int = 0
    open: bool = True


class Node(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    cluster: str
    gpu_type: str
    gpus: int
    state: NodeState = "active"
    drain_reason: str = ""
    lost_reason: str = ""


class Job(msgspec.Struct, frozen=True, kw_only=True):
    spec: e.JobSubmitted
    status: JobStatus = "pending"
    slots: tuple[e.GpuSlot, ...] = ()
    placed_at: float | None = None
    started_at: float | None = None
    checkpoint_at: float | None = None
    outcome: e.FinishOutcome | None = None
    exit_code: int | None = None
    preemptions: int = 0
    logs: tuple[str, ...] = ()
    held: bool = False
    """A held pending job is not scheduled until released."""
    engine: str = ""
    engine_job_id: str = ""
    """The engine's run of the current placement (`JobEngineLinked`), "" while none is known."""

    @property
    def job_id(self) -> int:
        return self.spec.job_id

    @property
    def funded(self) -> bool:
        return self.spec.min_runtime_s > 0

    @property
    def active(self) -> bool:
        return self.status != "finished"

    def contract_ends_at(self) -> float | None:
        """When the job becomes preemptible; None when it holds no GPUs."""
        if self.placed_at is None:
            return None
        return self.placed_at + self.spec.min_runtime_s


class Token(msgspec.Struct, frozen=True, kw_only=True):
    """A bearer token as the ledger knows it: never the secret, only its SHA-256."""

    token_id: str
    user: str
    name: str
    secret_sha256: str
    issued_at: float
    expires_at: float | None = None
    scope: e.TokenScope = "user"
    scope_node: str | None = None
    scope_job: int | None = None
    revoked: bool = False

    @property
    def acts_as(self) -> str:
        """The actor its calls act as: the user, or a narrow system actor for node/job scope."""
        if self.scope == "node":
            return f"{NODE_ACTOR}{self.scope_node}"
        if self.scope == "job":
            return f"{JOB_ACTOR}{self.scope_job}"
        return self.user


@dataclass
class State:
    """Everything `decide` needs to enforce the invariants. Built only by folding events."""

    initialised: bool = False
    cluster: str = "default"
    min_runtime_cap_s: int = 8 * 3600
    admins: set[str] = field(default_factory=set)
    accounts: dict[str, Account] = field(default_factory=dict)
    members: dict[str, set[str]] = field(default_factory=dict)
    managers: dict[str, set[str]] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    holders: dict[tuple[str, int], int] = field(default_factory=dict)
    node_jobs: dict[str, set[int]] = field(default_factory=dict)
    jobs: dict[int, Job] = field(default_factory=dict)
    tokens: dict[str, Token] = field(default_factory=dict)
    service: e.ServiceConfigured | None = None
    """The settings the service last recorded (policy, interval, executor)."""
    next_job_id: int = 1
    events: int = 0
    live_only: bool = False
    """A live state: a finished job leaves `jobs` (decisions never need it again; history reads
    come from the projection), so memory follows live work, not history. `next_job_id` says
    which ids existed: a command on a job that left is refused as finished."""
    finished: int = 0
    """How many jobs have finished (counted in both modes)."""
    active: set[int] = field(default_factory=set)
    """The ids of the jobs not finished (pending, placed, running): what the dispatcher's
    snapshot reads, so its cost follows live work even when `jobs` keeps finished ones."""
    _capacity: dict[tuple[str | None, str | None], tuple[int, int]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def copy(self) -> State:
        return State(
            initialised=self.initialised,
            cluster=self.cluster,
            min_runtime_cap_s=self.min_runtime_cap_s,
            admins=set(self.admins),
            accounts=dict(self.accounts),
            members={k: set(v) for k, v in self.members.items()},
            managers={k: set(v) for k, v in self.managers.items()},
            nodes=dict(self.nodes),
            holders=dict(self.holders),
            node_jobs={k: set(v) for k, v in self.node_jobs.items()},
            jobs=dict(self.jobs),
            tokens=dict(self.tokens),
            service=self.service,
            next_job_id=self.next_job_id,
            events=self.events,
            live_only=self.live_only,
            finished=self.finished,
            active=set(self.active),
        )

    # --- queries -------------------------------------------------------------------------------

    def is_admin(self, actor: str) -> bool:
        return actor in self.admins

    def manages(self, actor: str, path: str) -> bool:
        """Admins manage everything; a manager manages their account and everything below it."""
        if self.is_admin(actor):
            return True
        return any(
            path == root or path.startswith(root + "/") for root in self.managers.get(actor, ())
        )

    def open_account(self, path: str) -> Account:
        acct = self.accounts.get(path)
        if acct is None or not acct.open:
            raise UnknownEntity(
                f"unknown account {path!r}",
                hint="see `gpuledger account tree` for the open accounts",
                account=path,
            )
        return acct

    def job(self, job_id: int) -> Job:
        job = self.jobs.get(job_id)
        if job is None and self.live_only and 0 < job_id < self.next_job_id:
            raise InvalidTransition(
                f"job {job_id} is finished", hint="see `gpuledger jobs`", job_id=job_id
            )
        if job is None:
            raise UnknownEntity(f"unknown job {job_id}", hint="see `gpuledger jobs`", job_id=job_id)
        return job

    def node(self, name: str) -> Node:
        node = self.nodes.get(name)
        if node is None or node.state == "removed":
            raise UnknownEntity(
                f"unknown node {name!r}", hint="see `gpuledger node list`", node=name
            )
        return node

    def capacity(self, gpu_type: str | None, cluster: str | None) -> tuple[int, int]:
        """(total GPUs, largest node) over registered nodes matching the constraints. Cached;
        `evolve` drops the cache on every node event."""
        key = (gpu_type, cluster)
        hit = self._capacity.get(key)
        if hit is None:
            hit = self._capacity[key] = self._scan_capacity(gpu_type, cluster)
        return hit

    def _scan_capacity(self, gpu_type: str | None, cluster: str | None) -> tuple[int, int]:
        total = largest = 0
        for n in self.nodes.values():
            if n.state == "removed":
                continue
            if gpu_type is not None and n.gpu_type != gpu_type:
                continue
            if cluster is not None and n.cluster != cluster:
                continue
            total += n.gpus
            largest = max(largest, n.gpus)
        return total, largest

    def free_indices(self, node: str) -> list[int]:
        n = self.nodes[node]
        return [i for i in range(n.gpus) if (node, i) not in self.holders]


def is_system(actor: str) -> bool:
    """System actors (the dispatcher, executors, the simulator) start with '@'."""
    return actor.startswith("@")


NODE_ACTOR = "@node:"
"""A node token acts as `@node:NAME`: it reports starts, exits and samples of jobs on NAME only."""
JOB_ACTOR = "@job:"
"""A job token acts as `@job:ID`: it reports checkpoints of job ID only."""
_NODE_COMMANDS = (c.StartJob, c.FinishJob, c.SampleUtilisation, c.ReportCheckpoint)


def _check_narrow(state: State, cmd: c.AnyCommand, actor: str) -> None:
    """Node and job actors are system actors confined to their node or job."""
    if actor.startswith(NODE_ACTOR):
        node = actor[len(NODE_ACTOR) :]
        if isinstance(cmd, _NODE_COMMANDS):
            job = state.job(cmd.job_id)
            if any(sl.node == node for sl in job.slots):
                return
            raise NotAuthorised(
                f"{actor!r} may not report for job {cmd.job_id}: it does not run on {node!r}",
                actor=actor,
            )
        raise NotAuthorised(f"{actor!r} may only report for its node", actor=actor)
    if actor.startswith(JOB_ACTOR):
        if isinstance(cmd, c.ReportCheckpoint) and actor == f"{JOB_ACTOR}{cmd.job_id}":
            return
        raise NotAuthorised(f"{actor!r} may only report checkpoints of its job", actor=actor)


def check_act_as(state: State, real: str, actor: str) -> None:
    """Pure: `real` may act as `actor` (`--as`) only when they are the same or `real` is an
    admin, and nobody acts as a system actor."""
    if real == actor:
        return
    if is_system(actor):
        raise NotAuthorised(
            f"{real!r} may not act as {actor!r}: system actors cannot be taken on", actor=real
        )
    if not state.is_admin(real):
        raise NotAuthorised(
            f"{real!r} may not act as {actor!r}: only admins may use --as", actor=real
        )


# --- decide -------------------------------------------------------------------------------------


NewId = Callable[[], str]


def decide(state: State, cmd: c.AnyCommand, now: float, new_id: NewId) -> list[e.AnyEvent]:
    """Pure: validate `cmd` against `state` and return the events it causes, or raise."""
    _bounded(cmd)
    if not isinstance(cmd, c.InitLedger) and not state.initialised:
        raise InvalidCommand(
            "the ledger is not initialised", hint="run `gpuledger init --admin USER`"
        )
    if not cmd.actor:
        raise NotAuthorised("no actor given", hint="pass --as USER or set GPULEDGER_USER")
    if cmd.real_actor is not None:
        check_act_as(state, cmd.real_actor, cmd.actor)
    _check_narrow(state, cmd, cmd.actor)
    handler = _HANDLERS[type(cmd)]
    real = cmd.real_actor if cmd.real_actor != cmd.actor else None
    return handler(state, cmd, _Stamp(now, cmd.actor, new_id, real))


def _bounded(cmd: c.AnyCommand) -> None:
    """Every field inside its type's bounds (`schemas.bounds`): the one check of them, whoever
    built the command (a Struct built in Python skips its `Meta`)."""
    try:
        validate(cmd)
    except msgspec.ValidationError as err:
        op = type(cmd).__struct_config__.tag
        data = msgspec.to_builtins(cmd)
        field = str(err).rpartition("at `$.")[2].rstrip("`")
        found, value = field_value(data, field)
        fields = {field: value} if found and field.isidentifier() else {}
        raise InvalidCommand(
            f"invalid {op} command: {describe(err, data)}", op=op, **fields
        ) from err


class _Envelope(TypedDict):
    event_id: str
    at: float
    actor: str
    real_actor: str | None


@dataclass(frozen=True)
class _Stamp:
    now: float
    actor: str
    new_id: NewId
    real_actor: str | None = None

    def kw(self) -> _Envelope:
        return {
            "event_id": self.new_id(),
            "at": self.now,
            "actor": self.actor,
            "real_actor": self.real_actor,
        }


def _name(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise InvalidCommand(
            f"invalid {what} {value!r}",
            hint="use letters, digits, '_', '.', '-' (at most 63 characters)",
            value=value,
        )
    return value


def _path(value: str) -> str:
    parts = value.split("/")
    for p in parts:
        _name(p, "account name")
    return value


def _require_admin(state: State, actor: str, what: str) -> None:
    if not state.is_admin(actor):
        raise NotAuthorised(f"{actor!r} may not {what}: only admins may", actor=actor)


def _require_manages(state: State, actor: str, path: str | None, what: str) -> None:
    """Top-level (path None) needs an admin; otherwise a manager of `path`'s subtree."""
    if path is None:
        _require_admin(state, actor, what)
        return
    if not state.manages(actor, path):
        raise NotAuthorised(
            f"{actor!r} may not {what}: it needs a manager of {path!r} or an admin",
            actor=actor,
            account=path,
        )


def _init(state: State, cmd: c.InitLedger, s: _Stamp) -> list[e.AnyEvent]:
    if state.initialised:
        raise InvalidTransition("the ledger is already initialised")
    _name(cmd.admin, "user name")
    _name(cmd.cluster, "cluster name")
    return [
        e.LedgerInitialised(
            **s.kw(), admin=cmd.admin, min_runtime_cap_s=cmd.min_runtime_cap_s, cluster=cmd.cluster
        )
    ]


def _grant_admin(state: State, cmd: c.GrantAdmin, s: _Stamp) -> list[e.AnyEvent]:
    _require_admin(state, s.actor, "grant admin")
    _name(cmd.user, "user name")
    if cmd.user in state.admins:
        raise InvalidTransition(f"{cmd.user!r} is already an admin")
    return [e.AdminGranted(**s.kw(), user=cmd.user)]


def _revoke_admin(state: State, cmd: c.RevokeAdmin, s: _Stamp) -> list[e.AnyEvent]:
    _require_admin(state, s.actor, "revoke admin")
    if cmd.user not in state.admins:
        raise InvalidTransition(f"{cmd.user!r} is not an admin")
    if len(state.admins) <= 1:
        raise InvalidTransition("the last admin cannot be revoked")
    return [e.AdminRevoked(**s.kw(), user=cmd.user)]


_PARENT_KINDS: dict[str, tuple[str | None, ...]] = {
    "program": (None, "program"),
    "project": ("program", "project"),
    "user": ("project",),
}


def _open_account(state: State, cmd: c.OpenAccount, s: _Stamp) -> list[e.AnyEvent]:
    path = _path(cmd.path)
    parent = path.rsplit("/", 1)[0] if "/" in path else None
    _require_manages(state, s.actor, parent, f"open {path!r}")
    existing = state.accounts.get(path)
    if not (existing is None or not existing.open):
        raise InvalidTransition(f"account {path!r} is already open", account=path)
    parent_kind = state.open_account(parent).kind if parent is not None else None
    allowed = _PARENT_KINDS[cmd.kind]
    if parent_kind not in allowed:
        raise InvalidCommand(
            f"a {cmd.kind} cannot sit under {parent_kind or 'the root'}",
            hint="programs hold programs and projects; projects hold projects and users",
            account=path,
        )
    return [
        e.AccountOpened(**s.kw(), path=path, parent=parent, kind=cmd.kind),
        e.SharesSet(**s.kw(), account=path, shares=cmd.shares, reason=cmd.reason or "opened"),
    ]


def _active_jobs(state: State, pred: Callable[[Job], bool]) -> list[int]:
    return [j.job_id for j in state.jobs.values() if j.active and pred(j)]


def _close_account(state: State, cmd: c.CloseAccount, s: _Stamp) -> list[e.AnyEvent]:
    acct = state.open_account(cmd.path)
    _require_manages(state, s.actor, acct.parent, f"close {cmd.path!r}")
    user = cmd.path.rsplit("/", 1)[-1]
    if acct.kind == "user" and acct.parent and user in state.members.get(acct.parent, ()):
        raise InvalidTransition(
            f"{cmd.path!r} is the account of member {user!r} of {acct.parent!r}",
            hint="use `gpuledger member remove`",
        )
    children = [a.path for a in state.accounts.values() if a.open and a.parent == cmd.path]
    if children:
        raise InvalidTransition(
            f"account {cmd.path!r} still has open accounts below it: {', '.join(sorted(children))}",
            hint="close them first",
        )
    busy = _active_jobs(state, lambda j: j.spec.account == cmd.path)
    if busy:
        raise InvalidTransition(
            f"account {cmd.path!r} has {len(busy)} unfinished jobs", hint="cancel them first"
        )
    return [e.AccountClosed(**s.kw(), path=cmd.path, reason=cmd.reason)]


def _set_shares(state: State, cmd: c.SetShares, s: _Stamp) -> list[e.AnyEvent]:
    acct = state.open_account(cmd.account)
    _require_manages(state, s.actor, acct.parent, f"set the shares of {cmd.account!r}")
    return [e.SharesSet(**s.kw(), account=cmd.account, shares=cmd.shares, reason=cmd.reason)]


def _project(state: State, path: str) -> Account:
    acct = state.open_account(path)
    if acct.kind != "project":
        raise InvalidCommand(f"{path!r} is a {acct.kind}, not a project", account=path)
    return acct


def _add_member(state: State, cmd: c.AddMember, s: _Stamp) -> list[e.AnyEvent]:
    _project(state, cmd.project)
    _name(cmd.user, "user name")
    _require_manages(state, s.actor, cmd.project, f"add members to {cmd.project!r}")
    if cmd.user in state.members.get(cmd.project, ()):
        raise InvalidTransition(f"{cmd.user!r} is already a member of {cmd.project!r}")
    out: list[e.AnyEvent] = [e.MemberAdded(**s.kw(), user=cmd.user, project=cmd.project)]
    leaf = f"{cmd.project}/{cmd.user}"
    existing = state.accounts.get(leaf)
    if existing is not None and existing.open and existing.kind != "user":
        raise InvalidCommand(
            f"{leaf!r} is an open {existing.kind}, so it cannot be {cmd.user!r}'s account",
            hint="rename the account or the user",
        )
    if existing is None or not existing.open:
        out.append(e.AccountOpened(**s.kw(), path=leaf, parent=cmd.project, kind="user"))
        out.append(e.SharesSet(**s.kw(), account=leaf, shares=cmd.shares, reason="member added"))
    return out


def _remove_member(state: State, cmd: c.RemoveMember, s: _Stamp) -> list[e.AnyEvent]:
    _project(state, cmd.project)
    _require_manages(state, s.actor, cmd.project, f"remove members from {cmd.project!r}")
    if cmd.user not in state.members.get(cmd.project, ()):
        raise UnknownEntity(f"{cmd.user!r} is not a member of {cmd.project!r}")
    busy = _active_jobs(state, lambda j: j.spec.account == cmd.project and j.spec.user == cmd.user)
    if busy:
        raise InvalidTransition(
            f"{cmd.user!r} has {len(busy)} unfinished jobs in {cmd.project!r}",
            hint="cancel them first",
        )
    out: list[e.AnyEvent] = [e.MemberRemoved(**s.kw(), user=cmd.user, project=cmd.project)]
    leaf = state.accounts.get(f"{cmd.project}/{cmd.user}")
    if leaf is not None and leaf.open and leaf.kind == "user":
        out.append(e.AccountClosed(**s.kw(), path=leaf.path, reason="member removed"))
    return out


def _grant_manager(state: State, cmd: c.GrantManager, s: _Stamp) -> list[e.AnyEvent]:
    _require_admin(state, s.actor, "grant managers")
    state.open_account(cmd.account)
    _name(cmd.user, "user name")
    if cmd.account in state.managers.get(cmd.user, ()):
        raise InvalidTransition(f"{cmd.user!r} already manages {cmd.account!r}")
    return [e.ManagerGranted(**s.kw(), user=cmd.user, account=cmd.account)]


def _revoke_manager(state: State, cmd: c.RevokeManager, s: _Stamp) -> list[e.AnyEvent]:
    _require_admin(state, s.actor, "revoke managers")
    if cmd.account not in state.managers.get(cmd.user, ()):
        raise UnknownEntity(f"{cmd.user!r} does not manage {cmd.account!r}")
    return [e.ManagerRevoked(**s.kw(), user=cmd.user, account=cmd.account)]


def _register_node(state: State, cmd: c.RegisterNode, s: _Stamp) -> list[e.AnyEvent]:
    _require_admin(state, s.actor, "register nodes")
    _name(cmd.node, "node name")
    _name(cmd.gpu_type, "GPU type")
    cluster = _name(cmd.cluster or state.cluster, "cluster name")
    existing = state.nodes.get(cmd.node)
    if not (existing is None or existing.state == "removed"):
        raise InvalidTransition(f"node {cmd.node!r} is already registered")
    return [
        e.NodeRegistered(
            **s.kw(), cluster=cluster, node=cmd.node, gpu_type=cmd.gpu_type, gpus=cmd.gpus
        )
    ]


def _drain_node(state: State, cmd: c.DrainNode, s: _Stamp) -> list[e.AnyEvent]:
    if not is_system(s.actor):  # an execution engine that marks a node down drains it
        _require_admin(state, s.actor, "drain nodes")
    node = state.node(cmd.node)
    if node.state != "active":
        raise InvalidTransition(f"node {cmd.node!r} is already {node.state}")
    if not bool(cmd.reason.strip()):
        raise InvalidCommand("a drain needs a reason", hint="pass --reason")
    out: list[e.AnyEvent] = [e.NodeDrainRequested(**s.kw(), node=cmd.node, reason=cmd.reason)]
    if not state.node_jobs.get(cmd.node):
        out.append(e.NodeDrained(**s.kw(), node=cmd.node))
    return out


def _return_node(state: State, cmd: c.ReturnNode, s: _Stamp) -> list[e.AnyEvent]:
    if not is_system(s.actor):  # ... and returns it when the engine brings it back
        _require_admin(state, s.actor, "return nodes")
    node = state.node(cmd.node)
    if node.state not in ("draining", "drained", "lost"):
        raise InvalidTransition(f"node {cmd.node!r} is {node.state}, not draining, drained or lost")
    return [e.NodeReturned(**s.kw(), node=cmd.node)]


def _mark_node_lost(state: State, cmd: c.MarkNodeLost, s: _Stamp) -> list[e.AnyEvent]:
    """The node is gone, and so are the runs on it: every job it holds ends in the same command
    (resumable ones requeued, same id; the others failed, with the engine's `node_failure`
    ending where an engine runs them). Other nodes of a gang are freed with it."""
    _require_system(state, s.actor, "mark nodes lost")
    node = state.node(cmd.node)
    if node.state == "lost":
        raise InvalidTransition(f"node {cmd.node!r} is already lost", node=cmd.node)
    if not bool(cmd.reason.strip()):
        raise InvalidCommand("a lost node needs a reason", hint="pass --reason")
    out: list[e.AnyEvent] = [e.NodeLost(**s.kw(), node=cmd.node, reason=cmd.reason)]
    leaving = set(state.node_jobs.get(cmd.node, ()))
    others: list[str] = []
    note = f"node {cmd.node} lost: {cmd.reason}"[:1000]
    for job_id in sorted(leaving):
        job = state.jobs[job_id]
        others += [sl.node for sl in job.slots if sl.node != cmd.node]
        if job.spec.resumable:
            out += [
                e.JobPreempted(**s.kw(), job_id=job_id, reason="node_failure", note=note),
                e.JobRequeued(**s.kw(), job_id=job_id),
            ]
            continue
        out.append(e.JobFinished(**s.kw(), job_id=job_id, outcome="failed"))
        if job.engine:
            out.append(
                e.JobEngineEnded(
                    **s.kw(),
                    job_id=job_id,
                    engine=job.engine,
                    engine_job_id=job.engine_job_id,
                    reason="node_failure",
                )
            )
    return out + _drained_after(state, others, leaving, s)


def _remove_node(state: State, cmd: c.RemoveNode, s: _Stamp) -> list[e.AnyEvent]:
    _require_admin(state, s.actor, "remove nodes")
    state.node(cmd.node)
    busy = state.node_jobs.get(cmd.node)
    if busy:
        raise InvalidTransition(
            f"node {cmd.node!r} still runs {len(busy or ())} jobs",
            hint="drain it first: `gpuledger node drain`",
        )
    return [e.NodeRemoved(**s.kw(), node=cmd.node, reason=cmd.reason)]


def _submit(state: State, cmd: c.SubmitJob, s: _Stamp) -> list[e.AnyEvent]:
    user = _name(cmd.user, "user name") if cmd.user else s.actor
    if (
        cmd.user
        and cmd.user != s.actor
        and not (is_system(s.actor) or state.manages(s.actor, cmd.account))
    ):
        raise NotAuthorised(f"{s.actor!r} may not submit on behalf of {cmd.user!r}")
    _project(state, cmd.account)
    if user not in state.members.get(cmd.account, ()):
        raise NotAuthorised(
            f"{user!r} is not a member of {cmd.account!r}",
            hint="a manager adds members: `gpuledger member add`",
        )
    total, largest = state.capacity(cmd.gpu_type, cmd.cluster)
    if cmd.gpus > total:
        kind = f"{cmd.gpu_type} GPUs" if cmd.gpu_type else "GPUs"
        where = f"cluster {cmd.cluster!r}" if cmd.cluster else "the cluster"
        raise InvalidCommand(
            f"{cmd.gpus} GPUs requested but {where} has {total} {kind}",
            gpus=cmd.gpus,
            capacity=total,
        )
    cap = state.min_runtime_cap_s
    min_runtime = cap if cmd.min_runtime_s is None else cmd.min_runtime_s
    if not (0 <= min_runtime <= cap):
        raise ContractViolation(
            f"min runtime {min_runtime}s is outside 0..{cap}s (the contract cap)",
            hint="ask for at most the cap; 0 runs unfunded",
            min_runtime_s=min_runtime,
        )
    if cmd.time_limit_s is not None:
        min_runtime = min(min_runtime, cmd.time_limit_s)
    debug = (
        cmd.time_limit_s is not None
        and cmd.time_limit_s <= DEBUG_TIME_LIMIT_S
        and cmd.gpus <= largest
    )
    return [
        e.JobSubmitted(
            **s.kw(),
            job_id=state.next_job_id,
            account=cmd.account,
            user=user,
            gpus=cmd.gpus,
            gpu_type=cmd.gpu_type,
            cluster=cmd.cluster,
            min_runtime_s=min_runtime,
            resumable=cmd.resumable,
            priority=cmd.priority,
            time_limit_s=cmd.time_limit_s,
            debug=debug,
            command=cmd.command,
            labels=cmd.labels,
            duration_s=cmd.duration_s,
            grace_s=cmd.grace_s,
        )
    ]


def _drained_after(
    state: State, freed_nodes: Iterable[str], leaving: set[int], s: _Stamp
) -> list[e.AnyEvent]:
    """NodeDrained for each draining node that the leaving jobs leave empty."""
    out: list[e.AnyEvent] = []
    for name in sorted(set(freed_nodes)):
        node = state.nodes[name]
        if node.state == "draining" and not (state.node_jobs.get(name, set()) - leaving):
            out.append(e.NodeDrained(**s.kw(), node=name))
    return out


def _require_owner(state: State, job: Job, actor: str, what: str) -> None:
    """The job's owner, a manager of its account, an admin or a system actor (cancel's rule)."""
    if not (actor == job.spec.user or state.manages(actor, job.spec.account) or is_system(actor)):
        raise NotAuthorised(
            f"{actor!r} may not {what} job {job.job_id}: only its owner, a manager or an admin"
        )


def _cancel(state: State, cmd: c.CancelJob, s: _Stamp) -> list[e.AnyEvent]:
    job = state.job(cmd.job_id)
    _require_owner(state, job, s.actor, "cancel")
    if not job.active:
        raise InvalidTransition(f"job {cmd.job_id} already {job.outcome}")
    out: list[e.AnyEvent] = [e.JobFinished(**s.kw(), job_id=cmd.job_id, outcome="cancelled")]
    return out + _drained_after(state, (sl.node for sl in job.slots), {cmd.job_id}, s)


def _hold(state: State, cmd: c.HoldJob, s: _Stamp) -> list[e.AnyEvent]:
    job = state.job(cmd.job_id)
    _require_owner(state, job, s.actor, "hold")
    if job.status != "pending":
        raise InvalidTransition(
            f"job {cmd.job_id} is {job.outcome or job.status}: only pending jobs can be held",
            hint="`gpuledger requeue` puts a running job back in the queue",
        )
    if job.held:
        raise InvalidTransition(f"job {cmd.job_id} is already held")
    return [e.JobHeld(**s.kw(), job_id=cmd.job_id, reason=cmd.reason)]


def _release_job(state: State, cmd: c.ReleaseJob, s: _Stamp) -> list[e.AnyEvent]:
    job = state.job(cmd.job_id)
    _require_owner(state, job, s.actor, "release")
    if not job.held:
        raise InvalidTransition(f"job {cmd.job_id} is not held")
    return [e.JobReleased(**s.kw(), job_id=cmd.job_id)]


def _requeue(state: State, cmd: c.RequeueJob, s: _Stamp) -> list[e.AnyEvent]:
    job = state.job(cmd.job_id)
    _require_owner(state, job, s.actor, "requeue")
    if job.status not in ("placed", "running"):
        raise InvalidTransition(
            f"job {cmd.job_id} is {job.outcome or job.status}: only placed or running jobs can "
            "be requeued"
        )
    note = f"requeued by {s.actor}" + (f": {cmd.reason}" if cmd.reason else "")
    out: list[e.AnyEvent] = [
        e.JobPreempted(**s.kw(), job_id=cmd.job_id, reason="admin", note=note[:1000]),
        e.JobRequeued(**s.kw(), job_id=cmd.job_id),
    ]
    return out + _drained_after(state, (sl.node for sl in job.slots), {cmd.job_id}, s)


def _require_system(state: State, actor: str, what: str) -> None:
    if not (is_system(actor) or state.is_admin(actor)):
        raise NotAuthorised(
            f"{actor!r} may not {what}: only the dispatcher, executors and admins may"
        )


def _preemption_events(
    job: Job, p: c.Preemption, cycle_id: str | None, s: _Stamp
) -> list[e.AnyEvent]:
    out: list[e.AnyEvent] = [
        e.JobPreempted(
            **s.kw(),
            job_id=job.job_id,
            reason=p.reason,
            for_job=p.for_job,
            cycle_id=cycle_id,
            note=p.note,
        )
    ]
    if job.spec.resumable:
        out.append(e.JobRequeued(**s.kw(), job_id=job.job_id))
    else:
        out.append(e.JobFinished(**s.kw(), job_id=job.job_id, outcome="preempted"))
    return out


def _check_preemptible(job: Job, now: float) -> None:
    if job.status not in ("placed", "running"):
        raise InvalidTransition(f"job {job.job_id} is {job.status}, not running", job_id=job.job_id)
    ends = job.contract_ends_at()
    if not (ends is None or now >= ends):
        raise ContractViolation(
            f"job {job.job_id} is inside its contract until t={ends}; only an admin preemption "
            "with a reason may end it early",
            job_id=job.job_id,
        )


def _check_slots(
    state: State, job: Job, slots: tuple[e.GpuSlot, ...], taken: set[tuple[str, int]]
) -> None:
    if sum(len(sl.gpu_indices) for sl in slots) != job.spec.gpus:
        raise InvalidCommand(f"placement of job {job.job_id} does not give it {job.spec.gpus} GPUs")
    for sl in slots:
        node = state.node(sl.node)
        if node.state != "active":
            raise InvalidTransition(f"node {sl.node!r} is {node.state}")
        if not (job.spec.gpu_type is None or node.gpu_type == job.spec.gpu_type):
            raise InvalidCommand(
                f"node {sl.node!r} has {node.gpu_type}, job {job.job_id} needs {job.spec.gpu_type}"
            )
        if not (job.spec.cluster is None or node.cluster == job.spec.cluster):
            raise InvalidCommand(f"node {sl.node!r} is not in cluster {job.spec.cluster}")
        for i in sl.gpu_indices:
            if not (0 <= i < node.gpus):
                raise InvalidCommand(f"node {sl.node!r} has no GPU {i}")
            if (sl.node, i) in taken:
                raise InvalidTransition(
                    f"GPU {i} of node {sl.node!r} is already held", node=sl.node, gpu=i
                )
            taken.add((sl.node, i))


def _apply_decision(state: State, cmd: c.ApplyDecision, s: _Stamp) -> list[e.AnyEvent]:
    _require_system(state, s.actor, "apply dispatcher decisions")
    if cmd.based_on > state.events:
        raise InvalidCommand(
            f"a decision based on position {cmd.based_on} is ahead of the log "
            f"(position {state.events})",
            based_on=cmd.based_on,
        )
    out: list[e.AnyEvent] = [
        e.CycleDecided(
            **s.kw(),
            cycle_id=cmd.cycle_id,
            based_on=cmd.based_on,
            policy_version=cmd.policy_version,
            config=cmd.config,
            policy=cmd.policy,
            decided_at=cmd.decided_at,
            ranks=cmd.ranks,
            placed=tuple(p.job_id for p in cmd.placements),
            preempted=tuple(p.job_id for p in cmd.preemptions),
            waiting=cmd.waiting,
            fragmentation_gpus=cmd.fragmentation_gpus,
            wake_at=cmd.wake_at,
            skipped_cycles=cmd.skipped_cycles,
        )
    ]
    # 1. preemptions free GPUs (validated against contracts)
    taken = set(state.holders)
    leaving: set[int] = set()
    touched: list[str] = []
    for p in cmd.preemptions:
        job = state.job(p.job_id)
        if p.job_id in leaving:
            raise InvalidCommand(f"job {p.job_id} is preempted twice")
        _check_preemptible(job, s.now)
        leaving.add(p.job_id)
        for sl in job.slots:
            touched.append(sl.node)
            taken.difference_update((sl.node, i) for i in sl.gpu_indices)
        out += _preemption_events(job, p, cmd.cycle_id, s)
    # 2. placements claim free GPUs on active nodes
    placed: set[int] = set()
    for pl in cmd.placements:
        job = state.job(pl.job_id)
        if not (job.status == "pending" and pl.job_id not in placed):
            raise InvalidTransition(
                f"job {pl.job_id} is placed twice"
                if pl.job_id in placed
                else f"job {pl.job_id} is {job.status}, not pending",
                job_id=pl.job_id,
            )
        if job.held:
            raise InvalidTransition(f"job {pl.job_id} is held", job_id=pl.job_id)
        _check_slots(state, job, pl.slots, taken)
        placed.add(pl.job_id)
        out.append(
            e.JobPlaced(
                **s.kw(),
                job_id=pl.job_id,
                slots=pl.slots,
                cycle_id=cmd.cycle_id,
                based_on=cmd.based_on,
            )
        )
    # 3. draining nodes the preemptions emptied report drained
    return out + _drained_after(state, touched, leaving, s)


def _preempt(state: State, cmd: c.PreemptJob, s: _Stamp) -> list[e.AnyEvent]:
    _require_admin(state, s.actor, "preempt jobs by hand")
    if cmd.reason == "node_failure":
        raise InvalidCommand(
            "a node failure is recorded on the node, not on a job",
            hint="`gpuledger node lost NODE --reason ...` ends its jobs",
        )
    if not bool(cmd.note.strip()):
        raise InvalidCommand("an admin preemption needs a reason", hint="pass --reason")
    job = state.job(cmd.job_id)
    if job.status not in ("placed", "running"):
        raise InvalidTransition(f"job {job.job_id} is {job.status}, not running")
    p = c.Preemption(job_id=job.job_id, reason=cmd.reason, note=cmd.note)
    out = _preemption_events(job, p, None, s)
    return out + _drained_after(state, (sl.node for sl in job.slots), {job.job_id}, s)


def _start(state: State, cmd: c.StartJob, s: _Stamp) -> list[e.AnyEvent]:
    _require_system(state, s.actor, "start jobs")
    job = state.job(cmd.job_id)
    if job.status != "placed":
        raise InvalidTransition(f"job {cmd.job_id} is {job.status}, not placed")
    out: list[e.AnyEvent] = [e.JobStarted(**s.kw(), job_id=cmd.job_id, logs=cmd.logs)]
    if cmd.engine:
        out.append(
            e.JobEngineLinked(
                **s.kw(),
                job_id=cmd.job_id,
                engine=cmd.engine,
                engine_job_id=cmd.engine_job_id,
                run=cmd.run,
                gpus=cmd.gpus,
            )
        )
    return out


def _finish(state: State, cmd: c.FinishJob, s: _Stamp) -> list[e.AnyEvent]:
    _require_system(state, s.actor, "finish jobs")
    job = state.job(cmd.job_id)
    if job.status not in ("placed", "running"):
        raise InvalidTransition(f"job {cmd.job_id} is {job.status}, not running")
    # a run the engine ended (time limit, node failure, ...) did not complete, whatever its code
    ok = cmd.exit_code == 0 and cmd.reason == "exited"
    outcome: e.FinishOutcome = "completed" if ok else "failed"
    out: list[e.AnyEvent] = [
        e.JobFinished(**s.kw(), job_id=cmd.job_id, outcome=outcome, exit_code=cmd.exit_code)
    ]
    if cmd.reason == "node_failure" and job.spec.resumable:  # as when the ledger loses the node
        note = f"its run ended with its node ({cmd.engine_state or 'node failure'})"
        out = [
            e.JobPreempted(**s.kw(), job_id=cmd.job_id, reason="node_failure", note=note),
            e.JobRequeued(**s.kw(), job_id=cmd.job_id),
        ]
    if cmd.engine:
        out.append(
            e.JobEngineEnded(
                **s.kw(),
                job_id=cmd.job_id,
                engine=cmd.engine,
                engine_job_id=cmd.engine_job_id,
                reason=cmd.reason,
                engine_state=cmd.engine_state,
                exit_code=cmd.exit_code,
            )
        )
    return out + _drained_after(state, (sl.node for sl in job.slots), {cmd.job_id}, s)


def _sample(state: State, cmd: c.SampleUtilisation, s: _Stamp) -> list[e.AnyEvent]:
    _require_system(state, s.actor, "report utilisation")
    job = state.job(cmd.job_id)
    if job.status != "running":
        raise InvalidTransition(f"job {cmd.job_id} is {job.status}, not running")
    if not (
        len(cmd.gpu_utilisation) == job.spec.gpus
        and all(0.0 <= u <= 100.0 for u in cmd.gpu_utilisation)
    ):
        raise InvalidCommand(f"job {cmd.job_id} needs {job.spec.gpus} utilisation values in 0..100")
    return [e.UtilisationSampled(**s.kw(), job_id=cmd.job_id, gpu_utilisation=cmd.gpu_utilisation)]


def _checkpoint(state: State, cmd: c.ReportCheckpoint, s: _Stamp) -> list[e.AnyEvent]:
    job = state.job(cmd.job_id)
    if not (is_system(s.actor) or s.actor == job.spec.user or state.is_admin(s.actor)):
        raise NotAuthorised(f"{s.actor!r} may not report checkpoints of job {cmd.job_id}")
    if job.status != "running":
        raise InvalidTransition(f"job {cmd.job_id} is {job.status}, not running")
    if not job.spec.resumable:
        raise InvalidCommand(f"job {cmd.job_id} is not resumable")
    return [e.CheckpointReported(**s.kw(), job_id=cmd.job_id)]


_HEX = re.compile(r"^[0-9a-f]+$")


def _issue_token(state: State, cmd: c.IssueToken, s: _Stamp) -> list[e.AnyEvent]:
    if not (8 <= len(cmd.token_id) <= 32 and _HEX.match(cmd.token_id)):
        raise InvalidCommand("a token id is 8 to 32 lowercase hex digits")
    if not (len(cmd.secret_sha256) == 64 and _HEX.match(cmd.secret_sha256)):
        raise InvalidCommand("secret_sha256 must be a SHA-256 in lowercase hex")
    if cmd.token_id in state.tokens:
        raise InvalidTransition(f"token {cmd.token_id} already exists")
    if cmd.expires_at is not None and not (s.now < cmd.expires_at < s.now + 10 * 365 * 86400):
        raise InvalidCommand("a token expires in the future, within 10 years")
    if cmd.scope == "user":
        _name(cmd.user, "user name")
        if cmd.user != s.actor:
            _require_admin(state, s.actor, f"create tokens for {cmd.user!r}")
        if cmd.scope_node is not None or cmd.scope_job is not None:
            raise InvalidCommand("a user token names no node or job")
    elif cmd.scope == "node":
        if cmd.scope_node is None or cmd.scope_job is not None:
            raise InvalidCommand("a node token names its node (and no job)")
        state.node(cmd.scope_node)
        _require_admin(state, s.actor, "create node tokens")
    else:
        if cmd.scope_job is None or cmd.scope_node is not None:
            raise InvalidCommand("a job token names its job (and no node)")
        job = state.job(cmd.scope_job)
        if not (
            s.actor == job.spec.user
            or state.manages(s.actor, job.spec.account)
            or (is_system(s.actor) and not s.actor.startswith((NODE_ACTOR, JOB_ACTOR)))
        ):
            raise NotAuthorised(f"{s.actor!r} may not create tokens for job {job.job_id}")
    return [
        e.TokenIssued(
            **s.kw(),
            token_id=cmd.token_id,
            user=cmd.user,
            name=cmd.name,
            secret_sha256=cmd.secret_sha256,
            expires_at=cmd.expires_at,
            scope=cmd.scope,
            scope_node=cmd.scope_node,
            scope_job=cmd.scope_job,
        )
    ]


def _revoke_token(state: State, cmd: c.RevokeToken, s: _Stamp) -> list[e.AnyEvent]:
    token = state.tokens.get(cmd.token_id)
    if token is None:
        raise UnknownEntity(f"unknown token {cmd.token_id!r}", hint="see `gpuledger token list`")
    if not (s.actor == token.user or state.is_admin(s.actor)):
        raise NotAuthorised(f"{s.actor!r} may not revoke token {cmd.token_id}: not theirs")
    if token.revoked:
        raise InvalidTransition(f"token {cmd.token_id} is already revoked")
    return [e.TokenRevoked(**s.kw(), token_id=cmd.token_id)]


def _configure(state: State, cmd: c.ConfigureService, s: _Stamp) -> list[e.AnyEvent]:
    if s.actor.startswith((NODE_ACTOR, JOB_ACTOR)) or not (
        is_system(s.actor) or state.is_admin(s.actor)
    ):
        raise NotAuthorised(f"{s.actor!r} may not configure the service: only admins may")
    if not (cmd.interval_s > 0):
        raise InvalidCommand("the cycle interval must be positive")
    return [
        e.ServiceConfigured(
            **s.kw(), policy=cmd.policy, interval_s=cmd.interval_s, executor=cmd.executor
        )
    ]


def authorisation_failure(state: State, ev: e.AnyEvent) -> str | None:
    """Pure: the rule `ev`'s actor failed at the moment `state` stands for, as the handlers above
    enforce it (None: allowed, or no rule). The audit replays history through this, so the
    domain's rules are its only copy."""
    try:
        _authorise_event(state, ev)
    except NotAuthorised as err:
        return err.message
    return None


def _authorise_event(state: State, ev: e.AnyEvent) -> None:
    actor = ev.actor
    if ev.real_actor is not None:
        check_act_as(state, ev.real_actor, actor)
    match ev:
        case e.AccountOpened() | e.AccountClosed():
            parent = ev.path.rsplit("/", 1)[0] if "/" in ev.path else None
            verb = "open" if isinstance(ev, e.AccountOpened) else "close"
            _require_manages(state, actor, parent, f"{verb} {ev.path!r}")
        case e.SharesSet():
            parent = ev.account.rsplit("/", 1)[0] if "/" in ev.account else None
            _require_manages(state, actor, parent, f"set the shares of {ev.account!r}")
        case e.MemberAdded():
            _require_manages(state, actor, ev.project, f"add members to {ev.project!r}")
        case e.MemberRemoved():
            _require_manages(state, actor, ev.project, f"remove members from {ev.project!r}")
        case e.ManagerGranted():
            _require_admin(state, actor, "grant managers")
        case e.ManagerRevoked():
            _require_admin(state, actor, "revoke managers")
        case e.AdminGranted():
            _require_admin(state, actor, "grant admin")
        case e.AdminRevoked():
            _require_admin(state, actor, "revoke admin")
        case e.NodeRegistered():
            _require_admin(state, actor, "register nodes")
        case e.NodeDrainRequested() if not is_system(actor):
            _require_admin(state, actor, "drain nodes")
        case e.NodeReturned() if not is_system(actor):
            _require_admin(state, actor, "return nodes")
        case e.NodeLost():
            _require_system(state, actor, "mark nodes lost")
        case e.NodeRemoved():
            _require_admin(state, actor, "remove nodes")
        case e.TokenIssued() if ev.scope == "user" and ev.user != actor:
            _require_admin(state, actor, f"create tokens for {ev.user!r}")
        case e.TokenIssued() if ev.scope == "node":
            _require_admin(state, actor, "create node tokens")
        case _:
            pass


_HANDLERS: dict[type, Callable[[State, c.AnyCommand, _Stamp], list[e.AnyEvent]]] = {
    c.InitLedger: _init,  # type: ignore[dict-item]
    c.GrantAdmin: _grant_admin,  # type: ignore[dict-item]
    c.RevokeAdmin: _revoke_admin,  # type: ignore[dict-item]
    c.OpenAccount: _open_account,  # type: ignore[dict-item]
    c.CloseAccount: _close_account,  # type: ignore[dict-item]
    c.SetShares: _set_shares,  # type: ignore[dict-item]
    c.AddMember: _add_member,  # type: ignore[dict-item]
    c.RemoveMember: _remove_member,  # type: ignore[dict-item]
    c.GrantManager: _grant_manager,  # type: ignore[dict-item]
    c.RevokeManager: _revoke_manager,  # type: ignore[dict-item]
    c.RegisterNode: _register_node,  # type: ignore[dict-item]
    c.DrainNode: _drain_node,  # type: ignore[dict-item]
    c.ReturnNode: _return_node,  # type: ignore[dict-item]
    c.RemoveNode: _remove_node,  # type: ignore[dict-item]
    c.MarkNodeLost: _mark_node_lost,  # type: ignore[dict-item]
    c.SubmitJob: _submit,  # type: ignore[dict-item]
    c.CancelJob: _cancel,  # type: ignore[dict-item]
    c.HoldJob: _hold,  # type: ignore[dict-item]
    c.ReleaseJob: _release_job,  # type: ignore[dict-item]
    c.RequeueJob: _requeue,  # type: ignore[dict-item]
    c.ApplyDecision: _apply_decision,  # type: ignore[dict-item]
    c.PreemptJob: _preempt,  # type: ignore[dict-item]
    c.StartJob: _start,  # type: ignore[dict-item]
    c.FinishJob: _finish,  # type: ignore[dict-item]
    c.SampleUtilisation: _sample,  # type: ignore[dict-item]
    c.ReportCheckpoint: _checkpoint,  # type: ignore[dict-item]
    c.IssueToken: _issue_token,  # type: ignore[dict-item]
    c.RevokeToken: _revoke_token,  # type: ignore[dict-item]
    c.ConfigureService: _configure,  # type: ignore[dict-item]
}


# --- evolve -------------------------------------------------------------------------------------


def _release(state: State, job: Job) -> None:
    for sl in job.slots:
        for i in sl.gpu_indices:
            state.holders.pop((sl.node, i), None)
        state.node_jobs.get(sl.node, set()).discard(job.job_id)


_NODE_EVENTS = (e.NodeRegistered, e.NodeRemoved)


def evolve(state: State, event: e.AnyEvent) -> State:
    """Fold one event into `state` (in place) and return it. Events are facts: never raises
    for a valid history."""
    state.events += 1
    if isinstance(event, _NODE_EVENTS):
        state._capacity.clear()
    match event:
        case e.LedgerInitialised():
            state.initialised = True
            state.admins.add(event.admin)
            state.min_runtime_cap_s = event.min_runtime_cap_s
            state.cluster = event.cluster
        case e.AdminGranted():
            state.admins.add(event.user)
        case e.AdminRevoked():
            state.admins.discard(event.user)
        case e.AccountOpened():
            state.accounts[event.path] = Account(
                path=event.path, parent=event.parent, kind=event.kind
            )
        case e.AccountClosed():
            acct = state.accounts[event.path]
            state.accounts[event.path] = msgspec.structs.replace(acct, open=False)
        case e.SharesSet():
            acct = state.accounts[event.account]
            state.accounts[event.account] = msgspec.structs.replace(acct, shares=event.shares)
        case e.MemberAdded():
            state.members.setdefault(event.project, set()).add(event.user)
        case e.MemberRemoved():
            state.members.get(event.project, set()).discard(event.user)
        case e.ManagerGranted():
            state.managers.setdefault(event.user, set()).add(event.account)
        case e.ManagerRevoked():
            state.managers.get(event.user, set()).discard(event.account)
        case e.NodeRegistered():
            state.nodes[event.node] = Node(
                name=event.node, cluster=event.cluster, gpu_type=event.gpu_type, gpus=event.gpus
            )
            state.node_jobs[event.node] = set()
        case e.NodeDrainRequested():
            n = state.nodes[event.node]
            state.nodes[event.node] = msgspec.structs.replace(
                n, state="draining", drain_reason=event.reason
            )
        case e.NodeDrained():
            state.nodes[event.node] = msgspec.structs.replace(
                state.nodes[event.node], state="drained"
            )
        case e.NodeReturned():
            n = state.nodes[event.node]
            state.nodes[event.node] = msgspec.structs.replace(
                n, state="active", drain_reason="", lost_reason=""
            )
        case e.NodeLost():
            n = state.nodes[event.node]
            state.nodes[event.node] = msgspec.structs.replace(
                n, state="lost", lost_reason=event.reason
            )
        case e.NodeRemoved():
            state.nodes[event.node] = msgspec.structs.replace(
                state.nodes[event.node], state="removed"
            )
        case e.JobSubmitted():
            state.jobs[event.job_id] = Job(spec=event)
            state.active.add(event.job_id)
            state.next_job_id = max(state.next_job_id, event.job_id + 1)
        case e.JobPlaced():
            job = state.jobs[event.job_id]
            for sl in event.slots:
                for i in sl.gpu_indices:
                    state.holders[(sl.node, i)] = event.job_id
                state.node_jobs.setdefault(sl.node, set()).add(event.job_id)
            state.jobs[event.job_id] = msgspec.structs.replace(
                job, status="placed", slots=event.slots, placed_at=event.at, checkpoint_at=event.at
            )
        case e.JobStarted():
            job = state.jobs[event.job_id]
            state.jobs[event.job_id] = msgspec.structs.replace(
                job, status="running", started_at=event.at, logs=event.logs
            )
        case e.JobPreempted():
            job = state.jobs[event.job_id]
            _release(state, job)
            state.jobs[event.job_id] = msgspec.structs.replace(
                job,
                slots=(),
                placed_at=None,
                started_at=None,
                preemptions=job.preemptions + 1,
                engine="",
                engine_job_id="",
            )
        case e.JobHeld():
            state.jobs[event.job_id] = msgspec.structs.replace(state.jobs[event.job_id], held=True)
        case e.JobReleased():
            state.jobs[event.job_id] = msgspec.structs.replace(state.jobs[event.job_id], held=False)
        case e.JobRequeued():
            state.jobs[event.job_id] = msgspec.structs.replace(
                state.jobs[event.job_id], status="pending"
            )
        case e.JobFinished():
            job = state.jobs[event.job_id]
            _release(state, job)
            state.finished += 1
            state.active.discard(event.job_id)
            if state.live_only:
                del state.jobs[event.job_id]
            else:
                state.jobs[event.job_id] = msgspec.structs.replace(
                    job,
                    status="finished",
                    outcome=event.outcome,
                    exit_code=event.exit_code,
                    slots=(),
                )
        case e.CheckpointReported():
            held = state.jobs.get(event.job_id)
            if held is not None:  # a live state no longer holds a finished job
                state.jobs[event.job_id] = msgspec.structs.replace(held, checkpoint_at=event.at)
        case e.TokenIssued():
            state.tokens[event.token_id] = Token(
                token_id=event.token_id,
                user=event.user,
                name=event.name,
                secret_sha256=event.secret_sha256,
                issued_at=event.at,
                expires_at=event.expires_at,
                scope=event.scope,
                scope_node=event.scope_node,
                scope_job=event.scope_job,
            )
        case e.TokenRevoked():
            token = state.tokens[event.token_id]
            state.tokens[event.token_id] = msgspec.structs.replace(token, revoked=True)
        case e.ServiceConfigured():
            state.service = event
        case e.JobEngineLinked():
            linked = state.jobs.get(event.job_id)
            if linked is not None and linked.active:
                state.jobs[event.job_id] = msgspec.structs.replace(
                    linked, engine=event.engine, engine_job_id=event.engine_job_id
                )
        case e.UtilisationSampled() | e.CycleDecided() | e.JobEngineEnded():
            pass
    return state


def fold(events: Iterable[e.AnyEvent], state: State | None = None) -> State:
    s = state if state is not None else State()
    for ev in events:
        evolve(s, ev)
    return s


# --- conflicts ----------------------------------------------------------------------------------


def event_keys(event: e.AnyEvent) -> set[str]:
    """What an event touches, for optimistic concurrency: `job:N`, `node:X`, `account:P`."""
    keys: set[str] = set()
    job_id = getattr(event, "job_id", None)
    if isinstance(job_id, int):
        keys.add(f"job:{job_id}")
    node = getattr(event, "node", None)
    if isinstance(node, str):
        keys.add(f"node:{node}")
    for sl in getattr(event, "slots", ()):
        keys.add(f"node:{sl.node}")
    for attr in ("path", "account", "project"):
        v = getattr(event, attr, None)
        if isinstance(v, str):
            keys.add(f"account:{v}")
    return keys


def command_keys(state: State, cmd: c.AnyCommand) -> set[str]:
    """What a command depends on; a change to any of these since its expected position conflicts."""
    keys: set[str] = set()
    if isinstance(cmd, c.ApplyDecision):
        for p in cmd.preemptions:
            keys.add(f"job:{p.job_id}")
            job = state.jobs.get(p.job_id)
            keys.update(f"node:{sl.node}" for sl in (job.slots if job else ()))
        for pl in cmd.placements:
            keys.add(f"job:{pl.job_id}")
            keys.update(f"node:{sl.node}" for sl in pl.slots)
        return keys
    for attr in ("job_id",):
        v = getattr(cmd, attr, None)
        if isinstance(v, int):
            keys.add(f"job:{v}")
    v = getattr(cmd, "node", None)
    if isinstance(v, str):
        keys.add(f"node:{v}")
    for attr in ("path", "account", "project"):
        v = getattr(cmd, attr, None)
        if isinstance(v, str):
            keys.add(f"account:{v}")
    return keys
