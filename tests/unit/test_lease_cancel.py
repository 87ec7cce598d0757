"""The lease's watchdog cancels a statement that outlives its answer time on a timer thread;
over a silent partition the cancel itself gets no answer (psycopg's `CancellationTimeout`),
which was an unhandled "Exception in thread" traceback in the server's log (atk45ha F3)."""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest

from ledger.store.lease import cancel_quietly


class Silent:
    def cancel_safe(self, timeout: float) -> None:
        raise psycopg.errors.CancellationTimeout("cancellation timeout expired")


def test_a_cancel_nobody_answers_is_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    raised: list[BaseException] = []
    hook, threading.excepthook = threading.excepthook, lambda a: raised.append(a.exc_value)  # type: ignore[assignment,arg-type]
    try:
        with caplog.at_level(logging.WARNING, "gpuledger.lease"):
            timer = threading.Timer(0.0, cancel_quietly, (Silent(),))
            timer.start()
            timer.join(5)
    finally:
        threading.excepthook = hook
    assert raised == []
    assert (
        "could not be cancelled: CancellationTimeout: cancellation timeout expired" in caplog.text
    )
