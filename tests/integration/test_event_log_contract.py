"""One contract for every event log a projector reads, run against each backend.

`EventLogContract` states what a sink (the ledger appending, plus whatever publishes its log) and
a source (`EventSource`) promise together; each subclass plugs in one backend:

- `TestEmbeddedLog`: the ledger's SQLite store read by `EmbeddedSource` (the embedded default);
- `TestKafkaLog`: the same store published by the relay to a real Kafka topic and read back by
  `KafkaSource`. The relay commits small transactions and another transactional producer aborts
  junk records in between, so offsets drift far from positions (markers, aborted batches).

The contract: positions 1..N in order, no gap, no duplicate; tag and bytes identical to the store;
`read(after, limit)` returns exactly the next `limit` records after `after`, from any `after`, in
any order of calls; `head()` is the last position and follows the log; a new source (a restart)
resumes after any position; a projection fed by the source equals one fed by the store.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.embedded import EmbeddedSource
from ledger.store.relay import Relay, open_store
from projections.kafka_source import KafkaSource
from projections.projector import Projector
from projections.source import EventSource, LogRecord
from projections.store import Store
from projections.testing import compare as audit
from schemas import commands as c

SEED = 20261130


def org(ledger: Ledger) -> None:
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=3),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )


def submissions(n: int) -> list[c.AnyCommand]:
    return [
        c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1 + i % 4, duration_s=60.0 + i)
        for i in range(n)
    ]


def stored(home: Path) -> list[LogRecord]:
    """Every event of the store as (position, tag, bytes), straight from its table."""
    con = sqlite3.connect(f"file:{home / 'events.sqlite'}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT rowid, topic, state FROM stored_events ORDER BY rowid")
        return [LogRecord(int(p), str(t), bytes(d)) for p, t, d in rows]
    finally:
        con.close()


def read_all(source: EventSource, after: int = 0, page: int = 97) -> list[LogRecord]:
    out: list[LogRecord] = []
    while True:
        got = source.read(after, page)
        if not got:
            return out
        out += got
        after = got[-1].position


class LogUnderTest:
    """A ledger (the sink's input) and a way to make what it appended readable."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.ledger = Ledger(home, SimClock(1_000.0), seeded_ids(1))
        self.opened: list[EventSource] = []

    def append(self, commands: list[c.AnyCommand]) -> None:
        self.ledger.execute_all(commands)
        self.publish()

    def publish(self) -> None:
        """Make everything appended so far readable through new and existing sources."""

    def new_source(self) -> EventSource:
        raise NotImplementedError

    def source(self) -> EventSource:
        src = self.new_source()
        self.opened.append(src)
        return src

    def close(self) -> None:
        for src in self.opened:
            src.close()
        self.ledger.close()


def caught_up(projector: Projector, head: int, timeout_s: float = 15.0) -> tuple[int, int]:
    """Catch up until `head` is applied: a Kafka transaction's commit markers reach the partition
    shortly after `commit_transaction` returns, so a read_committed reader sees it a moment later.
    Returns (events applied in all, final position)."""
    deadline = time.monotonic() + timeout_s
    applied = 0
    while True:
        result = projector.catch_up()
        applied += result.applied
        if result.position >= head or time.monotonic() > deadline:
            return applied, result.position
        time.sleep(0.05)


class EventLogContract:
    """The contract. Subclasses provide the `log` fixture."""

    @pytest.fixture
    def log(self, tmp_path: Path) -> Iterator[LogUnderTest]:
        raise NotImplementedError

    def test_an_empty_log_has_head_zero_and_nothing_to_read(self, log: LogUnderTest) -> None:
        src = log.source()
        assert src.head() == 0
        assert src.read(0, 10) == []

    def test_records_come_back_in_log_order_with_the_stored_bytes(self, log: LogUnderTest) -> None:
        org(log.ledger)
        for n in (1, 250, 7, 120):
            log.append(submissions(n))
        log.publish()
        got = read_all(log.source())
        want = stored(log.home)
        assert [r.position for r in got] == list(range(1, len(want) + 1))
        assert got == want

    def test_read_returns_exactly_the_records_after_a_position_up_to_the_limit(
        self, log: LogUnderTest
    ) -> None:
        org(log.ledger)
        log.append(submissions(300))
        want = stored(log.home)
        n = len(want)
        rng = random.Random(SEED)
        edges = [(0, 1), (0, n + 50), (n - 1, 10), (n, 10), (1, 1), (n // 2, n), (5, 0)]
        calls = edges + [(rng.randint(0, n), rng.randint(1, 60)) for _ in range(40)]
        # sequential pages too: each call continues where the last one ended
        after = 0
        while after < n:
            calls.append((after, 23))
            after += 23
        src = log.source()
        for after, limit in calls:
            assert src.read(after, limit) == want[after : after + limit], (after, limit)

    def test_head_is_the_last_position_and_moves_with_the_log(self, log: LogUnderTest) -> None:
        src = log.source()
        org(log.ledger)
        log.publish()
        assert src.head() == log.ledger.position == len(stored(log.home)) > 0
        for n in (1, 40, 3):
            log.append(submissions(n))
            assert src.head() == log.ledger.position == len(stored(log.home))

    def test_a_new_source_resumes_after_any_position(self, log: LogUnderTest) -> None:
        org(log.ledger)
        log.append(submissions(200))
        want = stored(log.home)
        first = log.source()
        assert read_all(first, page=50) == want
        for after in (0, 1, 5, 99, 100, 204, 205):
            restarted = log.source()
            assert restarted.head() == len(want)
            assert restarted.read(after, 40) == want[after : after + 40], after
            assert read_all(restarted, after) == want[after:], after
        log.append(submissions(10))
        assert read_all(first, len(want)) == stored(log.home)[len(want) :]

    def test_reading_while_the_log_grows_never_skips_or_repeats(self, log: LogUnderTest) -> None:
        rng = random.Random(SEED + 1)
        org(log.ledger)
        log.publish()
        src = log.source()
        got: list[LogRecord] = []
        for _ in range(8):
            log.append(submissions(rng.randint(1, 80)))
            got += read_all(src, got[-1].position if got else 0, page=16)
            assert [r.position for r in got] == list(range(1, len(got) + 1))
        assert got == stored(log.home)

    def test_a_projection_fed_by_the_source_equals_one_fed_by_the_store(
        self, log: LogUnderTest
    ) -> None:
        org(log.ledger)
        log.append(submissions(150))
        with (
            Store(":memory:") as fed,
            Store(":memory:") as reference,
            EmbeddedSource(log.home) as embedded,
        ):
            projector = Projector(fed, log.source(), batch_size=64)
            assert caught_up(projector, log.ledger.position)[1] == log.ledger.position
            log.append(submissions(33))
            assert caught_up(projector, log.ledger.position) == (33, log.ledger.position)
            Projector(reference, embedded).catch_up()
            assert audit.dump(fed) == audit.dump(reference)


class TestEmbeddedLog(EventLogContract):
    @pytest.fixture
    def log(self, tmp_path: Path) -> Iterator[LogUnderTest]:
        log = EmbeddedLog(tmp_path / "home")
        yield log
        log.close()


class EmbeddedLog(LogUnderTest):
    def new_source(self) -> EventSource:
        return EmbeddedSource(self.home)


@pytest.mark.kafka
class TestKafkaLog(EventLogContract):
    @pytest.fixture
    def log(
        self, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str, transactional_id: str
    ) -> Iterator[LogUnderTest]:
        log = KafkaLog(tmp_path / "home", kafka_bootstrap, kafka_topic, transactional_id)
        yield log
        log.close()

    def test_offsets_are_not_positions(self, log: LogUnderTest) -> None:
        """The drift the other tests run with: markers and aborted junk take offsets."""
        assert isinstance(log, KafkaLog)
        org(log.ledger)
        log.publish()
        for _ in range(3):
            log.append(submissions(40))
        src = log.source()
        assert isinstance(src, KafkaSource)
        records = src.read(0, 1_000)
        last = src.where(records[-1].position)
        assert last is not None and last.offset > records[-1].position + 20


class KafkaLog(LogUnderTest):
    """The relay publishes in transactions of 37 events; after each publish another producer
    sends 5 junk records and aborts them."""

    def __init__(self, home: Path, bootstrap: str, topic: str, transactional_id: str) -> None:
        super().__init__(home)
        self.bootstrap = bootstrap
        self.topic = topic
        self.relay = Relay(
            open_store(home), bootstrap, topic=topic, transactional_id=transactional_id, batch=37
        )
        self.noise: Any = KafkaProducer(
            bootstrap_servers=bootstrap, transactional_id=transactional_id + "-noise"
        )
        self.noise.init_transactions()

    def publish(self) -> None:
        self.relay.publish_pending()
        self.noise.begin_transaction()
        for i in range(5):
            self.noise.send(self.topic, value=b"junk %d" % i, partition=0)
        self.noise.flush()
        self.noise.abort_transaction()

    def new_source(self) -> EventSource:
        return KafkaSource(self.bootstrap, self.topic)

    def close(self) -> None:
        super().close()
        self.relay.close()
        self.noise.close()
