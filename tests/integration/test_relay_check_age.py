"""How old the relay's last check of its topic is (the record's `checked`: the topic found the
one the relay published to, every second, at a connect, at a commit): `relay status` told it
alone (stop 59's closing note); now the server's `/v1/health` (`relay_checked_s_ago`) and
`/metrics` (`gpuledger_relay_topic_checked_age_seconds`) tell it too, all three from one
computation (`RelayHealth.checked_s_ago`). A real server and a private broker made to hang
(SIGSTOP: connections open, no answers): the age counts up in all three alike, and falls back
once the broker answers (docs/kafka.md, "How old the topic's check is")."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.serverkit import (
    GPULEDGER,
    Server,
    env_for,
    make_token,
    set_up_ledger,
    start_server,
)
from tests.integration.waits import wait_for

pytestmark = pytest.mark.kafka

GAUGE = "gpuledger_relay_topic_checked_age_seconds"


def _health(server: Server) -> dict[str, Any]:
    status, body = server.request("GET", "/v1/health")
    assert status == 200, body
    return dict(body)


def _gauge(server: Server, token: str) -> float | None:
    status, text = server.request("GET", "/metrics", token=token)
    assert status == 200, text
    raw = text.decode() if isinstance(text, bytes) else str(text)
    got = [s.value for f in text_string_to_metric_families(raw) for s in f.samples
           if s.name == GAUGE]  # fmt: skip
    return got[0] if got else None


def _status_age(home: Path) -> tuple[int, float | None]:
    """`relay status`: (exit code, the age of the topic's last check it says, if it says one)."""
    done = subprocess.run([GPULEDGER, "--home", str(home), "relay", "status"], env=env_for(home),
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    said = re.search(r"as of its topic's last check, ([\d,]+) s ago", done.stdout)
    return done.returncode, float(said.group(1).replace(",", "")) if said else None


def test_the_topic_check_s_age_counts_up_alike_in_health_metrics_and_relay_status(
    tmp_path: Path, own_broker: Any
) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    token = make_token(home, "--user", "alice")
    server = start_server(home, "--interval", "0.2s", "--kafka", own_broker.bootstrap)
    pid = int((own_broker.data / "kafka.pid").read_text().split()[0])
    try:
        wait_for("the relay to publish", lambda: _health(server)["relay_state"] == "publishing"
                 and _health(server)["relay_checked_s_ago"] is not None, 90,
                 lambda: server.log_path.read_text())  # fmt: skip
        fresh = _health(server)["relay_checked_s_ago"]
        assert 0 <= fresh < 4, fresh  # checked every second
        assert (_gauge(server, token) or 99.0) < 4
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for("the check's age to pass 6 s", lambda: (
                _health(server)["relay_checked_s_ago"] or 0) > 6, 60)  # fmt: skip
            low = _health(server)["relay_checked_s_ago"]
            gauge = _gauge(server, token)
            code, said = _status_age(home)  # it asks the broker itself too (2 s at most)
            high = _health(server)["relay_checked_s_ago"]
            assert gauge is not None and low - 0.5 <= gauge <= high + 0.5, (low, gauge, high)
            assert code == 1 and said is not None and low - 1 <= said <= high + 1, (
                low, said, high)  # fmt: skip
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for("a check once the broker answers", lambda: (
            _health(server)["relay_checked_s_ago"] or 99.0) < 4, 90)  # fmt: skip
        assert (_gauge(server, token) or 99.0) < 5
        began = time.monotonic()
        wait_for("relay status to say no age", lambda: _status_age(home) == (0, None), 60)
        assert time.monotonic() - began < 60
    finally:
        assert server.stop() == 0, server.log_path.read_text()
