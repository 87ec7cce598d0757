"""The service loop: the one body both `gpuledger up` and `gpuledger serve` run.

It owns, in one process, everything that writes: the ledger (the eventsourcing store), the DuckDB
projection that feeds the dispatcher its ranks, the relay to Kafka (when configured) and the
dispatcher cycle with its executor. `up` drives it from its main thread; `serve` drives it from
one worker thread that also runs the HTTP API's commands (group commit), so exactly one thread
ever touches the ledger and the executor. The projection is folded by its projector under the
projector's lock (`Projector.lock`): here, and in `serve` by the reads' projector beside it too
(`Projector.beside`, on a connection of its own: `ledger.server.copied`), one catch-up at a time.

Stopping (SIGINT/SIGTERM) never harms work: the current cycle finishes, the relay publishes what
the store holds, and running jobs are left alone unless the executor is this process's own
(the supervised executor of `up` and `serve` leaves its jobs running: the next start adopts them).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledger.core.runas import RunAs
from ledger.cycle.dispatcher import CycleResult, Dispatcher, ProjectionRanks
from ledger.cycle.executor import Executor, Observed
from ledger.cycle.lifecycle import lifecycle_lines
from ledger.cycle.record import SERVICE, max_time_s, record
from ledger.dispatch import registry
from ledger.dispatch.decision import Decision
from ledger.dispatch.policy import Policy
from ledger.store.application import Ledger
from projections.errors import ProjectionBusy, ProjectionMismatch
from projections.projector import Projector
from projections.source import EventSource
from projections.store import Store
from schemas import commands as c
from schemas.errors import EngineAway, LedgerError

if TYPE_CHECKING:
    from ledger.store.relay_service import RelayService


@dataclass
class LoopStats:
    """What `status` and `/v1/health` report about the loop."""

    started_at: float
    cycles: int = 0
    last_cycle_at: float | None = None
    last_cycle_s: float | None = None
    last_error: str | None = None
    projection_position: int = 0
    engine_away: str | None = None
    """Why the executor is not open (its engine does not answer, or refuses): nothing is
    placed, and each step asks again (`ServiceLoop._recover`)."""
    engine_away_since: float | None = None


class ServiceLoop:
    """Store + projection + relay + dispatcher + executor, opened together, stepped by a caller:
    `serve`'s worker thread between HTTP tasks, `up`'s main thread through `run()`.

    Use as a context manager: `with ServiceLoop(...) as loop: loop.step(now)`.
    """

    def __init__(
        self,
        ledger: Ledger,
        executor: Executor,
        policy: Policy,
        *,
        kafka: str | None = None,
        log: logging.Logger | None = None,
        reports_starts: bool = True,
        lifecycle_dir: Path | None = None,
        run_as: RunAs | None = None,
        placing: bool = True,
    ) -> None:
        """`lifecycle_dir`: log each job start, finish and preemption the cycles append, naming
        the job's output file in this directory (`up`). `run_as`: who a job runs as, asked
        before each launch (`Dispatcher`). `placing`: False when nothing runs the jobs
        (`serve` without an executor): no cycle places anything, and `status` says so."""
        self.run_as = run_as
        self.placing = placing
        self.about: dict[str, str] = {}
        """What `status` says of the service beyond its counters: its executor, who jobs run
        as (set by the composition root)."""
        self.ledger = ledger
        self.home: Path = ledger.home
        self.executor = executor
        self.policy = policy
        self.kafka = kafka
        self.log = log or logging.getLogger("gpuledger.service")
        self.reports_starts = reports_starts
        self.relay: RelayService | None = None
        self._shut = False
        """The executor was shut down (`shut_executor`)."""
        self._stepped_down_relay: RelayService | None = None
        """The relay a step-down stopped while its thread still ran: the next one waits for it."""
        self.source: EventSource | None = None
        self.store: Store | None = None
        self.projector: Projector | None = None
        self.dispatcher: Dispatcher | None = None
        self.lifecycle_dir = lifecycle_dir
        self._seen = 0
        self._jobs: dict[int, Any] = {}
        self.clock = ledger.clock
        self.stats = LoopStats(started_at=self.clock.now())
        self._rewound = ledger.rewound
        """`Ledger.rewound` when the projection was last made again (`_project`)."""
        self.on_cycle: list[Callable[[float], None]] = []
        """Called with each cycle's duration in seconds (the server's metrics)."""

    # --- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> ServiceLoop:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self, *, lead: bool = True) -> None:
        """1 transport (embedded or relay + topic)  2 projection  3 dispatcher  4 recovery.

        `lead=False`: a standby of several servers on one store (docs/ha.md) opens the
        projection only, and follows the log (`follow`) until it leads (`lead`)."""
        self.source = self._transport()
        self.store = _open_projection(self.home)
        self.projector = Projector(self.store, self.source)
        if lead:
            self.lead(self.executor)

    def lead(
        self,
        executor: Executor,
        *,
        epoch: int = 0,
        may_act: Callable[[], bool] | None = None,
        holds: Callable[[], bool] | None = None,
    ) -> None:
        """Take up the leader's work: the executor, the relay, the dispatcher, and the recovery
        of what runs (adopted from the executor's own view: agents' reports, Slurm's list).
        `epoch` and `may_act`: the lease this server leads by (docs/ha.md); the dispatcher
        passes the epoch with its orders and carries none out once `may_act()` is false.
        `holds`: the store's answer on that lease, which the relay asks before it touches its
        transactional producer (`RelayService`, atk58 F5)."""
        assert self.projector is not None, "open() first"
        self.executor = executor
        if self.relay is None:
            self._start_relay(may_act, holds)
        self.dispatcher = Dispatcher(
            self.ledger,
            ProjectionRanks(self.projector),
            self.policy,
            self.executor,
            run_as=self.run_as,
        )
        self.dispatcher.epoch = epoch
        if may_act is not None:
            self.dispatcher.may_act = may_act
        self._recover()
        self._seen = self.ledger.head()
        self._jobs = dict(self.ledger.state.jobs)

    def step_down(self) -> None:
        """Stop the leader's work (no cycle, no relay); running jobs are left alone. The relay
        is stopped without a flush (the lease is another server's: its relay publishes the
        rest) and waited for; one whose thread still runs is waited for by the next
        (`RelayService(after=...)`): two relays of one process fenced each other (atk55-25 F3)."""
        self.dispatcher = None
        if self.relay is not None:
            self.relay.stop(flush=False)
            self._stepped_down_relay = self.relay if self.relay.lingering else None
            self.relay = None

    def follow(self) -> int:
        """A standby's step: fold what the log gained (live state and projection)."""
        self.ledger.refresh()
        if self.projector is not None:
            self.stats.projection_position = self._project(None)
        return self.ledger.position

    def _project(self, until: int | None) -> int:
        """Catch the projection up (to `until`). One built on events the log no longer holds is
        made again from the log, in place, and the live state read back too: its position past
        the log's end (a failover to a standby that never got the last commits, whose rows the
        old primary showed to every session), or the live state found the log holds other
        events than it folded (`Ledger.rewind`). Before, every cycle failed on it, forever
        (atk51-ha F2)."""
        assert self.projector is not None and self.store is not None
        if self.ledger.rewound != self._rewound:
            self._remake("the live state was read back from the log")
        try:
            return self.projector.catch_up(until=until).position
        except ProjectionMismatch:
            head, at = self.ledger.head(), self.store.position()
            if at <= head:
                raise
            if self.ledger.position > head:
                self.ledger.rewind(f"the log ends at position {head}")
            self._remake(f"it is at position {at} but the log ends at {head}")
            until = None if until is None else min(until, self.ledger.position)
            return self.projector.catch_up(until=until).position

    def _remake(self, why: str) -> None:
        assert self.projector is not None and self.store is not None
        self._rewound = self.ledger.rewound
        self.log.error("the projection is made again from the log: %s", why)
        with self.projector.lock:
            self.store.empty()

    def record_settings(self, interval_s: float, executor: str, grace_s: int | None = None) -> None:
        longest = getattr(self.executor, "max_time_s", None)  # Slurm's MaxTime, as checked
        record_settings(self.ledger, self.policy, interval_s, executor, self.log, grace_s,
                        max_time_s(longest))  # fmt: skip

    def shut_executor(self) -> None:
        """Shut the executor down, recording the exits of runs that end with it (once: `close`
        does it if no one did). A server under a lease does it before it hands the lease over,
        then stops its relay (`run.serve`)."""
        if self._shut:
            return
        self._shut = True
        exits = self.executor.shutdown(self.clock.now())
        record(self.ledger, Observed(exits=tuple(exits)), self.executor.engine)
        self._log_lifecycles()

    def close(self, store_away: bool = False) -> None:
        """Stop cleanly: shut the executor down (recording the exits of runs that end with it;
        every engine today keeps its runs: supervised jobs, agents and Slurm run on, and the next
        start adopts them), flush the relay, close the projection, snapshot the live state (the
        next start folds no tail; not when the store is known to be away: `store_away`). Never
        raises for a clean stop."""
        self.shut_executor()
        if self.relay is not None:
            health = self.relay.stop()  # flushes what the store holds (bounded)
            self.log.info("%s", health.line())
            self.relay = None
        if self.source is not None:
            self.source.close()
            self.source = None
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.ledger.state.live_only and not store_away:
            try:
                self.ledger.snapshot_state()
            except Exception as err:  # the next start folds the tail instead
                self.log.warning("no snapshot at the stop: %s", (str(err).splitlines() or [""])[0])

    # --- the loop ------------------------------------------------------------------------------

    def step(self, now: float) -> CycleResult:
        """One dispatcher cycle, timed for `status`."""
        assert self.dispatcher is not None, "open() first"
        t0 = time.perf_counter()
        try:
            if self.stats.engine_away is not None:
                self._recover()  # the engine answers now? (cheap while it does not)
            # the state and projection current first: never decided on a log that moved back
            position = self.ledger.refresh()
            if self.projector is not None:
                self._project(position)
            if not self.placing or self.stats.engine_away is not None:
                # nothing would run what it places (no executor, or one not open yet): it
                # places nothing, but its state and projection stay current
                idle = Decision(based_on=position, policy_version=self.policy.version)
                return CycleResult(position, idle, appended=False)
            result = self.dispatcher.cycle(now)
            self._log_lifecycles()
            self.stats.last_error = None
        except LedgerError as err:
            self.stats.last_error = err.line()
            raise
        finally:
            self.stats.cycles += 1
            self.stats.last_cycle_at = now
            self.stats.last_cycle_s = time.perf_counter() - t0
            for observe in self.on_cycle:
                observe(self.stats.last_cycle_s)
            if self.store is not None:
                self.stats.projection_position = self.store.position()
        return result

    def run(
        self,
        stop: threading.Event,
        tick: float,
        *,
        until_idle: bool = False,
        deadline: float | None = None,
    ) -> None:
        """Cycle until `stop` is set (`up`'s driver): every `tick`, or sooner when a contract
        ends; with `until_idle`, until nothing is pending or running; with `deadline`, until
        then."""
        while not stop.is_set():
            now = self.clock.now()
            result = self.step(now)
            if until_idle and self.idle():
                self.log.info("nothing pending or running: exiting")
                return
            if deadline is not None and now >= deadline:
                return
            stop.wait(wait_time(result, tick, self.clock.now()))

    def take_reports(self, now: float) -> None:
        """Record what the executor saw outside a cycle (a node agent's report), the way a cycle
        records it (`Dispatcher.observe`); then stop what the ledger no longer runs (the other
        parts of a gang job one of whose parts failed)."""
        assert self.dispatcher is not None, "open() first"
        self.dispatcher.reconcile(now)

    def idle(self) -> bool:
        return not any(j.active for j in self.ledger.state.jobs.values())

    # --- status --------------------------------------------------------------------------------

    def relay_position(self) -> int | None:
        """The last position the relay published, known to be its topic's (None without Kafka,
        and before the relay's first connect: `RelayService.unsure`, whose words
        `relay_state` tells; a row naming a topic since deleted said `relay_lag 0` with the
        topic 25,000-30,000 short, atk58 F4)."""
        if self.relay is None or self.relay.unsure():
            return None
        return self.relay.health.position

    def relay_checked_s_ago(self) -> float | None:
        """How long ago this server's relay last found its topic the one it published to
        (`RelayHealth.checked_s_ago`, by the relay's clock; None without Kafka, or not known)."""
        if self.relay is None:
            return None
        return self.relay.health.checked_s_ago(self.relay.clock.now())

    def relay_state(self) -> tuple[str | None, str | None]:
        """(state, error) of the relay: a relay that cannot publish says so in health and
        status, never silently (None, None without Kafka); a position not known to be the
        topic's says why (`RelayService.unsure`)."""
        if self.relay is None:
            return None, None
        health = self.relay.health
        # a republish's progress where no error is (atk54-25 F6: it said nothing of it)
        said = [w for w in (health.error or health.republishing, self.relay.unsure()) if w]
        return health.state, "; ".join(said) or None

    # --- internals -----------------------------------------------------------------------------

    def _log_lifecycles(self) -> None:
        """Log each job start, finish, failure and preemption the log gained since the last
        look (finished jobs leave the live state: the ones live at the last look are kept until
        their endings are logged, for their names)."""
        if self.lifecycle_dir is None:
            return
        events = [ev for _, ev in self.ledger.read(self._seen, 100_000)]
        self._jobs.update(self.ledger.state.jobs)
        for line in lifecycle_lines(events, self._jobs, str(self.lifecycle_dir)):
            self.log.info("%s", line)
        self._seen = self.ledger.head()
        self._jobs = dict(self.ledger.state.jobs)  # only live jobs are kept: memory stays bounded

    def _recover(self) -> None:
        """With an executor of our own, compare the ledger with it before any cycle (adopt, or
        record as lost what died with the last process). Agents report for themselves, so
        nothing is assumed without one."""
        if not self.reports_starts or self.dispatcher is None:
            return
        now = self.clock.now()
        try:
            self.dispatcher.recover(now)
        except EngineAway as err:  # started during an outage: placing waits for the engine
            if self.stats.engine_away is None:
                self.stats.engine_away_since = now
                self.log.warning("the executor cannot open: %s; placing nothing until it can",
                                 err.line())  # fmt: skip
            self.stats.engine_away = err.line()
            return
        if self.stats.engine_away is not None:
            self.log.warning("the executor is open after %.0f s: placing again",
                             now - (self.stats.engine_away_since or now))  # fmt: skip
        self.stats.engine_away = self.stats.engine_away_since = None

    def _transport(self) -> EventSource:
        """The projection always reads the store (scheduling never waits on a broker); with
        Kafka a relay thread publishes the log for other readers (`_start_relay`), and a broker
        outage shows as relay lag."""
        return self.ledger.source()

    def _start_relay(
        self, may_act: Callable[[], bool] | None = None, holds: Callable[[], bool] | None = None
    ) -> None:
        """The relay thread (GPULEDGER_KAFKA_TOPIC and GPULEDGER_KAFKA_TRANSACTIONAL_ID override
        the topic and the relay's transactional id), when the service has Kafka; `may_act`: the
        lease it publishes under (its round ends once it runs out)."""
        if self.kafka is not None:
            from ledger.store.relay_service import RelayService, flush_timeout
            from projections.kafka_wire import connect_timeout, quiet_kafka_logs, topic

            quiet_kafka_logs(logging.getLevelName(logging.root.level))
            self.relay = RelayService(
                self.home,
                self.kafka,
                topic=topic(),
                transactional_id=os.environ.get("GPULEDGER_KAFKA_TRANSACTIONAL_ID") or None,
                connect_timeout_s=connect_timeout(),
                flush_s=flush_timeout(),
                may_act=may_act,
                holds=holds,
                after=self._stepped_down_relay,
            ).start()
            self._stepped_down_relay = None


def _open_projection(home: Path, wait_s: float = 15.0) -> Store:
    """The projection file, for writing. A read command may hold it for a moment (DuckDB allows
    one writer per file; readers open it only when no service does): retry until `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return Store.open(home)
        except ProjectionBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def record_settings(
    ledger: Ledger,
    policy: Policy,
    interval_s: float,
    executor: str,
    log: logging.Logger,
    grace_s: int | None = None,
    longest_s: int | None = None,
) -> None:
    """Append `service.configured` when the service runs with other settings than the ones
    last recorded (a restart with the same settings appends nothing). `grace_s`: its `--grace`
    (the grace of a job stopped without its own), which every read counts a SIGKILL with;
    `longest_s`: its engine's longest time limit (Slurm's MaxTime, `max_time_s`)."""
    config = registry.config_of(policy)
    now = ledger.state.service
    if now is not None and (
        now.policy, now.interval_s, now.executor, now.grace_s, now.max_time_s
    ) == (config, interval_s, executor, grace_s, longest_s):  # fmt: skip
        return
    ledger.execute(
        c.ConfigureService(
            actor=SERVICE,
            policy=config,
            interval_s=interval_s,
            executor=executor,
            grace_s=grace_s,
            max_time_s=longest_s,
        )
    )
    grace = "" if grace_s is None else f", grace {grace_s}s"
    log.info("recorded settings: %s every %gs, executor %s%s", config, interval_s, executor, grace)


MIN_WAIT_S = 0.05
"""The least a service waits between two cycles (replay bounds a record's `skipped_cycles`
by it: `ledger.history.compare.SkippedBound`)."""


def wait_time(result: CycleResult, tick: float, now: float) -> float:
    """How long to sleep before the next cycle: the interval, or sooner when a contract ends
    (never less than `MIN_WAIT_S`)."""
    wake = result.decision.wake_at
    return tick if wake is None else max(MIN_WAIT_S, min(tick, wake - now))
