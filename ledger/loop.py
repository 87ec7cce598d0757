"""The service loop: the one body both `gpuledger up` and `gpuledger serve` run.

It owns, in one process, everything that writes: the ledger (the eventsourcing store), the DuckDB
projection that feeds the dispatcher its ranks, the relay to Kafka (when configured) and the
dispatcher cycle with its executor. `up` drives it from its main thread; `serve` drives it from
one worker thread that also runs the HTTP API's commands (group commit) and reads, so exactly
one thread ever touches the ledger, the projection and the executor.

Stopping (SIGINT/SIGTERM) never harms work: the current cycle finishes, the relay publishes what
the store holds, and running jobs are left alone unless the executor is this process's own
(`up`'s LocalExecutor stops its children and records their exits, as before).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ledger.application import Ledger
from ledger.dispatch import registry
from ledger.dispatch.policy import Policy
from ledger.executors import Executor, Exit, Launch
from ledger.service import EXECUTOR, CycleResult, Dispatcher, ProjectionRanks
from projections.errors import SourceUnavailable
from projections.projector import Projector
from projections.source import EmbeddedSource, EventSource, LogRecord
from projections.store import Store
from schemas import commands as c
from schemas.errors import LedgerError

if TYPE_CHECKING:
    from ledger.relay import Relay
    from projections.kafka_source import KafkaSource
    from projections.quarantine import Where


SERVICE = "@service"


def make_policy(name: str, margin: float, debug_lane: bool) -> Policy:
    """The named policy; `margin` and `debug_lane` set fair share's knobs."""
    config = registry.default_config(name)
    if registry.lookup(name).name == "fairshare":
        config = registry.with_knobs(config, {"margin": margin, "debug_lane": debug_lane})
    return registry.policy_from_config(config)


class NoExecutor:
    """`serve --executor none`: placements are recorded and handed to node agents, which report
    starts and exits themselves; nothing runs in this process."""

    def launch(self, job: Launch, now: float) -> None:
        return None

    def stop(self, job_id: int, now: float) -> None:
        return None

    def poll(self, now: float) -> list[Exit]:
        return []

    def running(self) -> set[int]:
        return set()

    def next_event_at(self) -> float | None:
        return None


@dataclass
class LoopStats:
    """What `status` and `/v1/health` report about the loop."""

    started_at: float
    cycles: int = 0
    last_cycle_at: float | None = None
    last_cycle_s: float | None = None
    last_error: str | None = None
    projection_position: int = 0


class ServiceLoop:
    """Store + projection + relay + dispatcher + executor, opened together, stepped by a caller.

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
    ) -> None:
        self.ledger = ledger
        self.home: Path = ledger.home
        self.executor = executor
        self.policy = policy
        self.kafka = kafka
        self.log = log or logging.getLogger("gpuledger.service")
        self.reports_starts = reports_starts
        self.stop_relay = threading.Event()
        self.relay: Relay | None = None
        self._relay_thread: threading.Thread | None = None
        self.source: EventSource | None = None
        self.store: Store | None = None
        self.projector: Projector | None = None
        self.dispatcher: Dispatcher | None = None
        self.clock = ledger.clock
        self.stats = LoopStats(started_at=self.clock.now())

    # --- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> ServiceLoop:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """1 transport (embedded or relay + topic)  2 projection  3 dispatcher  4 recovery."""
        self.source = self._transport()
        self.store = Store.open(self.home)
        self.projector = Projector(self.store, self.source)
        self.dispatcher = Dispatcher(
            self.ledger, ProjectionRanks(self.projector), self.policy, self.executor
        )
        self._recover()

    def record_settings(self, interval_s: float, executor: str) -> None:
        """Append `service.configured.v1` when the service runs with other settings than the
        ones last recorded (a restart with the same settings appends nothing)."""
        config = registry.config_of(self.policy)
        now = self.ledger.state.service
        if now is not None and (now.policy, now.interval_s, now.executor) == (
            config,
            interval_s,
            executor,
        ):
            return
        self.ledger.execute(
            c.ConfigureService(
                actor=SERVICE, policy=config, interval_s=interval_s, executor=executor
            )
        )
        self.log.info("recorded settings: %s every %gs, executor %s", config, interval_s, executor)

    def close(self, *, stop_jobs: bool = False) -> None:
        """Stop cleanly: optionally stop this process's own jobs (recording their exits), flush
        the relay, close the projection. Never raises for a clean stop."""
        if stop_jobs:
            shutdown = getattr(self.executor, "shutdown", None)
            exits: list[Exit] = shutdown(self.clock.now()) if shutdown is not None else []
            for ex in exits:
                self.record_exit(ex)
        self.stop_relay.set()
        if self._relay_thread is not None:
            self._relay_thread.join(timeout=30)
            self._relay_thread = None
        if self.source is not None:
            self.source.close()
            self.source = None
        if self.store is not None:
            self.store.close()
            self.store = None

    # --- the loop ------------------------------------------------------------------------------

    def step(self, now: float) -> CycleResult:
        """One dispatcher cycle, timed for `status`."""
        assert self.dispatcher is not None, "open() first"
        t0 = time.perf_counter()
        try:
            result = self.dispatcher.cycle(now)
            self.stats.last_error = None
        except LedgerError as err:
            self.stats.last_error = err.line()
            raise
        finally:
            self.stats.cycles += 1
            self.stats.last_cycle_at = now
            self.stats.last_cycle_s = time.perf_counter() - t0
            if self.store is not None:
                self.stats.projection_position = self.store.position()
        return result

    def idle(self) -> bool:
        return not any(j.active for j in self.ledger.state.jobs.values())

    def record_exit(self, ex: Exit) -> None:
        try:
            self.ledger.execute(
                c.FinishJob(actor=EXECUTOR, job_id=ex.job_id, exit_code=ex.exit_code)
            )
        except LedgerError as err:
            self.log.info("exit of job %s not recorded: %s", ex.job_id, err.line())

    # --- status --------------------------------------------------------------------------------

    def relay_position(self) -> int | None:
        """The last position the relay published (None without Kafka)."""
        if self.relay is None:
            return None
        return int(getattr(self.relay, "position", 0))

    # --- internals -----------------------------------------------------------------------------

    def _recover(self) -> None:
        """Jobs the ledger says run here but no process runs (the service stopped uncleanly):
        with an executor of our own they ended when it stopped; record that, so their GPUs are
        free again. Agents report for themselves, so nothing is assumed without one."""
        if not self.reports_starts:
            return
        state = self.ledger.state
        lost = [j.job_id for j in state.jobs.values() if j.status in ("placed", "running")]
        for job_id in sorted(set(lost) - self.executor.running()):
            self.log.warning("job %s has no process after a restart: recording it failed", job_id)
            self.ledger.execute(c.FinishJob(actor=EXECUTOR, job_id=job_id, exit_code=-1))

    def _transport(self) -> EventSource:
        """Embedded: the projection reads the store. Kafka: a relay thread publishes the store
        and the projection consumes the topic (GPULEDGER_KAFKA_TOPIC and
        GPULEDGER_KAFKA_TRANSACTIONAL_ID override the topic and the relay's transactional id)."""
        if self.kafka is None:
            return EmbeddedSource(self.home)
        from ledger.relay import DEFAULT_TRANSACTIONAL_ID, TOPIC, Relay, open_store
        from projections.kafka_source import KafkaSource

        logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.root.level))
        topic = os.environ.get("GPULEDGER_KAFKA_TOPIC") or TOPIC
        txn_id = os.environ.get("GPULEDGER_KAFKA_TRANSACTIONAL_ID") or DEFAULT_TRANSACTIONAL_ID
        relay = self.relay = Relay(
            open_store(self.home), self.kafka, topic=topic, transactional_id=txn_id
        )
        log = self.log

        def run() -> None:
            try:
                relay.run(self.stop_relay, on_error=lambda e: log.warning("relay: %s", e))
                relay.publish_pending()  # flush: what the store holds reaches the topic
            except LedgerError as err:
                log.error("relay stopped: %s", err.line())
            finally:
                relay.close()

        self._relay_thread = threading.Thread(target=run, name="relay", daemon=True)
        self._relay_thread.start()
        return _Relayed(KafkaSource(self.kafka, topic), EmbeddedSource(self.home), log)


class _Relayed:
    """The topic as the projection's source with Kafka. Its head waits (up to `wait_s`) until
    the relay has published the store's head, so the dispatcher ranks at exactly its snapshot's
    position, as on the embedded default. When Kafka lags longer or is away, it goes on with the
    projection as far as the topic has it, and says so: placements stay safe (the ledger checks
    them against its own state); only the fair-share order may lag behind."""

    def __init__(
        self, kafka: KafkaSource, store: EmbeddedSource, log: logging.Logger, wait_s: float = 10.0
    ) -> None:
        self.kafka = kafka
        self.store = store
        self.log = log
        self.wait_s = wait_s
        self._head: int | None = None

    def read(self, after: int, limit: int) -> list[LogRecord]:
        try:
            return self.kafka.read(after, limit)
        except SourceUnavailable as err:
            self.log.warning("kafka: %s; ranking on the projection as it stands", err.line())
            return []

    def head(self) -> int:
        target = self.store.head()
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                head = self._head = self.kafka.head()
            except SourceUnavailable as err:
                if self._head is None:
                    raise
                self.log.warning("kafka: %s; ranking on the projection as it stands", err.line())
                return self._head
            if head >= target:
                return head
            if time.monotonic() > deadline:
                self.log.warning(
                    "kafka: the topic is at position %d, the store at %d: ranking on the topic",
                    head,
                    target,
                )
                return head
            time.sleep(0.005)

    def where(self, position: int) -> Where | None:
        return self.kafka.where(position)

    def close(self) -> None:
        self.kafka.close()
        self.store.close()


def wait_time(result: CycleResult, tick: float, now: float) -> float:
    """How long to sleep before the next cycle: the interval, or sooner when a contract ends."""
    wake = result.decision.wake_at
    return tick if wake is None else max(0.05, min(tick, wake - now))
