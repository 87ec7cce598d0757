"""The relay against a real Kafka broker: the topic is an exact copy of the event store.

"Exact" is asserted the same way everywhere (`assert_topic_equals_store`): the read_committed
records carry positions 1..N with nothing missing or repeated, and every record's key, headers
and value bytes equal the store's notification at that position.

Every test uses its own topic and transactional id. The broker-restart test runs its own
broker (`own_broker`) so the shared one is never stopped.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from ledger.store.application import STREAM_ID, Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.relay import (
    Relay,
    RelayError,
    RelayFenced,
    ensure_topic,
    last_published,
    open_store,
)
from ledger.store.relay_topic import TopicRefused
from projections.kafka_wire import POSITION_HEADER, TAG_HEADER, parse_keys
from schemas import commands as c
from tests.integration.waits import wait_for

pytestmark = pytest.mark.kafka

ReadTopic = Callable[..., list[Any]]

REPO = Path(__file__).resolve().parents[2]
ALICE_JOB = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=0, duration_s=60)


# --- helpers ----------------------------------------------------------------------------------


def submit(ledger: Ledger, n: int, per_batch: int = 1_000) -> None:
    """Append `n` JobSubmitted events in batches (one event per command)."""
    while n > 0:
        k = min(n, per_batch)
        ledger.execute_all([ALICE_JOB] * k)
        n -= k


def stored(home: Path) -> list[tuple[int, str, bytes, str]]:
    """(position, tag, bytes, key) of every stored event, straight from the recorder."""
    recorder = open_store(home)
    return [
        (n.id, n.topic, n.state, str(n.originator_id))
        for n in recorder.select_notifications(start=1, limit=10_000_000)
    ]


def head(home: Path) -> int:
    return int(open_store(home).max_notification_id() or 0)


def positions(records: list[Any]) -> list[int]:
    return [int(dict(r.headers)[POSITION_HEADER]) for r in records]


def assert_topic_equals_store(records: list[Any], home: Path) -> None:
    want = stored(home)
    assert positions(records) == list(range(1, len(want) + 1))
    for rec, (pos, tag, data, key) in zip(records, want, strict=True):
        headers = dict(rec.headers)
        assert (rec.partition, rec.key, headers[TAG_HEADER], rec.value) == (
            0,
            key.encode(),
            tag.encode(),
            data,
        ), f"position {pos}"


def new_relay(home: Path, bootstrap: str, topic: str, tid: str, **kw: Any) -> Relay:
    return Relay(open_store(home), bootstrap, topic=topic, transactional_id=tid, **kw)


class Worker(threading.Thread):
    """A thread whose exception is re-raised by `result()` (pytest would only warn about it)."""

    def __init__(self, target: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._target_fn = target
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._target_fn()
        except BaseException as e:
            self.error = e

    def result(self, timeout: float = 60.0) -> BaseException | None:
        self.join(timeout)
        assert not self.is_alive(), "worker thread did not stop"
        return self.error


def make_ledger(home: Path, *, seed: int, t0: float, jobs: int) -> Ledger:
    """A ledger where alice may submit, then `jobs` submissions."""
    ledger = Ledger(home, SimClock(t0), seeded_ids(seed))
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=3),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )
    submit(ledger, jobs, per_batch=5_000)
    return ledger


@pytest.fixture
def small(org_ledger: Ledger) -> Ledger:
    """The shared organisation (every kind of set-up event) plus 50 submissions."""
    submit(org_ledger, 50, per_batch=10)
    return org_ledger


BACKLOG = 30_000


@pytest.fixture(scope="module")
def backlog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A store of about 30,000 events, read-only: relays only read it, so tests share it."""
    ledger = make_ledger(tmp_path_factory.mktemp("backlog"), seed=7, t0=1_000.0, jobs=BACKLOG)
    ledger.close()
    yield ledger.home


# --- 1. topic and records ---------------------------------------------------------------------


def test_topic_is_created_explicitly_with_one_partition_and_unlimited_retention(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    ensure_topic(kafka_bootstrap, kafka_topic)
    ensure_topic(kafka_bootstrap, kafka_topic)  # a second call accepts the topic it made

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="test-relay")
    try:
        (described,) = admin.describe_topics([kafka_topic])
        keys = ["retention.ms", "retention.bytes", "cleanup.policy"]
        configs = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, kafka_topic, keys)], config_filter="all"
        )["topic"][kafka_topic]
    finally:
        admin.close()
    assert len(described["partitions"]) == 1
    assert {k: configs[k]["value"] for k in keys} == {
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "cleanup.policy": "delete",
    }


@pytest.mark.parametrize(
    ("partitions", "configs", "want_message"),
    [
        pytest.param(
            3,
            {},
            "has 3 partitions; the relay needs exactly 1 to keep order",
            id="three partitions would lose the order",
        ),
        pytest.param(
            1,
            {"retention.ms": "604800000"},
            "has retention.ms=604800000: it would not keep every event",
            id="seven-day retention would forget events",
        ),
        pytest.param(
            1,
            {"retention.ms": "-1", "cleanup.policy": "compact"},
            "has cleanup.policy=compact: it would not keep every event",
            id="compaction would keep only the last event of the stream",
        ),
    ],
)
def test_an_existing_topic_of_the_wrong_shape_is_refused(
    kafka_bootstrap: str,
    kafka_topic: str,
    partitions: int,
    configs: dict[str, str],
    want_message: str,
) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="test-relay")
    try:
        admin.create_topics(
            {
                kafka_topic: {
                    "num_partitions": partitions,
                    "replication_factor": 1,
                    "configs": configs,
                }
            },
            wait_for_metadata=True,
        )
    finally:
        admin.close()
    with pytest.raises(RelayError) as err:
        ensure_topic(kafka_bootstrap, kafka_topic)
    # not retried (no RelayUnavailable): the settings' refusal is a TopicRefused, which a
    # service's stopped relay waits on until the topic is deleted or made again (atk51-25 F6)
    assert type(err.value) in (RelayError, TopicRefused)
    assert err.value.message == f"topic {kafka_topic} {want_message}"


def test_relay_publishes_every_event_with_position_tag_key_and_wall_clock_timestamp(
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    small: Ledger,
    read_topic: ReadTopic,
) -> None:
    relay = new_relay(small.home, kafka_bootstrap, kafka_topic, transactional_id)
    try:
        producer = relay.producer.config
        assert (producer["transactional_id"], producer["enable_idempotence"]) == (
            transactional_id,
            True,
        )
        assert producer["acks"] in ("all", -1)
        assert relay.position == 0
        before_ms = time.time() * 1000
        assert relay.publish_pending() == small.position
        after_ms = time.time() * 1000
        assert relay.position == small.position
        assert relay.publish_pending() == 0
    finally:
        relay.close()

    records = read_topic(kafka_topic)
    assert_topic_equals_store(records, small.home)
    assert {r.key for r in records} == {str(STREAM_ID).encode()}
    # The record timestamp is when it was published; the event time (the test's virtual
    # clock, 1970) stays in the payload.
    assert all(before_ms - 1 <= r.timestamp <= after_ms + 1 for r in records)
    assert {msgspec.json.decode(r.value)["at"] for r in records} == {1_000.0}
    assert last_published(kafka_bootstrap, kafka_topic) == small.position


def test_new_relays_resume_after_the_last_committed_record(
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    small: Ledger,
    read_topic: ReadTopic,
) -> None:
    """Restarts with new events, without new events, and without closing the old relay."""
    n = small.position
    published: list[int] = []
    for step, new_events in enumerate([0, 7, 0, 1, 1_234]):
        submit(small, new_events, per_batch=500)
        relay = new_relay(small.home, kafka_bootstrap, kafka_topic, transactional_id, batch=100)
        assert relay.position == (published[-1] if published else 0), f"restart {step}"
        relay.publish_pending()
        published.append(relay.position)
        if step % 2 == 0:
            relay.close()  # odd steps leave it open, like a crash; the next relay fences it
    assert published == [n, n + 7, n + 7, n + 8, n + 1_242]
    assert_topic_equals_store(read_topic(kafka_topic), small.home)


def test_a_topic_from_another_ledger_is_refused(
    kafka_bootstrap: str, kafka_topic: str, transactional_id: str, small: Ledger, tmp_path: Path
) -> None:
    """Another ledger's topic is refused. A topic that holds, after our last record, events
    signed with our key that the store lacks (a store replaced by an older copy) is refused
    too; without signing nothing tells them from forged records, which a relay skips
    (tests/integration/security/test_security_kafka.py)."""
    keys = parse_keys("k1:shared-secret")
    relay = new_relay(small.home, kafka_bootstrap, kafka_topic, transactional_id, keys=keys)
    n = relay.publish_pending()
    relay.close()

    shorter = make_ledger(tmp_path / "shorter", seed=1, t0=1_000.0, jobs=0)
    with pytest.raises(RelayError) as ahead:
        new_relay(shorter.home, kafka_bootstrap, kafka_topic, transactional_id, keys=keys)
    assert ahead.value.message == (
        f"topic {kafka_topic} is ahead of the store: it has position {n} signed with our key, "
        f"the store ends at {shorter.position}"
    )
    assert 0 < int(str(ahead.value.fields["published"])) <= shorter.position  # ours, on it

    other = make_ledger(tmp_path / "other", seed=2, t0=2_000.0, jobs=n)  # other ids and times
    with pytest.raises(RelayError) as differs:
        new_relay(other.home, kafka_bootstrap, kafka_topic, transactional_id)
    assert differs.value.message == f"topic {kafka_topic} differs from the store at position {n}"


# --- 2. fencing and crashes ---------------------------------------------------------------------


def test_a_second_relay_fences_the_first(
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    small: Ledger,
    read_topic: ReadTopic,
) -> None:
    n = small.position
    first = new_relay(small.home, kafka_bootstrap, kafka_topic, transactional_id)
    assert first.publish_pending() == n
    submit(small, 5)
    second = new_relay(small.home, kafka_bootstrap, kafka_topic, transactional_id)
    assert second.position == n

    with pytest.raises(RelayFenced) as fenced:
        first.publish_pending()
    assert fenced.value.message == (
        f"relay fenced after position {n}: another relay with transactional id "
        f"{transactional_id!r} took over"
    )
    assert second.publish_pending() == 5

    # A relay running in a loop stops (raises) when fenced instead of reconnecting, which
    # would fence the newcomer in turn.
    stop = threading.Event()
    loop = Worker(lambda: second.run(stop, interval_s=0.01))
    loop.start()
    third = new_relay(small.home, kafka_bootstrap, kafka_topic, transactional_id)
    assert third.position == n + 5
    submit(small, 3)
    error = loop.result(timeout=30)
    stop.set()
    assert isinstance(error, RelayFenced)
    assert third.publish_pending() == 3
    for relay in (first, second, third):
        relay.close()
    assert_topic_equals_store(read_topic(kafka_topic), small.home)


CHILD = """
import sys, time
from pathlib import Path
from ledger.store.relay import Relay, open_store

home, bootstrap, topic, tid, batch, hold_at = sys.argv[1:]
store = open_store(Path(home))
relay = Relay(store, bootstrap, topic=topic, transactional_id=tid, batch=int(batch))
if hold_at != "0":
    # Stop in the middle of a transaction, with part of the batch already on the broker.
    send = relay.producer.send
    def send_then_hold(topic, **kw):
        future = send(topic, **kw)
        if dict(kw["headers"])["gpuledger.position"] == hold_at.encode():
            relay.producer.flush()
            print("holding", flush=True)
            time.sleep(3600)
        return future
    relay.producer.send = send_then_hold
print("publishing", relay.position, flush=True)
relay.publish_pending()
print("done", relay.position, flush=True)
"""


def start_child(home: Path, bootstrap: str, topic: str, tid: str, batch: int, hold_at: int) -> Any:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    args = [str(home), bootstrap, topic, tid, str(batch), str(hold_at)]
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )


def test_a_relay_killed_mid_transaction_leaves_only_committed_batches(
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    backlog: Path,
    read_topic: ReadTopic,
) -> None:
    total = head(backlog)
    batch, hold_at = 2_000, 5_000  # two batches committed, the third half sent
    child = start_child(backlog, kafka_bootstrap, kafka_topic, transactional_id, batch, hold_at)
    try:
        assert child.stdout.readline() == "publishing 0\n"
        assert child.stdout.readline() == "holding\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        child.stdout.close()

    assert positions(read_topic(kafka_topic)) == list(range(1, 4_001))
    # The half batch is on the broker, in a transaction nobody will commit.
    assert positions(read_topic(kafka_topic, "read_uncommitted"))[4_000:] == list(
        range(4_001, 5_001)
    )

    relay = new_relay(backlog, kafka_bootstrap, kafka_topic, transactional_id, batch=batch)
    assert relay.position == 4_000
    assert relay.publish_pending() == total - 4_000
    relay.close()
    assert_topic_equals_store(read_topic(kafka_topic), backlog)
    # read_uncommitted still shows the aborted half batch: consumers must read committed.
    raw = positions(read_topic(kafka_topic, "read_uncommitted"))
    assert len(raw) == total + 1_000


def test_a_relay_killed_at_any_moment_is_completed_by_the_next(
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    backlog: Path,
    read_topic: ReadTopic,
) -> None:
    total = head(backlog)
    batch = 1_000
    child = start_child(backlog, kafka_bootstrap, kafka_topic, transactional_id, batch, 0)
    try:
        assert child.stdout.readline() == "publishing 0\n"
        wait_for("a first commit", lambda: last_published(kafka_bootstrap, kafka_topic) > 0)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        child.stdout.close()

    committed = positions(read_topic(kafka_topic))
    assert committed == list(range(1, len(committed) + 1))
    assert len(committed) % batch == 0 or len(committed) == total

    relay = new_relay(backlog, kafka_bootstrap, kafka_topic, transactional_id, batch=batch)
    assert relay.position == len(committed)
    relay.publish_pending()
    relay.close()
    assert_topic_equals_store(read_topic(kafka_topic), backlog)


# --- 3. the broker goes away and comes back -----------------------------------------------------


# kafka-python 3.0.12 does not close a socket whose connect() was refused (kafka/net/inet.py,
# KafkaNetSocket.sock_connect); while the broker is down the producer leaks one per attempt until
# the garbage collector closes it. Harmless, but a ResourceWarning.
@pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")
def test_broker_restart_while_commands_arrive_loses_and_repeats_nothing(
    own_broker: Any,
    kafka_topic: str,
    transactional_id: str,
    small: Ledger,
    read_topic: ReadTopic,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Captured kafka-python log records would keep the leaked sockets alive past the test.
    caplog.set_level(logging.CRITICAL, logger="kafka")
    relay_at_down, store_at_down, store_at_up = restart_under_load(
        own_broker, kafka_topic, transactional_id, small
    )
    gc.collect()  # close the leaked sockets while the filter above is active

    assert store_at_up > store_at_down, "no command arrived while the broker was down"
    assert small.position > relay_at_down + 200
    records = read_topic(kafka_topic, bootstrap=own_broker.bootstrap)
    assert_topic_equals_store(records, small.home)


def restart_under_load(broker: Any, topic: str, tid: str, ledger: Ledger) -> tuple[int, int, int]:
    """Append submissions and relay them while the broker restarts; stop once the relay caught
    up. Returns the relay's position once the broker is down, and the store's positions when
    the broker went down and when it was started again.

    Depending on where the outage hits, the relay either waits it out inside a commit or times
    out (timeout_s=3 < the ~5-10 s outage), reports the error and reconnects; both must end
    with the same topic."""
    relay = new_relay(ledger.home, broker.bootstrap, topic, tid, batch=500, timeout_s=3)
    stop_writing, stop_relay = threading.Event(), threading.Event()

    def write() -> None:
        while not stop_writing.is_set():
            ledger.execute(ALICE_JOB)
            time.sleep(0.001)

    writer = Worker(write)
    loop = Worker(lambda: relay.run(stop_relay, interval_s=0.02))
    writer.start()
    loop.start()
    try:
        try:
            wait_for("a first publish", lambda: relay.position > 100)
            store_at_down = ledger.position
            broker.down()  # SIGTERM: a clean stop, so it restarts in a few seconds
            relay_at_down = relay.position  # nothing can commit from here until `up`
            time.sleep(1)
            store_at_up = ledger.position
            broker.up()
            wait_for("publishing after the restart", lambda: relay.position > store_at_up)
        finally:
            stop_writing.set()
            assert writer.result() is None
        wait_for("the relay catching up", lambda: relay.position == ledger.position)
    finally:
        stop_relay.set()
        assert loop.result() is None
        relay.close()
    return relay_at_down, store_at_down, store_at_up
