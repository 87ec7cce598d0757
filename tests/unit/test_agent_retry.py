"""An agent's registration is retried past a 429 as past a 503 (atk38-25 F5: one 429 at
registration, a cap the server says to retry past, made the agent process exit, and with it
the node's jobs went unwatched); an error of the request itself stays fatal."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from ledger.agent import node
from schemas.errors import InvalidCommand, LedgerError, TooBusy, Unavailable


def agent() -> Any:
    return SimpleNamespace(stop_event=threading.Event(), _contact=lambda sent, granted: None,
                           _error=lambda err: None,
                           client=SimpleNamespace(node_lease=None))  # fmt: skip


@pytest.mark.parametrize("refusal", [TooBusy("127.0.0.1 has 64 connections open", retry_after=1),
                                     Unavailable("the server is stopping")])  # fmt: skip
def test_a_429_or_503_at_registration_is_retried_with_one_log_line(
    refusal: LedgerError, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(node, "REFUSED_PAUSE_S", 0.001)
    calls = []

    def register() -> str:
        calls.append(1)
        if len(calls) <= 3:
            raise refusal
        return "registered"

    with caplog.at_level(logging.WARNING, logger="gpuledger.agent"):
        assert node.NodeAgent._retry(agent(), "register", register) == "registered"
    assert len(calls) == 4
    said = [r.getMessage() for r in caplog.records if "register" in r.getMessage()]
    assert len(said) == 1 and "(retrying)" in said[0], said


def test_an_error_of_the_request_itself_is_still_fatal() -> None:
    def register() -> str:
        raise InvalidCommand("no such node")

    with pytest.raises(InvalidCommand):
        node.NodeAgent._retry(agent(), "register", register)
