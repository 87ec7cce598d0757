"""atk58 F5: an ex-leader's relay touches no transactional producer, and a leader's relay fenced
by one connects again at once, saying so. A leader paused or cut off in the middle of its
relay's connect went on with it after another server took the lease: its `init_transactions`
(the ledger's one transactional id) fenced the new leader's relay, which stood still for up to
30 s while its health blamed the broker. Unit: the real SQLite store; fakes of the broker's
clients and of the store's answer on the lease (the integration test is
`tests/integration/test_ha_relay_fenced.py`)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kafka.errors import IllegalStateError, InvalidProducerEpochError, KafkaError

from ledger.store import relay as relay_module
from ledger.store.application import Ledger
from ledger.store.relay import ConnectEnded, RelayFenced
from ledger.store.relay_producer import fenced
from ledger.store.relay_service import RelayService

FENCED = "fenced by another producer of this ledger (an ex-leader)"


class _Producer:
    def __init__(self) -> None:
        self.inits = 0

    def init_transactions(self) -> None:
        self.inits += 1

    def close(self, timeout: float | None = None) -> None:
        pass


def test_an_ex_leader_whose_clock_says_it_leads_initialises_no_producer(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own clock says it leads (a frozen VM's clock stood still; a pause right after its
    check), the store says the lease is another server's: the connect ends before the init."""
    producer = _Producer()
    monkeypatch.setattr(relay_module, "ensure_topic", lambda *a, **k: 1 << 20)
    monkeypatch.setattr(relay_module, "new_producer", lambda *a: producer)
    asked: list[str] = []
    service = RelayService(ledger.home, "127.0.0.1:9", may_act=lambda: True,
                           holds=lambda: asked.append("holds") or False)  # fmt: skip
    with pytest.raises(ConnectEnded, match="the store says the lease is not this server's"):
        service._publish_once()
    assert producer.inits == 0 and asked == ["holds"] and service.relay is None


def test_a_leaders_relay_asks_the_store_and_initialises_its_producer(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    producer = _Producer()
    monkeypatch.setattr(relay_module, "ensure_topic", lambda *a, **k: 1 << 20)
    monkeypatch.setattr(relay_module, "new_producer", lambda *a: producer)
    monkeypatch.setattr(relay_module, "held_at", lambda *a: None)
    monkeypatch.setattr(relay_module.Relay, "_mark_now", lambda self: None)  # no topic: ends
    service = RelayService(ledger.home, "127.0.0.1:9", may_act=lambda: True, holds=lambda: True)
    with pytest.raises(relay_module.RelayUnavailable, match="does not exist"):
        service._publish_once()
    assert producer.inits == 1


class _Manager:
    def __init__(self, bumping: bool = False, last_error: Any = None) -> None:
        self.bumping, self.last_error = bumping, last_error

    def is_bumping_epoch(self) -> bool:
        return self.bumping


@pytest.mark.parametrize(
    ("case", "manager", "error", "want_fenced"),
    [
        ("a batch refused for its epoch", _Manager(), InvalidProducerEpochError(), True),
        ("the client's epoch bump under way (KIP-360)", _Manager(bumping=True),
         IllegalStateError("Cannot call send in state BUMPING_PRODUCER_EPOCH"), True),
        ("a refused epoch its last error", _Manager(last_error=InvalidProducerEpochError()),
         KafkaError("Cannot execute transactional method because we are in an error state"),
         True),
        ("a broker that did not answer", _Manager(), KafkaError("timed out"), False),
    ],
)  # fmt: skip
def test_a_refused_epoch_is_fenced_never_a_broker_outage(
    case: str, manager: _Manager, error: BaseException, want_fenced: bool
) -> None:
    producer = type("P", (), {"_transaction_manager": manager})()
    assert fenced(producer, error) is want_fenced, case


@pytest.mark.parametrize("holds", [True, False])
def test_fenced_under_the_lease_connects_again_at_once_and_says_why(
    ledger: Ledger, caplog: pytest.LogCaptureFixture, holds: bool
) -> None:
    service = RelayService(ledger.home, "127.0.0.1:9", may_act=lambda: True,
                           holds=lambda: holds)  # fmt: skip
    waited: list[float] = []
    service._stop.wait = lambda t=None: waited.append(t) or False  # type: ignore[method-assign,assignment]
    caplog.set_level(logging.INFO, "gpuledger.relay")
    service._fenced_under_lease(RelayFenced("relay fenced after position 7: ..."))
    if holds:  # before: "connecting again in 5 s", state `unavailable`
        assert service.health.state == "connecting" and FENCED in service.health.error
        assert waited == [0.0] and FENCED in caplog.text and "at once" in caplog.text
        service._fenced_under_lease(RelayFenced("relay fenced after position 7: ..."))
        assert waited[-1] > 0, "fenced again in a row: it waits a moment"
    else:  # the store says the lease went: quiet, as after a step-down
        assert FENCED not in caplog.text and "the lease is another server's" in caplog.text
        assert waited == [] and service.health.state != "unavailable"
