"""atk58 F2, F4: the relay across a leadership change on a topic deleted and made again. A leader
killed -9 (or paused past its lease) right after its first commit to the new topic, before it
replaced the store's progress row (which still named the old topic id), left the next leader
to find "the topic deleted and made again since the relay last committed to it" and publish
the store's log from position 1 once more: the topic held 1..5,000 twice (read_committed),
`relay status` "0 behind". The relay's own records on the new topic (positions 1..m, in order,
equal to the store's events, whoever of this ledger's leaders wrote them) are read from its
start: the next leader goes on after the last one. Real servers on one PostgreSQL store with a
shared state key, a real broker.

F4: before a new leader's relay connected, health said `relay_lag 0` from the store's progress
row (which named a topic id since deleted), as did its /metrics gauge and its standby."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from ledger.store.relay_progress import keep, opened, read, read_anchor, read_mac
from ledger.store.snapshots import STATE_KEY_ENV, state_key
from tests.integration import waits
from tests.integration.conftest import delete_topics
from tests.integration.hakit import free_port, make_group
from tests.integration.serverkit import cli, make_token
from tests.integration.test_ha_relay_handover import build
from tests.integration.test_ha_relay_status import scrape
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


def test_a_position_not_read_back_from_the_topic_is_told_as_unknown_never_0_behind(
    tmp_path: Path, pg_store: str, kafka_bootstrap: str, kafka_topic: str, transactional_id: str
) -> None:
    """atk58 F4: a new leader's health said `connecting` (and `unavailable` while the broker
    was away) with `relay_position` the store's progress row and `relay_lag 0`, its /metrics
    `gpuledger_relay_lag_events 0`, and the standby relayed the same, while the row named a
    topic id since deleted and the topic was 25,000-30,000 short. Before the relay's first
    connect its position is not known to be the topic's: health gives no position and no lag
    and says why, the gauge is absent, `status` says "unknown". Here the broker is unreachable
    (nothing listens at the address the servers are given), so no connect ever comes."""
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    token = make_token(home)
    head = build(home, pg_store, 50)
    state_key(home)
    env = {"GPULEDGER_KAFKA_TOPIC": kafka_topic,
           "GPULEDGER_KAFKA_TRANSACTIONAL_ID": transactional_id,
           STATE_KEY_ENV: str(home / "state.key")}  # fmt: skip
    (tmp_path / "first").mkdir()
    first = make_group(tmp_path / "first", pg_store, 1, "--kafka", kafka_bootstrap, home=home)
    first.lease, first.env = "3s", env
    try:  # the log published: the store's row says position `head` on the topic's id
        (m,) = first.members
        first.start(m)
        waits.wait_for("the log published",
                       lambda: ((m.health() or {}).get("relay_position") or 0) >= head, 120,
                       first.why)  # fmt: skip
    finally:
        first.stop()
    g = make_group(tmp_path, pg_store, 2, "--kafka", f"127.0.0.1:{free_port()}", home=home)
    g.lease, g.env = "3s", env
    try:
        for m in g.members:
            g.start(m)
        leader = g.leader(timeout=90)
        (standby,) = [m for m in g.members if m is not leader]

        def told(m: Any) -> dict[str, Any] | None:
            h = m.health() or {}
            return h if h.get("relay_state") in ("connecting", "unavailable") else None

        for m in (leader, standby):
            h = waits.wait_for(f"{m.name} to tell the relay", lambda m=m: told(m), 60, g.why)
            # before: relay_position `head`, relay_lag 0
            assert h["relay_lag"] is None and h["relay_position"] is None, h
            assert "lag unknown: position" in str(h["relay_error"]), h
            assert "not yet read back from topic" in str(h["relay_error"]), h
        assert "gpuledger_relay_lag_events" not in scrape(leader.server(), token)  # before: 0
        assert "gpuledger_relay_lag_events" not in scrape(standby.server(), token)
        said = cli(leader.home, "status", GPULEDGER_URL=leader.url).stdout
        assert "relay         lag unknown, " in said, said  # before: "lag 0 events, ..."
    finally:
        g.stop()
