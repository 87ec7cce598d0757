"""What-if: the recorded submissions of a period re-simulated with other budgets, window or policy.

Steps (`run_whatif`):

1. read the log (`ledger.sim.scenario`, pure over its events): the organisation as of T1
   (accounts, shares, members, managers, nodes), the jobs active at T1 (carried over: submitted
   again at T1, a running one with the work it had left), the submissions of [T1, T2) with
   their durations, the cancellations, and the organisation's and nodes' changes of the period;
2. a fresh ledger in a temporary data directory, on a `SimClock` starting at T1: that
   organisation, then the new budgets (budgets as code: `ledger.core.budget.plan`), the nodes;
   an account the budgets name that the period opens (or a member it adds) gets them then;
3. the loop: at each moment something can happen (a submission, a simulated exit, a
   cancellation, a recorded change, the decision's `wake_at`, a periodic tick) append what is
   due and run the real `Dispatcher` cycle (with `step_s`, the cycle only at the moments
   `start + k * step_s`: `kernel.drive`) (policy as recorded unless changed, fair-share ranks
   from the simulator's incremental rank source over the same math as the projection). The
   recorded changes are made again at their times (a share change of an account the budgets
   name is not: the budgets hold for the whole period), so the what-if of no change replays
   the recorded organisation;
4. the same measures for what happened and for the what-if, per team: owed vs delivered (by
   period), waits (submission to first placement, of the jobs submitted in the period) and
   preemptions in the period (`team_metrics`, SQL over a projection of each ledger).

The change's effect is the what-if against the **same simulation with no change** (the
`baseline`: the period simulated again the same way, same step, tick and seed, with no budgets,
the recorded policy and window), not against what happened: the simulation's own difference from
history (durations, a kernel's exits, decisions once a step) was shown as the change's effect, a
what-if of no change "moving" a team's delivered hours by 47% (atk49-29 F1). A what-if with a
change simulates the period twice (twice the time); what happened stays beside both.

Durations: see `ledger.sim.scenario`.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ledger.core import budget as b
from ledger.cycle.dispatcher import CycleResult, Dispatcher, RankSource
from ledger.dispatch import registry
from ledger.dispatch.baselines import team_of
from ledger.dispatch.policy import Policy
from ledger.history.compare import recorded_policy
from ledger.sim.kernel import KernelExecutor, drive
from ledger.sim.ranks import IncrementalRanks
from ledger.sim.scenario import (
    ADMIN,
    Change,
    Scenario,
    Submission,
    expected_work,
    log_events,
    scenario,
    setup_commands,
    team_fractions,
    work_by,
)
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.locate import open_source
from projections import history, queries
from projections.fairshare import CHARGE_PLACEMENT, WEEK_S, UsagePolicy
from projections.projector import Projector
from projections.store import Store
from schemas import commands as c
from schemas import events as e
from schemas.errors import LedgerError
from schemas.policy import settings
from schemas.units import when

SIM = "@whatif"
POLICIES = registry.NAMES


# --- 2-3. the simulation --------------------------------------------------------------------------


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


def _made(cmd: c.AnyCommand) -> str | None:
    """The account a recorded change opens or adds (a member's leaf), if any."""
    if isinstance(cmd, c.OpenAccount):
        return cmd.path
    if isinstance(cmd, c.AddMember):
        return f"{cmd.project}/{cmd.user}"
    return None


WORK_GRID_S = 60.0
"""The moments the progress weighs the work at when the what-if decides at every event."""


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
        step_s: float | None = None,
    ) -> None:
        self.scen = scen
        self.step_s = step_s
        # the organisation is set up at the start of the period's first clock hour: owed hours
        # take each hour's allocation as of the hour's start, as the recorded side's do
        self.clock = SimClock(math.floor(scen.start / 3600.0) * 3600.0)
        self.ledger = Ledger(home, self.clock, seeded_ids(seed), bounded=False)  # a replay
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
        self._changes: list[Change] = []
        self._budgets = budgets.accounts if budgets is not None else {}
        self._dropped: set[str] = set()
        """Accounts whose submissions dropped (noted once each)."""
        self._added = 0
        """Members added so that a recorded submission can run."""
        self._i = self._ci = self._ni = 0
        self._next_tick = scen.start
        self._grid_s = step_s or WORK_GRID_S
        self._work: list[int] = [0]
        self._setup(budgets)
        self.clock.advance_to(scen.start)
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
            # an account the period opens, or a member it adds, gets the budgets at its opening
            # or addition (`_replay`): its project may not exist yet
            later = {_made(ch.command) for ch in self.scen.changes} - {None}
            now = {k: v for k, v in budgets.accounts.items() if k not in later or self._open(k)}
            changes = b.plan(self.ledger.state, b.BudgetFile(accounts=now), ADMIN)
            if changes:
                self.ledger.execute_all([ch.command for ch in changes])
        self._observe()

    def _open(self, account: str) -> bool:
        acct = self.ledger.state.accounts.get(account)
        return acct is not None and acct.open

    def _budgeted(self, account: str) -> int | None:
        """The shares the budgets give `account` for the whole period (None: as recorded)."""
        spec = self._budgets.get(account)
        if spec is not None:
            return spec.shares
        parent, _, user = account.rpartition("/")
        spec = self._budgets.get(parent)
        return spec.member_shares.get(user) if spec is not None else None

    def _replay(self, change: Change) -> list[c.AnyCommand]:
        """A recorded change, made again: with the budgets' shares where they give some (an
        opening opens with them, a share change of such an account is not made: the budgets
        hold for the whole period), and the budgets' people of an account the period opens."""
        cmd = change.command
        match cmd:
            case c.OpenAccount() | c.AddMember():
                path = cmd.path if isinstance(cmd, c.OpenAccount) else f"{cmd.project}/{cmd.user}"
                shares = self._budgeted(path)
                if shares is not None:
                    cmd = msgspec.structs.replace(cmd, shares=shares)
                return [cmd]
            case c.SetShares() if self._budgeted(cmd.account) is not None:
                self.notes.append(
                    f"{when(change.at)}: the recorded shares {cmd.shares} of {cmd.account} not "
                    f"set: the budgets give it {self._budgeted(cmd.account)}"
                )
                return []
            case _:
                return [cmd]

    def _people(self, opened: Sequence[c.AnyCommand]) -> list[c.AnyCommand]:
        """The budgets' members and managers of the accounts just opened (`_replay`)."""
        paths = [x.path for x in opened if isinstance(x, c.OpenAccount) and x.path in self._budgets]
        if not paths:
            return []
        file = b.BudgetFile(accounts={p: self._budgets[p] for p in paths})
        return [ch.command for ch in b.plan(self.ledger.state, file, ADMIN)]

    def _members(self, due: Sequence[Submission]) -> list[c.AnyCommand]:
        """Members added so that the recorded submissions can run (the changes made again make
        the recorded members: this is for what they could not make); an account that is not
        open drops its jobs (noted once)."""
        adds: list[c.AnyCommand] = []
        for account, user in sorted({(s.spec.account, s.spec.user) for s in due}):
            if not self._open(account):
                if account not in self._dropped:
                    self._dropped.add(account)
                    self.notes.append(
                        f"account {account} is not open in the what-if: its jobs drop"
                    )
            elif user not in self.ledger.state.members.get(account, ()):
                adds.append(c.AddMember(actor=ADMIN, user=user, project=account))
        self._added += len(adds)
        return adds

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
                self.notes.append(f"{when(self.clock.now())}: {what} refused: {err.line()}")

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
                case e.JobUnplaced():
                    self.running.pop(ev.job_id, None)
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
        self._changes = sorted(scen.changes, key=lambda n: n.at)  # stable: log order kept
        self._next_tick = scen.start
        self._grid_s = self.step_s or WORK_GRID_S
        self._work = expected_work(scen, self._grid_s)
        self.cycles += drive(
            self, self.clock, self.dispatcher, self.executor, scen.end,
            step_s=self.step_s, origin=scen.start,
        )  # fmt: skip
        if self.progress is not None:  # all of it (the queue may have emptied before the end)
            self.progress(self._work[-1], self._work[-1])
        if self.step_s is not None:  # first: what the rest of the answer rests on
            self.notes.insert(0, step_note(self.step_s))
        if self._added:
            self.notes.append(
                f"{self._added} members added so that the recorded submissions can run"
            )

    # --- the kernel loop's questions (`kernel.drive`) -------------------------------------------

    def times(self, now: float) -> list[float]:
        cands = []
        if self.pending or self.running:
            cands.append(self._next_tick)
        if self._i < len(self._subs):
            cands.append(self._subs[self._i].at)
        if self._ci < len(self._cancels):
            cands.append(self._cancels[self._ci][0])
        if self._ni < len(self._changes):
            cands.append(self._changes[self._ni].at)
        return cands

    def due(self, t: float) -> None:
        # the recorded changes first: a submission may need an account opened at its time
        changes: list[c.AnyCommand] = []
        while self._ni < len(self._changes) and self._changes[self._ni].at <= t:
            changes += self._replay(self._changes[self._ni])
            self._ni += 1
        self._execute(changes, ())
        self._execute(self._people(changes), ())
        due: list[Submission] = []
        while self._i < len(self._subs) and self._subs[self._i].at <= t:
            due.append(self._subs[self._i])
            self._i += 1
        self._execute([*self._members(due), *(self._submit(s) for s in due)], due)
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
        again = not getattr(self.dispatcher.policy, "carries_budget", False)  # fairshare-14
        return again and bool(result.appended) and result.decision.budget_spent

    progress: Callable[[int, int], None] | None = None
    """Told the work done so far and the period's whole work after each step
    (`scenario.expected_work`: the decisions weighed by the queue the log had, and the
    submissions; not the simulated time, atk48-29 F3: 95% in 3 s when the last minutes held
    the submissions; nor the submissions alone, atk52-29 F4: 4% for 16 s, then 29%)."""

    def stepped(self, t: float) -> None:
        if self.progress is not None:
            work = self._work
            self.progress(work_by(work, self.scen, self._grid_s, t), work[-1])

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
    progress: Callable[[int, int], None] | None = None,
    step_s: float | None = None,
) -> WhatIfRun:
    """Run the scenario through a fresh ledger in `home` (which must not hold one), deciding
    with the policy last recorded (the default when the log has no decision) unless `policy`
    names another (its defaults), counting usage over the window the recorded ranks did (the
    7-day window) unless `window_s` says otherwise; deciding at every moment something happens,
    or with `step_s` only every `step_s` from the period's start (`kernel.drive`)."""
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
    sim = _Sim(scen, budgets, chosen, usage, home, tick_s, checkpoint_every_s, seed, step_s)
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
    """What happened."""
    whatif: TeamMetrics
    baseline: TeamMetrics | None = None
    """The same simulation with no change (None: the what-if itself changes nothing)."""


COMPARED_BASELINE = (
    "the what-if against the same simulation with no change (the period simulated twice, the "
    "same way): the difference is the change's effect; what happened is shown beside them"
)
COMPARED_ACTUAL = (
    "the simulation of the period with no change against what happened: the difference is the "
    "simulation's own, not a change's"
)


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
    step_s: float | None = None
    """The what-if decided every `step_s` seconds of the period (None: at every moment
    something happened: `gpuledger whatif` without `--step`)."""
    compared: str = COMPARED_ACTUAL
    """What the figures compare, in words (`COMPARED_BASELINE` when a change was simulated)."""


def compare_runs(
    actual: Mapping[str, TeamMetrics],
    whatif: Mapping[str, TeamMetrics],
    baseline: Mapping[str, TeamMetrics] | None = None,
) -> tuple[TeamDiff, ...]:
    """Pure: the teams of every side side by side (a team missing on one side gets zeros)."""
    teams = set(actual) | set(whatif) | set(baseline or ())
    return tuple(
        TeamDiff(
            team=t,
            actual=actual.get(t, TeamMetrics(team=t)),
            whatif=whatif.get(t, TeamMetrics(team=t)),
            baseline=None if baseline is None else baseline.get(t, TeamMetrics(team=t)),
        )
        for t in sorted(teams)
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
    step_s: float | None = None
    """The what-if's decisions were every `step_s` (None: at every moment something
    happened)."""
    baseline: dict[str, TeamMetrics] | None = None
    """The same simulation with no change, measured the same way (None: not run)."""
    baseline_cycles: int | None = None


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
    progress: Callable[[int, int], None] | None = None,
    step_s: float | None = None,
    baseline: Path | None = None,
) -> Simulated:
    """Steps 1-3 and the what-if's measures of step 4, over the ledger in `home`: the what-if
    ledger is made in `where` (a new directory); with `baseline` (another new directory) and a
    change (budgets, policy or window), the same simulation with no change is run there first
    and measured too (`Simulated.baseline`)."""
    with open_source(home) as source:
        scen = scenario(log_events(source), start, end)
    changed = budgets is not None or policy is not None or window_s is not None
    runs = 2 if baseline is not None and changed else 1

    def told(k: int) -> Callable[[int, int], None] | None:
        if progress is None:
            return None
        return lambda done, total: progress(k * total + done, runs * total)

    base: WhatIfRun | None = None
    base_metrics: dict[str, TeamMetrics] | None = None
    if runs == 2 and baseline is not None:
        base = simulate(scen, baseline, tick_s=tick_s, progress=told(0), step_s=step_s)
        with _projection(baseline) as store:
            base_metrics = team_metrics(store, start, end, exclude=sorted(base.carried))
    run = simulate(
        scen, where, budgets=budgets, policy=policy, window_s=window_s, tick_s=tick_s,
        progress=told(runs - 1), step_s=step_s,
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
        step_s=step_s,
        baseline=base_metrics,
        baseline_cycles=None if base is None else base.cycles,
    )


def report(
    sim: Simulated, actual: Mapping[str, TeamMetrics], home: str | None = None
) -> WhatIfReport:
    """Pure: step 4's comparison: the what-if against the same simulation with no change when
    it was run (`sim.baseline`), else against what happened (`actual`: `team_metrics` of the
    recorded projection over the same period), what happened beside it either way."""
    fields = msgspec.structs.asdict(sim)
    for key in ("metrics", "baseline", "baseline_cycles"):
        del fields[key]
    compared = COMPARED_ACTUAL if sim.baseline is None else COMPARED_BASELINE
    teams = compare_runs(actual, sim.metrics, sim.baseline)
    return WhatIfReport(**fields, teams=teams, home=home, compared=compared)


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
    progress: Callable[[int, int], None] | None = None,
    step_s: float | None = None,
) -> WhatIfReport:
    """Steps 1-4 over the ledger in `home` (`actual`: its projection, caught up); `progress`
    is told the submissions made and their total after each step (both runs': a change is
    simulated twice, `simulate_period`)."""
    with tempfile.TemporaryDirectory(prefix="gpuledger-whatif-") as tmp:
        sim = simulate_period(
            home, start, end, keep if keep is not None else Path(tmp) / "ledger",
            budgets=budgets, policy=policy, window_s=window_s, tick_s=tick_s, progress=progress,
            step_s=step_s, baseline=Path(tmp) / "baseline",
        )  # fmt: skip
    theirs = team_metrics(actual, start, end)
    return report(sim, theirs, str(keep) if keep is not None else None)


def step_note(step_s: float) -> str:
    """Pure: what deciding every `step_s` leaves out, in the what-if's notes (whole seconds
    written out: `:g` wrote 8.64e+09, atk49-29 F5)."""
    n = f"{step_s:.0f}" if step_s == int(step_s) else f"{step_s:g}"
    return (
        f"the what-if decided every {n} s of the period, not at every submission or "
        f"exit: a job waited at least until the next such moment (up to {n} s more "
        f"than a decision at once would have made it wait), and GPUs freed in between stayed "
        f"free until then"
    )


def _settings_text(run: WhatIfRun) -> dict[str, str]:
    """The what-if's policy settings as text for the report, with its usage window when it is
    not the 7-day one."""
    out = settings(registry.config_of(run.policy))
    if run.usage.window_s != WEEK_S:
        out["window_s"] = repr(float(run.usage.window_s))
    return out
