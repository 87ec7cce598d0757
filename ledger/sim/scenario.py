"""The what-if's scenario (step 1 of `ledger.sim.whatif`), pure over a log's events: what the
log says about a period [start, end).

- the organisation as of `start` (accounts, shares, members, managers, nodes), rebuilt in a fresh
  ledger by `setup_commands`;
- the jobs active at `start` (carried over: submitted again at `start`, a running one with the
  work it had left), the submissions of the period with their durations, the cancellations;
- the changes of the period, as the commands that make them again, at their recorded times and
  in log order: accounts opened, closed and given shares, members added and removed, managers
  granted and revoked, nodes registered, drained, returned, removed and lost. A period in which
  an account was opened anywhere in the tree is replayed with that opening at its time, so the
  what-if of no change is what happened.

Durations: the recorded `duration_s` when the submission carries one (simulated logs); else, for
a job that ran to completion, the time it actually ran (its last placement to its finish, plus
the work resumable jobs had saved by checkpoints before earlier preemptions); else unknown (the
job runs until the period ends or it is cancelled at the recorded time).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import msgspec

from ledger.core.evolve import evolve
from ledger.core.state import State
from projections.source import EventSource, follow
from schemas import codec
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidCommand

ADMIN = "whatif-admin"
"""The what-if ledger's admin: the actor of every command that rebuilds the organisation."""


class Submission(msgspec.Struct, frozen=True, kw_only=True):
    """A job to submit in the what-if, as recorded."""

    at: float
    original: int
    """The job id in the recorded log."""
    spec: e.JobSubmitted
    duration_s: float | None
    """Work to do (None: unknown, runs until cancelled or the period ends)."""
    carried: bool = False
    """Active at T1: submitted again at T1 (its waits are not counted)."""
    cancel_at: float | None = None
    placed_at: float | None = None
    """When the log first placed it (None: never): how long it waited in the recorded queue,
    what the what-if's progress weighs its work by (`expected_work`)."""


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """A recorded change of the organisation or the nodes: the command that makes it again
    (actor `ADMIN`), at its recorded time."""

    at: float
    command: c.AnyCommand


@dataclass
class Scenario:
    """What the log says about [start, end): the organisation at start and what came after."""

    start: float
    end: float
    state: State
    """The write-side state at `start` (the organisation, the nodes, the active jobs)."""
    submissions: list[Submission] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    """The organisation's and the nodes' changes in [start, end), in log order."""
    decided: e.CycleDecided | None = None
    """The last decision recorded before `end` (None: no decision): its policy is the
    what-if's unless it names another."""


@dataclass
class _Run:
    """One job's recorded life, for its duration."""

    spec: e.JobSubmitted
    placed_at: float | None = None
    first_placed_at: float | None = None
    checkpoint_at: float | None = None
    saved_s: float = 0.0
    """Work kept by checkpoints before earlier preemptions (resumable jobs)."""
    worked_s: float | None = None
    """Set when the job completed: the time it actually ran to completion."""
    cancelled_at: float | None = None

    def work_at(self, t: float) -> float:
        """Work done by time `t` (saved work plus the current placement's time)."""
        current = 0.0 if self.placed_at is None else max(0.0, t - self.placed_at)
        return self.saved_s + current

    def duration(self) -> float | None:
        if self.spec.duration_s is not None:
            return float(self.spec.duration_s)
        return self.worked_s


def _track(runs: dict[int, _Run], ev: e.AnyEvent) -> None:
    match ev:
        case e.JobSubmitted():
            runs[ev.job_id] = _Run(ev)
        case e.JobPlaced():
            r = runs[ev.job_id]
            r.placed_at = r.checkpoint_at = ev.at
            if r.first_placed_at is None:
                r.first_placed_at = ev.at
        case e.CheckpointReported():
            runs[ev.job_id].checkpoint_at = ev.at
        case e.JobUnplaced():  # never started: no work done
            runs[ev.job_id].placed_at = None
        case e.JobPreempted():
            r = runs[ev.job_id]
            if r.spec.resumable and r.placed_at is not None and r.checkpoint_at is not None:
                r.saved_s += max(0.0, r.checkpoint_at - r.placed_at)
            r.placed_at = None
        case e.JobFinished():
            r = runs[ev.job_id]
            if ev.outcome in ("completed", "failed") and r.placed_at is not None:
                r.worked_s = r.saved_s + (ev.at - r.placed_at)
            elif ev.outcome == "cancelled":
                r.cancelled_at = ev.at
            r.placed_at = None
        case _:
            pass


def _node_command(ev: e.AnyEvent) -> c.AnyCommand | None:
    match ev:
        case e.NodeRegistered():
            return c.RegisterNode(
                actor=ADMIN, node=ev.node, gpu_type=ev.gpu_type, gpus=ev.gpus, cluster=ev.cluster
            )
        case e.NodeDrainRequested():
            return c.DrainNode(actor=ADMIN, node=ev.node, reason=ev.reason or "maintenance")
        case e.NodeReturned():
            return c.ReturnNode(actor=ADMIN, node=ev.node)
        case e.NodeRemoved():
            return c.RemoveNode(actor=ADMIN, node=ev.node, reason=ev.reason, force=True)
        case e.NodeLost():
            return c.MarkNodeLost(actor=ADMIN, node=ev.node, reason=ev.reason or "lost")
        case _:
            return None


class _Changes:
    """The period's changes as commands, in log order. Where one command made several events,
    they fold back into it: an opening (AccountOpened, then its SharesSet), a new member
    (MemberAdded, then its leaf's AccountOpened and SharesSet when the leaf was not open), a
    removed member (MemberRemoved, then its leaf's AccountClosed)."""

    def __init__(self) -> None:
        self.out: list[Change] = []
        self._member: tuple[str, int] | None = None
        """The leaf of the member just added, and the index of its AddMember."""
        self._opened: tuple[str, int] | None = None
        """The account just opened, and the index of the command whose shares its SharesSet
        gives."""
        self._removed: str | None = None
        """The leaf of the member just removed."""

    def add(self, ev: e.AnyEvent) -> None:
        member, opened, removed = self._member, self._opened, self._removed
        self._member = self._opened = self._removed = None
        cmd: c.AnyCommand | None
        match ev:
            case e.AccountOpened() if member is not None and member[0] == ev.path:
                self._opened = member
                return
            case e.AccountOpened():
                self._opened = (ev.path, len(self.out))
                cmd = c.OpenAccount(actor=ADMIN, path=ev.path, kind=ev.kind, reason="as recorded")
            case e.SharesSet() if opened is not None and opened[0] == ev.account:
                i = opened[1]
                made = self.out[i]
                shares = msgspec.structs.replace(made.command, shares=ev.shares)
                self.out[i] = Change(at=made.at, command=shares)
                return
            case e.SharesSet():
                cmd = c.SetShares(
                    actor=ADMIN,
                    account=ev.account,
                    shares=ev.shares,
                    reason=ev.reason or "as recorded",
                )
            case e.AccountClosed() if ev.path == removed:
                return
            case e.AccountClosed():
                cmd = c.CloseAccount(actor=ADMIN, path=ev.path, reason=ev.reason)
            case e.MemberAdded():
                self._member = (f"{ev.project}/{ev.user}", len(self.out))
                cmd = c.AddMember(actor=ADMIN, user=ev.user, project=ev.project)
            case e.MemberRemoved():
                self._removed = f"{ev.project}/{ev.user}"
                cmd = c.RemoveMember(actor=ADMIN, user=ev.user, project=ev.project)
            case e.ManagerGranted():
                cmd = c.GrantManager(actor=ADMIN, user=ev.user, account=ev.account)
            case e.ManagerRevoked():
                cmd = c.RevokeManager(actor=ADMIN, user=ev.user, account=ev.account)
            case _:
                cmd = _node_command(ev)
        if cmd is not None:
            self.out.append(Change(at=ev.at, command=cmd))


def scenario(events: Iterable[e.AnyEvent], start: float, end: float) -> Scenario:
    """Pure: the scenario of [start, end) from a whole history (in log order). The organisation
    is taken just before the first event after `start` (or the first submission at `start`), so
    accounts and nodes set up at `start` itself belong to it."""
    if not end > start:
        raise InvalidCommand("a what-if needs --to after --from")
    state = State()
    runs: dict[int, _Run] = {}
    at_start: State | None = None
    carried: dict[int, float] = {}
    """Carried job -> work done by `start`."""
    submitted: list[int] = []
    changes = _Changes()
    last: e.CycleDecided | None = None
    for ev in events:
        if at_start is None and (
            ev.at > start or (ev.at == start and isinstance(ev, e.JobSubmitted))
        ):
            at_start = state.copy()
            carried = {
                j.job_id: runs[j.job_id].work_at(start) for j in state.jobs.values() if j.active
            }
        if ev.at >= end:
            break
        _track(runs, ev)
        if at_start is not None:
            if isinstance(ev, e.JobSubmitted):
                submitted.append(ev.job_id)
            elif isinstance(ev, e.LedgerInitialised):  # a period from before the ledger began:
                evolve(at_start, ev)  # its contract cap and cluster name
            else:
                changes.add(ev)
        if isinstance(ev, e.CycleDecided):
            last = ev
        evolve(state, ev)
    if at_start is None:
        at_start = state.copy()
        carried = {j.job_id: runs[j.job_id].work_at(start) for j in state.jobs.values() if j.active}
    out: list[Submission] = []
    for job_id, done in sorted(carried.items()):
        run = runs[job_id]
        total = run.duration()
        out.append(
            Submission(
                at=start,
                original=job_id,
                spec=run.spec,
                duration_s=None if total is None else max(0.0, total - done),
                carried=True,
                cancel_at=run.cancelled_at,
                placed_at=run.first_placed_at,
            )
        )
    for job_id in submitted:
        run = runs[job_id]
        out.append(
            Submission(
                at=run.spec.at,
                original=job_id,
                spec=run.spec,
                duration_s=run.duration(),
                cancel_at=run.cancelled_at,
                placed_at=run.first_placed_at,
            )
        )
    return Scenario(
        start=start,
        end=end,
        state=at_start,
        submissions=out,
        changes=changes.out,
        decided=last,
    )


def setup_commands(state: State) -> list[c.AnyCommand]:
    """Pure: the commands that rebuild `state`'s organisation and nodes in a fresh ledger whose
    admin is `ADMIN` (accounts parents first, members with their leaf shares, managers, admins,
    nodes with their drains)."""
    cmds: list[c.AnyCommand] = []
    accounts = sorted(
        (a for a in state.accounts.values() if a.open and a.kind != "user"),
        key=lambda a: (a.path.count("/"), a.path),
    )
    for a in accounts:
        cmds.append(
            c.OpenAccount(
                actor=ADMIN, path=a.path, kind=a.kind, shares=a.shares, reason="as recorded"
            )
        )
    for project in sorted(state.members):
        for user in sorted(state.members[project]):
            leaf = state.accounts.get(f"{project}/{user}")
            shares = leaf.shares if leaf is not None else 1
            cmds.append(c.AddMember(actor=ADMIN, user=user, project=project, shares=shares))
    for user in sorted(state.managers):
        for account in sorted(state.managers[user]):
            acct = state.accounts.get(account)
            if acct is not None and acct.open:
                cmds.append(c.GrantManager(actor=ADMIN, user=user, account=account))
    for n in sorted(state.nodes.values(), key=lambda n: n.name):
        if n.state == "removed":
            continue
        cmds.append(
            c.RegisterNode(
                actor=ADMIN, node=n.name, gpu_type=n.gpu_type, gpus=n.gpus, cluster=n.cluster
            )
        )
        if n.state in ("draining", "drained"):
            cmds.append(c.DrainNode(actor=ADMIN, node=n.name, reason=n.drain_reason or "drained"))
        elif n.state == "lost":
            cmds.append(c.MarkNodeLost(actor=ADMIN, node=n.name, reason=n.lost_reason or "lost"))
    return cmds


def team_fractions(state: State, depth: int = 2) -> dict[str, float]:
    """Pure: each team's fraction of the cluster (product of norm shares down the tree)."""
    sibling: dict[str | None, int] = {}
    for a in state.accounts.values():
        if a.open:
            sibling[a.parent] = sibling.get(a.parent, 0) + a.shares
    out = {}
    for a in state.accounts.values():
        if not (a.open and a.path.count("/") == depth - 1):
            continue
        frac, path = 1.0, a.path
        while True:
            acct = state.accounts[path]
            total = sibling.get(acct.parent, 0)
            frac *= acct.shares / total if total else 0.0
            if acct.parent is None:
                break
            path = acct.parent
        out[a.path] = frac
    return out


def log_events(source: EventSource, page: int = 10_000) -> Iterator[e.AnyEvent]:
    """Every event of a log, decoded, in order."""
    for records in follow(source, page=page):
        for rec in records:
            yield codec.decode(rec.data)


WORK_PER_DECISION = 60
"""The work of a decision moment with a queue, in jobs considered: one decision over 60
waiting jobs costs about twice one over none (a what-if of 4 weeks, profiled: ~17 ms a
decision and ~0.28 ms a job it considers)."""
WORK_PER_SUBMISSION = 15
"""The work of a submission made again (its events appended, ~4 ms), in jobs considered."""


def expected_work(scen: Scenario, step_s: float) -> list[int]:
    """Pure: the what-if's work expected by each decision moment of the period, cumulative:
    element k + 1 the work through the moment `start + k * step_s` (element 0: none). The work of a
    decision grows with the jobs waiting (most of a what-if's time is its decisions over the
    queue), so each moment weighs `WORK_PER_DECISION` plus the jobs the log had waiting then
    (each from its submission to its first placement, `Submission.placed_at`, or its cancel),
    and each submission `WORK_PER_SUBMISSION`. The progress of a what-if told by its
    submissions alone raced ahead while they came and stood still while the queue they made
    was decided over (4% for 16 s, then 29%: atk52-29 F4)."""
    n = max(1, math.ceil((scen.end - scen.start) / step_s))
    waiting = [0] * (n + 2)
    made = [0] * (n + 2)

    def moment(t: float) -> int:  # the first decision moment at or after `t`
        return min(n + 1, max(0, math.ceil((t - scen.start) / step_s - 1e-9)))

    for s in scen.submissions:
        made[moment(s.at)] += 1
        # waiting to its first placement, or its cancel if it never ran (a job cancelled while
        # pending waited until then: atk53-29 F1), or the period's end
        until = min(t for t in (s.placed_at, s.cancel_at, scen.end) if t is not None)
        if until > s.at:
            waiting[moment(s.at)] += 1
            waiting[moment(until)] -= 1
    out = [0]
    queue = 0
    for k in range(n + 1):
        queue += waiting[k]
        out.append(out[-1] + (WORK_PER_DECISION + queue if queue > 0 else 0)
                   + WORK_PER_SUBMISSION * made[k])  # fmt: skip
    return out


def work_by(work: list[int], scen: Scenario, step_s: float, t: float) -> int:
    """Pure: the work `expected_work` expects done through the decision moment at or before
    `t`."""
    k = math.floor((t - scen.start) / step_s + 1e-9) + 1
    return work[min(len(work) - 1, max(0, k))]
