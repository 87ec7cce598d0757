"""atk55-25 F6: two ledgers on one Kafka cluster (two topics) shared the default transactional
id `gpuledger-relay`, and each relay's start fenced the other's (`relay fenced after position
...`, stopped until a leadership change). The default is one id per topic now: the same for every
server and start of one ledger (a zombie leader's relay is still fenced), never another's."""

from __future__ import annotations

from pathlib import Path

from ledger.store.relay_service import RelayService


def test_two_topics_get_two_ids_and_one_topic_always_the_same(tmp_path: Path) -> None:
    def tid(home: Path, topic: str) -> str:
        home.mkdir(exist_ok=True)
        return RelayService(home, "127.0.0.1:9", topic=topic).transactional_id

    a, b = tmp_path / "a", tmp_path / "b"
    assert tid(a, "gpuledger.events") == "gpuledger-relay"  # the default topic's, as before
    assert tid(a, "lab.events") != tid(b, "other.events")  # two ledgers: was gpuledger-relay
    assert tid(a, "lab.events") == tid(b, "lab.events") == "gpuledger-relay.lab.events"
    told = RelayService(a, "127.0.0.1:9", topic="lab.events", transactional_id="mine")
    assert told.transactional_id == "mine"  # GPULEDGER_KAFKA_TRANSACTIONAL_ID still wins
