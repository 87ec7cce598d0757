"""A standby runs no relay: its health and `relay status` tell the leader's relay as the leader
last reported it to the store (atk52-ha F4: "no Kafka" from every standby)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ledger.cli.kafka import _servers_relay
from ledger.server.app import _leaders_relay
from ledger.server.ha import relay_word
from ledger.store.lease import RelayWord
from schemas.api import Health


def health(**kw: Any) -> Health:
    base: dict[str, Any] = dict(
        status="up", version="v", started_at=0.0, head=30, cycles=0, last_cycle_at=None,
        last_cycle_s=None, projection_position=30, projection_lag=0, relay_position=None,
        relay_lag=None,
    )  # fmt: skip
    return Health(**(base | kw))


def test_a_server_reports_its_relay_or_none() -> None:
    assert relay_word((None, None), None) is None  # no Kafka
    assert relay_word(("publishing", None), 12) == RelayWord("publishing", 12, "")
    assert relay_word(("stopped", "fenced"), 12) == RelayWord("stopped", 12, "fenced")


def test_a_standbys_health_names_the_leaders_relay_and_how_old_the_word_is() -> None:
    ha = SimpleNamespace(leader_relay=lambda: None, leader_address=lambda: "http://a")
    assert _leaders_relay(ha) == (None, None, None)  # no leader, or it reported none
    ha.leader_relay = lambda: (RelayWord("stopped", 9, "fenced"), 1.4)
    assert _leaders_relay(ha) == (
        9, "stopped", "the leader's relay (http://a), as it reported 1 s ago: fenced"
    )  # fmt: skip


def test_relay_status_on_a_standby_prints_the_leaders_relay_from_the_server() -> None:
    said = "the leader's relay (http://a), as it reported 1 s ago: fenced"
    told = health(role="standby", relay_position=25, relay_lag=5, relay_state="stopped",
                  relay_error=said)  # fmt: skip
    ctx = SimpleNamespace(remote=SimpleNamespace(get=lambda *_a, **_k: told))
    line, ok = _servers_relay(ctx) or ("", True)  # type: ignore[arg-type]
    assert line.startswith("relay stopped: position 25, lag 5 behind this standby's log")
    assert line.endswith("(the leader's relay (http://a), as it reported 1 s ago: fenced)")
    assert not ok
    leader = SimpleNamespace(remote=SimpleNamespace(get=lambda *_a, **_k: health(
        role="leader", relay_position=25, relay_lag=0, relay_state="publishing")))  # fmt: skip
    assert _servers_relay(leader) is None  # type: ignore[arg-type]  # its home's record says
    assert _servers_relay(SimpleNamespace(remote=None)) is None  # type: ignore[arg-type]
