"""The dispatcher cycle and the service loop: the edge around the pure `decide()`.

One cycle, as numbered steps (Kueue's `schedule()` shape):
  1. snapshot at position P: catch the ledger up, take fair-share ranks at `now`, build the
     snapshot of pending/running jobs and nodes;
  2. decide (pure);
  3. append the decision expecting position P: a decision the log has overtaken in a way that
     touches it is rejected by the ledger (`Conflict`) and simply retried next cycle;
  4. hand preemptions and placements to the executor, report starts and exits back as commands;
  5. return what happened (metrics, log line).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import msgspec

from ledger.core.utilisation import UtilTracker
from ledger.cycle.executor import Executor, Launch, OwnsNodes, Reporting, ServiceExecutor
from ledger.cycle.inputs import snapshot_from_state
from ledger.dispatch.engine import Decision, decide
from ledger.dispatch.policy import Policy
from ledger.dispatch.registry import config_of
from ledger.dispatch.snapshot import Snapshot
from projections import queries
from projections.fairshare import RANKING_VERSION, UsagePolicy
from projections.source import gc_paused
from projections.store import Store
from schemas import commands as c
from schemas import events as e
from schemas.digest import rank_digest
from schemas.errors import Conflict, LedgerError, UnknownEntity
from schemas.events import tag_of
from schemas.policy import AnyPolicyConfig

if TYPE_CHECKING:  # the projector brings DuckDB's Python API, the application eventsourcing; a
    # read that needs neither a catch-up nor an append (the CLI's `queue`) loads neither
    from ledger.core.state import State
    from ledger.store.application import Ledger
    from projections.projector import Projector

log = logging.getLogger("gpuledger.dispatcher")

_UTIL_TAGS = [tag_of(t) for t in (e.UtilisationSampled, e.JobPlaced, e.JobPreempted, e.JobFinished)]
DISPATCHER = "@dispatcher"
EXECUTOR = "@executor"
IDLE_RECORD_S = 60.0
"""A cycle that decides nothing while jobs wait is recorded at most this often (the record
counts the empty cycles it stands for), so the log answers "why did nothing start"."""


class LiveState(Protocol):
    """A live state the read side previews from: the service's `Ledger` (which also appends)
    or a CLI read's `ledger.store.live.LiveView` (read-only, no eventsourcing)."""

    @property
    def state(self) -> State: ...

    def catch_up(self) -> int:
        """Fold what was appended since; the position folded."""
        ...


class RankSource(Protocol):
    """Fair-share ranks at a moment, read where the dispatcher consumes them."""

    def ranks(self, now: float, position: int) -> tuple[Mapping[str, int], Mapping[str, float]]:
        """(rank per account path, lower is better; level fair share per account path) at `now`
        from the log up to `position`."""
        ...


def rank_inputs(
    source: RankSource,
    position: int,
    ranks: Mapping[str, int],
    level_fs: Mapping[str, float],
) -> e.RankInputs | None:
    """What a decision record says about its ranks: where they were read (the source's
    `read_position` when it has one, else the snapshot's), their digest, the ranking code's
    version and the usage settings (`usage_policy`). None for sources without usage settings
    (policies that read no ranks)."""
    usage: UsagePolicy | None = getattr(source, "usage_policy", None)
    if usage is None:
        return None
    read_at: int | None = getattr(source, "read_position", None)
    return e.RankInputs(
        position=position if read_at is None else read_at,
        digest=rank_digest(ranks, level_fs),
        ranking_version=RANKING_VERSION,
        usage=e.UsageSettings(
            window_s=usage.window_s, half_life_s=usage.half_life_s, weights=dict(usage.weights)
        ),
    )


def typed_config(policy: Policy) -> AnyPolicyConfig | None:
    """The typed config a decision record carries (`registry.config_of`; of the wrapped policy
    for a wrapper that only records more settings); None for a policy no version registers."""
    inner = getattr(policy, "inner", policy)
    try:
        return config_of(inner)
    except (UnknownEntity, AttributeError):
        return None


class StoreRanks:
    """Ranks from a DuckDB projection as it stands (fed by Kafka, it may trail the ledger)."""

    def __init__(self, store: Store, usage: UsagePolicy | None = None) -> None:
        self.store = store
        self.usage = usage or UsagePolicy()
        self.read_position: int | None = None
        """The projection position of the last reading."""

    @property
    def usage_policy(self) -> UsagePolicy:
        return self.usage

    def ranks(self, now: float, position: int) -> tuple[Mapping[str, int], Mapping[str, float]]:
        self.read_position = self.store.position()
        tree = queries.fair_share(self.store, now, self.usage)
        return tree.leaf_ranks(), tree.level_fs()


class ProjectionRanks(StoreRanks):
    """Ranks from the DuckDB projection, caught up with the log before each reading."""

    def __init__(self, projector: Projector, usage: UsagePolicy | None = None) -> None:
        super().__init__(projector.store, usage)
        self.projector = projector

    def ranks(self, now: float, position: int) -> tuple[Mapping[str, int], Mapping[str, float]]:
        """Catch up to exactly `position`, the snapshot's, so a replay from the log alone sees
        the same usage."""
        self.projector.catch_up(until=position)
        return super().ranks(now, position)


def preview(
    ledger: LiveState,
    ranks: RankSource,
    policy: Policy,
    now: float,
    low_util_since: Mapping[int, float] | None = None,
) -> tuple[Snapshot, Decision]:
    """What the dispatcher would decide now, without appending anything (queue, explain)."""
    position = ledger.catch_up()
    leaf_ranks, level_fs = ranks.ranks(now, position)
    snapshot = snapshot_from_state(
        ledger.state,
        leaf_ranks,
        now,
        level_fs=level_fs,
        low_util_since=low_util_since,
        position=position,
    )
    return snapshot, decide(snapshot, policy, now)


@dataclass(frozen=True)
class CycleResult:
    position: int
    decision: Decision
    appended: bool
    conflict: str | None = None
    started: int = 0
    finished: int = 0


class Dispatcher:
    """Runs cycles against one ledger, one rank source and one executor."""

    def __init__(
        self,
        ledger: Ledger,
        ranks: RankSource,
        policy: Policy,
        executor: Executor,
        util: UtilTracker | None = None,
        unavailable: Callable[[], Mapping[str, frozenset[int]]] | None = None,
        *,
        idle_record_s: float | None = IDLE_RECORD_S,
    ) -> None:
        """`idle_record_s`: record a cycle that decides nothing while jobs wait at most this
        often (None: never; the simulator's choice)."""
        self.ledger = ledger
        self.rank_source = ranks
        self.policy = policy
        self.executor = executor
        if unavailable is None and isinstance(executor, OwnsNodes):
            unavailable = executor.foreign
        self.unavailable = unavailable
        """GPUs the engine says are busy with work the ledger does not own (foreign Slurm jobs):
        never placed on."""
        # the squat threshold is the policy's, and utilisation is read from the whole log (not
        # only from when this process started), so replay sees what the cycle saw
        threshold = float(getattr(policy, "squat_util_pct", UtilTracker.threshold_pct))
        self.util = util or UtilTracker(threshold_pct=threshold)
        self._seen = 0
        self.idle_record_s = idle_record_s
        self._skipped = 0
        """Cycles that decided nothing since the last record, not recorded on their own."""
        self._recorded_at: float | None = None

    def _observe_new_events(self) -> None:
        """Feed the utilisation tracker the events it looks at (the store filters by tag, so a
        large decision record is never decoded here)."""
        head = self.ledger.position
        for _, event in self.ledger.follow(self._seen, head, tags=_UTIL_TAGS):
            self.util.observe(event)
        self._seen = head

    def report_exits(self, now: float) -> int:
        """Exits the executor saw become JobFinished (unless the ledger already ended the job)."""
        done = 0
        engine = self.executor.engine
        exits = self.executor.poll(now)
        self.report_starts(now)  # a run that began and ended since the last look started first
        if any(ex.reason == "node_failure" for ex in exits):
            self.follow_nodes()  # the node went down since the cycle looked: lose it first
        for ex in exits:
            job = self.ledger.state.jobs.get(ex.job_id)
            if job is None or job.status not in ("placed", "running"):
                continue
            cmd = c.FinishJob(actor=EXECUTOR, job_id=ex.job_id, exit_code=ex.exit_code)
            if engine:
                cmd = msgspec.structs.replace(
                    cmd,
                    engine=engine,
                    engine_job_id=ex.engine_job_id,
                    reason=ex.reason,
                    engine_state=ex.engine_state,
                )
            try:
                self.ledger.execute(cmd)
                done += 1
            except LedgerError as err:  # the ledger moved on (cancel, preemption): keep going
                log.info("exit of job %s not recorded: %s", ex.job_id, err.line())
        return done

    def report_progress(self, now: float) -> None:
        """Checkpoints and utilisation samples of an executor that reports them (`Reporting`)
        become events; what the ledger has moved past is dropped."""
        if not isinstance(self.executor, Reporting):
            return
        got = self.executor.reports(now)
        jobs = self.ledger.state.jobs
        batch: list[c.AnyCommand] = [
            c.ReportCheckpoint(actor=EXECUTOR, job_id=j)
            for j in got.checkpoints
            if j in jobs and jobs[j].status == "running" and jobs[j].spec.resumable
        ]
        batch += [
            c.SampleUtilisation(actor=EXECUTOR, job_id=j, gpu_utilisation=u)
            for j, u in got.samples
            if j in jobs and jobs[j].status == "running" and len(u) == jobs[j].spec.gpus
        ]
        self._execute_reports(batch)

    def _execute_reports(self, batch: list[c.AnyCommand]) -> None:
        if not batch:
            return
        try:
            self.ledger.execute_all(batch)
        except LedgerError:  # one stale report must not hide the others
            for cmd in batch:
                try:
                    self.ledger.execute(cmd)
                except LedgerError as err:
                    log.info("report not recorded: %s", err.line())

    def report_starts(self, now: float) -> int:
        """Runs the executor saw begin become JobStarted (with the engine's run id, if any)."""
        engine = self.executor.engine
        starts: list[c.AnyCommand] = []
        for st in self.executor.starts(now):
            job = self.ledger.state.jobs.get(st.job_id)
            if job is None or job.status != "placed":
                continue
            if engine:
                starts.append(
                    c.StartJob(
                        actor=EXECUTOR,
                        job_id=st.job_id,
                        engine=engine,
                        engine_job_id=st.engine_job_id,
                        run=st.run,
                        gpus=st.gpus,
                        logs=st.logs,
                    )
                )
            else:
                starts.append(c.StartJob(actor=EXECUTOR, job_id=st.job_id, logs=st.logs))
        if starts:
            self.ledger.execute_all(starts)
        return len(starts)

    def recover(self, executor: ServiceExecutor, now: float) -> None:
        """After a (re)start, before any cycle: compare the ledger with the engine.

        1. the engine adopts its runs that the ledger still holds GPUs for and stops the runs of
           ours the ledger no longer runs;
        2. a placed job the engine never received is launched again (engines that keep runs
           across our restarts) or, like a run the engine has no trace of, recorded as lost.
        """
        self.ledger.catch_up()
        held = {
            j.job_id: j
            for j in self.ledger.state.jobs.values()
            if j.status in ("placed", "running")
        }
        known = executor.adopt({jid: j.preemptions for jid, j in held.items()}, now)
        for job_id in sorted(set(held) - known):
            job = held[job_id]
            if job.status == "placed" and executor.relaunch_placed:
                log.warning("job %s was placed but never reached the engine: launching it", job_id)
                executor.launch(self._launch(job_id), now)
                continue
            log.warning(
                "job %s has no run in the engine after a restart: recording it lost", job_id
            )
            cmd = c.FinishJob(actor=EXECUTOR, job_id=job_id, exit_code=-1)
            if executor.engine:
                cmd = msgspec.structs.replace(cmd, engine=executor.engine, reason="lost")
            self.ledger.execute(cmd)

    def _launch(self, job_id: int) -> Launch:
        job = self.ledger.state.jobs[job_id]
        spec = job.spec
        return Launch(
            job_id,
            job.slots,
            spec.command,
            spec.duration_s,
            spec.user,
            spec.account,
            run=job.preemptions,
            time_limit_s=spec.time_limit_s,
            grace_s=spec.grace_s,
            debug=spec.debug,
        )

    def reconcile(self, now: float) -> None:
        """Stop processes of jobs the ledger no longer runs (cancelled, preempted, removed)."""
        for job_id in sorted(self.executor.running()):
            job = self.ledger.state.jobs.get(job_id)
            if job is None or job.status not in ("placed", "running"):
                self.executor.stop(job_id, now)

    def _record_idle(self, decision: Decision, now: float) -> bool:
        """Whether to record a cycle that decided nothing: jobs wait and the last record is at
        least `idle_record_s` old."""
        if self.idle_record_s is None or not decision.waiting:
            return False
        return self._recorded_at is not None and now - self._recorded_at >= self.idle_record_s

    def follow_nodes(self) -> None:
        """Nodes follow an engine that owns node health (`OwnsNodes`): drains, losses (their
        jobs end in the same command) and returns, before the runs' exits are read, so a run
        that ended with its node is requeued (resumable) rather than failed."""
        if not isinstance(self.executor, OwnsNodes):
            return
        for cmd in self.executor.node_changes(self.ledger.state.nodes):
            try:
                self.ledger.execute(cmd)
                log.info("node %s follows the engine: %s", getattr(cmd, "node", "?"), cmd)
            except LedgerError as err:
                log.warning("node change not recorded: %s", err.line())

    def cycle(self, now: float) -> CycleResult:
        """One dispatcher cycle. The cyclic garbage collector waits until it ends: a cycle makes
        ~100k short-lived objects that reference counting frees, and the full collections they
        would set off (40-50 ms over the live state) run between cycles instead of inside one."""
        with gc_paused():
            return self._cycle(now)

    def _cycle(self, now: float) -> CycleResult:
        # 0. the engine's node changes; starts, checkpoints and samples, then exits: GPUs they
        #    free are free for this cycle
        self.follow_nodes()
        self.report_starts(now)
        self.report_progress(now)
        finished = self.report_exits(now)
        # 1. snapshot at position P
        position = self.ledger.catch_up()
        self._observe_new_events()
        ranks, level_fs = self.rank_source.ranks(now, position)
        snapshot = snapshot_from_state(
            self.ledger.state,
            ranks,
            now,
            level_fs=level_fs,
            low_util_since=self.util.low_since,
            position=position,
            unavailable=None if self.unavailable is None else self.unavailable(),
        )
        # 2. decide (pure)
        decision = decide(snapshot, self.policy, now)
        if self._recorded_at is None:
            self._recorded_at = now
        if (
            not decision.placements
            and not decision.preemptions
            and not self._record_idle(decision, now)
        ):
            self._skipped += 1
            self.reconcile(now)
            return CycleResult(position, decision, appended=False, finished=finished)
        # 3. append expecting P
        try:
            command = decision.to_command(
                DISPATCHER,
                f"cycle-{position}",
                decided_at=now,
                policy=typed_config(self.policy),
                ranks=rank_inputs(self.rank_source, position, ranks, level_fs),
                skipped_cycles=self._skipped,
            )
            self.ledger.execute(command)
            self._skipped, self._recorded_at = 0, now
        except Conflict as err:
            log.info("decision at position %s overtaken: %s", position, err.line())
            return CycleResult(
                position, decision, appended=False, conflict=err.line(), finished=finished
            )
        # 4. executor: stop the preempted, launch the placed, report starts
        self.reconcile(now)
        for pl in decision.placements:
            self.executor.launch(self._launch(pl.job_id), now)
        started = self.report_starts(now)
        self._observe_new_events()
        # 5. what happened
        log.info(
            "cycle at %s: %d placed, %d preempted, %d waiting",
            position,
            len(decision.placements),
            len(decision.preemptions),
            len(decision.waiting),
        )
        return CycleResult(position, decision, appended=True, started=started, finished=finished)
