"""What-if: the recorded submissions of a period re-simulated with other budgets, window or policy.

Steps (`run_whatif`):

1. read the log (`scenario`, pure over its events): the organisation as of T1 (accounts, shares,
   members, managers, nodes), the jobs active at T1 (carried over: submitted again at T1, a
   running one with the work it had left), the submissions of [T1, T2) with their durations,
   the cancellations and node changes of the period;
2. a fresh ledger in a temporary data directory, on a `SimClock` starting at T1: that
   organisation, then the new budgets (budgets as code: `ledger.core.budget.plan`), the nodes;
3. the loop: at each moment something can happen (a submission, a simulated exit, a
   cancellation, a node change, the decision's `wake_at`, a periodic tick) append what is due
   and run the real `Dispatcher` cycle (policy as recorded unless changed, fair-share ranks
   from the simulator's incremental rank source over the same math as the projection);
4. the same measures for what happened and for the what-if, per team: owed vs delivered (by
   period), waits (submission to first placement, of the jobs submitted in the period) and
   preemptions in the period (`team_metrics`, SQL over a projection of each ledger).

Durations: the recorded `duration_s` when the submission carries one (simulated logs); else, for
a job that ran to completion, the time it actually ran (its last placement to its finish, plus
the work resumable jobs had saved by checkpoints before earlier preemptions); else unknown (the
job runs until the period ends or it is cancelled at the recorded time).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from ledger.core import budget as b
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.cycle.dispatcher import CycleResult, Dispatcher, RankSource
from ledger.dispatch import registry
from ledger.dispatch.baselines import team_of
from ledger.dispatch.policy import Policy
from ledger.history.compare import recorded_policy
from ledger.sim.kernel import KernelExecutor, drive
from ledger.sim.ranks import IncrementalRanks
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.locate import open_source
from projections import history, queries
from projections.fairshare import CHARGE_PLACEMENT, WEEK_S, UsagePolicy
from projections.projector import Projector
from projections.source import EventSource, follow
from projections.store import Store
from schemas import codec
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidCommand, LedgerError
from schemas.policy import settings

SIM = "@whatif"
ADMIN = "whatif-admin"
POLICIES = registry.NAMES


# --- 1. the scenario, read from the log (pure) --------------------------------------------------


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


class NodeChange(msgspec.Struct, frozen=True, kw_only=True):
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
    node_changes: list[NodeChange] = field(default_factory=list)
    decided: e.CycleDecided | None = None
    """The last decision recorded before `end` (None: no decision): its policy is the
    what-if's unless it names another."""


@dataclass
class _Run:
    """One job's recorded life, for its duration."""

    spec: e.JobSubmitted
    placed_at: float | None = None
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
        case e.CheckpointReported():
            runs[ev.job_id].checkpoint_at = ev.at
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


_NODE_COMMANDS = (
    e.NodeRegistered,
    e.NodeDrainRequested,
    e.NodeReturned,
    e.NodeRemoved,
    e.NodeLost,
)


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
            return c.RemoveNode(actor=ADMIN, node=ev.node, reason=ev.reason)
        case e.NodeLost():
            return c.MarkNodeLost(actor=ADMIN, node=ev.node, reason=ev.reason or "lost")
        case _:
            return None


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
    node_changes: list[NodeChange] = []
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
            elif isinstance(ev, _NODE_COMMANDS):
                cmd = _node_command(ev)
                if cmd is not None:
                    node_changes.append(NodeChange(at=ev.at, command=cmd))
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
            )
        )
    return Scenario(
        start=start,
        end=end,
        state=at_start,
        submissions=out,
        node_changes=node_changes,
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


# --- 2-3. the simulation --------------------------------------------------------------------------


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


@dataclass
class WhatIfRun:
    """The what-if ledger and what the loop had to leave out."""

    home: Path
    original_of: dict[int, int]
    """What-if job id -> recorded job id."""
    carried: set[int]
    """What-if job ids carried over from before the period."""
    notes: list[str]
    cycles: int
    policy: Policy
    usage: UsagePolicy
    """How its ranks counted usage (recorded in its decisions' rank inputs)."""


class _Sim:
    def __init__(
        self,
        scen: Scenario,
        budgets: b.BudgetFile | None,
        policy: Policy,
        usage: UsagePolicy,
        home: Path,
        tick_s: float,
        checkpoint_every_s: float,
        seed: int,
    ) -> None:
        self.scen = scen
        self.clock = SimClock(scen.start)
        self.ledger = Ledger(home, self.clock, seeded_ids(seed))
        self.home = home
        self.tick_s = tick_s
        self.checkpoint_every_s = checkpoint_every_s
        self.notes: list[str] = []
        self.original_of: dict[int, int] = {}
        self.carried: set[int] = set()
        self.work: dict[int, float | None] = {}
        self.executor = KernelExecutor()
        self.pending: set[int] = set()
        self.running: dict[int, tuple[bool, float]] = {}
        """Running job -> (resumable, last checkpoint)."""
        self.draining = 0
        self._seen = 0
        self.cycles = 0
        self._subs: list[Submission] = []
        self._cancels: list[tuple[float, int]] = []
        self._nodes: list[NodeChange] = []
        self._i = self._ci = self._ni = 0
        self._next_tick = scen.start
        self._setup(budgets)
        ranks: RankSource = IncrementalRanks(self.ledger, usage)
        self.dispatcher = Dispatcher(self.ledger, ranks, policy, self.executor, idle_record_s=None)

    def _setup(self, budgets: b.BudgetFile | None) -> None:
        st = self.scen.state
        self.ledger.execute(
            c.InitLedger(
                actor=ADMIN, admin=ADMIN, min_runtime_cap_s=st.min_runtime_cap_s, cluster=st.cluster
            )
        )
        self.ledger.execute_all(setup_commands(st))
        if budgets is not None:
            changes = b.plan(self.ledger.state, budgets, ADMIN)
            if changes:
                self.ledger.execute_all([ch.command for ch in changes])
        # every user who submits must be a member of the project
        need = sorted({(s.spec.account, s.spec.user) for s in self.scen.submissions})
        adds: list[c.AnyCommand] = []
        for account, user in need:
            acct = self.ledger.state.accounts.get(account)
            if acct is None or not acct.open:
                self.notes.append(f"account {account} is not open in the what-if: its jobs drop")
            elif user not in self.ledger.state.members.get(account, ()):
                adds.append(c.AddMember(actor=ADMIN, user=user, project=account))
        if adds:
            self.ledger.execute_all(adds)
            self.notes.append(f"{len(adds)} members added so that the recorded submissions can run")
        self._observe()

    def _submit(self, s: Submission) -> c.SubmitJob:
        spec = s.spec
        labels = {"whatif_of": str(s.original)}
        if s.carried:
            labels["carried"] = "true"
        return c.SubmitJob(
            actor=SIM,
            user=spec.user,
            account=spec.account,
            gpus=spec.gpus,
            gpu_type=spec.gpu_type,
            cluster=spec.cluster,
            min_runtime_s=spec.min_runtime_s,
            resumable=spec.resumable,
            priority=spec.priority,
            time_limit_s=spec.time_limit_s,
            command=spec.command,
            duration_s=s.duration_s,
            labels=labels,
        )

    def _execute(self, cmds: Sequence[c.AnyCommand], subs: Sequence[Submission]) -> None:
        """Append `cmds` in one batch; when one is refused, one by one (noting what dropped)."""
        if not cmds:
            return
        try:
            self._record(self.ledger.execute_all(cmds).events, subs)
            return
        except LedgerError:
            pass
        for cmd in cmds:
            try:
                self._record(self.ledger.execute(cmd).events, subs)
            except LedgerError as err:
                what = type(cmd).__name__
                self.notes.append(f"t={self.clock.now():g}: {what} refused: {err.line()}")

    def _record(self, events: Iterable[e.AnyEvent], subs: Sequence[Submission]) -> None:
        by_original = {s.original: s for s in subs}
        for ev in events:
            if isinstance(ev, e.JobSubmitted):
                original = int(ev.labels["whatif_of"])
                s = by_original[original]
                self.original_of[ev.job_id] = original
                self.executor.work[ev.job_id] = s.duration_s
                if s.carried:
                    self.carried.add(ev.job_id)

    def _observe(self) -> None:
        for pos, ev in self.ledger.follow(self._seen):
            self._seen = pos
            match ev:
                case e.JobSubmitted() | e.JobRequeued():
                    self.pending.add(ev.job_id)
                case e.JobPlaced():
                    self.pending.discard(ev.job_id)
                    spec = self.ledger.state.jobs[ev.job_id].spec
                    self.running[ev.job_id] = (spec.resumable, ev.at)
                case e.CheckpointReported():
                    if ev.job_id in self.running:
                        self.running[ev.job_id] = (True, ev.at)
                    self.executor.checkpoint(ev.job_id, ev.at)
                case e.JobPreempted():
                    self.running.pop(ev.job_id, None)
                case e.JobFinished():
                    self.running.pop(ev.job_id, None)
                    self.pending.discard(ev.job_id)
                case e.NodeDrainRequested() | e.NodeDrained() | e.NodeReturned() | e.NodeLost():
                    nodes = self.ledger.state.nodes.values()
                    self.draining = sum(1 for n in nodes if n.state == "draining")
                case _:
                    pass

    def run(self) -> None:
        scen = self.scen
        self._subs = sorted(scen.submissions, key=lambda s: (s.at, s.original))
        self._cancels = sorted(
            (s.cancel_at, s.original) for s in scen.submissions if s.cancel_at is not None
        )
        self._nodes = sorted(scen.node_changes, key=lambda n: n.at)
        self._next_tick = scen.start
        self.cycles += drive(self, self.clock, self.dispatcher, self.executor, scen.end)

    # --- the kernel loop's questions (`kernel.drive`) -------------------------------------------

    def times(self, now: float) -> list[float]:
        cands = []
        if self.pending or self.running:
            cands.append(self._next_tick)
        if self._i < len(self._subs):
            cands.append(self._subs[self._i].at)
        if self._ci < len(self._cancels):
            cands.append(self._cancels[self._ci][0])
        if self._ni < len(self._nodes):
            cands.append(self._nodes[self._ni].at)
        return cands

    def due(self, t: float) -> None:
        due: list[Submission] = []
        while self._i < len(self._subs) and self._subs[self._i].at <= t:
            due.append(self._subs[self._i])
            self._i += 1
        cmds: list[c.AnyCommand] = [self._submit(s) for s in due]
        while self._ni < len(self._nodes) and self._nodes[self._ni].at <= t:
            cmds.append(self._nodes[self._ni].command)
            self._ni += 1
        self._execute(cmds, due)
        self._observe()
        cancel_cmds: list[c.AnyCommand] = []
        while self._ci < len(self._cancels) and self._cancels[self._ci][0] <= t:
            cancel_cmds += self._cancel(self._cancels[self._ci][1])
            self._ci += 1
        if t >= self._next_tick:
            cancel_cmds += self._checkpoints(t)
            start = self.scen.start
            self._next_tick = start + (math.floor((t - start) / self.tick_s) + 1) * self.tick_s
        self._execute(cancel_cmds, ())
        self._observe()

    def cycled(self, t: float, result: CycleResult) -> bool:
        self._observe()
        return bool(result.appended) and result.decision.budget_spent

    progress: Callable[[float], None] | None = None
    """Told the simulated moment after each step (the CLI's progress bar)."""

    def stepped(self, t: float) -> None:
        if self.progress is not None:
            self.progress(t)

    def _cancel(self, original: int) -> list[c.AnyCommand]:
        for job_id, orig in self.original_of.items():
            if orig == original:
                job = self.ledger.state.jobs.get(job_id)
                if job is not None and job.active:
                    return [c.CancelJob(actor=SIM, job_id=job_id)]
        return []

    def _checkpoints(self, t: float) -> list[c.AnyCommand]:
        return [
            c.ReportCheckpoint(actor=SIM, job_id=job_id)
            for job_id, (resumable, last) in sorted(self.running.items())
            if resumable and t - last >= self.checkpoint_every_s
        ]

    def needs_cycle(self, t: float) -> bool:
        if self.pending or self.draining:
            return True
        nxt = self.executor.next_event_at()
        return nxt is not None and nxt <= t


def simulate(
    scen: Scenario,
    home: Path,
    *,
    budgets: b.BudgetFile | None = None,
    policy: str | None = None,
    window_s: float | None = None,
    tick_s: float = 600.0,
    checkpoint_every_s: float = 3600.0,
    seed: int = 1,
    progress: Callable[[float], None] | None = None,
) -> WhatIfRun:
    """Run the scenario through a fresh ledger in `home` (which must not hold one), deciding
    with the policy last recorded (the default when the log has no decision) unless `policy`
    names another (its defaults), counting usage over the window the recorded ranks did (the
    7-day window) unless `window_s` says otherwise."""
    last = scen.decided if policy is None else None
    gpus = sum(n.gpus for n in scen.state.nodes.values() if n.state != "removed")
    chosen = registry.build(
        policy if last is None else recorded_policy(last),
        gpus=gpus,
        team_fractions=team_fractions(scen.state),  # legacy caps from the log's tree
    )
    recorded = last.ranks.usage.window_s if last is not None and last.ranks is not None else None
    half_life = registry.half_life_s(registry.config_of(chosen))
    # charged from placement: the kernel starts every launch at its placement
    usage = UsagePolicy(window_s or recorded or WEEK_S, half_life, charge=CHARGE_PLACEMENT)
    sim = _Sim(scen, budgets, chosen, usage, home, tick_s, checkpoint_every_s, seed)
    sim.progress = progress
    try:
        sim.run()
    finally:
        sim.ledger.close()
    return WhatIfRun(
        home=home,
        original_of=sim.original_of,
        carried=sim.carried,
        notes=sim.notes,
        cycles=sim.cycles,
        policy=chosen,
        usage=usage,
    )


# --- 4. measures ----------------------------------------------------------------------------------


class TeamMetrics(msgspec.Struct, frozen=True, kw_only=True):
    team: str
    owed_gpu_h: float = 0.0
    delivered_gpu_h: float = 0.0
    by_period: float | None = None
    jobs: int = 0
    """Jobs submitted in the period (carried-over ones excluded)."""
    never_placed: int = 0
    mean_wait_s: float | None = None
    p90_wait_s: float | None = None
    """Over the jobs placed in the period."""
    preemptions: int = 0


def _p90(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, math.ceil(0.9 * len(s)) - 1)]


def team_metrics(
    store: Store,
    start: float,
    end: float,
    *,
    exclude: Sequence[int] = (),
    team_depth: int = 2,
) -> dict[str, TeamMetrics]:
    """Per team over [start, end) from a projection: owed and delivered GPU-hours (by period),
    waits of the jobs submitted in the period (`exclude`: job ids not to count), preemptions."""
    report = queries.delivered_report(store, start, end, team_depth=team_depth)
    teams: dict[str, dict[str, object]] = {}
    for t in report.teams:
        teams.setdefault(t.team, {}).update(
            owed_gpu_h=t.owed_gpu_h, delivered_gpu_h=t.delivered_gpu_h, by_period=t.by_period
        )
    waits: dict[str, list[float]] = {}
    never: dict[str, int] = {}
    counts: dict[str, int] = {}
    for _job, account, submitted, placed in history.first_placements(
        store.con, start, end, exclude
    ):
        team = team_of(account, team_depth)
        teams.setdefault(team, {})
        if placed is None or placed >= end:
            never[team] = never.get(team, 0) + 1
            waits.setdefault(team, [])
        else:
            waits.setdefault(team, []).append(float(placed) - float(submitted))
    for preempted_in, n in history.preemptions_by_account(store.con, start, end):
        team = team_of(preempted_in or "-", team_depth)
        teams.setdefault(team, {})
        counts[team] = counts.get(team, 0) + int(n)
    out = {}
    for team, fields in sorted(teams.items()):
        w = waits.get(team, [])
        out[team] = TeamMetrics(
            team=team,
            jobs=len(w) + never.get(team, 0),
            never_placed=never.get(team, 0),
            mean_wait_s=sum(w) / len(w) if w else None,
            p90_wait_s=_p90(w),
            preemptions=counts.get(team, 0),
            **fields,  # type: ignore[arg-type]
        )
    return out


class TeamDiff(msgspec.Struct, frozen=True, kw_only=True):
    team: str
    actual: TeamMetrics
    whatif: TeamMetrics


class WhatIfReport(msgspec.Struct, frozen=True, kw_only=True):
    start: float
    end: float
    policy_version: str
    config: dict[str, str]
    teams: tuple[TeamDiff, ...]
    submissions: int
    carried: int
    cycles: int
    notes: tuple[str, ...] = ()
    home: str | None = None


def compare_runs(
    actual: Mapping[str, TeamMetrics], whatif: Mapping[str, TeamMetrics]
) -> tuple[TeamDiff, ...]:
    """Pure: the teams of both sides side by side (a team missing on one side gets zeros)."""
    return tuple(
        TeamDiff(
            team=t,
            actual=actual.get(t, TeamMetrics(team=t)),
            whatif=whatif.get(t, TeamMetrics(team=t)),
        )
        for t in sorted(set(actual) | set(whatif))
    )


def _projection(home: Path) -> Store:
    store = Store(":memory:")
    with open_source(home) as source:
        Projector(store, source).catch_up()
    return store


class Simulated(msgspec.Struct, frozen=True, kw_only=True):
    """The what-if side of a report: the period simulated and measured (`simulate_period`)."""

    start: float
    end: float
    policy_version: str
    config: dict[str, str]
    metrics: dict[str, TeamMetrics]
    submissions: int
    carried: int
    cycles: int
    notes: tuple[str, ...] = ()


def simulate_period(
    home: Path,
    start: float,
    end: float,
    where: Path,
    *,
    budgets: b.BudgetFile | None = None,
    policy: str | None = None,
    window_s: float | None = None,
    tick_s: float = 600.0,
    progress: Callable[[float], None] | None = None,
) -> Simulated:
    """Steps 1-3 and the what-if's measures of step 4, over the ledger in `home`: the what-if
    ledger is made in `where` (a new directory)."""
    with open_source(home) as source:
        scen = scenario(log_events(source), start, end)
    run = simulate(
        scen, where, budgets=budgets, policy=policy, window_s=window_s, tick_s=tick_s,
        progress=progress,
    )  # fmt: skip
    with _projection(where) as store:
        mine = team_metrics(store, start, end, exclude=sorted(run.carried))
    return Simulated(
        start=start,
        end=end,
        policy_version=run.policy.version,
        config=_settings_text(run),
        metrics=mine,
        submissions=sum(1 for s in scen.submissions if not s.carried),
        carried=sum(1 for s in scen.submissions if s.carried),
        cycles=run.cycles,
        notes=tuple(run.notes),
    )


def report(
    sim: Simulated, actual: Mapping[str, TeamMetrics], home: str | None = None
) -> WhatIfReport:
    """Pure: step 4's comparison, what happened (`actual`: `team_metrics` of the recorded
    projection over the same period) beside the what-if."""
    fields = msgspec.structs.asdict(sim)
    del fields["metrics"]
    return WhatIfReport(**fields, teams=compare_runs(actual, sim.metrics), home=home)


def run_whatif(
    home: Path,
    actual: Store,
    start: float,
    end: float,
    *,
    budgets: b.BudgetFile | None = None,
    policy: str | None = None,
    window_s: float | None = None,
    keep: Path | None = None,
    tick_s: float = 600.0,
    progress: Callable[[float], None] | None = None,
) -> WhatIfReport:
    """Steps 1-4 over the ledger in `home` (`actual`: its projection, caught up); `progress`
    is told the simulated moment after each step."""
    with tempfile.TemporaryDirectory(prefix="gpuledger-whatif-") as tmp:
        sim = simulate_period(
            home, start, end, keep if keep is not None else Path(tmp) / "ledger",
            budgets=budgets, policy=policy, window_s=window_s, tick_s=tick_s, progress=progress,
        )  # fmt: skip
    theirs = team_metrics(actual, start, end)
    return report(sim, theirs, str(keep) if keep is not None else None)


def _settings_text(run: WhatIfRun) -> dict[str, str]:
    """The what-if's policy settings as text for the report, with its usage window when it is
    not the 7-day one."""
    out = settings(registry.config_of(run.policy))
    if run.usage.window_s != WEEK_S:
        out["window_s"] = repr(float(run.usage.window_s))
    return out


def log_events(source: EventSource, page: int = 10_000) -> Iterator[e.AnyEvent]:
    """Every event of a log, decoded, in order."""
    for records in follow(source, page=page):
        for rec in records:
            yield codec.decode(rec.data)
