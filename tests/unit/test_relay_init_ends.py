"""A stop ends the relay's `init_transactions` under way (stop 57's note: bounded only by the
producer's `max_block_ms`, its 30 s set when it was made, so a stopping server whose broker
hung kept its relay thread). Unit: the real SQLite store; a fake of kafka-python's producer
that waits for its answer as kafka-python does (`max_block_ms`, read at each call)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError

from ledger.store import relay as relay_module
from ledger.store.application import Ledger
from ledger.store.relay_service import RelayService


class _Unanswered:
    """A producer whose InitProducerId is never answered (a broker hung or gone)."""

    def __init__(self, max_block_s: float) -> None:
        self.config: dict[str, Any] = {"max_block_ms": int(max_block_s * 1000)}
        self.asked = threading.Event()
        self._answer = threading.Event()

    def init_transactions(self) -> None:
        self.asked.set()
        if not self._answer.wait(self.config["max_block_ms"] / 1000):
            raise KafkaTimeoutError("Timeout expired while initializing transactional state")

    def close(self, timeout: float | None = None) -> None:
        pass


def _made(monkeypatch: pytest.MonkeyPatch) -> list[_Unanswered]:
    made: list[_Unanswered] = []

    def new_producer(*a: Any) -> _Unanswered:
        made.append(_Unanswered(a[3]))  # its max_block_ms: the timeout it was made with
        return made[-1]

    monkeypatch.setattr(relay_module, "ensure_topic", lambda *a, **k: 1 << 20)
    monkeypatch.setattr(relay_module, "new_producer", new_producer)
    return made


@pytest.mark.parametrize("flush", [True, False], ids=["a stop that flushes", "a step-down"])
def test_a_stop_ends_the_init_transactions_under_way(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch, flush: bool
) -> None:
    made = _made(monkeypatch)
    service = RelayService(ledger.home, "127.0.0.1:9", timeout_s=30, connect_timeout_s=1,
                           flush_s=10).start()  # fmt: skip
    deadline = time.monotonic() + 10
    while not made and time.monotonic() < deadline:
        time.sleep(0.02)
    assert made and made[0].asked.wait(10)
    began = time.monotonic()
    service.stop(flush=flush)
    took = time.monotonic() - began
    # before: the thread waited the producer's 30 s; stop() gave up after 16 s, `lingering`
    assert not service.lingering, "the relay thread still waits for init_transactions"
    assert took < 3, f"the stop took {took:.1f} s"
    assert made[0].config["max_block_ms"] == 30_000  # the producer's own setting put back


def test_a_flushs_own_connect_waits_until_its_deadline(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connect begun after the stop (the flush's) is not cut by it: its deadline bounds it."""
    _made(monkeypatch)
    service = RelayService(ledger.home, "127.0.0.1:9", timeout_s=30, connect_timeout_s=1,
                           flush_s=1.5)  # fmt: skip
    service._stop.set()
    service._deadline = time.monotonic() + 1.5
    began = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - ended at the deadline (ConnectEnded)
        service._publish_once()
    took = time.monotonic() - began
    assert 1.2 < took < 3, f"the flush's connect took {took:.1f} s"
