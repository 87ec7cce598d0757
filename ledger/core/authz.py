"""Who may do what: every authorisation rule of the write side, each stated once.

Pure: no I/O, no clock. Identity is established at the edge (`ledger.server.identity`) and arrives
here as an actor; these rules are its only judge. `decide` (`ledger.core.decide`) asks
`authorise` before a command's handler runs, and the audit (`ledger.history.audit`) asks
`authorisation_failure` of every event in a history, so one rule judges a change when it is
asked for and again when history is checked.

Most rules are rules about an event (`_EVENT_RULES`): who may open an account, set shares, add
members, grant managers or admins, register, drain, return, lose or remove nodes, issue tokens
for others or for nodes, and decide and place (the dispatcher alone: its `ApplyDecision` is judged
by the same rule). A command is judged by the rule of the event it causes (`_CAUSES`), read
off the command itself, whose fields are named as the event's: so a caller who may not make a
change is refused before anything about the state is checked (a denied caller learns nothing,
whatever the state). The other events (a job started, finished, preempted, ...) do not say on their
own who may cause them (a requeue and a hand preemption both record a `JobPreempted`); their
commands carry the rule (`_command_rule`).

`authorise(state, cmd)`, as numbered steps:

1. acting as someone else (`--as`): only admins, and nobody acts as a system actor;
2. narrow actors (`@node:NAME`, `@job:ID`) report only for the jobs of their node or job;
3. the rule of the event the command causes, if it has one;
4. the command's own rule: a job's owner (cancel, hold, release, requeue), submissions on behalf
   of others and membership, the dispatcher (decisions) and executors (starts, finishes,
   samples), hand preemptions (admins), checkpoints, job tokens, revoking tokens and the
   service's settings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ledger.core.cancels import stopping_of
from ledger.core.state import JOB_ACTOR, NODE_ACTOR, Job, State, is_system
from schemas import commands as c
from schemas import events as e
from schemas.errors import NotAuthorised

_NODE_COMMANDS = (
    c.StartJob, c.FinishJob, c.SampleUtilisation, c.ReportCheckpoint, c.ReportLeaderEnded
)  # fmt: skip


def authorise(state: State, cmd: c.AnyCommand) -> None:
    """Pure: raise NotAuthorised unless `cmd`'s actor may send it at the moment `state` stands
    for."""
    actor = cmd.actor
    # 1. --as
    if cmd.real_actor is not None:
        check_act_as(state, cmd.real_actor, actor)
    # 2. node and job actors
    _check_narrow(state, cmd, actor)
    # 3. the rule of the event it causes, judged on the command
    causes = _CAUSES.get(type(cmd))
    if causes is not None:
        _EVENT_RULES[causes](state, actor, cmd)
    # 4. the command's own rule
    _command_rule(state, cmd, actor)


def authorisation_failure(state: State, ev: e.AnyEvent) -> str | None:
    """Pure: the rule `ev`'s actor failed at the moment `state` stands for (None: allowed, or no
    rule an event alone can be judged by). The audit replays history through this."""
    try:
        if ev.real_actor is not None:
            check_act_as(state, ev.real_actor, ev.actor)
        rule = _EVENT_RULES.get(type(ev))
        if rule is not None:
            rule(state, ev.actor, ev)
    except NotAuthorised as err:
        return err.message
    return None


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


def _parent(path: str) -> str | None:
    return path.rsplit("/", 1)[0] if "/" in path else None


Rule = Callable[[State, str, Any], None]
"""(state, actor, subject): raise NotAuthorised unless `actor` may make the change; `subject` is
the event, or the command that causes it (they name the fields a rule reads alike)."""


def _open(state: State, actor: str, x: Any) -> None:
    _require_manages(state, actor, _parent(x.path), f"open {x.path!r}")


def _close(state: State, actor: str, x: Any) -> None:
    _require_manages(state, actor, _parent(x.path), f"close {x.path!r}")


def _shares(state: State, actor: str, x: Any) -> None:
    _require_manages(state, actor, _parent(x.account), f"set the shares of {x.account!r}")


def _add_member(state: State, actor: str, x: Any) -> None:
    _require_manages(state, actor, x.project, f"add members to {x.project!r}")


def _remove_member(state: State, actor: str, x: Any) -> None:
    _require_manages(state, actor, x.project, f"remove members from {x.project!r}")


def _admin(what: str) -> Rule:
    return lambda state, actor, _: _require_admin(state, actor, what)


def _admin_or_engine(what: str) -> Rule:
    """An execution engine that marks a node down drains it, and returns it when it is back."""
    return lambda state, actor, _: None if is_system(actor) else _require_admin(state, actor, what)


def _lose_node(state: State, actor: str, _: Any) -> None:
    _require_system(state, actor, "mark nodes lost")


def _record_agent(state: State, actor: str, _: Any) -> None:
    _require_system(state, actor, "record a node's agent")


def _unplace(state: State, actor: str, _: Any) -> None:
    _require_system(state, actor, "take back runs that never started")


def _decides(state: State, actor: str, _: Any) -> None:
    """Only the dispatcher (or the simulator's) decides and places: a system actor, not a node's
    or a job's. No person does, admins included: a decision is data `replay` re-derives, and
    a person's is not one (`audit check` flags one in a history, atk34-26 F2)."""
    if not is_system(actor) or actor.startswith((NODE_ACTOR, JOB_ACTOR)):
        raise NotAuthorised(
            f"{actor!r} may not apply dispatcher decisions: only the dispatcher may",
            actor=actor,
        )


def _issue_token(state: State, actor: str, x: Any) -> None:
    if x.scope == "user" and x.user != actor:
        _require_admin(state, actor, f"create tokens for {x.user!r}")
    elif x.scope == "node":
        _require_admin(state, actor, "create node tokens")


_EVENT_RULES: dict[type[e.Event], Rule] = {
    e.AccountOpened: _open,
    e.AccountClosed: _close,
    e.SharesSet: _shares,
    e.MemberAdded: _add_member,
    e.MemberRemoved: _remove_member,
    e.ManagerGranted: _admin("grant managers"),
    e.ManagerRevoked: _admin("revoke managers"),
    e.AdminGranted: _admin("grant admin"),
    e.AdminRevoked: _admin("revoke admin"),
    e.NodeRegistered: _admin("register nodes"),
    e.NodeDrainRequested: _admin_or_engine("drain nodes"),
    e.NodeReturned: _admin_or_engine("return nodes"),
    e.NodeLost: _lose_node,
    e.NodeAgentChanged: _record_agent,
    e.JobUnplaced: _unplace,
    e.NodeRemoved: _admin("remove nodes"),
    e.TokenIssued: _issue_token,
    e.CycleDecided: _decides,
    e.JobPlaced: _decides,
}
"""Who may cause each event that says on its own who may (events not here follow from others,
or their command carries the rule)."""

_CAUSES: dict[type[c.Command], type[e.Event]] = {
    c.OpenAccount: e.AccountOpened,
    c.CloseAccount: e.AccountClosed,
    c.SetShares: e.SharesSet,
    c.AddMember: e.MemberAdded,
    c.RemoveMember: e.MemberRemoved,
    c.GrantManager: e.ManagerGranted,
    c.RevokeManager: e.ManagerRevoked,
    c.GrantAdmin: e.AdminGranted,
    c.RevokeAdmin: e.AdminRevoked,
    c.RegisterNode: e.NodeRegistered,
    c.DrainNode: e.NodeDrainRequested,
    c.ReturnNode: e.NodeReturned,
    c.MarkNodeLost: e.NodeLost,
    c.RecordNodeAgent: e.NodeAgentChanged,
    c.UnplaceJob: e.JobUnplaced,
    c.RemoveNode: e.NodeRemoved,
    c.IssueToken: e.TokenIssued,
}
"""Command -> the event whose rule judges it. Every other event it causes has the same rule or
none (an account opened with its shares, a member with their account, a lost node with its
jobs' ends), which tests/unit/test_domain.py checks against the events `decide` returns."""


def _command_rule(state: State, cmd: c.AnyCommand, actor: str) -> None:
    """4. Who may send `cmd`, where its events alone do not say."""
    match cmd:
        case c.SubmitJob():
            user = cmd.user or actor
            if user != actor and not (is_system(actor) or state.manages(actor, cmd.account)):
                raise NotAuthorised(f"{actor!r} may not submit on behalf of {cmd.user!r}")
            _raise_priority(state, cmd, actor)
            # only a project's members charge it (what is not an open project, the handler
            # refuses as such)
            account = state.accounts.get(cmd.account)
            project = account is not None and account.open and account.kind == "project"
            if project and user not in state.members.get(cmd.account, ()):
                raise NotAuthorised(
                    f"{user!r} is not a member of {cmd.account!r}",
                    hint="a manager adds members: `gpuledger member add`",
                )
        case c.CancelJob() | c.HoldJob() | c.ReleaseJob() | c.RequeueJob():
            verb = {
                c.CancelJob: "cancel",
                c.HoldJob: "hold",
                c.ReleaseJob: "release",
                c.RequeueJob: "requeue",
            }[type(cmd)]
            tasks = state.array_tasks(cmd.job_id) if isinstance(cmd, c.CancelJob) else set()
            if isinstance(cmd, c.CancelJob) and cmd.whole_array and tasks:
                for task in sorted(tasks):  # every task of the array: each must be theirs
                    _require_owner(state, state.jobs[task], actor, verb)
            elif isinstance(cmd, c.CancelJob) and (ending := stopping_of(state, cmd)):
                # cancelled again while its stopped runs live on (gone from the live state):
                # every task's of an array, each must be theirs
                for sr in ending:
                    _require_owner_of(state, sr.user, sr.account, sr.job_id, actor, verb)
            else:
                _require_owner(state, state.job(cmd.job_id), actor, verb)
        case c.ApplyDecision():
            _decides(state, actor, cmd)
        case c.PreemptJob():
            _require_admin(state, actor, "preempt jobs by hand")
        case c.StartJob():
            _require_system(state, actor, "start jobs")
        case c.FinishJob():
            _require_system(state, actor, "finish jobs")
        case c.ConfirmRunEnded():
            _require_system(state, actor, "report the ends of runs")
        case c.SampleUtilisation():
            _require_system(state, actor, "report utilisation")
        case c.ReportLeaderEnded():
            _require_system(state, actor, "report the ends of commands")
        case c.ReportCheckpoint():
            job = state.job(cmd.job_id)
            if not (is_system(actor) or actor == job.spec.user or state.is_admin(actor)):
                raise NotAuthorised(f"{actor!r} may not report checkpoints of job {cmd.job_id}")
        case c.IssueToken() if cmd.scope == "job" and cmd.scope_job is not None:
            job = state.job(cmd.scope_job)
            if not (
                actor == job.spec.user
                or state.manages(actor, job.spec.account)
                or (is_system(actor) and not actor.startswith((NODE_ACTOR, JOB_ACTOR)))
            ):
                raise NotAuthorised(f"{actor!r} may not create tokens for job {job.job_id}")
        case c.RevokeToken():
            token = state.tokens.get(cmd.token_id)
            if token is not None and not (actor == token.user or state.is_admin(actor)):
                raise NotAuthorised(f"{actor!r} may not revoke token {cmd.token_id}: not theirs")
        case c.ConfigureService():
            if actor.startswith((NODE_ACTOR, JOB_ACTOR)) or not (
                is_system(actor) or state.is_admin(actor)
            ):
                raise NotAuthorised(f"{actor!r} may not configure the service: only admins may")
        case _:
            pass


def _raise_priority(state: State, cmd: c.SubmitJob, actor: str) -> None:
    """A priority above the default (0) orders a job before its teammates' (it sorts before
    the per-person fair share inside a team): only a manager of the job's account or an admin
    sets one, as Slurm's `--priority` is its operators' and admins'; anyone may lower their
    own (`--nice`). A member's `--priority 1000000000` went ahead of every teammate's job
    (atk46-23 F15)."""
    if cmd.priority > 0 and not (is_system(actor) or state.manages(actor, cmd.account)):
        raise NotAuthorised(
            f"{actor!r} may not raise a job's priority above 0 in {cmd.account!r}: only its "
            "managers and admins may (a member may lower it, a negative --priority)",
            actor=actor,
            account=cmd.account,
        )


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


def _require_system(state: State, actor: str, what: str) -> None:
    if not (is_system(actor) or state.is_admin(actor)):
        raise NotAuthorised(
            f"{actor!r} may not {what}: only the dispatcher, executors and admins may"
        )


def _require_owner(state: State, job: Job, actor: str, what: str) -> None:
    """The job's owner, a manager of its account, an admin or a system actor."""
    _require_owner_of(state, job.spec.user, job.spec.account, job.job_id, actor, what)


def _require_owner_of(
    state: State, user: str, account: str, job_id: int, actor: str, what: str
) -> None:
    """`user`'s job `job_id` in `account`: its owner, a manager of its account, an admin or a
    system actor."""
    if not (actor == user or state.manages(actor, account) or is_system(actor)):
        raise NotAuthorised(
            f"{actor!r} may not {what} job {job_id}: only its owner, a manager or an admin"
        )
