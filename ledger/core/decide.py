"""The write side's decisions: `decide(state, command, now, new_id) -> events`.

Pure: no I/O, no clock, no random ids. `now` and `new_id` are parameters. `decide` never mutates
the state; it validates the whole command first and raises a typed LedgerError, so a rejected
command produces nothing. `ledger.core.authz.authorise` first says whether the actor may send the
command (every authorisation rule is written there, once); then the command's handler validates
it against the state and returns the events it causes. The fold is `ledger.core.evolve`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict, cast

from ledger.core import jobs
from ledger.core.authz import authorise
from ledger.core.cancels import cancel
from ledger.core.conflicts import command_keys, event_keys
from ledger.core.nodes import NODE_HANDLERS
from ledger.core.nodes import name as _name
from ledger.core.runs import between, confirm_run_ended, limit_passed, limits_stop
from ledger.core.runs import drained_after as _drained_after
from ledger.core.state import DRAINED_NOTE, Account, Job, State
from schemas import commands as c
from schemas import events as e
from schemas.bounds import check_command, job_grace
from schemas.errors import (
    ContractViolation,
    InvalidCommand,
    InvalidTransition,
    NotAuthorised,
    UnknownEntity,
)
from schemas.units import when

__all__ = ["command_keys", "decide", "decide_parts", "event_keys"]

DEBUG_TIME_LIMIT_S = 15 * 60

NewId = Callable[[], str]
_Evs = list[e.AnyEvent]


def decide(state: State, cmd: c.AnyCommand, now: float, new_id: NewId) -> list[e.AnyEvent]:
    """Pure: validate `cmd` against `state` and return the events it causes, or raise."""
    return [ev for part in decide_parts(state, cmd, now, new_id) for ev in part]


def decide_parts(state: State, cmd: c.AnyCommand, now: float, new_id: NewId) -> tuple[_Evs, _Evs]:
    """Pure: `decide` in two: its own events, the dependents' ends they cause (atk46-25 F1)."""
    check_command(cmd)
    if not isinstance(cmd, c.InitLedger) and not state.initialised:
        raise InvalidCommand(
            "the ledger is not initialised", hint="run `gpuledger init --admin USER`"
        )
    if not cmd.actor:
        raise NotAuthorised("no actor given", hint="pass --as USER or set GPULEDGER_USER")
    authorise(state, cmd)
    real = cmd.real_actor if cmd.real_actor != cmd.actor else None
    stamp = _Stamp(now, cmd.actor, new_id, real)
    events = _HANDLERS[type(cmd)](state, cmd, stamp)
    return events, jobs.dependents_ended(state, events, stamp.kw)


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


def _path(value: str) -> str:
    parts = value.split("/")
    for p in parts:
        _name(p, "account name")
    return value


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
    _name(cmd.user, "user name")
    if cmd.user in state.admins:
        raise InvalidTransition(f"{cmd.user!r} is already an admin")
    return [e.AdminGranted(**s.kw(), user=cmd.user)]


def _revoke_admin(state: State, cmd: c.RevokeAdmin, s: _Stamp) -> list[e.AnyEvent]:
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
    existing = state.accounts.get(path)
    if not (existing is None or not existing.open):
        raise InvalidTransition(f"account {path!r} is already open", account=path)
    _room_below(state, cmd.actor, path)
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
    state.open_account(cmd.account)
    return [e.SharesSet(**s.kw(), account=cmd.account, shares=cmd.shares, reason=cmd.reason)]


def _project(state: State, path: str) -> Account:
    acct = state.open_account(path)
    if acct.kind != "project":
        raise InvalidCommand(f"{path!r} is a {acct.kind}, not a project", account=path)
    return acct


MAX_MEMBERS = 2_000  # a manager's most in a project; each costs every cycle (atk44-25 F13)
MAX_BELOW = 10_000  # a manager's most open accounts below one they manage, members' included


def _room_below(state: State, actor: str, path: str) -> None:
    """A manager (an admin may go past) opens no account at `path` where one they manage above
    it has MAX_BELOW open accounts below it: the bound on members is per project, and a manager
    opens projects at will (atk44w F3)."""
    for root in () if state.is_admin(actor) else sorted(state.managers.get(actor, ())):
        if path.startswith(root + "/") and (n := state.open_below(root)) >= MAX_BELOW:
            raise InvalidTransition(
                f"{root!r} has {n:,} open accounts below it, the most a manager may keep below "
                f"one account ({MAX_BELOW:,})", hint="close unused ones, or ask an admin",
                actor=actor, account=root,
            )  # fmt: skip


def _add_member(state: State, cmd: c.AddMember, s: _Stamp) -> list[e.AnyEvent]:
    _project(state, cmd.project)
    _name(cmd.user, "user name")
    members = state.members.get(cmd.project, ())
    if cmd.user in members:
        raise InvalidTransition(f"{cmd.user!r} is already a member of {cmd.project!r}")
    if len(members) >= MAX_MEMBERS and not state.is_admin(cmd.actor):
        raise NotAuthorised(
            f"{cmd.project!r} has {len(members):,} members, the most a manager may give one "
            f"project ({MAX_MEMBERS:,})", hint="split it, or ask an admin", actor=cmd.actor,
        )  # fmt: skip
    out: list[e.AnyEvent] = [e.MemberAdded(**s.kw(), user=cmd.user, project=cmd.project)]
    leaf = f"{cmd.project}/{cmd.user}"
    existing = state.accounts.get(leaf)
    if existing is not None and existing.open and existing.kind != "user":
        raise InvalidCommand(
            f"{leaf!r} is an open {existing.kind}, so it cannot be {cmd.user!r}'s account",
            hint="rename the account or the user",
        )
    if existing is None or not existing.open:
        _room_below(state, cmd.actor, leaf)
        out.append(e.AccountOpened(**s.kw(), path=leaf, parent=cmd.project, kind="user"))
        out.append(e.SharesSet(**s.kw(), account=leaf, shares=cmd.shares, reason="member added"))
    return out


def _remove_member(state: State, cmd: c.RemoveMember, s: _Stamp) -> list[e.AnyEvent]:
    _project(state, cmd.project)
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
    state.open_account(cmd.account)
    _name(cmd.user, "user name")
    if cmd.account in state.managers.get(cmd.user, ()):
        raise InvalidTransition(f"{cmd.user!r} already manages {cmd.account!r}")
    return [e.ManagerGranted(**s.kw(), user=cmd.user, account=cmd.account)]


def _revoke_manager(state: State, cmd: c.RevokeManager, s: _Stamp) -> list[e.AnyEvent]:
    if cmd.account not in state.managers.get(cmd.user, ()):
        raise UnknownEntity(f"{cmd.user!r} does not manage {cmd.account!r}")
    return [e.ManagerRevoked(**s.kw(), user=cmd.user, account=cmd.account)]


def _submit(state: State, cmd: c.SubmitJob, s: _Stamp) -> list[e.AnyEvent]:
    """The contract settled here; the job's world, array and dependency in `ledger.core.jobs`."""
    user = _name(cmd.user, "user name") if cmd.user else s.actor
    _project(state, cmd.account)
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
    limit, taken_from = cmd.time_limit_s, None
    if cmd.unlimited and limit is not None:  # the API's (atk62b G4: taken as the limit, silently)
        raise InvalidCommand(
            f"no time limit (unlimited) and a time limit of {limit} s are both asked",
            hint="ask one: time_limit_s, or unlimited with no time_limit_s",
            time_limit_s=limit,
        )
    if limit is None and cmd.unlimited and state.max_time_s is not None:
        raise jobs.unlimited_refused(state.max_time_s)
    if limit is None and state.max_time_s is not None:  # Slurm's rule: the partition's limit
        taken_from = state.max_time_s
        limit = jobs.taken_limit(taken_from, job_grace(cmd.grace_s, state.grace_s))
    elif limit is not None and state.max_time_s is not None:  # its grace fits too (atk62b G1)
        refused = jobs.grace_refused(limit, job_grace(cmd.grace_s, state.grace_s), state.max_time_s)
        if refused is not None:
            raise refused
    if limit is not None:  # no protection past the limit
        min_runtime = min(min_runtime, limit)
    debug = (
        cmd.time_limit_s is not None
        and cmd.time_limit_s <= DEBUG_TIME_LIMIT_S
        and cmd.gpus <= largest
    )
    contract = dict(
        account=cmd.account,
        user=user,
        gpus=cmd.gpus,
        gpu_type=cmd.gpu_type,
        cluster=cmd.cluster,
        min_runtime_s=min_runtime,
        resumable=cmd.resumable,
        priority=cmd.priority,
        time_limit_s=limit,
        max_time_s=taken_from,
        debug=debug,
        command=cmd.command,
        labels=cmd.labels,
        duration_s=cmd.duration_s,
        grace_s=cmd.grace_s,
    )
    return jobs.submissions(state, cmd, contract, s.kw)


def _hold(state: State, cmd: c.HoldJob, s: _Stamp) -> list[e.AnyEvent]:
    job = state.job(cmd.job_id)
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
    if not job.held:
        raise InvalidTransition(f"job {cmd.job_id} is not held")
    return [e.JobReleased(**s.kw(), job_id=cmd.job_id)]


def _requeue(state: State, cmd: c.RequeueJob, s: _Stamp) -> list[e.AnyEvent]:
    job = state.job(cmd.job_id)
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


def _unplace(state: State, cmd: c.UnplaceJob, s: _Stamp) -> list[e.AnyEvent]:
    """An engine's take-back of a run it never started (`JobUnplaced`): not a preemption."""
    job = state.job(cmd.job_id)
    if job.status != "placed" or job.run != cmd.run:
        raise InvalidTransition(
            f"job {cmd.job_id} is {job.outcome or job.status} (run {job.run}): only a placed "
            f"run not started can be taken back, not run {cmd.run}"
        )
    unplaced = e.JobUnplaced(**s.kw(), job_id=cmd.job_id, run=cmd.run, reason=cmd.reason)
    return [unplaced, *_drained_after(state, (sl.node for sl in job.slots), {cmd.job_id}, s)]


def _preemption_events(
    job: Job, p: c.Preemption, cycle_id: str | None, s: _Stamp, limits: bool = False
) -> list[e.AnyEvent]:
    """The events of a preemption: requeued when resumable, else finished `preempted`; a job
    in its time limit's grace (`limits`: its engine stops jobs there, `runs.limits_stop`) timed
    out, `time_limit` (atk53-23 F5)."""
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
    if limits and (passed := limit_passed(job, s.now)) is not None:
        # in its limit's grace: it timed out, as at its SIGKILL; the preemption only cuts the
        # grace (atk53-23 F5: it was `preempted`, a resumable one requeued to run again)
        note = f"its time limit passed at {when(passed)}; preempted ({p.reason}) in its grace"
        out.append(e.JobFinished(**s.kw(), job_id=job.job_id, outcome="failed",
                                 reason="time_limit", note=note[:1000]))  # fmt: skip
    elif job.spec.resumable:
        out.append(e.JobRequeued(**s.kw(), job_id=job.job_id))
    else:
        out.append(
            e.JobFinished(
                **s.kw(), job_id=job.job_id, outcome="preempted", reason="preempted", note=p.note
            )
        )
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
    named = [sl.node for sl in slots]
    if len(set(named)) != len(named):  # one slot per node (a log may hold older ones: the
        twice = next(n for n in named if named.count(n) > 1)  # dispatcher's view joins them)
        raise InvalidCommand(f"placement of job {job.job_id} names node {twice!r} in two slots")
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


_RECORDED = tuple(
    f for f in c.DecisionBody.__struct_fields__ if f not in ("placements", "preemptions")
)
"""The fields of a decision that its record keeps as they are (the outcomes, by reference)."""


def _apply_decision(state: State, cmd: c.ApplyDecision, s: _Stamp) -> list[e.AnyEvent]:
    d = cmd.decision
    if d.based_on > state.events:
        raise InvalidCommand(
            f"a decision based on position {d.based_on} is ahead of the log "
            f"(position {state.events})",
            based_on=d.based_on,
        )
    out: list[e.AnyEvent] = [
        e.CycleDecided(
            **s.kw(),
            **{f: getattr(d, f) for f in _RECORDED},
            placed=tuple(p.job_id for p in d.placements),
            preempted=tuple(p.job_id for p in d.preemptions),
        )
    ]
    # 1. preemptions free GPUs (validated against contracts)
    taken = set(state.holders)
    leaving: set[int] = set()
    touched: list[str] = []
    for p in d.preemptions:
        job = state.job(p.job_id)
        if p.job_id in leaving:
            raise InvalidCommand(f"job {p.job_id} is preempted twice")
        _check_preemptible(job, s.now)
        leaving.add(p.job_id)
        for sl in job.slots:
            touched.append(sl.node)
            taken.difference_update((sl.node, i) for i in sl.gpu_indices)
        out += _preemption_events(job, p, d.cycle_id, s, limits_stop(state))
    # 2. placements claim free GPUs on active nodes
    placed: set[int] = set()
    for pl in d.placements:
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
                cycle_id=d.cycle_id,
                based_on=d.based_on,
            )
        )
    # 3. draining nodes the preemptions emptied report drained
    return out + _drained_after(state, touched, leaving, s)


def _preempt(state: State, cmd: c.PreemptJob, s: _Stamp) -> list[e.AnyEvent]:
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
    out = _preemption_events(job, p, None, s, limits_stop(state))
    return out + _drained_after(state, (sl.node for sl in job.slots), {job.job_id}, s)


def _start(state: State, cmd: c.StartJob, s: _Stamp) -> list[e.AnyEvent]:
    job = state.job(cmd.job_id)
    if job.status != "placed":
        raise InvalidTransition(f"job {cmd.job_id} is {job.status}, not placed")
    started = between(cmd.started_at, job.placed_at, s.now)
    out: list[e.AnyEvent] = [
        e.JobStarted(**s.kw(), job_id=cmd.job_id, logs=cmd.logs, started_at=started)
    ]
    if cmd.engine:
        out.append(
            e.JobEngineLinked(
                **s.kw(),
                job_id=cmd.job_id,
                engine=cmd.engine,
                engine_job_id=cmd.engine_job_id,
                run=cmd.run,
                gpus=cmd.gpus or job.slots,  # an engine that cannot say was asked for these
                started_at=started,
                parts=cmd.parts,
            )
        )
    return out


_ENDINGS: dict[str, e.FinishReason] = {
    "time_limit": "time_limit",
    "node_failure": "node_lost",
    "cancelled": "cancelled",
    "out_of_memory": "failed",
    "lost": "failed",
    "launch_failed": "launch_failed",
    "drained": "preempted",
}
"""How an engine's word for a run's end becomes the job's `FinishReason` (an exit: its code)."""
_NOTES = {"out_of_memory": "out of memory", "lost": "its run vanished with no exit code"}


def _finish(state: State, cmd: c.FinishJob, s: _Stamp) -> list[e.AnyEvent]:
    job = state.job(cmd.job_id)
    if job.status not in ("placed", "running"):
        raise InvalidTransition(f"job {cmd.job_id} is {job.status}, not running")
    # a run the engine ended (time limit, node failure, ...) did not complete, whatever its code
    if cmd.reason == "exited":
        reason: e.FinishReason = "completed" if cmd.exit_code == 0 else "failed"
    else:
        reason = _ENDINGS[cmd.reason]
    outcome: e.FinishOutcome = "failed"
    if reason in ("completed", "cancelled", "preempted"):  # preempted: not resumable, drained
        outcome = reason  # (by its node's drain, not a decision: no preemption is recorded)
    note = DRAINED_NOTE if cmd.reason == "drained" else cmd.note or _NOTES.get(cmd.reason, "")
    # its own end, inside its placement and not after now
    ended_at = between(cmd.ended_at, job.placed_at, s.now)
    out: list[e.AnyEvent] = [
        e.JobFinished(
            **s.kw(),
            job_id=cmd.job_id,
            outcome=outcome,
            exit_code=None if reason == "launch_failed" else cmd.exit_code,  # no process
            reason=reason,
            note=note[:1000],
            ended_at=ended_at,
        )
    ]
    if cmd.reason == "node_failure" and job.spec.resumable:  # as when the ledger loses the node
        note = f"its run ended with its node ({cmd.engine_state or 'node failure'})"
        out = [
            e.JobPreempted(**s.kw(), job_id=cmd.job_id, reason="node_failure", note=note),
            e.JobRequeued(**s.kw(), job_id=cmd.job_id),
        ]
    if cmd.reason == "drained" and job.spec.resumable:  # requeued: a maintenance preemption
        p = c.Preemption(job_id=cmd.job_id, reason="maintenance", note=DRAINED_NOTE)
        out = _preemption_events(job, p, None, s, limits_stop(state))
    if cmd.engine and cmd.reason not in ("launch_failed", "drained"):
        out.append(
            e.JobEngineEnded(
                **s.kw(),
                job_id=cmd.job_id,
                engine=cmd.engine,
                engine_job_id=cmd.engine_job_id,
                reason=cast(e.EndReason, cmd.reason),  # the engine's words: not the two above
                engine_state=cmd.engine_state,
                exit_code=cmd.exit_code,
                ended_at=ended_at,
                note=cmd.note,
                killed=cmd.killed,
            )
        )
    return out + _drained_after(state, (sl.node for sl in job.slots), {cmd.job_id}, s)


def _sample(state: State, cmd: c.SampleUtilisation, s: _Stamp) -> list[e.AnyEvent]:
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
    if job.status != "running":
        raise InvalidTransition(f"job {cmd.job_id} is {job.status}, not running")
    if not job.spec.resumable:
        raise InvalidCommand(f"job {cmd.job_id} is not resumable")
    return [e.CheckpointReported(**s.kw(), job_id=cmd.job_id)]


def _leader_ended(state: State, cmd: c.ReportLeaderEnded, s: _Stamp) -> list[e.AnyEvent]:
    job = state.job(cmd.job_id)
    if job.status != "running" or job.run != cmd.run:
        raise InvalidTransition(f"job {cmd.job_id} is {job.status}, not running run {cmd.run}")
    if job.reaping_kill_at is not None:
        raise InvalidTransition(f"job {cmd.job_id}'s command has already been reported ended")
    return [
        e.LeaderEnded(**s.kw(), job_id=cmd.job_id, run=cmd.run, left=cmd.left,
                      leader_ended_at=cmd.leader_ended_at, kill_at=cmd.kill_at,
                      exit_code=cmd.exit_code)
    ]  # fmt: skip


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
        if cmd.scope_node is not None or cmd.scope_job is not None:
            raise InvalidCommand("a user token names no node or job")
    elif cmd.scope == "node":
        if cmd.scope_node is None or cmd.scope_job is not None:
            raise InvalidCommand("a node token names its node (and no job)")
        state.node(cmd.scope_node)
    else:
        if cmd.scope_job is None or cmd.scope_node is not None:
            raise InvalidCommand("a job token names its job (and no node)")
        state.job(cmd.scope_job)
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
    if token.revoked:
        raise InvalidTransition(f"token {cmd.token_id} is already revoked")
    return [e.TokenRevoked(**s.kw(), token_id=cmd.token_id)]


def _configure(state: State, cmd: c.ConfigureService, s: _Stamp) -> list[e.AnyEvent]:
    if not (cmd.interval_s > 0):
        raise InvalidCommand("the cycle interval must be positive")
    return [
        e.ServiceConfigured(
            **s.kw(),
            policy=cmd.policy,
            interval_s=cmd.interval_s,
            executor=cmd.executor,
            grace_s=cmd.grace_s,
            max_time_s=cmd.max_time_s,
        )
    ]


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
    c.SubmitJob: _submit,  # type: ignore[dict-item]
    c.CancelJob: cancel,  # type: ignore[dict-item]
    c.HoldJob: _hold,  # type: ignore[dict-item]
    c.ReleaseJob: _release_job,  # type: ignore[dict-item]
    c.RequeueJob: _requeue,  # type: ignore[dict-item]
    c.UnplaceJob: _unplace,  # type: ignore[dict-item]
    c.ApplyDecision: _apply_decision,  # type: ignore[dict-item]
    c.PreemptJob: _preempt,  # type: ignore[dict-item]
    c.StartJob: _start,  # type: ignore[dict-item]
    c.FinishJob: _finish,  # type: ignore[dict-item]
    c.ConfirmRunEnded: confirm_run_ended,  # type: ignore[dict-item]
    c.SampleUtilisation: _sample,  # type: ignore[dict-item]
    c.ReportCheckpoint: _checkpoint,  # type: ignore[dict-item]
    c.ReportLeaderEnded: _leader_ended,  # type: ignore[dict-item]
    c.IssueToken: _issue_token,  # type: ignore[dict-item]
    c.RevokeToken: _revoke_token,  # type: ignore[dict-item]
    c.ConfigureService: _configure,  # type: ignore[dict-item]
    **NODE_HANDLERS,
}
