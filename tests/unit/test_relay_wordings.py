"""The relay's log lines around a lost lease and a stop say what happened (atk56-25 F3): "the
lease is another server's" although this server took it again at once; a WARNING for an error
that came after the lease went; "publishing again" with the broker still down; "flushed" 4 s
after the topic was deleted; "its head is 0" with PostgreSQL down. Unit: the real SQLite
store; fakes of the relay under the service."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from ledger.store import relay_topic
from ledger.store.application import Ledger
from ledger.store.relay import RelayUnavailable
from ledger.store.relay_flush import flush
from ledger.store.relay_service import RelayService


def _relay(position: int, head: int, reconnects: bool = False) -> Any:
    relay = SimpleNamespace(position=position, remakes=0, remade_note="", remade_from=1, skipped=(),
                            mark=SimpleNamespace(topic_id="id-1", appended=True),
                            reconnects=reconnects)  # fmt: skip
    relay.store_head = lambda: head
    relay.close = lambda: None
    return relay


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "gpuledger.relay"]


def test_a_step_down_whose_server_took_the_lease_again_says_so(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    service = RelayService(ledger.home, "127.0.0.1:9", may_act=lambda: True)
    service._flushing = False
    service._stop.set()
    with caplog.at_level(logging.INFO, "gpuledger.relay"):
        service._main()
    said = " ".join(m for _, m in _lines(caplog))
    assert "took the lease again" in said, said
    assert "another server's" not in said, said  # before: "the lease is another server's"


def test_an_error_of_a_flush_after_the_lease_went_is_info(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    lease = [True]
    service = RelayService(ledger.home, "127.0.0.1:9", may_act=lambda: lease[0])

    def publish() -> int:
        lease[0] = False  # the lease runs out while the flush waits on the broker
        raise RelayUnavailable("relay stopped after position 5: KafkaTimeoutError: Timeout")

    service._publish = publish  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, "gpuledger.relay"):
        flush(service)
    lines = _lines(caplog)
    assert not [m for lvl, m in lines if lvl >= logging.WARNING and "KafkaTimeout" in m], lines
    assert any("the lease is another server's" in m for _, m in lines), lines


def test_a_round_that_ended_before_its_reconnect_does_not_say_publishing_again(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    service = RelayService(ledger.home, "127.0.0.1:9")
    relay = _relay(5, 9, reconnects=True)  # a producer that failed: the next round reconnects
    relay.publish_pending = lambda going_on, deadline: 0  # ended at once: the broker not asked
    service.relay = relay
    service.health = msgspec.structs.replace(service.health, state="unavailable")
    with caplog.at_level(logging.INFO, "gpuledger.relay"):
        service._publish_once()
    assert not any("publishing again" in m for _, m in _lines(caplog))
    assert service.health.state == "unavailable"


@pytest.mark.parametrize("same", [True, False])
def test_flushed_is_said_only_over_the_topic_the_relay_published_to(
    ledger: Ledger, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, same: bool
) -> None:
    service = RelayService(ledger.home, "127.0.0.1:9")
    service.relay = _relay(9, 9)
    service._publish = lambda: 0  # type: ignore[method-assign]  # idle: nothing to send
    monkeypatch.setattr(relay_topic, "same_topic", lambda *a: same)
    with caplog.at_level(logging.INFO, "gpuledger.relay"):
        flush(service)
    said = " ".join(m for _, m in _lines(caplog))
    assert ("relay: flushed, topic at position 9" in said) == same, said
    assert ("not flushed" in said) == (not same), said


def test_a_store_that_does_not_answer_keeps_the_last_head_known(tmp_path: Path) -> None:
    service = RelayService(tmp_path, "127.0.0.1:9")
    service.relay = _relay(9, 9)
    service._set("publishing", head=None)
    assert service.health.store_head == 9

    def away() -> int:
        raise OSError("the store does not answer")

    service.relay.store_head = away
    service._set("exited")
    assert service.health.store_head == 9  # before: 0 ("its head is 0")
    assert "its head is 0" not in service.health.line()
