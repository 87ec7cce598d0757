"""atk58 F5: an ex-leader's relay fenced the new leader's. A leader paused (or cut off) in the
middle of its relay's connect went on with it when it ran again, after another server had taken
the lease: its `init_transactions` (the same transactional id, every server of a ledger shares
it) bumped the producer epoch and fenced the new leader's producer. The new leader's relay then
stood still (a transaction under way: its flush or commit failed after up to `timeout_s`, 30 s;
between two: 5 s before it connected again), and its health and `gpuledger status` blamed the
broker ("Kafka ... unreachable", "the broker is unreachable or failed the transaction").

Real servers on one PostgreSQL store, a real broker. The leader is paused mid-publish, the
other leads and publishes; the old one is resumed and the init its connect would make lands
while the new leader publishes (a producer of the ledger's transactional id: the moment a real
ex-leader's late connect hits is a race, seen once by the attack, so the test makes it land).
The new leader's relay connects again at once, says it was fenced by another producer of this
ledger (an ex-leader), never blames the broker, and the topic is whole."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from kafka import KafkaProducer

from ledger.store.relay import last_published
from tests.integration import waits
from tests.integration.test_ha_relay_handover import mid_publish
from tests.integration.test_relay import positions

FENCED = "fenced by another producer of this ledger (an ex-leader)"


def late_init(bootstrap: str, transactional_id: str) -> None:
    """What the ex-leader's late connect does to the broker: a producer of the ledger's
    transactional id initialised (its epoch bumped), then left."""
    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id,
                      enable_idempotence=True, acks="all")  # fmt: skip
    try:
        p.init_transactions()
    finally:
        p.close(timeout=5)


def test_a_new_leader_fenced_by_an_ex_leaders_late_init_connects_again_at_once(
    tmp_path: Path,
    pg_store: str,
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    read_topic: Any,
) -> None:
    with mid_publish(tmp_path, pg_store, kafka_bootstrap, kafka_topic, transactional_id) as (
        g,
        leader,
        other,
        paused_at,
        head,
    ):
        assert leader.proc is not None
        leader.proc.send_signal(signal.SIGSTOP)  # its lease runs out; the other takes it
        try:

            def publishing() -> int | None:
                h = other.health() or {}
                at = last_published(kafka_bootstrap, kafka_topic)
                return at if h.get("role") == "leader" and at > paused_at else None

            waits.wait_for("the other server's relay to publish past the paused one",
                           publishing, 120, g.why)  # fmt: skip
        finally:
            leader.proc.send_signal(signal.SIGCONT)
        before = len(other.text())
        late_init(kafka_bootstrap, transactional_id)  # the ex-leader's connect, landing late
        fenced_at = time.monotonic()
        at_fence = last_published(kafka_bootstrap, kafka_topic)
        assert at_fence < head, f"the new leader published all {head} before the late init"
        moved = lambda: last_published(kafka_bootstrap, kafka_topic) > at_fence  # noqa: E731
        waits.wait_for("the new leader's relay to commit again", moved, 120, g.why)
        stood = time.monotonic() - fenced_at
        whole = lambda: (other.health() or {}).get("relay_lag") == 0  # noqa: E731
        waits.wait_for("the new leader's relay to publish the whole log", whole, 240, g.why)
        said = other.text()[before:]
        # before: "relay: Kafka at ... is unreachable", "... the broker is unreachable or failed
        # the transaction" (a flush or commit that failed after up to 30 s), or "relay fenced
        # ... run one relay per ledger ... connecting again in 5 s"
        assert FENCED in said, said[-4000:]
        for wrong in ("unreachable", "connecting again in", "relay stopped"):
            assert wrong not in said, (wrong, said[-4000:])
        # at once: a reconnect (its bookmark read back) and the next batch's commit (5,000
        # events), 3.0-4.6 s at load ~15; before, 4.3-7.4 s here (a 5 s wait, or a reconnect
        # that blamed the broker) and ~30 s in the attack (a flush or commit timing out)
        assert stood < 10.0, (stood, said[-3000:])
        got = positions(read_topic(kafka_topic))
        assert got == list(range(1, len(got) + 1)) and len(got) >= head, (len(got), head)
