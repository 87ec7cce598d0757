"""atk58 F2: the relay across a leadership change on a topic deleted and made again. A leader
killed -9 (or paused past its lease) right after its first commit to the new topic, before it
replaced the store's progress row (which still named the old topic id), left the next leader
to find "the topic deleted and made again since the relay last committed to it" and publish
the store's log from position 1 once more: the topic held 1..5,000 twice (read_committed),
`relay status` "0 behind". The relay's own records on the new topic (positions 1..m, in order,
equal to the store's events, whoever of this ledger's leaders wrote them) are read from its
start: the next leader goes on after the last one. Real servers on one PostgreSQL store with a
shared state key, a real broker."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from ledger.store.relay_progress import keep, opened, read, read_anchor, read_mac
from ledger.store.snapshots import STATE_KEY_ENV, state_key
from tests.integration import waits
from tests.integration.conftest import delete_topics
from tests.integration.hakit import make_group
from tests.integration.serverkit import cli
from tests.integration.test_ha_relay_handover import build
from tests.integration.test_relay import positions

EVENTS = 15_000
"""Three batches of the relay's 5,000: the leader is killed after its first commit."""


def committed_end(consumer: Any, tp: TopicPartition) -> int:
    """The topic's read_committed end (0: none yet, or no topic)."""
    try:
        return int(consumer.end_offsets([tp]).get(tp, 0) or 0)
    except Exception:
        return 0


def test_a_leader_killed_after_its_first_commit_to_a_topic_made_again_publishes_nothing_twice(
    tmp_path: Path,
    pg_store: str,
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    read_topic: Any,
) -> None:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    head = build(home, pg_store, EVENTS)
    state_key(home)  # made; both servers sign and verify the progress row with it
    g = make_group(tmp_path, pg_store, 2, "--kafka", kafka_bootstrap, home=home)
    g.lease = "3s"
    g.env = {"GPULEDGER_KAFKA_TOPIC": kafka_topic,
             "GPULEDGER_KAFKA_TRANSACTIONAL_ID": transactional_id,
             STATE_KEY_ENV: str(home / "state.key")}  # fmt: skip
    tp = TopicPartition(kafka_topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, isolation_level="read_committed",
                             enable_auto_commit=False)  # fmt: skip
    try:
        for m in g.members:
            g.start(m)
        leader = g.leader(timeout=90)
        (other,) = [m for m in g.members if m is not leader]
        whole = lambda m: (m.health() or {}).get("relay_position") or 0  # noqa: E731
        waits.wait_for("the leader's relay to publish the log", lambda: whole(leader) >= head,
                       240, g.why)  # fmt: skip
        with opened(home, pg_store) as store:  # the row naming the topic before it is deleted
            old = (read(store, kafka_topic) or 0, read_mac(store, kafka_topic),
                   *read_anchor(store, kafka_topic))  # fmt: skip
        assert old[0] >= head and old[2], old
        delete_topics(kafka_bootstrap, [kafka_topic])
        # the leader makes the topic again and publishes the log to it: killed at its first
        # commit there (the read_committed end offset polled every 20 ms, as the attack did)
        deadline = time.monotonic() + 120
        while committed_end(consumer, tp) == 0:
            assert time.monotonic() < deadline, "no commit to the topic made again" + g.why()
            time.sleep(0.02)
        leader.kill()
        # the store as the leader left it when it died before replacing the row (its write
        # follows the commit by a moment; under load the attack hit it 3 times in 3): the row
        # naming the old topic id, exactly as it was (its own MAC)
        position, mac, topic_id, offset, stamp = old
        with opened(home, pg_store) as store:
            keep(store, kafka_topic, position, repair=True, signature=mac, topic_id=topic_id,
                 offset=offset, stamp=stamp)  # fmt: skip
        mine = committed_end(consumer, tp)
        assert mine < head, f"the leader published {mine} of {head} before it was killed"
        leads = lambda: (other.health() or {}).get("role") == "leader"  # noqa: E731
        waits.wait_for("the other server to lead", leads, 120, g.why)

        def published() -> bool:
            h = other.health() or {}
            return h.get("relay_state") == "publishing" and h.get("relay_lag") == 0

        waits.wait_for("the new leader's relay to publish the rest", published, 240, g.why)
        time.sleep(2.0)  # whatever it would publish again after it
        got = positions(read_topic(kafka_topic))
        # before: [1..m, 1..head]: 1..m twice, "publishing, 0 behind"
        dups = len(got) - len(set(got))
        assert got == list(range(1, len(got) + 1)), (len(got), dups, got[:3], got[-3:])
        assert len(got) >= head, (len(got), head)
        said = other.text()
        assert "deleted and made again since the relay last committed" in said, g.why()
    finally:
        consumer.close()
        g.stop()
