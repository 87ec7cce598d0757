"""atk52-ha F4: the relay runs on the leader only, and its health was read from the leader
alone: a standby's health and `status` said "no Kafka" and its `relay status` "no relay has run"
whether the leader's relay published or had stopped. Real servers on one PostgreSQL store, a
real broker: a standby tells the leader's relay as the leader last reported it to the store."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.integration import waits
from tests.integration.hakit import make_group
from tests.integration.serverkit import cli, make_token


def test_a_standby_tells_the_leaders_relay(
    tmp_path: Path, pg_store: str, kafka_bootstrap: str, kafka_topic: str, transactional_id: str
) -> None:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    token = make_token(home)
    g = make_group(tmp_path, pg_store, 2, "--kafka", kafka_bootstrap, home=home)
    g.env = {"GPULEDGER_KAFKA_TOPIC": kafka_topic,
             "GPULEDGER_KAFKA_TRANSACTIONAL_ID": transactional_id}  # fmt: skip
    try:
        for m in g.members:
            g.start(m)
        leader = g.leader(timeout=60)
        (standby,) = [m for m in g.members if m is not leader]

        def told() -> dict[str, Any] | None:
            h = standby.health() or {}
            return h if h.get("relay_state") == "publishing" else None

        h = waits.wait_for("the standby to tell the leader's relay", told, 60, g.why)
        # before: None ("no Kafka" from every standby)
        assert h is not None and h["role"] == "standby" and h["relay_position"] >= 1, h
        assert str(h["relay_error"]).startswith(f"the leader's relay ({leader.url})"), h
        status = cli(standby.home, "status", GPULEDGER_URL=standby.url)
        assert "publishing: the leader's relay" in status.stdout, status.stdout
        said = cli(standby.home, "relay", "status", GPULEDGER_URL=standby.url, ok=False)
        assert said.returncode == 0, (said.stdout, said.stderr)  # was 1, "no relay has run"
        assert said.stdout.startswith("relay publishing: position "), said.stdout
        assert f"(the leader's relay ({leader.url})" in said.stdout, said.stdout
        # the standby's /metrics: the leader's lag under the leader's name, and the word's age
        # (stop 54: no relay lag on a standby's /metrics at all)
        samples = scrape(standby.server(), token)
        assert samples.get("gpuledger_relay_lag_events", -1) >= 0, samples
        assert 0 <= samples["gpuledger_relay_report_age_seconds"] < 15, samples
        assert "gpuledger_relay_report_age_seconds" not in scrape(leader.server(), token)
    finally:
        g.stop()


def scrape(server: Any, token: str) -> dict[str, float]:
    """The unlabelled samples of a server's /metrics."""
    status, text = server.request("GET", "/metrics", token=token)
    assert status == 200, text
    raw = text.decode() if isinstance(text, bytes) else str(text)
    return {
        s.name: s.value
        for fam in text_string_to_metric_families(raw)
        for s in fam.samples
        if not s.labels
    }


def test_a_standby_calls_a_dead_leaders_word_on_its_relay_stale(
    tmp_path: Path, pg_store: str, kafka_bootstrap: str, kafka_topic: str, transactional_id: str
) -> None:
    """atk54-25 F1, F4: the leader killed -9 (lease 30 s), the standby's health said
    relay_state "publishing" and its `relay status` exit 0 for 28-29 s, until it took the lease:
    the leader's last report had no age limit. It reports every third of the lease: past that
    and 3 s the word is stale (exit 1), well before the standby takes over; `--json` prints
    JSON (it printed the line)."""
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    g = make_group(tmp_path, pg_store, 2, "--kafka", kafka_bootstrap, home=home)
    g.lease = "30s"
    g.env = {"GPULEDGER_KAFKA_TOPIC": kafka_topic,
             "GPULEDGER_KAFKA_TRANSACTIONAL_ID": transactional_id}  # fmt: skip
    try:
        for m in g.members:
            g.start(m)
        leader = g.leader(timeout=60)
        (standby,) = [m for m in g.members if m is not leader]

        def state() -> str | None:
            h = standby.health() or {}
            assert h.get("role") in (None, "standby"), h  # took over: too late to tell
            return h.get("relay_state")

        waits.wait_for("the standby to tell the leader's relay",
                       lambda: state() == "publishing", 60, g.why)  # fmt: skip
        said = cli(standby.home, "relay", "status", "--json", GPULEDGER_URL=standby.url, ok=False)
        assert said.returncode == 0, (said.stdout, said.stderr)
        assert json.loads(said.stdout)["state"] == "publishing", said.stdout  # was the line
        leader.kill()
        killed = time.monotonic()
        waits.wait_for("the standby to call the word stale",
                       lambda: state() == "stale", 25, g.why)  # fmt: skip
        assert time.monotonic() - killed < 25  # a third of the lease + 3 s after its last report
        said = cli(standby.home, "relay", "status", GPULEDGER_URL=standby.url, ok=False)
        assert said.returncode == 1, (said.stdout, said.stderr)  # was 0, "publishing"
        assert said.stdout.startswith("relay stale: position "), said.stdout
        assert f"the leader's relay ({leader.url}) said publishing " in said.stdout, said.stdout
    finally:
        g.stop()
