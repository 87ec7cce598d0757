"""The relay's transaction commit waits for the broker a bounded time (unit: fakes of the
producer's two internals the commit uses)."""

from __future__ import annotations

import inspect
import time

import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaTimeoutError
from kafka.producer.transaction_manager import TransactionalRequestResult

from ledger.store.relay_producer import commit as _commit


class _Manager:
    def __init__(self, answered: bool) -> None:
        self.answered = answered

    def begin_commit(self) -> TransactionalRequestResult:
        result = TransactionalRequestResult()
        if self.answered:
            result.done()
        return result


class _Sender:
    def __init__(self) -> None:
        self.woken = 0

    def wakeup(self) -> None:
        self.woken += 1


class _Producer:
    def __init__(self, answered: bool) -> None:
        self._transaction_manager = _Manager(answered)
        self._sender = _Sender()


def test_an_answered_commit_returns_after_waking_the_sender() -> None:
    producer = _Producer(answered=True)
    _commit(producer, 5.0)
    assert producer._sender.woken == 1


def test_a_commit_the_broker_never_answers_times_out_instead_of_holding_the_relay() -> None:
    producer = _Producer(answered=False)
    t0 = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match=r"did not answer the commit in 0\.2 s"):
        _commit(producer, 0.2)
    assert 0.15 <= time.monotonic() - t0 < 5


def test_the_client_still_has_the_internals_the_bounded_commit_uses() -> None:
    """Without them `_commit` falls back to the unbounded `commit_transaction`."""
    source = inspect.getsource(KafkaProducer.__init__)
    assert "self._transaction_manager =" in source and "self._sender =" in source
    assert "wait(" in inspect.getsource(KafkaProducer.commit_transaction)
