"""A relay's connect ends at its next step once its round may not go on (a stop, the lease
gone): atk56-25 F2, a step-down's relay went on connecting for 8-18 s at load 40 (the producer,
its `init_transactions`, the open-transaction check, the topic's mark, the bookmark's read of
the tail) and the next relay of its server waited for it. Unit: the real SQLite store; fakes of
the broker's clients."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from ledger.store import relay as relay_module
from ledger.store import relay_tail
from ledger.store.application import Ledger
from ledger.store.relay import ConnectEnded
from ledger.store.relay_service import RelayService


class _Producer:
    def __init__(self, during_init: Any) -> None:
        self.during_init = during_init

    def init_transactions(self) -> None:
        self.during_init()  # what happens while the broker answers (seconds at load)

    def close(self, timeout: float | None = None) -> None:
        pass


def _broker(monkeypatch: pytest.MonkeyPatch, during_init: Any) -> list[str]:
    """Fakes of the broker's clients; the steps asked after `init_transactions`."""
    asked: list[str] = []
    monkeypatch.setattr(relay_module, "ensure_topic", lambda *a, **k: 1 << 20)
    monkeypatch.setattr(relay_module, "new_producer", lambda *a: _Producer(during_init))

    def held_at(*a: Any) -> None:
        asked.append("held_at")
        time.sleep(8)  # the connect's next steps, seconds each at load
        raise RuntimeError("the connect went on")

    monkeypatch.setattr(relay_module, "held_at", held_at)
    return asked


def test_a_step_down_during_the_connect_ends_it_at_its_next_step(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = [True]
    asked = _broker(monkeypatch, lambda: lease.__setitem__(0, False))  # the lease runs out
    service = RelayService(ledger.home, "127.0.0.1:9", may_act=lambda: lease[0])
    # before: it went on (the open-transaction check, the mark, the tail), RelayUnavailable
    with pytest.raises(ConnectEnded):
        service._publish_once()
    assert asked == [] and service.relay is None


def test_a_stop_ends_the_connect_under_way_and_its_thread(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    connecting, stopped = threading.Event(), threading.Event()

    def during_init() -> None:
        connecting.set()
        stopped.wait(10)

    asked = _broker(monkeypatch, during_init)
    service = RelayService(ledger.home, "127.0.0.1:9", may_act=lambda: True).start()
    assert connecting.wait(10)
    threading.Timer(0.2, stopped.set).start()
    began = time.monotonic()
    service.stop(flush=False)  # a step-down while its relay connects
    assert not service.lingering, "the relay thread still connects"
    assert time.monotonic() - began < 5
    assert asked == []


def test_a_bookmarks_read_asks_every_so_many_records() -> None:
    asked: list[int] = []

    def check() -> None:
        asked.append(1)
        if len(asked) == 3:
            raise ConnectEnded("ended")

    got = relay_tail._checked(iter(range(10 * relay_tail.CHECK_EVERY)), check)
    with pytest.raises(ConnectEnded):
        list(got)
    assert len(asked) == 3
