"""The position a relay service shows (its health, the server's `/v1/health` and the `/metrics`
relay lag) is the topic's once its relay connected, and the store's progress row before that:
never the home's `relay.json` over them. atk56-25 F2: after a failover the new leader said
`connecting, relay_position 45021, relay_lag 0` for 38 s while the topic held 25,000 (its
relay.json from before the topic was made again), and another's `/metrics` lag said 40,025
where the topic was 10,025 short (its relay.json said 5,000; the other server had published
to 35,000). Unit: the real SQLite store; a fake of the relay under the service."""

from __future__ import annotations

from pathlib import Path

import msgspec

from ledger.store.application import Ledger
from ledger.store.relay import open_store
from ledger.store.relay_health import RelayHealth, health_path
from ledger.store.relay_progress import keep
from ledger.store.relay_service import RelayService
from ledger.store.snapshots import state_key

TOPIC = "t"


def _left(home: Path, position: int) -> None:
    """The health a previous service of this home left: its relay at `position`."""
    health = RelayHealth(state="exited", bootstrap="127.0.0.1:9", topic=TOPIC, position=position)
    health_path(home).write_bytes(msgspec.json.encode(health))


class _Connected:
    """A relay connected at `position` (its bookmark on the topic)."""

    remakes = 0
    skipped: tuple[int, ...] = ()
    remade_note = ""
    remade_from = 1
    mark = None

    def __init__(self, position: int, head: int) -> None:
        self.position, self.head = position, head

    def store_head(self) -> int:
        return self.head


def test_a_connected_relays_position_is_the_topics_not_the_homes_higher_word(
    tmp_path: Path,
) -> None:
    _left(tmp_path, 45_021)  # this home published it all, before the topic was made again
    service = RelayService(tmp_path, "127.0.0.1:9", topic=TOPIC)
    service.relay = _Connected(25_000, 45_021)  # type: ignore[assignment]
    service._set("connecting", head=45_021)
    # before: 45,021 (the higher of the two), "lag 0" with 20,021 events not on the topic
    assert (service.health.position, service.health.lag) == (25_000, 20_021)
    service.relay.position = 30_000  # type: ignore[union-attr]
    service._busy_since = 1.0
    assert service._moving()  # the round commits: `publishing` (before: not until 45,021)


def test_before_its_first_connect_the_position_is_the_stores_progress_row(
    org_ledger: Ledger,
) -> None:
    home, head = org_ledger.home, org_ledger.position
    _left(home, 1)  # this home's relay published 1; another server's since published more
    keep(open_store(home), TOPIC, head - 1, state_key(home))
    service = RelayService(home, "127.0.0.1:9", topic=TOPIC)
    service._read_word()  # the thread's first step, before it waits or connects
    assert service.health.state == "connecting"
    assert (service.health.position, service.health.lag) == (head - 1, 1)  # before: (1, head - 1)
    assert service._published == 1  # the home's word (the relay's floor) is kept as it was


def test_a_row_that_does_not_verify_is_not_shown(org_ledger: Ledger) -> None:
    home, head = org_ledger.home, org_ledger.position
    _left(home, 1)
    keep(open_store(home), TOPIC, head - 1, b"another key" * 3)
    service = RelayService(home, "127.0.0.1:9", topic=TOPIC)
    service._read_word()
    assert service.health.position == 1


def test_a_started_services_first_health_is_the_stores_progress_row(org_ledger: Ledger) -> None:
    """atk55-25 F7: a new leader's first health said its relay.json's position (`connecting,
    relay_position 5000, relay_lag 55036` for ~2 s, the topic whole): `start()` returns once
    the row is read, and the first relay.json it writes says it too."""
    home, head = org_ledger.home, org_ledger.position
    _left(home, 1)
    keep(open_store(home), TOPIC, head - 1, state_key(home))
    service = RelayService(home, "127.0.0.1:9", topic=TOPIC, connect_timeout_s=1).start()
    try:
        shown = service.health.position  # what /v1/health says as soon as the service is there
        written = msgspec.json.decode(health_path(home).read_bytes(), type=RelayHealth).position
    finally:
        service.stop(flush=False)
    assert (shown, written) == (head - 1, head - 1)  # before: (1, 1)


def test_before_its_first_connect_no_lag_is_told_from_the_stores_row(org_ledger: Ledger) -> None:
    """atk58 F4: before its first connect a new leader's health said `relay_lag 0` (and its
    /metrics gauge 0) from the store's row, which named a topic id since deleted, the topic
    25,000-30,000 short. The position is shown (relay.json, `relay status`), and the service
    says it is not known to be the topic's (`unsure`: its server then tells no lag and these
    words); once the relay connected, it is the topic's."""
    home, head = org_ledger.home, org_ledger.position
    keep(open_store(home), TOPIC, head, state_key(home), topic_id="old-id", offset=head - 1)
    service = RelayService(home, "127.0.0.1:9", topic=TOPIC)
    service._read_word()
    assert (service.health.position, service.health.lag) == (head, 0)
    said = service.unsure()  # before: no such word, and the server said "lag 0"
    assert said.startswith(f"lag unknown: position {head:,} is the relay's last commit"), said
    assert "(on topic id old-id), not yet read back from topic t" in said, said
    service.relay = _Connected(head - 3, head)  # type: ignore[assignment]
    service._set("connecting", head=head)
    assert service.unsure() == "" and service.health.lag == 3
