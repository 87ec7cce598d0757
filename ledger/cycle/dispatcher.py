"""The dispatcher cycle and the service loop: the edge around the pure `decide()`.

One cycle, as numbered steps (Kueue's `schedule()` shape), talking to the executor once each
way (`ledger.cycle.executor`):
  0. observe: ask the engine once what it saw, and record it (`ledger.cycle.record`: node
     changes, starts, checkpoints and samples, exits): GPUs they free are free for this cycle;
  1. snapshot at position P: catch the ledger up, take fair-share ranks at `now`, build the
     snapshot of pending/running jobs and nodes (less the GPUs foreign work holds);
  2. decide (pure);
  3. append the decision expecting position P: a decision the log has overtaken in a way that
     touches it is rejected by the ledger (`Conflict`) and simply retried next cycle;
  4. carry out: stop what the ledger no longer runs, launch the placements; record the runs
     that began at once;
  5. return what happened (metrics, log line).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from ledger.core.runas import Lookup, RunAs
from ledger.core.utilisation import UtilTracker, squat_threshold
from ledger.cycle.accounts import os_account
from ledger.cycle.executor import (
    Executor,
    Exit,
    HandsOutAgain,
    Launch,
    Observed,
    Orders,
    launch_of,
)
from ledger.cycle.inputs import Views, snapshot_kept
from ledger.cycle.record import EXECUTOR, Recorded, record, record_longest
from ledger.dispatch.decision import Carry, Decision
from ledger.dispatch.engine import decide_carried
from ledger.dispatch.policy import Policy
from ledger.dispatch.registry import config_of
from ledger.dispatch.snapshot import Snapshot
from projections import queries
from projections.fairshare import FairTree, UsagePolicy, ranking_version
from projections.store import Store
from schemas import commands as c
from schemas import events as e
from schemas.bounds import DEFAULT_GRACE_S
from schemas.codec import gc_paused
from schemas.digest import rank_digest
from schemas.errors import Conflict, LedgerError, NotAuthorised, UnknownEntity
from schemas.events import tag_of
from schemas.policy import AnyPolicyConfig

if TYPE_CHECKING:  # the projector brings DuckDB's Python API, the application eventsourcing; a
    # read that needs neither a catch-up nor an append (the CLI's `queue`) loads neither
    from ledger.core.state import State
    from ledger.store.application import Ledger
    from projections.projector import Projector

log = logging.getLogger("gpuledger.dispatcher")

_UTIL_TAGS = [tag_of(t) for t in (e.UtilisationSampled, e.JobPlaced, e.JobPreempted, e.JobUnplaced,
                                   e.JobFinished)]  # fmt: skip
DISPATCHER = "@dispatcher"
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

    @property
    def usage_policy(self) -> UsagePolicy | None:
        """How usage is counted (what a decision record says of its ranks); None for a source
        that reads no usage (policies without ranks)."""
        ...

    @property
    def read_position(self) -> int | None:
        """The log position the last ranks were read at when the source may trail the ledger
        (a projection); None when they are read at the snapshot's position."""
        ...

    @property
    def computed_by(self) -> str:
        """How it computes ranks, as decision records name it (`RankInputs.computed_by`): ""
        the projection's SQL, "fold" the in-memory usage fold."""
        ...

    def ranks(self, now: float, position: int) -> tuple[Mapping[str, int], Mapping[str, float]]:
        """(rank per account path, lower is better; level fair share per account path) at `now`
        from the log up to `position`."""
        ...


Standing = tuple[Mapping[str, float], Mapping[str, float]]
"""(account -> usage, account -> norm share): what `Snapshot.usage` and `Snapshot.shares` hold."""


def usage_shares(source: object, policy: object, now: float, position: int) -> Standing:
    """The usage and shares behind the ranks `source` read last, for a policy that reads them
    (`reads_usage`: `fairshare-10` charges placements against them inside a cycle); empty for
    every other policy (they read ranks only) and for a source that has none. A source has them
    as an optional `usage_shares(now, position)`, asked right after its `ranks`."""
    if not getattr(policy, "reads_usage", False):
        return {}, {}
    read = getattr(source, "usage_shares", None)
    if read is None:
        return {}, {}
    found: Standing = read(now, position)
    return found


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
    usage = source.usage_policy
    if usage is None:
        return None
    read_at = source.read_position
    return e.RankInputs(
        position=position if read_at is None else read_at,
        digest=rank_digest(ranks, level_fs),
        ranking_version=ranking_version(usage),
        usage=e.UsageSettings(
            window_s=usage.window_s, half_life_s=usage.half_life_s, weights=dict(usage.weights)
        ),
        computed_by=source.computed_by,
    )


def typed_config(policy: Policy) -> AnyPolicyConfig | None:
    """The typed config a decision record carries (`registry.config_of`); None for a policy no
    version registers."""
    try:
        return config_of(policy)
    except (UnknownEntity, AttributeError):
        return None


class StoreRanks:
    """Ranks from a DuckDB projection as it stands (fed by Kafka, it may trail the ledger)."""

    computed_by = ""
    """The projection's SQL."""

    def __init__(self, store: Store, usage: UsagePolicy | None = None) -> None:
        self.store = store
        self.usage = usage or UsagePolicy()
        self.read_position: int | None = None
        """The projection position of the last reading."""
        self._tree: FairTree | None = None
        """The Fair Tree of the last reading."""

    @property
    def usage_policy(self) -> UsagePolicy:
        return self.usage

    def ranks(self, now: float, position: int) -> tuple[Mapping[str, int], Mapping[str, float]]:
        self.read_position = self.store.position()
        tree = self._tree = queries.fair_share(self.store, now, self.usage)
        return tree.leaf_ranks(), tree.level_fs()

    def usage_shares(self, now: float, position: int) -> Standing:
        """The usage and norm shares of the Fair Tree the last `ranks` read (`usage_shares`)."""
        if self._tree is None:
            self.ranks(now, position)
        assert self._tree is not None
        return self._tree.usage_shares()


class ProjectionRanks(StoreRanks):
    """Ranks from the DuckDB projection, caught up with the log before each reading."""

    def __init__(self, projector: Projector, usage: UsagePolicy | None = None) -> None:
        super().__init__(projector.store, usage)
        self.projector = projector

    def ranks(self, now: float, position: int) -> tuple[Mapping[str, int], Mapping[str, float]]:
        """Catch up to exactly `position`, the snapshot's, so a replay from the log alone sees
        the same usage. The projector's lock is held across both: no other projector of this
        projection (the server's reads', `Projector.beside`) folds past it in between."""
        with self.projector.lock:
            self.projector.catch_up(until=position)
            return super().ranks(now, position)


def preview(
    ledger: LiveState,
    ranks: RankSource,
    policy: Policy,
    now: float,
    low_util_since: Mapping[int, float] | None = None,
    *,
    unavailable: Mapping[str, frozenset[int]] | None = None,
) -> tuple[Snapshot, Decision]:
    """What the dispatcher would decide now, without appending anything (queue, explain);
    `unavailable`: GPUs foreign work holds (node -> indices), never free, as in a cycle."""
    snapshot, decision, _ = preview_carried(
        ledger, ranks, policy, now, None, low_util_since, unavailable=unavailable
    )
    return snapshot, decision


Carried = tuple[Views, Carry]
"""What one preview hands the next (`preview_carried`): its snapshot's views and its
decision's carry, as a cycle hands them on."""


def preview_carried(
    ledger: LiveState,
    ranks: RankSource,
    policy: Policy,
    now: float,
    carried: Carried | None,
    low_util_since: Mapping[int, float] | None = None,
    *,
    unavailable: Mapping[str, frozenset[int]] | None = None,
    longest_s: float | None = None,
) -> tuple[Snapshot, Decision, Carried]:
    """`preview`, made from what an earlier preview handed on (`carried`, None: nothing), as a
    cycle's snapshot and decision are made from the last cycle's (`snapshot_kept`,
    `decide_carried`: equal in every answer to one made from nothing, only the jobs and nodes
    that changed since are looked at again; nothing kept is ever changed, so two previews may
    start from one `carried` at once), and what to hand the next. `longest_s`: the longest
    time limit the engine starts, as the service last observed it (`Observed.longest_s`): a
    job asking for more is left out, as a cycle leaves it out."""
    position = ledger.catch_up()
    leaf_ranks, level_fs = ranks.ranks(now, position)
    usage, shares = usage_shares(ranks, policy, now, position)
    views, carry = carried if carried is not None else (None, None)
    snapshot, views = snapshot_kept(
        ledger.state,
        leaf_ranks,
        now,
        views,
        level_fs=level_fs,
        usage=usage,
        shares=shares,
        low_util_since=low_util_since,
        position=position,
        unavailable=unavailable,
        longest_s=longest_s,
        hold_stopping=True,  # as a cycle does
        hold_lost=True,
        hold_placed=True,
        hold_grace=True,
    )
    decision, carry = decide_carried(snapshot, policy, now, carry)
    return snapshot, decision, (views, carry)


def decided_longest(state: State, seen_s: float | None) -> float | None:
    """Pure: the longest time limit a cycle decides with (a pending job over it is not placed):
    the one the log records (`State.max_time_s`, recorded before the cycle decides:
    `record_longest`), as replay reads it, so the same log gives the same decision (atk62b G3:
    a cycle held a job over the MaxTime its engine read, the replay, which read none, placed
    it); the engine's own (`seen_s`) only on a log with no service settings recorded (a test,
    a tool), which replays with none."""
    return seen_s if state.service is None else state.max_time_s


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
        *,
        idle_record_s: float | None = IDLE_RECORD_S,
        run_as: RunAs | None = None,
        lookup: Lookup = os_account,
    ) -> None:
        """`idle_record_s`: record a cycle that decides nothing while jobs wait at most this
        often (None: never; the simulator's choice). `run_as`: the rule of who a job runs as,
        asked before each launch (None: jobs run as the engine's own account, the simulator's
        and a service with `run_as = "service"`)."""
        self.run_as = run_as
        self.lookup = lookup
        self.ledger = ledger
        self.rank_source = ranks
        self.policy = policy
        self.executor = executor
        if isinstance(executor, HandsOutAgain):
            executor.world = self._launch
        # the squat threshold is the policy's, and utilisation is read from the whole log (not
        # only from when this process started), so replay sees what the cycle saw
        threshold = squat_threshold(policy)
        self.util = util or UtilTracker(threshold_pct=threshold)
        self._seen = 0
        self._views: Views | None = None
        self._carry: Carry | None = None
        """What the last cycle's snapshot and `decide()` hand the next (`snapshot_kept`,
        `decide_carried`): views and indexes of what did not change, kept by this dispatcher
        and passed in, so the pure parts keep nothing."""
        self.idle_record_s = idle_record_s
        self._skipped = 0
        """Cycles that decided nothing since the last record, not recorded on their own."""
        self._recorded_at: float | None = None
        self.epoch = 0
        """The leader epoch (several servers on one store); 0: the only server."""
        self.may_act: Callable[[], bool] = lambda: True
        """Whether this server still leads, by its lease's own clock: orders decided under a
        lease that has run out are not carried out (the next leader decides again)."""
        self.unobserved: frozenset[str] = frozenset()
        """Nodes the engine could not observe at the last cycle (outage mode: nothing decided
        about them)."""
        self.foreign: Mapping[str, frozenset[int]] = {}
        """GPUs work outside the ledger held at the last observation (`node list` shows them)."""
        self.stopping: Mapping[str, frozenset[int]] = {}
        """GPUs of stopped runs still in their grace at the last observation (`node list`)."""
        self.unobserved_since: float | None = None
        """When the engine last went from seeing everything to not (None while it sees all)."""
        self.unobserved_why = ""
        """Why, when the engine says (`Observed.unobserved_why`)."""
        self.engine_note = ""
        """The engine's word on its settings at the last observation (`Observed.engine_note`)."""
        self.longest_s: float | None = None
        """The longest time limit the engine starts, at the last observation
        (`Observed.longest_s`): the reads say why a job asking for more waits."""

    def _outage(self, unobserved: frozenset[str], now: float, why: str = "") -> None:
        """Keep what the engine cannot see, and say when that starts and ends."""
        if unobserved and not self.unobserved:
            self.unobserved_since = now
            log.warning("outage: the engine cannot observe %s; deciding nothing about them",
                        ", ".join(sorted(unobserved)))  # fmt: skip
        elif self.unobserved and not unobserved:
            log.warning("outage over after %.0f s: the engine observes every node again",
                        now - (self.unobserved_since or now))  # fmt: skip
            self.unobserved_since = None
        self.unobserved = unobserved
        self.unobserved_why = why if unobserved else ""

    def _observe_new_events(self) -> None:
        """Feed the utilisation tracker the events it looks at (the store filters by tag, so a
        large decision record is never decoded here)."""
        head = self.ledger.position
        for _, event in self.ledger.follow(self._seen, head, tags=_UTIL_TAGS):
            self.util.observe(event)
        self._seen = head

    def observe(self, now: float) -> tuple[Observed, Recorded]:
        """Ask the engine once what it saw, and record it (`ledger.cycle.record`)."""
        seen = self.executor.observe(now, self.ledger.state.nodes)
        return seen, record(self.ledger, seen, self.executor.engine, now)

    def reconcile(self, now: float) -> Recorded:
        """Between cycles (a node agent's report): record what the engine saw, then stop what
        the ledger no longer runs (the other parts of a gang job one of whose parts failed)."""
        seen, recorded = self.observe(now)
        self.carry_out(Orders(stops=self.stops(seen.running)), now)
        return recorded

    def stops(self, running: Set[int]) -> tuple[int, ...]:
        """The runs the engine has that the ledger no longer runs (cancelled, preempted,
        removed), in job order."""
        jobs = self.ledger.state.jobs
        held = ("placed", "running")
        return tuple(j for j in sorted(running) if j not in jobs or jobs[j].status not in held)

    def carry_out(self, orders: Orders, now: float) -> Recorded:
        """Hand the orders to the engine, with the stopped runs to SIGKILL now (`Orders.kills`,
        every time until their ends are recorded): those a second cancel ordered killed, and
        those whose grace, counted from the stop the log recorded, has passed (`StoppedRun.
        kill_due`: a restart between a stop and its SIGTERM gave the run a whole new grace,
        atk47-23 F3); record the runs that began at once."""
        grace = float(getattr(self.executor, "grace_s", DEFAULT_GRACE_S))  # its default grace
        kills = tuple(sorted({sr.job_id for sr in self.ledger.state.stopped_runs.values()
                              if sr.kill_due(now, grace)}))  # fmt: skip
        orders = replace(orders, kills=kills) if kills else orders
        if not orders.stops and not orders.launches and not orders.kills:
            return Recorded()
        if not self.may_act():
            log.warning("not carrying out orders of epoch %d: the lease ran out", self.epoch)
            return Recorded()
        if self.epoch:
            orders = replace(orders, epoch=self.epoch)
        began = self.executor.carry_out(orders, now)
        return record(self.ledger, Observed(starts=began), self.executor.engine)

    def recover(self, now: float) -> None:
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
        known = self.executor.adopt({jid: j.run for jid, j in held.items()}, now)
        relaunch: list[int] = []
        lost: list[Exit] = []
        for job_id in sorted(set(held) - known):
            if held[job_id].status == "placed" and self.executor.relaunch_placed:
                log.warning("job %s was placed but never reached the engine: launching it", job_id)
                relaunch.append(job_id)
                continue
            log.warning(
                "job %s has no run in the engine after a restart: recording it lost", job_id
            )
            lost.append(Exit(job_id, -1, now, "lost"))
        record(self.ledger, Observed(exits=tuple(lost)), self.executor.engine)
        self.carry_out(Orders(launches=self._launches(relaunch)), now)

    def _launches(self, job_ids: list[int]) -> tuple[Launch, ...]:
        """The launches of placed jobs. A job whose owner the run-as rule maps to no OS account
        it accepts is recorded `launch_failed`, with why, instead: nothing runs as an account
        it should not (a job submitted to the data directory with no server in front, or whose
        account went away after it was submitted)."""
        out = []
        for job_id in job_ids:
            try:
                out.append(self._launch(job_id))
            except NotAuthorised as err:
                log.warning("job %s is not launched: %s", job_id, err.line())
                finish = c.FinishJob(
                    actor=EXECUTOR,
                    job_id=job_id,
                    exit_code=-1,
                    reason="launch_failed",
                    note=err.line()[:1000],
                )
                try:
                    self.ledger.execute(finish)
                except LedgerError as gone:  # the ledger moved on (a cancel): nothing to do
                    log.info("launch failure of job %s not recorded: %s", job_id, gone.line())
        return tuple(out)

    def _launch(self, job_id: int) -> Launch:
        """A placed job as the engine runs it (`launch_of`), as its owner's OS account."""
        job = self.ledger.state.jobs[job_id]
        spec = job.spec
        user = spec.user
        if self.run_as is not None:  # its owner's OS account, or NotAuthorised
            admin = self.ledger.state.is_admin(spec.actor)
            user = self.run_as.account(spec.user, self.lookup, by=spec.actor, admin=admin).name
        return launch_of(job_id, job, user)

    def _record_idle(self, decision: Decision, now: float) -> bool:
        """Whether to record a cycle that decided nothing: jobs wait and the last record is at
        least `idle_record_s` old."""
        if self.idle_record_s is None or not decision.waiting:
            return False
        return self._recorded_at is not None and now - self._recorded_at >= self.idle_record_s

    def cycle(self, now: float) -> CycleResult:
        """One dispatcher cycle. The cyclic garbage collector waits until it ends: a cycle makes
        ~100k short-lived objects that reference counting frees, and the full collections they
        would set off (40-50 ms over the live state) run between cycles instead of inside one."""
        with gc_paused():
            return self._cycle(now)

    def _cycle(self, now: float) -> CycleResult:
        # 0. observe once and record it: node changes, starts, checkpoints and samples, exits
        seen, recorded = self.observe(now)
        self._outage(seen.unobserved, now, seen.unobserved_why)
        self.engine_note = seen.engine_note
        self.foreign = seen.foreign
        self.stopping = seen.stopping
        # the MaxTime it decides with is the one recorded, recorded first (atk62b G3: replay)
        record_longest(self.ledger, seen.longest_s, log)
        self.longest_s = decided_longest(self.ledger.state, seen.longest_s)
        finished = recorded.finished
        # 1. snapshot at position P
        position = self.ledger.catch_up()
        self._observe_new_events()
        ranks, level_fs = self.rank_source.ranks(now, position)
        usage, shares = usage_shares(self.rank_source, self.policy, now, position)
        snapshot, self._views = snapshot_kept(
            self.ledger.state,
            ranks,
            now,
            self._views,
            level_fs=level_fs,
            usage=usage,
            shares=shares,
            low_util_since=self.util.low_since,
            position=position,
            unavailable=seen.foreign,
            unobserved=seen.unobserved,
            # Slurm may hold a placement before it starts it: contracts count from its start
            from_start=self.executor.engine == "slurm",
            longest_s=self.longest_s,
            # a stopped run's GPUs are busy until its end is recorded (atk47-23 F8), a `node
            # lost`'s run's too (s50); the record says so (`stopping_held`, `lost_held`), for replay
            hold_stopping=True,
            hold_lost=True,
            hold_placed=True,  # and a run stopped while placed, its launch unheard (s52)
            hold_grace=True,  # and a job MaxTime cannot hold with its grace (s63)
        )
        # 2. decide (pure)
        decision, self._carry = decide_carried(snapshot, self.policy, now, self._carry)
        if self._recorded_at is None:
            self._recorded_at = now
        if (
            not decision.placements
            and not decision.preemptions
            and not self._record_idle(decision, now)
        ):
            self._skipped += 1
            self.carry_out(Orders(stops=self.stops(seen.running)), now)
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
                stopping_held=True,
                lost_held=True,
                placed_held=True,
                grace_held=True,
            )
            self.ledger.execute(command)
            self._skipped, self._recorded_at = 0, now
        except Conflict as err:
            log.info("decision at position %s overtaken: %s", position, err.line())
            return CycleResult(
                position, decision, appended=False, conflict=err.line(), finished=finished
            )
        # 4. carry out: stop the preempted (and whatever else the ledger no longer runs), launch
        #    the placed; record the runs that began at once
        orders = Orders(
            stops=self.stops(seen.running),
            launches=self._launches([pl.job_id for pl in decision.placements]),
        )
        started = self.carry_out(orders, now).started
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
