"""A stop's deadline binds the relay round already under way (atk56-25 F1: a leader SIGTERMed
mid-republish flushed and committed its round with the full 30 s timeout, its `deadline` read
only when the round began, and exited after 28-51 s). Unit: fakes of the producer and of the
relay under the service."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ledger.store import relay as relay_module
from ledger.store.relay import Relay
from ledger.store.relay_service import RelayService


class _Producer:
    def __init__(self) -> None:
        self.flushed: list[float] = []

    def begin_transaction(self) -> None:
        pass

    def flush(self, timeout: float) -> None:
        self.flushed.append(timeout)


def _relay(deadline: Any) -> tuple[Relay, _Producer]:
    relay = Relay.__new__(Relay)
    producer = _Producer()
    relay.producer, relay.timeout_s, relay.position = producer, 30.0, 0
    relay.transactional_id, relay.waiting_since = "t", None
    relay._going_on, relay._deadline, relay._holds = None, deadline, None
    relay._check_sent = lambda: None  # type: ignore[method-assign]
    return relay, producer


def test_a_deadline_set_while_the_batch_is_sent_bounds_its_flush_and_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    committed: list[float] = []
    monkeypatch.setattr(relay_module, "commit", lambda _, timeout: committed.append(timeout))
    stop: list[float] = []
    relay, producer = _relay(lambda: stop[0] if stop else None)
    with relay._transaction():  # the round began with no deadline; the stop comes meanwhile
        stop.append(time.monotonic() + 2.0)
    assert producer.flushed and producer.flushed[0] <= 2.0, producer.flushed
    assert committed and committed[0] <= 2.0, committed


class _Seen:
    """A relay whose round sees the service stopped while it runs."""

    reconnects = False
    position = 0

    def __init__(self, service: RelayService) -> None:
        self.service = service
        self.seen: list[float | None] = []

    def publish_pending(self, going_on: Any, deadline: Any) -> int:
        self.service._deadline = time.monotonic() + 3.0  # what `stop()` sets, mid-round
        self.seen.append(deadline() if callable(deadline) else deadline)
        self.service._deadline = None
        self.seen.append(deadline() if callable(deadline) else deadline)
        return 0

    def store_head(self) -> int:
        return 0


def test_the_services_round_reads_the_stops_deadline_set_after_it_began(tmp_path: Path) -> None:
    service = RelayService(tmp_path, "127.0.0.1:9")
    fake = _Seen(service)
    service.relay = fake  # type: ignore[assignment]
    service._publish_once()
    at, after = fake.seen
    assert at is not None and 0 < at - time.monotonic() <= 3.0, fake.seen
    assert after is None, fake.seen


def test_a_round_of_a_lease_run_out_ends_at_once(tmp_path: Path) -> None:
    held = [True]
    service = RelayService(tmp_path, "127.0.0.1:9", may_act=lambda: held[0])
    assert service._round_deadline() is None
    held[0] = False  # the lease ran out while the round ran: its next flush or commit is cut
    deadline = service._round_deadline()
    assert deadline is not None and deadline <= time.monotonic()
