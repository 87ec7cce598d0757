"""`simulate`: a workload replayed through the real ledger, projections and dispatcher.

An edge: it owns a virtual clock (`SimClock`), seeded event ids, a data directory on disk, and
drives `ledger.cycle.dispatcher.Dispatcher` with a simulated executor. Nothing here models
scheduling:
every submission, placement, preemption, checkpoint and exit is a command the real `Ledger`
decides and appends, and every decision is the real `decide()` with the chosen policy.

Time advances from event to event in the kernel loop (`ledger.sim.kernel.drive`, shared with the
what-if), numbered steps of one iteration:

1. the next time anything can happen: the next submission, the next simulated exit
   (`KernelExecutor.next_event_at`), the decision's `wake_at`, the next contract end of a running
   job while funded work waits, a drain or return, and a periodic tick (`tick_s`, default 10 min:
   fair-share ranks drift with time, and resumable jobs checkpoint);
2. append everything due at that time in ONE `Ledger.execute_all` batch: submissions,
   resubmissions of preempted non-resumable jobs, drains, checkpoints;
3. run a dispatcher cycle (exits, snapshot, decide, append, launch);
4. fold the new events into the metrics and the loop's own view (running jobs, contracts).
"""

from __future__ import annotations

import heapq
import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from ledger.core import budget as b
from ledger.cycle.dispatcher import CycleResult, Dispatcher, RankSource
from ledger.dispatch import registry
from ledger.sim.fold import LIMIT_GIVEN, IdleSample, JobFold
from ledger.sim.kernel import KernelExecutor, drive
from ledger.sim.metrics import Metrics, compute
from ledger.sim.ranks import IncrementalRanks, NoRanks, ProjectionRanks
from ledger.sim.workload import SimJob, Workload, team_fractions
from ledger.store import EVENTS_DB, relay_progress
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.embedded import EmbeddedSource
from projections import fairshare as fs
from projections import queries
from projections.projector import Projector
from projections.store import Store
from schemas import commands as c
from schemas import events as e
from schemas.errors import InvalidCommand

START_AT = 1_767_225_600.0
"""Where simulated time starts: 2026-01-01T00:00:00Z (hour-aligned, so team hours are clock
hours)."""
SIM = "@sim"
EXECUTOR = "@executor"
ADMIN = "root"
POLICIES = registry.NAMES
WEEK_S = 7 * 86_400.0
DAY_S = 86_400.0
RELAUNCH_S = 300.0
"""The default restart overhead of a relaunch: a job preempted and placed again spends 5
minutes starting (scheduling its processes, loading its checkpoint) before its work goes on."""

Progress = Callable[[float, float, int], None]
"""Called as the run goes: (simulated seconds done, seconds in all, events so far)."""


@dataclass(frozen=True)
class Cluster:
    nodes: int = 50
    gpus_per_node: int = 8
    gpu_type: str = "h100"

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_names(self) -> list[str]:
        width = max(3, len(str(self.nodes)))
        return [f"n{i + 1:0{width}d}" for i in range(self.nodes)]


@dataclass(frozen=True)
class Drain:
    """Drain `node` at `at_s` (seconds after the start); return it `back_after_s` later."""

    node: str
    at_s: float
    back_after_s: float | None = None


@dataclass(frozen=True)
class SimConfig:
    policy: str = "fairshare"
    cluster: Cluster = field(default_factory=Cluster)
    days: float = 28.0
    seed: int = 1
    tick_s: float = 600.0
    checkpoint_every_s: float = 3600.0
    """Running resumable jobs report a checkpoint at the first tick this long after the last."""
    resubmit: bool = True
    """A non-resumable job that is preempted is resubmitted at once by its user (a new job)."""
    knobs: tuple[tuple[str, str], ...] = ()
    """Policy settings changed from the defaults (`registry.with_knobs`)."""
    sigterm_checkpoint_p: float = 0.0
    """The signal contract: the share of resumable jobs that checkpoint when stopped (SIGTERM),
    so a preemption loses them at most `grace_s` (chosen per job, seeded)."""
    grace_s: float = 30.0
    relaunch_s: float = RELAUNCH_S
    """The restart overhead of every relaunch after a preemption (the run takes that much
    longer; the measures count it as lost)."""
    min_runtime_cap_s: int = 8 * 3600
    ranks: str = "incremental"
    """`incremental` (pure fair-share math on intervals kept in memory) or `projection`."""
    drains: tuple[Drain, ...] = ()
    start_at: float = START_AT

    @property
    def end_at(self) -> float:
        return self.start_at + self.days * DAY_S


@dataclass
class RunResult:
    metrics: Metrics
    home: Path
    config: SimConfig
    workload: Workload
    submitted: int
    dropped: list[str]
    offered_gpu_h: float


@dataclass
class _Running:
    placed_at: float
    contract_end: float
    resumable: bool
    checkpoint_at: float


class Simulation:
    """One run of one policy over one workload into one data directory."""

    def __init__(
        self,
        workload: Workload,
        config: SimConfig,
        home: Path,
        progress: Progress | None = None,
    ) -> None:
        if (home / EVENTS_DB).exists():
            raise InvalidCommand(
                f"{home} already holds a ledger",
                hint="a simulation writes a fresh ledger: pass a new --home",
            )
        self.workload = workload
        self.config = config
        self.home = home
        self.progress = progress
        self.clock = SimClock(config.start_at)
        # the log in memory while the run appends and reads it, written to `home` whole at the
        # end (`write_out`); the projection's ranks read the file as they go, so they keep it there
        self.ledger = Ledger(
            home,
            self.clock,
            seeded_ids(config.seed),
            memory=config.ranks != "projection",
            bounded=False,  # a simulated log: many submissions at one moment, never relayed
        )
        self.on_sigterm: set[int] = set()
        """Resumable jobs (ledger ids) that checkpoint on SIGTERM."""
        self.resubmitted: set[int] = set()
        """Resubmissions of preempted non-resumable jobs (ledger ids): their launch restarts."""
        self.policy = registry.build(
            config.policy,
            dict(config.knobs),
            gpus=config.cluster.gpus,
            team_fractions=team_fractions(workload.budget),
        )
        # a lab's Slurm (`slurm-lab-2`) gives a job that declared no limit the partition's
        # DefaultTime and ends every run at its limit (TIMEOUT)
        self._time_limit: Callable[[int | None], int | None] | None = getattr(
            self.policy, "job_time_limit_s", None
        )
        self._default_limit = bool(getattr(self.policy, "limit_runs", False))
        """The policy gives a job that declared no limit one (`job_time_limit_s`)."""
        # every policy's runs end at their time limits, as the service ends them: a trace job
        # whose `time_limit_s` is shorter than its work ends there (`time_limit`), its work
        # unfinished (atk55-26 F5: it read `completed` after its limit's worth of work)
        self.executor = KernelExecutor(
            on_sigterm=self.on_sigterm.__contains__,
            relaunch_s=config.relaunch_s,
            relaunched=self.resubmitted.__contains__,
            limit_runs=True,
        )
        settings = registry.config_of(self.policy)
        usage = None  # the usage its rank source counts (None: it reads no ranks)
        if registry.ranked(settings):
            # the kernel starts every launch at its placement: charged from there (fairtree-1),
            # as the simulations docs/simulation.md publishes were, so they replay as recorded
            usage = fs.UsagePolicy(
                half_life_s=registry.half_life_s(settings), charge=fs.CHARGE_PLACEMENT
            )
        self.rank_source: RankSource
        self._projection: ProjectionRanks | None = None
        if usage is None:
            self.rank_source = NoRanks()
        elif config.ranks == "projection":
            self._projection = ProjectionRanks(home, usage)
            self.rank_source = self._projection
        elif config.ranks == "incremental":
            self.rank_source = IncrementalRanks(self.ledger, usage)
        else:
            raise InvalidCommand(
                f"unknown rank source {config.ranks!r}", hint="use incremental or projection"
            )
        self.dispatcher = Dispatcher(
            self.ledger, self.rank_source, self.policy, self.executor, idle_record_s=None
        )
        self.fold = JobFold(
            on_sigterm=self.on_sigterm, grace_s=config.grace_s, relaunch_s=config.relaunch_s
        )
        self.samples: list[IdleSample] = []
        """What each cycle left free (`metrics.IdleSample`)."""
        self.cycles = 0
        self._seen = 0
        self._sim_jobs: dict[int, SimJob] = {}
        self._running: dict[int, _Running] = {}
        self._pending: dict[int, bool] = {}
        """Pending job -> funded."""
        self._contracts: list[tuple[float, int]] = []
        self._resubmit: list[tuple[SimJob, int]] = []
        self._queue: list[SimJob] = []
        """The workload's jobs to submit, by submit time; `_next` is the next one."""
        self._next = 0
        self._drains: list[tuple[float, c.AnyCommand]] = []
        self._next_tick = config.start_at + config.tick_s
        self._draining = 0
        self.dropped: list[str] = []

    # --- setup ----------------------------------------------------------------------------------

    def setup(self) -> None:
        cfg = self.config
        self.ledger.execute(
            c.InitLedger(actor=ADMIN, admin=ADMIN, min_runtime_cap_s=cfg.min_runtime_cap_s)
        )
        # as `gpuledger init` does: the relay's progress table, empty (no relay published
        # anywhere yet); without it a simulated home's first relay warned of "a dropped table?"
        # that nobody dropped (atk50-25 F7)
        relay_progress.begin(self.ledger.recorder)
        changes = b.plan(self.ledger.state, self.workload.budget, ADMIN)
        nodes: list[c.AnyCommand] = [
            c.RegisterNode(
                actor=ADMIN, node=n, gpu_type=cfg.cluster.gpu_type, gpus=cfg.cluster.gpus_per_node
            )
            for n in cfg.cluster.node_names()
        ]
        self.ledger.execute_all([ch.command for ch in changes] + nodes)
        self._observe()

    def _jobs(self) -> list[SimJob]:
        """The workload's jobs inside the horizon that the cluster can hold."""
        cfg = self.config
        horizon = cfg.days * DAY_S
        out = []
        too_big = 0
        for j in self.workload.jobs:
            if j.submit_s >= horizon:
                continue
            if j.gpus > cfg.cluster.gpus:
                too_big += 1
                continue
            out.append(j)
        if too_big:
            self.dropped.append(
                f"{too_big} jobs asking more GPUs than the cluster's {cfg.cluster.gpus}"
            )
        return out

    def _submit(self, j: SimJob, resubmit_of: int | None = None) -> c.SubmitJob:
        labels = {"trace_id": j.key}
        if resubmit_of is not None:
            labels["resubmit_of"] = str(resubmit_of)
        if j.time_limit_s is None and self._default_limit and self._time_limit is not None:
            # the engine gives it a limit and ends its runs there (the kernel's `limit_runs`);
            # it is submitted with all its work, and what is left when it times out is
            # resubmitted (`_track`)
            limit = self._time_limit(None)
            labels[LIMIT_GIVEN] = "1"
            return c.SubmitJob(
                actor=SIM, user=j.user, account=j.account, gpus=j.gpus,
                min_runtime_s=min(j.min_runtime_s, self.config.min_runtime_cap_s),
                resumable=j.resumable, priority=j.priority, time_limit_s=limit,
                duration_s=float(j.duration_s), labels=labels,
            )  # fmt: skip
        return c.SubmitJob(
            actor=SIM,
            user=j.user,
            account=j.account,
            gpus=j.gpus,
            min_runtime_s=min(j.min_runtime_s, self.config.min_runtime_cap_s),
            resumable=j.resumable,
            priority=j.priority,
            time_limit_s=j.time_limit_s,
            # all its work: a run ends at its time limit (the kernel), `time_limit` if work is left
            duration_s=float(j.duration_s),
            labels=labels,
        )

    # --- the loop -------------------------------------------------------------------------------

    def run(self) -> RunResult:
        cfg = self.config
        wall, cpu = time.perf_counter(), time.process_time()
        self.setup()
        jobs = self._queue = self._jobs()
        self._drains = self._drain_commands()
        self._next_tick = cfg.start_at + cfg.tick_s
        self.cycles = drive(self, self.clock, self.dispatcher, self.executor, cfg.end_at)
        start, end = cfg.start_at, cfg.end_at
        if self.progress is not None:
            self.progress(end - start, end - start, self.ledger.position)
        self.ledger.write_out()  # the report reads the log from `home`
        metrics = self._metrics(time.perf_counter() - wall, time.process_time() - cpu)
        self._close()
        self.ledger.write_out()
        return RunResult(
            metrics=metrics,
            home=self.home,
            config=cfg,
            workload=self.workload,
            submitted=len(jobs),
            dropped=self.dropped,
            offered_gpu_h=sum(j.gpus * j.duration_s for j in jobs) / 3600.0,
        )

    def _close(self) -> None:
        """The simulated period is over: jobs still holding GPUs are cancelled at its end (by
        `@sim`), so a ledger kept after the run charges no usage after its period; nothing
        runs them any more."""
        cmds = [
            c.CancelJob(actor=SIM, job_id=j.job_id)
            for j in self.ledger.state.jobs.values()
            if j.status in ("placed", "running")
        ]
        if cmds:
            self.ledger.execute_all(cmds)

    # --- the kernel loop's questions (`kernel.drive`) -------------------------------------------

    def times(self, now: float) -> list[float]:
        """1. the next submission, resubmission, drain, tick, or contract end while funded work
        waits."""
        start = self.config.start_at
        cands = [self._next_tick] if (self._pending or self._running) else []
        if self._next < len(self._queue):
            cands.append(start + self._queue[self._next].submit_s)
        if self._resubmit:
            cands.append(now)
        if self._drains:
            cands.append(self._drains[0][0])
        contract = self._next_contract_end(now)
        if contract is not None:
            cands.append(contract)
        return cands

    def due(self, t: float) -> None:
        """2. everything due now, in one batch."""
        cfg, jobs, start = self.config, self._queue, self.config.start_at
        cmds: list[c.AnyCommand] = []
        due: list[SimJob] = []
        resubmits: list[bool] = []
        while self._next < len(jobs) and start + jobs[self._next].submit_s <= t:
            due.append(jobs[self._next])
            resubmits.append(False)
            cmds.append(self._submit(jobs[self._next]))
            self._next += 1
        for j, of in self._resubmit:
            due.append(j)
            resubmits.append(True)
            cmds.append(self._submit(j, of))
        self._resubmit.clear()
        while self._drains and self._drains[0][0] <= t:
            cmds.append(self._drains.pop(0)[1])
        if t >= self._next_tick:
            cmds += self._checkpoints(t)
            self._next_tick = start + (math.floor((t - start) / cfg.tick_s) + 1) * cfg.tick_s
        if cmds:
            appended = self.ledger.execute_all(cmds)
            subs = [ev for ev in appended.events if isinstance(ev, e.JobSubmitted)]
            for ev, j, again in zip(subs, due, resubmits, strict=True):
                self._sim_jobs[ev.job_id] = j
                if again:
                    self.resubmitted.add(ev.job_id)
                if j.resumable and self._checkpoints_on_sigterm(j):
                    self.on_sigterm.add(ev.job_id)
        self._observe()

    def cycled(self, t: float, result: CycleResult) -> bool:
        """3. fold a cycle; again at once while the victim searches ran out."""
        idle = result.decision.idle
        self.samples.append(
            IdleSample(t, idle.reserve, idle.held, idle.fragmented, idle.funded_waiting > 0)
        )
        self._observe()
        # `fairshare-14` carries the budget in its cycle: the next event's cycle searches on
        again = not getattr(self.policy, "carries_budget", False)
        return again and bool(result.appended) and _budget_spent(result)

    def stepped(self, t: float) -> None:
        if self.progress is not None:
            start, end = self.config.start_at, self.config.end_at
            self.progress(t - start, end - start, self.ledger.position)

    def _checkpoints_on_sigterm(self, j: SimJob) -> bool:
        """Seeded per trace job: whether it is one of the `sigterm_checkpoint_p` that do."""
        p = self.config.sigterm_checkpoint_p
        if p <= 0:
            return False
        draw = zlib.crc32(f"{self.config.seed}:sigterm:{j.key}".encode()) / 2**32
        return draw < p

    def needs_cycle(self, t: float) -> bool:
        if self._pending or self._draining:
            return True
        nxt = self.executor.next_event_at()
        return nxt is not None and nxt <= t

    def _next_contract_end(self, now: float) -> float | None:
        """The next contract end of a running job, while funded work waits."""
        if not any(self._pending.values()):
            return None
        heap = self._contracts
        while heap:
            at, job_id = heap[0]
            run = self._running.get(job_id)
            if at > now and run is not None and run.contract_end == at:
                return at
            heapq.heappop(heap)
        return None

    def _checkpoints(self, t: float) -> list[c.AnyCommand]:
        every = self.config.checkpoint_every_s
        return [
            c.ReportCheckpoint(actor=EXECUTOR, job_id=job_id)
            for job_id, r in sorted(self._running.items())
            if r.resumable and t - r.checkpoint_at >= every
        ]

    def _drain_commands(self) -> list[tuple[float, c.AnyCommand]]:
        out: list[tuple[float, c.AnyCommand]] = []
        for d in self.config.drains:
            at = self.config.start_at + d.at_s
            out.append((at, c.DrainNode(actor=ADMIN, node=d.node, reason="simulated maintenance")))
            if d.back_after_s is not None:
                out.append((at + d.back_after_s, c.ReturnNode(actor=ADMIN, node=d.node)))
        out.sort(key=lambda x: x[0])
        return out

    # --- what happened --------------------------------------------------------------------------

    def _observe(self) -> None:
        """Fold the new events into the metrics and the loop's view."""
        for pos, ev in self.ledger.follow(self._seen):
            self.fold.apply(ev)
            self._track(ev)
            self._seen = pos

    def _track(self, ev: e.AnyEvent) -> None:
        match ev:
            case e.JobSubmitted():
                self._pending[ev.job_id] = ev.min_runtime_s > 0
            case e.JobPlaced():
                spec = self.ledger.state.jobs[ev.job_id].spec
                end = ev.at + spec.min_runtime_s
                self._pending.pop(ev.job_id, None)
                self._running[ev.job_id] = _Running(ev.at, end, spec.resumable, ev.at)
                if spec.min_runtime_s > 0:
                    heapq.heappush(self._contracts, (end, ev.job_id))
            case e.CheckpointReported():
                run = self._running.get(ev.job_id)
                if run is not None:
                    run.checkpoint_at = ev.at
                self.executor.checkpoint(ev.job_id, ev.at)
            case e.JobPreempted():
                self._running.pop(ev.job_id, None)
            case e.JobRequeued() | e.JobUnplaced():
                self._running.pop(ev.job_id, None)
                self._pending[ev.job_id] = self.ledger.state.jobs[ev.job_id].spec.min_runtime_s > 0
            case e.JobFinished():
                self._running.pop(ev.job_id, None)
                self._pending.pop(ev.job_id, None)
                j = self._sim_jobs.get(ev.job_id)
                if ev.outcome == "preempted" and self.config.resubmit and j is not None:
                    self._resubmit.append((j, ev.job_id))
                done = self.executor.timed_out.pop(ev.job_id, None)
                if (
                    ev.reason == "time_limit"
                    and done is not None
                    and j is not None
                    and j.time_limit_s is None
                ):  # the engine's limit (DefaultTime), not one the trace's job declared
                    self._timed_out(j, ev.job_id, done)
            case e.NodeDrainRequested() | e.NodeDrained() | e.NodeReturned() | e.NodeLost():
                nodes = self.ledger.state.nodes.values()
                self._draining = sum(1 for n in nodes if n.state == "draining")
            case _:
                pass

    def _timed_out(self, j: SimJob, job_id: int, done: float) -> None:
        """A run ended at the time limit the engine gave it, its work unfinished: its user
        resubmits what is left at once, as a lab's users chain jobs (a job script that saves
        its state at Slurm's warning signal before the limit, so no work is lost: in the
        baseline's favour); the new job is the original's resubmission, so its waits count in
        the original's queued time and its completion ends the original's."""
        left = math.ceil(j.duration_s - done)
        if left > 0:
            self._resubmit.append((msgspec.structs.replace(j, duration_s=left), job_id))

    def _metrics(self, wall_s: float, cpu_s: float) -> Metrics:
        cfg = self.config
        if self._projection is not None:
            store = self._projection.store
            Projector(store, self._projection.source).catch_up()
            rows = queries.team_hours(store, cfg.start_at, cfg.end_at)
            self._projection.close()
        else:
            with EmbeddedSource(self.home) as source, Store.open(self.home) as store:
                Projector(store, source).catch_up()
                rows = queries.team_hours(store, cfg.start_at, cfg.end_at)
        m = compute(
            cfg.policy,
            self.fold,
            rows,
            self.samples,
            start=cfg.start_at,
            end=cfg.end_at,
            capacity_gpus=cfg.cluster.gpus,
        )
        return msgspec.structs.replace(
            m, wall_s=wall_s, cpu_s=cpu_s, events=self.ledger.position, cycles=self.cycles
        )

    def close(self) -> None:
        if self._projection is not None:
            self._projection.close()
        self.ledger.close()


def _budget_spent(result: CycleResult) -> bool:
    """Some job waited only because the cycle's victim searches ran out: cycle again now."""
    return any(
        r.wait.code == "WAIT_PRIORITY" and "victim searches" in r.wait.reason
        for r in result.decision.runs
    )


def simulate(
    workload: Workload, config: SimConfig, home: Path, progress: Progress | None = None
) -> RunResult:
    """Run one simulation into `home` (a fresh directory) and return its metrics."""
    sim = Simulation(workload, config, home, progress)
    try:
        return sim.run()
    finally:
        sim.close()
