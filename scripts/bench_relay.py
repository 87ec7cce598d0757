"""Benchmark: the relay's throughput against a raw kafka-python producer, in the same run.

    python scripts/bench_relay.py                          # starts (and stops) its own broker
    python scripts/bench_relay.py --bootstrap 127.0.0.1:19092
    GPULEDGER_KAFKA=127.0.0.1:19092 python scripts/bench_relay.py --events 50000 --repeat 1

A store of `--events` submissions is built first (not measured). Each round then publishes the
whole store twice, each time to a fresh one-partition topic:

- raw: a plain idempotent producer (acks=all, the relay's batching settings) sends the same
  records (same key, value bytes and headers) read into memory beforehand, then flushes;
- relay: `Relay.publish_pending()`: reads the store in batches and commits one Kafka
  transaction per batch.

`--pg-barrier ROUNDS` measures instead what the PostgreSQL barrier commit costs a relay round
(`ledger/store/confirmed.py`: before it publishes, the relay makes one commit that locks the
log's last row, so it publishes only rows a synchronous standby confirmed): a store in a private
PostgreSQL (or $GPULEDGER_PG_DSN's server), `--per-round` submissions appended before each
round (not measured), then one `publish_pending()` timed, alternately with the barrier and
without it (the round as SQLite runs it); the barrier commit alone is timed too.

    python scripts/bench_relay.py --pg-barrier 200 --per-round 10

`--pg-lease ROUNDS` measures the lease statement a relay under a lease makes before each Kafka
transaction (`Lease.holds()`, on a connection of its own: the store says the lease is this
server's, atk58 F5): the same private PostgreSQL, a lease taken as a leader takes it, rounds of
`--per-round` submissions timed alternately with `holds=lease.holds` and without it (one
transaction a round: one statement), the statement alone, and, in the same run, its raw limit:
`SELECT 1` on a plain psycopg connection (one round trip, nothing read).

    python scripts/bench_relay.py --pg-lease 200 --per-round 10

Goal: relay >= 50% of raw. Prints events/s of both, the ratio per round and the median, and
which CRC32C implementation kafka-python uses (the pure-Python fallback caps batching at
~18k records/s; the `crc32c` C extension is installed with `kafka-python[crc32c]`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import NamedTuple

from benchkit import broker, machine
from kafka import KafkaAdminClient, KafkaProducer
from kafka.record import util as record_util

from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.relay import (
    DEFAULT_BATCH,
    RawRecord,
    Relay,
    ensure_topic,
    last_published,
    open_store,
    read_raw,
)
from projections.kafka_wire import record_headers
from schemas import commands as c

GOAL = 0.5


def crc32c_implementation() -> str:
    """Which CRC32C function kafka-python's record batches use (kafka.record.util)."""
    impl = record_util._crc32c
    if record_util.crc32c_c is not None and impl is record_util.crc32c_c:
        return f"crc32c {version('crc32c')} (C extension, package `crc32c`)"
    return "pure Python kafka.record._crc32c (slow: pip install 'kafka-python[crc32c]')"


def build_store(home: Path, events: int, store: str | None = None) -> int:
    """A ledger where alice submits `events` jobs, appended in batches of 5,000 (`store`: a
    PostgreSQL DSN; default the SQLite file in `home`)."""
    if store is not None:
        from ledger.store.creating import NewLedger

        NewLedger(home, store=store).close()  # its tables
    ledger = Ledger(home, SimClock(1_000.0), seeded_ids(1), store=store)
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="ai2", kind="program"),
            c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=3),
            c.AddMember(actor="root", user="alice", project="ai2/olmo"),
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )
    job = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=0, duration_s=60)
    left = events - ledger.position
    while left > 0:
        ledger.execute_all([job] * min(left, 5_000))
        left = events - ledger.position
    ledger.close()
    return ledger.position


class Took(NamedTuple):
    wall_s: float
    cpu_s: float
    """CPU seconds of this process, all threads (the caller and the producer's I/O thread):
    steadier than wall time when other programs share the machine."""


@contextlib.contextmanager
def clock(out: list[Took]) -> Iterator[None]:
    w0, c0 = time.perf_counter(), time.process_time()
    yield
    out.append(Took(time.perf_counter() - w0, time.process_time() - c0))


def raw_round(bootstrap: str, topic: str, records: list[RawRecord]) -> Took:
    """Time for a plain idempotent producer to send and flush `records`."""
    ensure_topic(bootstrap, topic)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        batch_size=1 << 20,
        max_request_size=16 << 20,
        client_id="gpuledger-bench-raw",
    )
    try:
        producer.partitions_for(topic)  # metadata before the clock starts
        took: list[Took] = []
        send = producer.send
        with clock(took):
            for r in records:
                send(
                    topic,
                    value=r.data,
                    key=r.key,
                    headers=record_headers(r.position, r.tag, r.data),
                    partition=0,
                )
            producer.flush()
        return took[0]
    finally:
        producer.close()


def relay_round(bootstrap: str, topic: str, home: Path, batch: int, want: int) -> Took:
    """Time for `Relay.publish_pending()` to publish the whole store."""
    relay = Relay(
        open_store(home),
        bootstrap,
        topic=topic,
        transactional_id=f"bench-{uuid.uuid4().hex[:12]}",
        batch=batch,
    )
    took: list[Took] = []
    try:
        with clock(took):
            published = relay.publish_pending()
    finally:
        relay.close()
    if published != want:
        sys.exit(f"error: the relay published {published} events, the store has {want}")
    return took[0]


def pg_barrier(bootstrap: str, rounds: int, per_round: int) -> None:
    """What the barrier commit costs a relay round on PostgreSQL (see the module docstring)."""
    from bench_pg import database
    from benchkit import postgres

    from ledger.store import confirmed, locate
    from ledger.store import relay as relay_module

    job = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=0, duration_s=60)
    with postgres() as admin, tempfile.TemporaryDirectory(prefix="gpuledger-bench-bar-") as tmp:
        dsn = database(admin, f"bench_barrier_{uuid.uuid4().hex[:8]}")
        home = Path(tmp)
        locate.remember(home, dsn)
        build_store(home, 1_000, store=dsn)
        ledger = Ledger(home, SimClock(2_000.0), seeded_ids(2), store=dsn)
        recorder = open_store(home)
        topic = f"bench-barrier-{uuid.uuid4().hex[:8]}"
        relay = Relay(recorder, bootstrap, topic=topic, transactional_id=f"bench-{topic}")
        real = relay_module.publishable
        took: dict[str, list[float]] = {"barrier": [], "none": [], "commit": []}
        try:
            relay.publish_pending()  # the store so far, and the producer's first connect
            for i in range(2 * rounds):
                ledger.execute_all([job] * per_round)
                barrier = i % 2 == 0
                relay_module.publishable = real if barrier else (lambda _r, _a: None)  # type: ignore[assignment]
                t0 = time.perf_counter()
                published = relay.publish_pending()
                took["barrier" if barrier else "none"].append(time.perf_counter() - t0)
                if published != per_round:
                    sys.exit(f"error: a round published {published}, not {per_round}")
                t0 = time.perf_counter()
                confirmed.confirmed_head(recorder)
                took["commit"].append(time.perf_counter() - t0)
        finally:
            relay_module.publishable = real
            relay.close()
            ledger.close()
            delete_topics(bootstrap, [topic])

    def ms(xs: list[float]) -> str:
        q = statistics.quantiles(xs, n=20)
        return f"median {statistics.median(xs) * 1e3:6.2f} ms, p95 {q[18] * 1e3:6.2f} ms"

    print(f"PostgreSQL relay rounds of {per_round} events, {rounds} each way (no standby):")
    print(f"  round with the barrier     {ms(took['barrier'])}")
    print(f"  round without it           {ms(took['none'])}")
    print(f"  the barrier commit alone   {ms(took['commit'])}")
    extra = statistics.median(took["barrier"]) - statistics.median(took["none"])
    print(
        f"  cost per round (medians)   {extra * 1e3:+.2f} ms, "
        f"{extra / per_round * 1e6:+.0f} us/event"
    )


def pg_lease(bootstrap: str, rounds: int, per_round: int) -> None:
    """What the per-transaction lease statement costs (see the module docstring)."""
    import psycopg
    from bench_pg import database
    from benchkit import postgres

    from ledger.store import lease as lease_module
    from ledger.store import locate

    job = c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=0, duration_s=60)
    with postgres() as admin, tempfile.TemporaryDirectory(prefix="gpuledger-bench-lease-") as tmp:
        dsn = database(admin, f"bench_lease_{uuid.uuid4().hex[:8]}")
        home = Path(tmp)
        locate.remember(home, dsn)
        build_store(home, 1_000, store=dsn)
        lease_module.setup(dsn)
        lease = lease_module.Lease(dsn, "bench", "http://127.0.0.1:1", 60.0)
        if not lease.acquire():
            sys.exit("error: the lease could not be taken")
        ledger = Ledger(home, SimClock(2_000.0), seeded_ids(2), store=dsn)
        topic = f"bench-lease-{uuid.uuid4().hex[:8]}"
        relay = Relay(open_store(home), bootstrap, topic=topic, transactional_id=f"b-{topic}",
                      holds=lease.holds)  # fmt: skip
        took: dict[str, list[float]] = {"held": [], "none": [], "holds": [], "raw": []}
        raw = psycopg.connect(dsn, autocommit=True)
        try:
            relay.publish_pending()  # the store so far, and the producer's first connect
            for i in range(2 * rounds):
                held = i % 2 == 0
                relay._holds = lease.holds if held else None  # the round as with no lease
                ledger.execute_all([job] * per_round)
                lease.renew()  # not timed: the leader's own thread renews it
                t0 = time.perf_counter()
                published = relay.publish_pending()
                took["held" if held else "none"].append(time.perf_counter() - t0)
                if published != per_round:
                    sys.exit(f"error: a round published {published}, not {per_round}")
                t0 = time.perf_counter()
                if not lease.holds():
                    sys.exit("error: the store says the lease is not this server's")
                took["holds"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                raw.execute("SELECT 1").fetchall()
                took["raw"].append(time.perf_counter() - t0)
        finally:
            raw.close()
            relay.close()
            ledger.close()
            lease.release()
            lease.close()
            delete_topics(bootstrap, [topic])

    def ms(xs: list[float]) -> str:
        q = statistics.quantiles(xs, n=20)
        return f"median {statistics.median(xs) * 1e3:6.2f} ms, p95 {q[18] * 1e3:6.2f} ms"

    print(f"PostgreSQL relay rounds of {per_round} events (one transaction), "
          f"{rounds} each way (no standby):")  # fmt: skip
    print(f"  round with the lease statement   {ms(took['held'])}")
    print(f"  round without it                 {ms(took['none'])}")
    print(f"  Lease.holds() alone              {ms(took['holds'])}")
    print(f"  raw limit: SELECT 1 (psycopg)    {ms(took['raw'])}")
    extra = statistics.median(took["held"]) - statistics.median(took["none"])
    ratio = statistics.median(took["raw"]) / statistics.median(took["holds"])
    print(f"  cost per transaction (medians)   {extra * 1e3:+.2f} ms; raw / holds() {ratio:.0%}")


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    with contextlib.suppress(Exception):
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="gpuledger-bench")
        try:
            admin.delete_topics(topics)
        finally:
            admin.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000, help="events in the store")
    ap.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="events per transaction")
    ap.add_argument("--repeat", type=int, default=3, help="counted rounds of raw + relay")
    ap.add_argument("--bootstrap", default=os.environ.get("GPULEDGER_KAFKA", "").strip() or None)
    ap.add_argument(
        "--pg-barrier",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="time PostgreSQL relay rounds with and without the barrier commit",
    )
    ap.add_argument(
        "--pg-lease",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="time PostgreSQL relay rounds with and without the lease statement",
    )
    ap.add_argument(
        "--per-round", type=int, default=10, help="events per --pg-barrier/--pg-lease round"
    )
    args = ap.parse_args()

    print(f"machine: {machine()}")
    if args.pg_barrier:
        with broker(args.bootstrap) as bootstrap:
            pg_barrier(bootstrap, args.pg_barrier, args.per_round)
        return
    if args.pg_lease:
        with broker(args.bootstrap) as bootstrap:
            pg_lease(bootstrap, args.pg_lease, args.per_round)
        return
    print(f"kafka-python {version('kafka-python')}; CRC32C: {crc32c_implementation()}")
    with (
        tempfile.TemporaryDirectory(prefix="gpuledger-bench-relay-") as tmp,
        broker(args.bootstrap) as bootstrap,
    ):
        home = Path(tmp)
        t0 = time.perf_counter()
        n = build_store(home, args.events)
        records = read_raw(open_store(home), 0, n)
        size = sum(len(r.data) for r in records) / n
        print(
            f"broker {bootstrap}; store: {n:,} events, {size:.0f} B mean value, "
            f"built in {time.perf_counter() - t0:.1f} s (not measured); batch {args.batch:,}"
        )

        topics: list[str] = []
        raw: list[Took] = []
        relay: list[Took] = []
        try:
            # Round 0 warms up the broker's JIT and caches and is not counted; the order of raw
            # and relay alternates so neither always runs on the hotter (or busier) broker.
            for i in range(args.repeat + 1):
                run = uuid.uuid4().hex[:8]
                raw_topic, relay_topic = f"bench-raw-{run}", f"bench-relay-{run}"
                topics += [raw_topic, relay_topic]
                if i % 2:
                    relay_took = relay_round(bootstrap, relay_topic, home, args.batch, n)
                    raw_took = raw_round(bootstrap, raw_topic, records)
                else:
                    raw_took = raw_round(bootstrap, raw_topic, records)
                    relay_took = relay_round(bootstrap, relay_topic, home, args.batch, n)
                if last_published(bootstrap, relay_topic) != n:
                    sys.exit("error: the relay topic does not end at the store's head")
                print(
                    f"{'warm-up' if i == 0 else f'round {i}':>7}: {line(n, raw_took, relay_took)}"
                )
                if i:
                    raw.append(raw_took)
                    relay.append(relay_took)
        finally:
            delete_topics(bootstrap, topics)

    def median(runs: list[Took]) -> Took:
        return Took(*(statistics.median(t[k] for t in runs) for k in range(2)))

    mid_raw, mid_relay = median(raw), median(relay)
    ratio = statistics.median(r.wall_s / s.wall_s for r, s in zip(raw, relay, strict=True))
    print(f" median: {line(n, mid_raw, mid_relay)}")
    print(
        f"relay/raw throughput (median of the rounds' ratios) {ratio:.0%}: "
        f"goal >= {GOAL:.0%} {'met' if ratio >= GOAL else 'NOT met'}"
    )


def line(n: int, raw: Took, relay: Took) -> str:
    """Events/s (wall clock) and client CPU microseconds per event, raw then relay."""
    return (
        f"raw {n / raw.wall_s:>7,.0f} ev/s {raw.cpu_s / n * 1e6:5.1f} us cpu/ev   "
        f"relay {n / relay.wall_s:>7,.0f} ev/s {relay.cpu_s / n * 1e6:5.1f} us cpu/ev   "
        f"relay/raw {raw.wall_s / relay.wall_s:4.0%} (cpu {raw.cpu_s / relay.cpu_s:4.0%})"
    )


if __name__ == "__main__":
    main()
