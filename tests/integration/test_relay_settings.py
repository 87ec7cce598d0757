"""The relay's topic given settings under it that do not keep every event (atk51-25 F1, F4):
real broker, real store, the service's relay.

- F1: `cleanup.policy=compact` set under a running relay (AlterConfigs, no Delete): every record
  has the same key, so the broker kept only the last ones, while `relay status` said
  "publishing, 0 behind" (exit 0); the settings were read only at connect, and the hint there
  ("set cleanup.policy=delete") led to the log appended behind the records compaction left,
  which a default reader never gets past.
- F4: a retention shortened under it was not seen until the broker deleted by it (up to its
  retention check, 5 minutes by default).

Now the relay's running check (and the service's watcher, while it is idle) reads the settings
too: the relay stops in one line, and the hint is what gives readers the whole log again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from ledger.store.application import Ledger
from ledger.store.relay_health import read_health
from ledger.store.relay_topic import START_GONE_HINT, RelayError, ensure_topic
from tests.integration.test_relay_forgeries import run
from tests.integration.test_relay_progress import JOB
from tests.integration.test_relay_remade import at_head
from tests.integration.waits import wait_for

pytestmark = pytest.mark.kafka


def alter(bootstrap: str, topic: str, **settings: str) -> None:
    """Kafka IncrementalAlterConfigs on the topic, as someone with AlterConfigs on it does."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="gpuledger-test-admin")
    try:
        wanted = {k.replace("_", "."): v for k, v in settings.items()}
        admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, wanted)], incremental=True
        )
    finally:
        admin.close()


def _state(home: Path) -> str | None:
    """The relay's state as relay.json says it (what `relay status` reads)."""
    health = read_health(home)
    return None if health is None else health.state


@pytest.mark.parametrize("flowing", [True, False], ids=["events-flow", "idle"])
def test_a_topic_compacted_under_a_running_relay_stops_it_naming_a_new_topic(
    flowing: bool, org_ledger: Ledger, kafka_bootstrap: str, kafka_topic: str,
    transactional_id: str,
) -> None:  # fmt: skip
    """F1: the relay's check (events waiting) or the service's watcher (idle) sees the setting
    within seconds; `relay status` says `stopped` in one line, exit 1, naming a new topic or
    the topic deleted, never "set cleanup.policy=delete" (the compacted records stay lost)."""
    home = org_ledger.home
    service = at_head(org_ledger, kafka_bootstrap, kafka_topic, transactional_id)
    try:
        alter(kafka_bootstrap, kafka_topic, cleanup_policy="compact")
        if flowing:
            org_ledger.execute_all([JOB] * 2)
        wait_for("the relay stopped", lambda: service.health.state == "stopped", 30,
                 lambda: str(service.health))  # fmt: skip
        # and relay.json says so (written, synced, just after the health in memory: under
        # load `relay status` read the file's `publishing` before it)
        wait_for("relay.json to say stopped", lambda: _state(home) == "stopped", 30,
                 lambda: str(read_health(home)))  # fmt: skip
        out = run("--home", str(home), "relay", "status", code=1)
    finally:
        health = service.stop()
    said = f"topic {kafka_topic} has cleanup.policy=compact: it would not keep every event"
    assert said in health.error and START_GONE_HINT in health.error, health.error
    assert "set cleanup.policy=delete" not in health.error, health.error
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("relay stopped:") and said in lines[0], out
    # a relay started on it refuses it at connect, with the same fix
    with pytest.raises(RelayError) as refused:
        ensure_topic(kafka_bootstrap, kafka_topic)
    assert said in refused.value.message and refused.value.hint == START_GONE_HINT


def test_a_retention_shortened_under_a_running_relay_stops_it_before_the_broker_deletes(
    org_ledger: Ledger, kafka_bootstrap: str, kafka_topic: str, transactional_id: str,
) -> None:  # fmt: skip
    """F4: `retention.ms=1000` under a running relay: it said "publishing, 0 behind" until the
    broker deleted by it. It stops at its next check; the start still there, the hint is to
    set the retention back at once (or, once deleted, the fix of a topic whose start is gone)."""
    service = at_head(org_ledger, kafka_bootstrap, kafka_topic, transactional_id)
    try:
        alter(kafka_bootstrap, kafka_topic, retention_ms="1000")
        org_ledger.execute_all([JOB] * 2)
        wait_for("the relay stopped", lambda: service.health.state == "stopped", 30,
                 lambda: str(service.health))  # fmt: skip
    finally:
        health = service.stop()
    said = f"topic {kafka_topic} has retention.ms=1000: it would not keep every event"
    assert said in health.error and START_GONE_HINT in health.error, health.error
    if "its start is still there" in health.error:  # (else the broker deleted by it first)
        assert "set retention.ms=-1 on the topic at once" in health.error, health.error
