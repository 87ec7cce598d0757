"""Fixtures for tests against a real Apache Kafka broker.

- `kafka_bootstrap`: the shared broker from ``GPULEDGER_KAFKA`` (``scripts/test`` starts one and
  exports it). Missing or unreachable is an error of every test that asks for it, never a skip.
- `kafka_topic` / `transactional_id`: fresh names per test, so tests never see each other's
  records or fence each other's producers. The topic is deleted afterwards.
- `own_broker`: a second, private broker for fault tests that stop and restart it, with its
  own data dir under tmp_path and free ports. It never touches the shared broker.
- `read_topic`: every record of a topic from offset 0, read_committed by default.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import subprocess
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from tests.integration.ports import free_port

KAFKA_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kafka" / "kafka"
TIMEOUT_S = 60.0


def pytest_configure(config: pytest.Config) -> None:
    """A socket to the shared broker left for the garbage collector is kafka-python's (every
    client the code and these tests make is closed, in a `finally` or a teardown, and the
    reachability probes close theirs); its ResourceWarning would fail whichever test the
    collector happens to run in, far from the test that made it. Seen once under load (a
    connected socket to the broker, collected in the dashboard's fixture; not reproduced in 25
    rounds of the audit's Kafka test with the collector paused). Only that warning, only for the
    broker's port: every other warning stays an error (pyproject's `filterwarnings`)."""
    # a socket that never connected (no peer: its connect() was refused) is one kafka-python
    # leaves for the collector while a broker is down (kafka/net/inet.py, see test_relay); it
    # holds nothing, and the collector may find it in any later test
    config.addinivalue_line("filterwarnings", f"ignore:{NEVER_CONNECTED}:ResourceWarning")
    bootstrap = os.environ.get("GPULEDGER_KAFKA", "")
    for server in (s.strip() for s in bootstrap.split(",") if s.strip()):
        port = server.rpartition(":")[2]
        if port.isdigit():
            config.addinivalue_line(
                "filterwarnings",
                rf"ignore:unclosed <socket\.socket .*raddr=\('[^']*', {port}\)>:ResourceWarning",
            )


NEVER_CONNECTED = (
    r"unclosed <socket\.socket fd=\d+, family=\d+, type=\d+, proto=\d+, laddr=\('[^']*', \d+\)>"
)
"""The warning of a socket with no peer (no `raddr`): its connect() never succeeded."""


def check_reachable(bootstrap: str) -> str | None:
    """None when some `host:port` of `bootstrap` accepts a TCP connection, else the reasons."""
    problems = []
    for server in (s.strip() for s in bootstrap.split(",") if s.strip()):
        host, _, port = server.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
                return None
        except (OSError, ValueError) as exc:
            problems.append(f"{server}: {exc}")
    return "; ".join(problems) or "no host:port given"


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """``$GPULEDGER_KAFKA`` once a TCP connect to it works; the test fails otherwise."""
    bootstrap = os.environ.get("GPULEDGER_KAFKA", "").strip()
    if not bootstrap:
        pytest.fail(
            "GPULEDGER_KAFKA is not set; run the suite with scripts/test, or start a broker with "
            "`export GPULEDGER_KAFKA=$(scripts/kafka/kafka up)`",
            pytrace=False,
        )
    problem = check_reachable(bootstrap)
    if problem:
        pytest.fail(
            f"Kafka broker GPULEDGER_KAFKA={bootstrap!r} is unreachable ({problem}); "
            "is `scripts/kafka/kafka up` running?",
            pytrace=False,
        )
    return bootstrap


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Best-effort cleanup: a test's topic is housekeeping, not part of its result."""
    with contextlib.suppress(Exception):
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="gpuledger-test-cleanup")
        try:
            existing = set(admin.list_topics())
            gone = [t for t in topics if t in existing]
            if gone:
                admin.delete_topics(gone, timeout_ms=int(TIMEOUT_S * 1000))
        finally:
            admin.close()


@pytest.fixture
def kafka_topic(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A topic name no other test uses; the topic (if created) is deleted after the test."""
    topic = unique_name(f"test-{request.node.name[:40]}".replace("[", "-").replace("]", ""))
    topic = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in topic)
    yield topic
    delete_topics(kafka_bootstrap, [topic])


@pytest.fixture
def transactional_id() -> str:
    """A transactional id no other test uses (a shared one would fence other tests)."""
    return unique_name("test-relay")


# --- reading a topic ------------------------------------------------------------------------------


def read_all(
    bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout_s: float = TIMEOUT_S
) -> list[Any]:
    """Every record of partition 0 from its first offset (0 unless records were deleted) up to
    the end offset at call time."""
    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level=isolation,
        client_id="gpuledger-test-reader",
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=32 << 20,
    )
    records: list[Any] = []
    try:
        consumer.assign([tp])
        end = consumer.end_offsets([tp], timeout_ms=int(timeout_s * 1000))[tp]
        # below the first offset the client would jump to the end (its reset is "latest")
        consumer.seek(tp, consumer.beginning_offsets([tp], timeout_ms=int(timeout_s * 1000))[tp])
        deadline = time.monotonic() + timeout_s
        while consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: read {len(records)} records, end offset {end}")
            records.extend(r for r in consumer.poll(timeout_ms=500).get(tp, []) if r.offset < end)
    finally:
        consumer.close()
    return records


@pytest.fixture
def read_topic(kafka_bootstrap: str) -> Callable[..., list[Any]]:
    """`read_topic(topic, isolation="read_committed", bootstrap=...)`: see `read_all`."""

    def read(topic: str, isolation: str = "read_committed", bootstrap: str = "") -> list[Any]:
        return read_all(bootstrap or kafka_bootstrap, topic, isolation=isolation)

    return read


# --- a private broker -----------------------------------------------------------------------------


@dataclass
class Broker:
    """A broker run by `scripts/kafka/kafka` on its own data dir and ports."""

    data: Path
    port: int
    controller_port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _kafka(self, command: str) -> str:
        env = dict(
            os.environ,
            GPULEDGER_KAFKA_DATA=str(self.data),
            GPULEDGER_KAFKA_PORT=str(self.port),
            GPULEDGER_KAFKA_CONTROLLER_PORT=str(self.controller_port),
        )
        done = subprocess.run(
            [str(KAFKA_SCRIPT), command], env=env, capture_output=True, text=True, timeout=180
        )
        if done.returncode != 0:
            pytest.fail(
                f"scripts/kafka/kafka {command} failed ({done.returncode}):\n{done.stderr}",
                pytrace=False,
            )
        return done.stdout.strip()

    def up(self) -> str:
        """Start (or restart) the broker; returns once it accepts connections."""
        return self._kafka("up")

    def down(self) -> None:
        """SIGTERM the broker by its pid (SIGKILL after the script's grace period)."""
        self._kafka("down")


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Broker]:
    """A private single-node broker, stopped after the test whatever happens."""
    port = free_port()
    controller_port = free_port()
    while controller_port == port:
        controller_port = free_port()
    broker = Broker(tmp_path / "kafka", port, controller_port)
    try:
        broker.up()
        yield broker
    finally:
        broker.down()
        # kafka-python's sockets to this broker that nothing closed (see `pytest_configure`)
        # are collected here, where their warning is known to be this broker's, not in a
        # later test (one failed CI in test_relay's next test)
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", rf"unclosed <socket\.socket .*raddr=\('[^']*', {port}\)>", ResourceWarning
            )
            gc.collect()


# --- PostgreSQL: the outage tests' pair ---------------------------------------------------------


@pytest.fixture(scope="session")
def pg_outage_pair() -> Iterator[Any]:
    """One primary with its synchronous standby, on free ports in a directory of its own, for
    every test_pg_outage_*.py test this worker runs (its outage groups, `PG_OUTAGE_GROUPS` in
    `tests/conftest.py`: another worker's group has a pair of its own), each on a fresh database
    of it (`pgoutkit.pg_pair`): starting a pair took 7-25 s per test."""
    from tests.integration.test_pg_failover import own_pair

    with own_pair() as pg:
        yield pg
