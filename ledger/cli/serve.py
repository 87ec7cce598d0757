"""`gpuledger up`: the service on the embedded default (ledger, projector, dispatcher loop,
LocalExecutor), or fed by Kafka with `--kafka`."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ledger.cli._common import Ctx, parse_duration, pass_ctx
from ledger.clock import SystemClock
from ledger.dispatch import registry
from ledger.dispatch.policy import Policy
from ledger.executors import LocalExecutor
from ledger.service import EXECUTOR, Dispatcher, ProjectionRanks
from projections.errors import SourceUnavailable
from projections.projector import Projector
from projections.source import EmbeddedSource, EventSource, LogRecord
from projections.store import Store
from schemas import commands as c
from schemas.errors import InvalidCommand, LedgerError

if TYPE_CHECKING:
    from projections.kafka_source import KafkaSource
    from projections.quarantine import Where


def _node_spec(text: str) -> tuple[str, int, str]:
    name, _, rest = text.partition(":")
    gpus, _, gpu_type = rest.partition(":")
    if not name or not gpus.isdigit():
        raise InvalidCommand(
            f"invalid node {text!r}", hint="use NAME:GPUS[:TYPE], e.g. local:4:h100"
        )
    return name, int(gpus), gpu_type or "gpu"


def _policy(name: str, margin: float, debug_lane: bool) -> Policy:
    """The named policy; `--margin` and `--debug-lane` set fair share's knobs."""
    config = registry.default_config(name)
    if registry.lookup(name).name == "fairshare":
        config = registry.with_knobs(config, {"margin": margin, "debug_lane": debug_lane})
    return registry.policy_from_config(config)


@click.command()
@click.option(
    "--node", "nodes", multiple=True, help="Register NAME:GPUS[:TYPE] if missing (repeatable)."
)
@click.option("--interval", default="2s", show_default=True, help="Time between dispatcher cycles.")
@click.option(
    "--grace", default="30s", show_default=True, help="SIGTERM-to-SIGKILL grace on preemption."
)
@click.option(
    "--policy",
    type=click.Choice(["fairshare", "fifo"]),
    default=registry.DEFAULT,
    show_default=True,
)
@click.option("--margin", type=float, default=0.1, show_default=True, help="Preemption hysteresis.")
@click.option("--debug-lane/--no-debug-lane", default=True, show_default=True)
@click.option(
    "--kafka",
    "kafka",
    envvar="GPULEDGER_KAFKA",
    default=None,
    help="Bootstrap HOST:PORT: relay the log to Kafka and feed the projection from it.",
)
@click.option("--until-idle", is_flag=True, help="Exit once nothing is pending or running.")
@click.option("--for", "run_for", default=None, help="Exit after this long (e.g. 10m).")
@click.option("--log-level", default="INFO", show_default=True)
@pass_ctx
def up(
    ctx: Ctx,
    nodes: tuple[str, ...],
    interval: str,
    grace: str,
    policy: str,
    margin: float,
    debug_lane: bool,
    kafka: str | None,
    until_idle: bool,
    run_for: str | None,
    log_level: str,
) -> None:
    """Run the service: every cycle snapshots, decides, appends, and runs placed jobs as local
    processes with CUDA_VISIBLE_DEVICES set to their GPUs."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    log = logging.getLogger("gpuledger.up")
    clock = SystemClock()
    ledger = ctx.ledger(live=True)
    _register_nodes(ctx, nodes)
    executor = LocalExecutor(ctx.home / "jobs", grace_s=parse_duration(grace))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    relay_thread, source = _transport(ctx.home, kafka, stop, log)
    deadline = None if run_for is None else clock.now() + parse_duration(run_for)
    tick = parse_duration(interval) or 1
    with Store.open(ctx.home) as store:
        dispatcher = Dispatcher(
            ledger,
            ProjectionRanks(Projector(store, source)),
            _policy(policy, margin, debug_lane),
            executor,
        )
        _recover(ledger, executor, log)
        log.info("up: %s, %d nodes, policy %s", ctx.home, len(ledger.state.nodes), policy)
        try:
            while not stop.is_set():
                now = clock.now()
                result = dispatcher.cycle(now)
                if until_idle and _idle(ledger):
                    log.info("nothing pending or running: exiting")
                    break
                if deadline is not None and now >= deadline:
                    break
                wake = result.decision.wake_at
                wait = tick if wake is None else max(0.05, min(tick, wake - clock.now()))
                stop.wait(wait)
        finally:
            exits = executor.shutdown(clock.now())
            for ex in exits:
                try:
                    ledger.execute(
                        c.FinishJob(actor=EXECUTOR, job_id=ex.job_id, exit_code=ex.exit_code)
                    )
                except LedgerError as err:
                    log.info("exit of job %s not recorded: %s", ex.job_id, err.line())
            stop.set()
            if relay_thread is not None:
                relay_thread.join(timeout=10)
            source.close()
            ledger.snapshot_state()  # a clean stop: the next start folds no tail


def _idle(ledger: Any) -> bool:
    return not any(j.active for j in ledger.state.jobs.values())


def _register_nodes(ctx: Ctx, nodes: tuple[str, ...]) -> None:
    ledger = ctx.ledger(live=True)
    cmds: list[c.AnyCommand] = []
    for text in nodes:
        name, gpus, gpu_type = _node_spec(text)
        have = ledger.state.nodes.get(name)
        if have is None or have.state == "removed":
            cmds.append(c.RegisterNode(actor=ctx.actor, node=name, gpus=gpus, gpu_type=gpu_type))
    if cmds:
        ledger.execute_all(cmds)


def _recover(ledger: Any, executor: LocalExecutor, log: logging.Logger) -> None:
    """Jobs the ledger says run here but no process runs (the service stopped uncleanly): they
    ended when it stopped. Record that, so their GPUs are free again."""
    lost = [j.job_id for j in ledger.state.jobs.values() if j.status in ("placed", "running")]
    for job_id in sorted(set(lost) - executor.running()):
        log.warning("job %s has no process after a restart: recording it as failed", job_id)
        ledger.execute(c.FinishJob(actor=EXECUTOR, job_id=job_id, exit_code=-1))


def _transport(
    home: Path, kafka: str | None, stop: threading.Event, log: logging.Logger
) -> tuple[threading.Thread | None, EventSource]:
    """Embedded: the projection reads the store. Kafka: a relay thread publishes the store and
    the projection consumes the topic (GPULEDGER_KAFKA_TOPIC and GPULEDGER_KAFKA_TRANSACTIONAL_ID
    override the topic and the relay's transactional id)."""
    if kafka is None:
        return None, EmbeddedSource(home)
    from ledger.relay import DEFAULT_TRANSACTIONAL_ID, TOPIC, Relay, open_store
    from projections.kafka_source import KafkaSource

    logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.root.level))  # chatty at INFO
    topic = os.environ.get("GPULEDGER_KAFKA_TOPIC") or TOPIC
    txn_id = os.environ.get("GPULEDGER_KAFKA_TRANSACTIONAL_ID") or DEFAULT_TRANSACTIONAL_ID
    relay = Relay(open_store(home), kafka, topic=topic, transactional_id=txn_id)

    def run() -> None:
        try:
            relay.run(stop, on_error=lambda e: log.warning("relay: %s", e))
        except LedgerError as err:
            log.error("relay stopped: %s", err.line())
            stop.set()
        finally:
            relay.close()

    thread = threading.Thread(target=run, name="relay", daemon=True)
    thread.start()
    return thread, _Relayed(KafkaSource(kafka, topic), EmbeddedSource(home), log)


class _Relayed:
    """The topic as the projection's source in `up --kafka`. Its head waits (up to `wait_s`)
    until the relay has published the store's head, so the dispatcher ranks at exactly its
    snapshot's position, as on the embedded default. When Kafka lags longer or is away, it goes
    on with the projection as far as the topic has it, and says so: placements stay safe (the
    ledger checks them against its own state); only the fair-share order may lag behind."""

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


COMMANDS = [up]
