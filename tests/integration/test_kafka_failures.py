"""The Kafka path when things go wrong, against real brokers: every failure is named, nothing is
lost, and scheduling never waits on the broker.

- Foreign records at the tail of the topic (a garbled header, a forged event claiming the next
  position, an old record copied): a new relay skips them with a warning naming their offsets
  and publishes after them; a quarantining reader sets exactly those aside and applies every
  real event; `audit verify --kafka` names them without crashing.
- A relay that cannot publish (another ledger's topic) stops with the error in its health
  record and in `gpuledger relay status`, instead of dying silently.
- Signed records: with signing keys a reader rejects a record that links correctly but was not
  signed by the relay, and keys rotate by key id.
- Unreachable brokers are reported in one line, without kafka-python's log lines.
- `gpuledger up --kafka` under load while its private broker is down for 60 s: dispatcher cycles
  keep their cadence, and once the broker is back the topic catches up exactly.
- SIGTERM of `gpuledger up --kafka` publishes every committed event before it exits.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from ledger.engines.supervised import live_processes
from ledger.store.application import Ledger
from ledger.store.embedded import EmbeddedSource
from ledger.store.relay import (
    Relay,
    ensure_topic,
    open_store,
)
from ledger.store.relay_health import read_health
from ledger.store.relay_service import RelayService
from projections.errors import PoisonRecord
from projections.kafka_source import KafkaSource
from projections.kafka_wire import (
    KEY_HEADER,
    POSITION_HEADER,
    SIGNATURE_HEADER,
    TAG_HEADER,
    parse_keys,
)
from projections.projector import Projector
from projections.store import Store
from schemas import commands as c
from tests.integration.waits import wait_for

pytestmark = pytest.mark.kafka

GPULEDGER = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"
ALICE_JOB = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=0, duration_s=60)
ReadTopic = Callable[..., list[Any]]


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    return env | extra


def stored(home: Path) -> list[tuple[int, str, bytes]]:
    with EmbeddedSource(home) as src:
        return [(r.position, r.tag, r.data) for r in src.read(0, 10_000_000)]


def position_of(rec: Any) -> int:
    return int(dict(rec.headers)[POSITION_HEADER])


def assert_records_equal_store(records: list[Any], home: Path) -> None:
    """The relay's records (in topic order) carry positions 1..N with the store's bytes."""
    want = stored(home)
    assert [position_of(r) for r in records] == [p for p, _t, _d in want]
    for rec, (p, tag, data) in zip(records, want, strict=True):
        assert (dict(rec.headers)[TAG_HEADER], rec.value) == (tag.encode(), data), p


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, Any]]) -> list[int]:
    """Write records with a plain producer (not the relay); their offsets."""
    ensure_topic(bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        sent = [producer.send(topic, value=v, key=b"k", headers=h, partition=0) for v, h in records]
        producer.flush(timeout=60)
        return [int(f.get(timeout=60).offset) for f in sent]
    finally:
        producer.close()


def forged(data: bytes, link: str) -> bytes:
    event = json.loads(data) | {"actor": "mallory", "user": "mallory", "prev_hash": link}
    return json.dumps(event, separators=(",", ":")).encode()


def relay_headers(position: int, tag: str) -> list[tuple[str, bytes]]:
    return [(POSITION_HEADER, str(position).encode()), (TAG_HEADER, tag.encode())]


def submit(ledger: Ledger, n: int) -> None:
    ledger.execute_all([ALICE_JOB] * n)


# --- foreign records at the tail ------------------------------------------------------------------


def test_a_relay_resumes_past_foreign_records_at_the_tail_and_readers_apply_every_real_event(
    org_ledger: Ledger,
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    read_topic: ReadTopic,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = org_ledger
    submit(ledger, 30)
    relay = Relay(
        open_store(ledger.home),
        kafka_bootstrap,
        topic=kafka_topic,
        transactional_id=transactional_id,
    )
    assert relay.publish_pending() == ledger.position
    relay.close()
    n = ledger.position
    last = stored(ledger.home)[-1]
    # another producer writes at the tail: a garbled header, a forged event claiming the next
    # position (its prev_hash is not the last event's), an old event copied
    first = stored(ledger.home)[2]
    foreign = produce(
        kafka_bootstrap,
        kafka_topic,
        [
            (last[2], [(POSITION_HEADER, b"\xff"), (TAG_HEADER, last[1].encode())]),
            (forged(last[2], "0" * 64), relay_headers(n + 1, last[1])),
            (first[2], relay_headers(first[0], first[1])),
        ],
    )
    submit(ledger, 20)
    with caplog.at_level(logging.WARNING, logger="gpuledger.relay"):
        relay = Relay(
            open_store(ledger.home),
            kafka_bootstrap,
            topic=kafka_topic,
            transactional_id=transactional_id,
        )
    try:
        assert (relay.position, relay.skipped) == (n, tuple(foreign))
        shown = ", ".join(map(str, foreign))
        assert (
            f"3 foreign record(s) after position {n} on {kafka_topic} skipped (offsets {shown})"
            in caplog.text
        )
        assert relay.publish_pending() == 20
    finally:
        relay.close()
    records = read_topic(kafka_topic)
    ours = [r for r in records if r.offset not in foreign]
    assert_records_equal_store(ours, ledger.home)

    # a quarantining reader sets exactly the foreign records aside and applies every real
    # event; the exact copy of an applied event brings nothing new: passed over, not set aside
    with Store(tmp_path / "q.duckdb") as store, KafkaSource(kafka_bootstrap, kafka_topic) as src:
        result = Projector(store, src, quarantine=True).catch_up()
        assert (result.position, result.applied) == (ledger.position, ledger.position)
        dead = store.con.execute(
            "SELECT kafka_offset, reason FROM dead_letters ORDER BY 1"
        ).fetchall()
        assert [o for o, _r in dead] == foreign[:2]
        assert dead[0][1] == "garbled gpuledger.position header b'\\xff'"
        assert dead[1][1].startswith('prev_hash "0000000000000000..." does not match position')
        assert store.con.execute(
            "SELECT count(*) FROM events WHERE actor = 'mallory'"
        ).fetchone() == (0,)
    # the default reader stops at the first one, naming it
    with Store(tmp_path / "d.duckdb") as store, KafkaSource(kafka_bootstrap, kafka_topic) as src:
        with pytest.raises(PoisonRecord) as err:
            Projector(store, src).catch_up()
        assert err.value.offset == foreign[0]
        assert store.position() == n

    # audit verify --kafka names the foreign records instead of crashing on them
    proc = subprocess.run(
        [
            GPULEDGER,
            "--home",
            str(ledger.home),
            "audit",
            "verify",
            "--kafka",
            kafka_bootstrap,
            "--topic",
            kafka_topic,
        ],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"the copy's record at offset {foreign[0]} has no position header" in proc.stdout


def test_a_relay_that_cannot_publish_stops_and_says_so_in_its_health(
    org_ledger: Ledger,
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    tmp_path: Path,
) -> None:
    """Another ledger's topic: the relay service stops publishing with the error in
    `relay.json` and `gpuledger relay status`; the thread ends, it does not die silently."""
    other = Ledger(tmp_path / "other")
    other.execute(c.InitLedger(actor="bob", admin="bob"))
    other.close()
    relay = Relay(
        open_store(other.home),
        kafka_bootstrap,
        topic=kafka_topic,
        transactional_id=transactional_id + "-other",
    )
    relay.publish_pending()
    relay.close()
    service = RelayService(
        org_ledger.home, kafka_bootstrap, topic=kafka_topic, transactional_id=transactional_id
    ).start()
    deadline = time.monotonic() + 60
    while service.health.state != "stopped":
        assert time.monotonic() < deadline, service.health
        time.sleep(0.05)
    health = service.stop()
    assert health.error == (
        f"topic {kafka_topic} differs from the store at position 1 "
        "(the topic belongs to another ledger; publish to a new topic)"
    )
    assert read_health(org_ledger.home) == health
    proc = subprocess.run(
        [GPULEDGER, "--home", str(org_ledger.home), "relay", "status"],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    # the service is gone: a status read more than a few check intervals after its stop (a
    # loaded machine) honestly adds that no service updates the record
    said = re.sub(r" \(as of [\d,]+ s ago: no service updates it\)", "", proc.stdout, count=1)
    assert said == f"{health.line()}\n"
    assert said.startswith(f"relay stopped: {kafka_topic} at {kafka_bootstrap}, position 0")


# --- signing --------------------------------------------------------------------------------------


def test_signed_records_a_reader_rejects_what_the_relay_did_not_sign_and_keys_rotate(
    org_ledger: Ledger,
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = org_ledger
    submit(ledger, 10)
    old = parse_keys("k1:first-secret")
    new = parse_keys("k2:second-secret,k1:first-secret")  # rotated: k2 signs, k1 still verifies
    assert old is not None and new is not None
    relay = Relay(
        open_store(ledger.home),
        kafka_bootstrap,
        topic=kafka_topic,
        transactional_id=transactional_id,
        keys=old,
    )
    relay.publish_pending()
    relay.close()
    n = ledger.position
    last = stored(ledger.home)[-1]
    # a forger who read the topic links correctly to the last event, but cannot sign
    link = hashlib.sha256(last[2]).hexdigest()
    foreign = produce(
        kafka_bootstrap,
        kafka_topic,
        [
            (forged(last[2], link), relay_headers(n + 1, last[1])),
            (
                forged(last[2], link),
                [
                    *relay_headers(n + 1, last[1]),
                    (KEY_HEADER, b"k1"),
                    (SIGNATURE_HEADER, b"00" * 32),
                ],
            ),
        ],
    )
    submit(ledger, 10)
    relay = Relay(
        open_store(ledger.home),
        kafka_bootstrap,
        topic=kafka_topic,
        transactional_id=transactional_id,
        keys=new,
    )
    assert relay.skipped == tuple(foreign)
    relay.publish_pending()
    relay.close()

    with (
        Store(tmp_path / "q.duckdb") as store,
        KafkaSource(kafka_bootstrap, kafka_topic, keys=new) as src,
    ):
        result = Projector(store, src, quarantine=True).catch_up()
        assert (result.position, result.applied) == (ledger.position, ledger.position)
        dead = store.con.execute(
            "SELECT kafka_offset, reason FROM dead_letters ORDER BY 1"
        ).fetchall()
        assert dead == [
            (foreign[0], "not signed (no gpuledger.key / gpuledger.sig header)"),
            (foreign[1], "signature does not match key id 'k1'"),
        ]
    with Store(":memory:") as reference, Store(tmp_path / "q.duckdb") as store:
        Projector(reference, EmbeddedSource(ledger.home)).catch_up()
        from projections.testing import compare as audit

        assert audit.dump(store) == audit.dump(reference)
    # a reader with only the old key holds at the records signed with the new one (a forger
    # can choose a key id nobody holds: atk44-25 F4): it sets them aside, applies nothing after
    # position n and says so once; given the new key, it applies every one of them
    with (
        Store(tmp_path / "o.duckdb") as store,
        KafkaSource(kafka_bootstrap, kafka_topic, keys=old) as src,
    ):
        with caplog.at_level(logging.WARNING, logger="gpuledger.kafka_source"):
            result = Projector(store, src, quarantine=True).catch_up()
        assert (result.position, store.position()) == (n, n)
        holding = [r.getMessage() for r in caplog.records if "holding at" in r.getMessage()]
        assert len(holding) == 1 and "signed with unknown key id 'k2'" in holding[0], holding
        assert f"holding at position {n} until a verified record follows" in holding[0]
    with (
        Store(tmp_path / "o.duckdb") as store,
        KafkaSource(kafka_bootstrap, kafka_topic, keys=new) as src,
    ):
        result = Projector(store, src, quarantine=True).catch_up()
        assert result.position == ledger.position


# --- unreachable brokers ---------------------------------------------------------------------


def closed_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize(
    "args",
    [
        ["project", "follow", "--once", "--kafka", "{bootstrap}"],
        ["audit", "verify", "--kafka", "{bootstrap}"],
    ],
    ids=["follow --once", "audit verify --kafka"],
)
def test_an_unreachable_broker_is_one_line(org_ledger: Ledger, args: list[str]) -> None:
    bootstrap = closed_port()
    proc = subprocess.run(
        [GPULEDGER, "--home", str(org_ledger.home), *(a.format(bootstrap=bootstrap) for a in args)],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: Kafka at {bootstrap} is unreachable ({bootstrap}: ")
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_up_with_an_unreachable_broker_schedules_and_says_so_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run(home, "init", "--admin", "root")
    run(home, "node", "add", "local", "--gpus", "2", "--gpu-type", "sim")
    bootstrap = closed_port()
    proc = subprocess.run(
        [
            GPULEDGER,
            "--home",
            str(home),
            "up",
            "--kafka",
            bootstrap,
            "--for",
            "3s",
            "--interval",
            "1s",
            "--log-level",
            "WARNING",
        ],
        env=cli_env(GPULEDGER_USER="root", GPULEDGER_KAFKA_FLUSH_TIMEOUT="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr  # the outage, then the flush that could not happen
    assert f"relay: Kafka at {bootstrap} is unreachable ({bootstrap}: " in lines[0]
    assert "scheduling goes on from the store" in lines[0]
    assert "event(s) not published at exit" in lines[1]
    health = read_health(home)
    assert health is not None and health.state == "exited" and health.lag > 0
    assert f"Kafka at {bootstrap} is unreachable" in health.error


# --- up --kafka: scheduling never waits on the broker; SIGTERM flushes -------------------------


def run(home: Path, *args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [GPULEDGER, "--home", str(home), *args],
        env=(env or cli_env()) | {"GPULEDGER_USER": "root"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"{args}: {proc.stderr}"
    return proc.stdout


def service_home(tmp_path: Path, gpus: int) -> Path:
    home = tmp_path / "home"
    run(home, "init", "--admin", "root")
    budget = tmp_path / "b.toml"
    budget.write_text(
        '[accounts."ai2"]\nkind = "program"\n'
        '[accounts."ai2/olmo"]\nkind = "project"\nmembers = ["alice"]\n'
    )
    run(home, "budget", "apply", str(budget))
    run(home, "node", "add", "local", "--gpus", str(gpus), "--gpu-type", "sim")
    return home


def start_up(home: Path, bootstrap: str, topic: str, tid: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            GPULEDGER,
            "--home",
            str(home),
            "up",
            "--run-as",
            "service",  # the ledger's users are not OS accounts here
            "--kafka",
            bootstrap,
            "--log-level",
            "WARNING",
            *args,
        ],
        env=cli_env(
            GPULEDGER_KAFKA_TOPIC=topic, GPULEDGER_KAFKA_TRANSACTIONAL_ID=tid, GPULEDGER_USER="root"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def job(command: str) -> c.SubmitJob:
    return c.SubmitJob(
        actor="alice",
        account="ai2/olmo",
        gpus=1,
        min_runtime_s=0,
        duration_s=60.0,
        command=("sh", "-c", command),
    )


def cycle_times(home: Path) -> list[float]:
    """When each appended dispatcher decision was made (wall clock), in log order."""
    out = []
    for _p, tag, data in stored(home):
        if tag.startswith("cycle.decided."):  # every stored version
            out.append(float(json.loads(data)["at"]))
    return out


def test_sigterm_publishes_every_committed_event_before_exit(
    tmp_path: Path,
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    read_topic: ReadTopic,
) -> None:
    """Jobs still run at SIGTERM and keep running under their supervisors (the service records
    no end for them); every event committed up to the signal is on the topic when the process
    has exited."""
    home = service_home(tmp_path, gpus=4)
    ledger = Ledger(home)
    ledger.execute_all([job("sleep 60")] * 4)
    up = start_up(
        home, kafka_bootstrap, kafka_topic, transactional_id, "--interval", "1s", "--grace", "1s"
    )
    try:
        ledger_jobs = lambda: [j.status for j in Ledger(home).state.jobs.values()]  # noqa: E731
        wait_for("four running jobs", lambda: ledger_jobs().count("running") == 4, 120)
        up.send_signal(signal.SIGTERM)
        _out, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
        survivors = live_processes(home / "agents" / "local")  # up's agent of node local
        for p in survivors:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    assert up.returncode == 0, err
    assert len(survivors) == 4 and ledger_jobs() == ["running"] * 4
    tags = [t for _p, t, _d in stored(home)]
    assert tags.count("job.started.v1") == 4 and "job.finished.v2" not in tags
    assert_records_equal_store(read_topic(kafka_topic), home)
    health = read_health(home)
    assert health is not None and (health.position, health.lag) == (len(stored(home)), 0)


OUTAGE_S = 60.0


@pytest.mark.alone
def test_a_60_s_broker_outage_under_load_keeps_the_cycle_cadence_and_the_topic_catches_up(
    own_broker: Any,
    tmp_path: Path,
    read_topic: ReadTopic,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`up --kafka` with an interval of 1 s while short jobs arrive all the time (2 a second, on
    4 GPUs): each cycle places some. The broker is stopped for 60 s; the decisions made during
    the outage keep the cadence they had before it; after the broker returns, the topic holds
    exactly the store."""
    caplog.set_level(logging.CRITICAL, logger="kafka")
    topic, tid = "outage-events", "outage-relay"
    home = service_home(tmp_path, gpus=4)
    ledger = Ledger(home)
    up = start_up(home, own_broker.bootstrap, topic, tid, "--interval", "1s")
    try:

        def submit_for(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                ledger.execute(job("sleep 0.5"))
                time.sleep(0.5)

        submit_for(15)
        health = read_health(home)
        assert health is not None and health.state == "publishing", health
        before = len(cycle_times(home))
        own_broker.down()
        down_at = time.time()
        submit_for(OUTAGE_S)
        up_at = time.time()
        outage = [t for t in cycle_times(home) if down_at <= t <= up_at]
        health = read_health(home)
        assert health is not None and health.state == "unavailable", health
        own_broker.up()
        submit_for(5)
        wait_for(
            "the topic to catch up",
            lambda: (h := read_health(home)) is not None and h.state == "publishing" and h.lag == 0,
            120,
        )
        up.send_signal(signal.SIGTERM)
        _out, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 0, err
    # cadence: a decision every few seconds all through the outage, as before it
    gaps = [b - a for a, b in zip([down_at, *outage], [*outage, up_at], strict=True)]
    print(  # shown with `pytest -s`: the figures docs/kafka.md quotes
        f"outage {up_at - down_at:.1f} s: {len(outage)} decisions, max gap {max(gaps):.2f} s; "
        f"before it: {before} decisions in 15 s"
    )
    assert before >= 5
    assert len(outage) >= OUTAGE_S / 4, (len(outage), gaps)
    assert max(gaps) < 8.0, gaps
    assert_records_equal_store(read_topic(topic, bootstrap=own_broker.bootstrap), home)
    # one line for the outage, one when publishing resumed: no kafka-python noise
    relay_lines = [line for line in err.splitlines() if "relay:" in line]
    assert len(relay_lines) == 2, err
    assert "publishing paused and retried, scheduling goes on from the store" in relay_lines[0]
    assert "relay: publishing again" in relay_lines[1]
    assert "kafka." not in err, err
