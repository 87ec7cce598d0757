"""The relay's window between the store's answer on the lease and Kafka's `init_transactions`
(s61, issue 25/28): a leader's relay asks the store whether its server holds the lease, then
initialises its transactional producer. If the lease moves in between and the new leader's
relay connects first, the old one's init fences the new one. What a record read from the
store then becomes, against a real broker: nothing is lost or published twice, because

- every connect reads its bookmark (the topic's last committed record) *after* its own init,
  which aborts whatever the fenced producer left open;
- every transaction asks the store again before it begins (`Relay._transaction`): records the
  old relay read from the store are not sent once the lease is another's;
- the fenced relay's batch is never committed (its commit fails), and the relay that connects
  next starts after the bookmark, whoever committed it.

A relay killed in the window has sent nothing; one killed inside a transaction leaves it open
for the next init to abort (`test_relay.py`, the crash tests). So the window is exactly-once as
the rest: these tests show it (no code change was needed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ledger.store.application import Ledger
from ledger.store.relay import Relay, RelayFenced
from tests.integration.test_relay import assert_topic_equals_store, new_relay, submit

pytestmark = pytest.mark.kafka

ReadTopic = Callable[..., list[Any]]


@pytest.mark.parametrize("old_learns", ["before its first transaction", "after one commit"])
def test_a_lease_moved_between_the_stores_answer_and_the_init_publishes_each_event_once(
    kafka_bootstrap: str,
    kafka_topic: str,
    transactional_id: str,
    org_ledger: Ledger,
    read_topic: ReadTopic,
    old_learns: str,
) -> None:
    ledger = org_ledger
    submit(ledger, 20, per_batch=5)
    n = ledger.position
    made: dict[str, Relay] = {}
    old_holds = [True]  # what the store answers the old leader's relay

    def old_asks() -> bool:
        if "new" not in made:  # the store said yes; the lease moves before the old init
            new = new_relay(ledger.home, kafka_bootstrap, kafka_topic, transactional_id,
                            holds=lambda: True)  # fmt: skip
            made["new"] = new
            assert new.publish_pending() == n  # the new leader's relay publishes first
        return old_holds[0]

    old = new_relay(ledger.home, kafka_bootstrap, kafka_topic, transactional_id, holds=old_asks)
    new = made["new"]
    try:
        assert old.position == n  # its bookmark, read after its init: the new relay's commit
        submit(ledger, 5, per_batch=5)
        if old_learns == "before its first transaction":
            old_holds[0] = False  # the store now says the lease is the other server's
            assert old.publish_pending() == 0  # the records it read from the store: not sent
        else:  # it committed a batch while the store still said yes: the store's own events
            assert old.publish_pending() == 5
            old_holds[0] = False
        with pytest.raises(RelayFenced):  # the old init fenced the new leader's producer
            new.publish_pending()
        # the new leader's relay connects again (its service does so at once, holding the lease)
        again = new_relay(ledger.home, kafka_bootstrap, kafka_topic, transactional_id,
                          holds=lambda: True)  # fmt: skip
        made["again"] = again
        assert again.position == (n if old_learns == "before its first transaction" else n + 5)
        submit(ledger, 3, per_batch=3)
        assert again.publish_pending() == (8 if old_learns == "before its first transaction"
                                           else 3)  # fmt: skip
    finally:
        for relay in (old, *made.values()):
            relay.close()
    assert_topic_equals_store(read_topic(kafka_topic), ledger.home)
