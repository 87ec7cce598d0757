"""Kafka-fed projections against a real broker: kills, poison records, many readers.

- A follower process (`gpuledger project follow --kafka`) is SIGKILLed at random points, again
  and again; after each kill its projection equals a clean build from the embedded store up to
  the same position, and the last run finishes with the whole log.
- Poison records written on the topic by a raw producer (not JSON, a known tag with fields of the
  wrong type, no / garbled / backwards position header): by default the projector stops right
  before the first one with an error naming topic, partition and offset; with quarantine each
  is recorded in `dead_letters` and everything else is applied.
- `gpuledger up --kafka` (ledger, relay, Kafka-fed projector, dispatcher in one process) and a
  follower in another process with its own data directory build identical tables.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.embedded import EmbeddedSource
from ledger.store.relay import Relay, ensure_topic, open_store
from projections.chain import link as link_to
from projections.errors import CorruptEvent, PoisonRecord
from projections.kafka_source import KafkaSource
from projections.kafka_wire import POSITION_HEADER, TAG_HEADER, envelope
from projections.projector import Projector
from projections.source import ListSource, LogRecord
from projections.store import Store, projection_path, scalar
from projections.testing import compare as audit
from projections.testing.synthetic import Shape, append_to_store, synthetic_events
from schemas import commands as c
from tests.integration.jobwatch import cpu_seconds
from tests.integration.serverkit import workdir

pytestmark = pytest.mark.kafka

GPULEDGER = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"
SEED = 20261130
KEY = b"a57ff0b4-2047-5b44-8936-e3e106b1eb04"
SAME = dict.fromkeys(audit.TABLES, (0, 0))


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    return env | extra


def clean_build(home: Path, path: Path, until: int | None = None) -> Path:
    """A projection of the embedded store at `path`, up to `until`."""
    path.unlink(missing_ok=True)
    with EmbeddedSource(home) as src, Store(path) as store:
        Projector(store, src).catch_up(until=until)
    return path


# --- a follower killed at random points -----------------------------------------------------------

EVENTS = 20_000
KILLS = 5
APPLIED = re.compile(r"applied through position (\d+)")


class Follower:
    """`gpuledger project follow` in a child process; its progress read from stderr."""

    def __init__(self, home: Path, bootstrap: str, topic: str, *args: str) -> None:
        self.positions: list[int] = []
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [
                GPULEDGER,
                "--home",
                str(home),
                "project",
                "follow",
                "--kafka",
                bootstrap,
                "--topic",
                topic,
                "--log-level",
                "DEBUG",
                *args,
            ],
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            m = APPLIED.search(line)
            if m:
                self.positions.append(int(m.group(1)))

    def wait_for(self, done: Any, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not done() and self.proc.poll() is None:
            assert time.monotonic() < deadline, "".join(self.lines[-20:])
            time.sleep(0.002)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=60)
        self._close()

    def _close(self) -> None:
        self._reader.join(timeout=10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def finish(self, timeout: float = 120) -> str:
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        self.proc.wait(timeout=timeout)
        self._close()
        assert self.proc.returncode == 0, "".join(self.lines[-20:])
        return out


@pytest.fixture
def published(
    tmp_path: Path, kafka_bootstrap: str, kafka_topic: str, transactional_id: str
) -> Iterator[Path]:
    """A synthetic store of EVENTS events, relayed to `kafka_topic` in transactions of 700."""
    home = tmp_path / "home"
    append_to_store(home, synthetic_events(EVENTS, seed=SEED, shape=Shape(nodes=32)))
    relay = Relay(
        open_store(home),
        kafka_bootstrap,
        topic=kafka_topic,
        transactional_id=transactional_id,
        batch=700,
    )
    try:
        assert relay.publish_pending() == EVENTS
    finally:
        relay.close()
    yield home


def test_a_follower_killed_at_random_points_resumes_exactly(
    tmp_path: Path, published: Path, kafka_bootstrap: str, kafka_topic: str
) -> None:
    rng = random.Random(SEED)
    other = tmp_path / "other"
    positions = [0]
    for kill in range(KILLS):
        child = Follower(other, kafka_bootstrap, kafka_topic, "--batch-size", "300")
        seen = rng.randint(1, 3)  # committed batches to let through, then a random moment more
        child.wait_for(lambda child=child, seen=seen: len(child.positions) >= seen)
        time.sleep(rng.uniform(0.0, 0.1))
        assert child.proc.poll() is None, f"the follower ended before kill {kill}"
        child.kill()
        with Store.open(other) as store:
            position = store.position()
        assert positions[-1] < position < EVENTS, f"kill {kill}: {positions} then {position}"
        clean = clean_build(published, tmp_path / "clean.duckdb", until=position)
        assert audit.compare_files(projection_path(other), clean) == SAME, f"kill {kill}"
        positions.append(position)
    out = Follower(other, kafka_bootstrap, kafka_topic, "--until", str(EVENTS)).finish()
    assert out == f"position {EVENTS:,}, {EVENTS:,} events, 0 quarantined\n"
    clean = clean_build(published, tmp_path / "clean.duckdb")
    assert audit.compare_files(projection_path(other), clean) == SAME


# --- poison records -------------------------------------------------------------------------------


def relay_like(rec: LogRecord) -> tuple[bytes | None, list[tuple[str, bytes]]]:
    """The value and headers the relay gives a stored event."""
    return rec.data, [(POSITION_HEADER, str(rec.position).encode()), (TAG_HEADER, rec.tag.encode())]


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, Any]]) -> list[int]:
    """Write records with a plain (non-transactional) producer; their offsets."""
    ensure_topic(bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        sent = [
            producer.send(topic, value=value, key=KEY, headers=headers, partition=0)
            for value, headers in records
        ]
        producer.flush(timeout=60)
        return [int(f.get(timeout=60).offset) for f in sent]
    finally:
        producer.close()


@pytest.fixture
def store_home(tmp_path: Path) -> Path:
    """A ledger of 69 events: the organisation (positions 1-9), then 60 submissions."""
    home = tmp_path / "home"
    ledger = Ledger(home, SimClock(1_000.0), seeded_ids(1))
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=3),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )
    ledger.execute_all(
        [
            c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1 + i % 4, duration_s=60.0)
            for i in range(60)
        ]
    )
    ledger.close()
    return home


def stored(home: Path) -> list[LogRecord]:
    with EmbeddedSource(home) as src:
        return src.read(0, 1_000_000)


def wrong_types(rec: LogRecord) -> bytes:
    event = json.loads(rec.data)
    event["gpus"] = "four"
    return json.dumps(event).encode()


def tag_only(rec: LogRecord) -> list[tuple[str, bytes]]:
    return [(TAG_HEADER, rec.tag.encode())]


def with_position(rec: LogRecord, position: bytes) -> list[tuple[str, bytes]]:
    return [(POSITION_HEADER, position), (TAG_HEADER, rec.tag.encode())]


WRONG_TYPE = "event 'job.submitted.v2' is invalid: Expected `int`, got `str` - at `$.gpus`"
NO_LINK = "no readable prev_hash in the value"


def chained(records: list[LogRecord], event: dict[str, Any]) -> bytes:
    """`event` as bytes that link to the last of `records` (as the writer would chain it)."""
    last = records[-1] if records else None
    prev = link_to(last.position, last.tag, last.data) if last else ""
    return json.dumps(event | {"prev_hash": prev}, separators=(",", ":")).encode()


def forged(rec: LogRecord, link: str = "0" * 64) -> bytes:
    """A submission by `mallory` shaped like `rec`, with its own `prev_hash`."""
    event = json.loads(rec.data) | {"actor": "mallory", "user": "mallory", "prev_hash": link}
    return json.dumps(event, separators=(",", ":")).encode()


def teleported(link: str = "feed") -> bytes:
    return json.dumps(
        {"type": "job.teleported.v9", "event_id": "x1", "at": 1.0, "actor": "x", "prev_hash": link}
    ).encode()


def no_match(records: list[LogRecord], position: int, link: str) -> str:
    """The reader's reason for a record at `position` whose prev_hash is `link`."""
    before = records[position - 2]
    want = link_to(before.position, before.tag, before.data)
    shown = f'"{link[:16]}..."' if len(link) > 16 else f'"{link}"'
    return f'prev_hash {shown} does not match position {position - 1} (link "{want[:16]}...")'


# (case id, position K: the records before it are 1..K-1; how to make the poison from the
#  stored records; the error after the topic/partition/offset prefix). Foreign records are
#  inserted right before the real event K (which follows them on the topic); a record that
#  continues the chain but does not validate is appended after the last event (K = 70).
POISON: list[tuple[str, int, Any, Any]] = [
    (
        "bytes that are not JSON claiming the next position",
        20,
        lambda rs: (b"{not json", relay_like(rs[19])[1]),
        lambda rs: ", log position 20: " + NO_LINK,
    ),
    (
        "a forged submission with a wrong prev_hash claiming the next position",
        20,
        lambda rs: (forged(rs[19]), relay_like(rs[19])[1]),
        lambda rs: ", log position 20: " + no_match(rs, 20, "0" * 64),
    ),
    (
        "a record of an unknown tag claiming the next position",
        20,
        lambda rs: (teleported(), [(POSITION_HEADER, b"20"), (TAG_HEADER, b"job.teleported.v9")]),
        lambda rs: ", log position 20: " + no_match(rs, 20, "feed"),
    ),
    (
        "no position header",
        20,
        lambda rs: (rs[19].data, tag_only(rs[19])),
        lambda rs: ": no gpuledger.position header",
    ),
    (
        "a garbled position header",
        20,
        lambda rs: (rs[19].data, with_position(rs[19], b"2O")),
        lambda rs: ": garbled gpuledger.position header b'2O'",
    ),
    (
        "a position that skips ahead",
        20,
        lambda rs: relay_like(rs[24]),
        lambda rs: ", log position 25: position 25 does not follow position 19",
    ),
    (
        "a garbled position header at the tail",
        70,
        lambda rs: (rs[0].data, with_position(rs[0], b"\xff7")),
        lambda rs: ": garbled gpuledger.position header b'\\xff7'",
    ),
    (
        "a chained known tag with fields of the wrong type at the tail",
        70,
        lambda rs: (
            chained(rs, json.loads(wrong_types(rs[19]))),
            [(POSITION_HEADER, b"70"), (TAG_HEADER, b"job.submitted.v2")],
        ),
        lambda rs: ", log position 70: " + WRONG_TYPE,
    ),
]


def poisoned_topic(bootstrap: str, topic: str, records: list[LogRecord], k: int, make: Any) -> int:
    """Publish `records` relay-style with the poison right before K (or after all); its offset."""
    out = [relay_like(r) for r in records]
    out.insert(k - 1, make(records))
    return produce(bootstrap, topic, out)[k - 1]


@pytest.mark.parametrize(
    ("k", "make", "error"), [p[1:] for p in POISON], ids=[p[0] for p in POISON]
)
def test_poison_stops_the_projector_right_before_it_naming_where_it_sits(
    tmp_path: Path,
    store_home: Path,
    kafka_bootstrap: str,
    kafka_topic: str,
    k: int,
    make: Any,
    error: Any,
) -> None:
    records = stored(store_home)
    assert len(records) == 69 and records[19].tag == "job.submitted.v2"
    offset = poisoned_topic(kafka_bootstrap, kafka_topic, records, k, make)
    where = f"topic {kafka_topic}, partition 0, offset {offset}"
    path = tmp_path / "p.duckdb"
    for _run in range(2):  # a rerun stops at the same place
        with Store(path) as store, KafkaSource(kafka_bootstrap, kafka_topic) as src:
            with pytest.raises((CorruptEvent, PoisonRecord)) as err:
                Projector(store, src, batch_size=8).catch_up()
            assert err.value.message == where + error(records)
            assert err.value.fields["offset"] == offset
            assert "--quarantine" in err.value.hint
            assert store.position() == k - 1
    clean = clean_build(store_home, tmp_path / "clean.duckdb", until=k - 1)
    assert audit.compare_files(path, clean) == SAME
    with Store(path) as store:  # nothing foreign was applied
        assert scalar(store.con, "SELECT count(*) FROM events WHERE actor = 'mallory'") == 0


def follow_cli(home: Path, bootstrap: str, topic: str, *args: str) -> list[str]:
    return [
        GPULEDGER,
        "--home",
        str(home),
        "project",
        "follow",
        "--kafka",
        bootstrap,
        "--topic",
        topic,
        "--log-level",
        "WARNING",
        *args,
    ]


@pytest.mark.parametrize(
    ("k", "make", "error", "once"),
    [(*POISON[1][1:], True), (*POISON[3][1:], True), (*POISON[7][1:], False)],
    ids=[f"{POISON[1][0]}, --once", f"{POISON[3][0]}, --once", f"{POISON[7][0]}, following"],
)
def test_follow_stops_at_poison_with_one_line_naming_it(
    tmp_path: Path,
    store_home: Path,
    kafka_bootstrap: str,
    kafka_topic: str,
    k: int,
    make: Any,
    error: Any,
    once: bool,
) -> None:
    """With or without --once (then it must not wait for the poison to go away): exit 1 with
    one line."""
    records = stored(store_home)
    offset = poisoned_topic(kafka_bootstrap, kafka_topic, records, k, make)
    args = ("--once",) if once else ()
    proc = subprocess.run(
        follow_cli(tmp_path / "other", kafka_bootstrap, kafka_topic, *args),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    line = proc.stderr.strip()
    assert "\n" not in line
    assert line.startswith(
        f"error: topic {kafka_topic}, partition 0, offset {offset}{error(records)} ("
    )
    with Store.open(tmp_path / "other") as store:
        assert store.position() == k - 1


def quarantine_topic(
    bootstrap: str, topic: str, records: list[LogRecord]
) -> tuple[list[tuple[bytes | None, Any]], list[tuple[Any, ...]]]:
    """Every kind of poison in one topic, each foreign record before the real event whose
    position it claims (or where it would sit); the records and the dead letters expected."""
    by = {r.position: r for r in records}
    out: list[tuple[bytes | None, Any]] = []
    dead: list[tuple[Any, ...]] = []  # (index in `out`, position, tag, reason, data)

    def foreign(position: int | None, tag: str | None, why: str, rec: tuple[bytes, Any]) -> None:
        dead.append((len(out), position, tag, why, rec[0]))
        out.append(rec)

    for r in records:
        p, tag = r.position, r.tag
        if p == 10:
            foreign(None, tag, "no gpuledger.position header", (r.data, tag_only(r)))
        if p == 20:
            why = "garbled gpuledger.position header b'2O'"
            foreign(None, tag, why, (r.data, with_position(r, b"2O")))
        if p == 30:  # an exact copy of an applied record brings nothing new: passed over
            out.append(relay_like(by[3]))
        if p == 12:
            foreign(12, tag, NO_LINK, (b"{not json", relay_like(r)[1]))
        if p == 25:
            foreign(25, tag, no_match(records, 25, "0" * 64), (forged(r), relay_like(r)[1]))
        if p == 40:
            headers = [(POSITION_HEADER, b"40"), (TAG_HEADER, b"job.teleported.v9")]
            foreign(40, "job.teleported.v9", no_match(records, 40, "feed"), (teleported(), headers))
        if p == 50:
            why = "position 55 does not follow position 49"
            foreign(55, by[55].tag, why, relay_like(by[55]))
        out.append(relay_like(r))
    # the tail: an event that continues the chain but does not validate, then a garbled header
    tail = chained(records, json.loads(wrong_types(by[20])))
    dead.append((len(out), 70, "job.submitted.v2", WRONG_TYPE, tail))
    out.append((tail, [(POSITION_HEADER, b"70"), (TAG_HEADER, b"job.submitted.v2")]))
    dead.append((len(out), None, by[1].tag, "garbled gpuledger.position header b'7 1'", by[1].data))
    out.append((by[1].data, with_position(by[1], b"7 1")))
    offsets = produce(bootstrap, topic, out)
    letters = [(topic, 0, offsets[i], p, t, why, data) for i, p, t, why, data in dead]
    return out, letters


def dead_letters(store: Store) -> list[tuple[Any, ...]]:
    return [
        tuple(row)
        for row in store.con.execute("SELECT * FROM dead_letters ORDER BY kafka_offset").fetchall()
    ]


READ_MODELS = tuple(t for t in audit.TABLES if t != "tracking")


@pytest.mark.parametrize("batch", [1, 8, 1_000])
def test_quarantine_sets_foreign_records_aside_and_applies_every_real_event(
    tmp_path: Path, store_home: Path, kafka_bootstrap: str, kafka_topic: str, batch: int
) -> None:
    records = stored(store_home)
    _out, letters = quarantine_topic(kafka_bootstrap, kafka_topic, records)
    path = tmp_path / "q.duckdb"
    with Store(path) as store, KafkaSource(kafka_bootstrap, kafka_topic) as src:
        result = Projector(store, src, batch_size=batch, quarantine=True).catch_up()
        assert (result.position, result.applied) == (70, 69)
        assert dead_letters(store) == letters
    with Store(path) as store, KafkaSource(kafka_bootstrap, kafka_topic) as src:  # a restart
        assert Projector(store, src, quarantine=True).catch_up().applied == 0
        assert dead_letters(store) == letters
        with Store(":memory:") as reference:
            Projector(reference, ListSource(records)).catch_up()
            assert audit.dump(store, READ_MODELS) == audit.dump(reference, READ_MODELS)


def test_follow_with_quarantine_waits_past_a_foreign_tail_and_applies_the_real_event(
    tmp_path: Path, store_home: Path, kafka_bootstrap: str, kafka_topic: str
) -> None:
    """Without --once: poison at the tail is reported and set aside, the follower waits without
    spinning, and the real event that comes later is applied."""
    records = stored(store_home)
    out, letters = quarantine_topic(kafka_bootstrap, kafka_topic, records)
    other = tmp_path / "other"
    proc = subprocess.Popen(
        follow_cli(other, kafka_bootstrap, kafka_topic, "--quarantine", "--until", "71"),
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(180, proc.kill)  # a follower that never says enough fails
    watchdog.start()
    try:
        lines: list[str] = []
        assert proc.stderr is not None
        while len(lines) < len(letters):  # one warning per dead letter
            line = proc.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        assert all("dead letter: topic" in line for line in lines), lines
        assert "offset" in lines[-1] and "garbled gpuledger.position header b'7 1'" in lines[-1]
        time.sleep(1.0)
        before = cpu_seconds(proc.pid)
        time.sleep(3.0)
        assert cpu_seconds(proc.pid) - before < 1.0, "the follower spins at the tail"
        # the real event 71 comes: it links to event 70 (which did not validate)
        event = {"type": "job.finished.v1", "event_id": "e71", "at": 1_001.0, "actor": "alice"}
        real = chained(
            [LogRecord(70, "job.submitted.v2", out[-2][0] or b"")], event | {"job_id": 1}
        )
        real = real.replace(b'"job_id":1', b'"job_id":1,"outcome":"cancelled"')
        headers = [(POSITION_HEADER, b"71"), (TAG_HEADER, b"job.finished.v1")]
        produce(kafka_bootstrap, kafka_topic, [(real, headers)])
        stdout, stderr = proc.communicate(timeout=60)  # --until 71: it ends there by itself
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert stdout == f"position 71, 70 events, {len(letters)} quarantined\n"
    with Store.open(other) as store:
        assert dead_letters(store) == letters
        assert scalar(store.con, "SELECT tag FROM events WHERE position = 71") == "job.finished.v1"


def test_an_unknown_tag_with_a_json_object_is_kept_not_poison(
    store_home: Path, kafka_bootstrap: str, kafka_topic: str
) -> None:
    records = stored(store_home)
    newer = LogRecord(
        len(records) + 1,
        "job.teleported.v9",
        chained(
            records,
            {
                "type": "job.teleported.v9",
                "event_id": "e1",
                "at": 1000.0,
                "actor": "x",
                "job_id": 3,
            },
        ),
    )
    produce(kafka_bootstrap, kafka_topic, [relay_like(r) for r in [*records, newer]])
    with (
        Store(":memory:") as fed,
        KafkaSource(kafka_bootstrap, kafka_topic) as src,
        Store(":memory:") as reference,
    ):
        result = Projector(fed, src).catch_up()
        assert (result.position, result.applied, result.unknown) == (70, 70, 1)
        assert fed.status().unknown_tags == {"job.teleported.v9": 1}
        Projector(reference, ListSource([*records, newer])).catch_up()
        assert audit.dump(fed) == audit.dump(reference)


P, T = POSITION_HEADER, TAG_HEADER
STARTED = b"job.started.v1"


@pytest.mark.parametrize(
    ("headers", "value", "want"),
    [
        pytest.param([(P, b"7"), (T, STARTED)], b"{}", (7, "job.started.v1", None), id="relay"),
        pytest.param(
            [(T, STARTED)], b"{}", (None, "job.started.v1", f"no {P} header"), id="no position"
        ),
        pytest.param(None, b"{}", (None, None, f"no {P} header"), id="no headers at all"),
        pytest.param(
            [(P, b"7"), (P, b"7"), (T, STARTED)],
            b"{}",
            (None, "job.started.v1", f"2 {P} headers"),
            id="two positions",
        ),
        *(
            pytest.param(
                [(P, raw), (T, STARTED)],
                b"{}",
                (None, "job.started.v1", f"garbled {P} header {raw or b''!r}"),
                id=f"garbled position {raw!r}",
            )
            for raw in (b"7a", b"07", b"-7", b"+7", b" 7", b"", None, b"\xd9\xa7")
        ),
        pytest.param(
            [(P, b"6"), (T, STARTED)],
            b"{}",
            (6, "job.started.v1", "position 6 does not follow position 6"),
            id="position not past the previous one",
        ),
        pytest.param(
            [(P, b"8"), (T, STARTED)],
            b"{}",
            (8, "job.started.v1", "position 8 does not follow position 6"),
            id="position past the next one",
        ),
        pytest.param([(P, b"7")], b"{}", (7, None, f"no {T} header"), id="no tag"),
        pytest.param(
            [(P, b"7"), (T, b"\xff")], b"{}", (7, None, f"garbled {T} header"), id="garbled tag"
        ),
        pytest.param(
            [(P, b"7"), (T, STARTED)], None, (7, "job.started.v1", "no value"), id="no value"
        ),
    ],
)
def test_envelope_accepts_only_well_formed_records_that_follow(
    headers: Any, value: bytes | None, want: tuple[Any, ...]
) -> None:
    assert envelope(headers, value, 6) == want


# --- many readers ---------------------------------------------------------------------------------


def run_cli(home: Path, *args: str, env: dict[str, str]) -> str:
    proc = subprocess.run(
        [GPULEDGER, "--home", str(home), *args],
        env=env | {"GPULEDGER_USER": "root"},
        cwd=workdir(home),  # the jobs' working directory, never the repository
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"{args}: {proc.stderr}"
    return proc.stdout


def test_up_with_kafka_and_a_follower_elsewhere_build_identical_tables(
    tmp_path: Path, kafka_bootstrap: str, kafka_topic: str, transactional_id: str
) -> None:
    home, other = tmp_path / "home", tmp_path / "other"
    env = cli_env(
        GPULEDGER_KAFKA_TOPIC=kafka_topic, GPULEDGER_KAFKA_TRANSACTIONAL_ID=transactional_id
    )
    run_cli(home, "init", "--admin", "root", env=env)
    budget = tmp_path / "b.toml"
    budget.write_text(
        '[accounts."ai2"]\nkind = "program"\n'
        '[accounts."ai2/olmo"]\nkind = "project"\nmembers = ["alice", "bob"]\n'
        '[accounts."ai2/tulu"]\nkind = "project"\nmembers = ["carol"]\n'
    )
    run_cli(home, "budget", "apply", str(budget), env=env)
    run_cli(home, "node", "add", "local", "--gpus", "4", "--gpu-type", "sim", env=env)
    for user, account, gpus, contract in [
        ("alice", "ai2/olmo", "2", "1h"),
        ("bob", "ai2/olmo", "4", "20m"),
        ("carol", "ai2/tulu", "2", "1h"),
        ("alice", "ai2/olmo", "1", "10m"),
    ]:
        run_cli(
            home,
            "--as",
            user,
            "submit",
            "-A",
            account,
            "-G",
            gpus,
            "--min-runtime",
            contract,
            "--",
            "sleep",
            "0.3",
            env=env,
        )
    # the follower starts first: it waits for the topic that `up`'s relay creates
    follower = Follower(other, kafka_bootstrap, kafka_topic)
    try:
        run_cli(
            home,
            "up",
            "--run-as",
            "service",  # the ledger's users are not OS accounts here
            "--kafka",
            kafka_bootstrap,
            "--interval",
            "1s",
            "--until-idle",
            "--for",
            "90s",
            "--log-level",
            "WARNING",
            env=env,
        )
        with EmbeddedSource(home) as src:
            head = src.head()
        with Store.open(home, read_only=True) as store:
            assert store.position() == head  # up's Kafka-fed projection saw the whole log
        follower.wait_for(lambda: follower.positions and follower.positions[-1] >= head, 60)
        follower.proc.send_signal(signal.SIGTERM)
        assert follower.finish(60).startswith(f"position {head}, ")
    finally:
        if follower.proc.poll() is None:
            follower.kill()
    jobs = json.loads(run_cli(home, "jobs", "--json", env=env))
    assert sorted(j["outcome"] for j in jobs) == ["completed"] * 4
    assert audit.compare_files(projection_path(home), projection_path(other)) == SAME
    clean = clean_build(home, tmp_path / "clean.duckdb")
    assert audit.compare_files(projection_path(other), clean) == SAME
