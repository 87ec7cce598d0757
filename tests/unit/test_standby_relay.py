"""A standby runs no relay: its health and `relay status` tell the leader's relay as the leader
last reported it to the store (atk52-ha F4: "no Kafka" from every standby)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ledger.cli.kafka import _servers_relay
from ledger.server import ha as ha_module
from ledger.server.app import _leaders_relay
from ledger.server.ha import Leadership, relay_word, relay_word_s
from ledger.store.lease import Member, RelayWord
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
    ha = SimpleNamespace(leader_relay=lambda: None, leader_address=lambda: "http://a",
                         relay_word_s=relay_word_s(30.0))  # fmt: skip
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
    line, ok, _report = _servers_relay(ctx) or ("", True, {})  # type: ignore[arg-type]
    assert line.startswith("relay stopped: position 25, lag 5 behind this standby's log")
    assert line.endswith("(the leader's relay (http://a), as it reported 1 s ago: fenced)")
    assert not ok
    leader = SimpleNamespace(remote=SimpleNamespace(get=lambda *_a, **_k: health(
        role="leader", relay_position=25, relay_lag=0, relay_state="publishing")))  # fmt: skip
    assert _servers_relay(leader) is None  # type: ignore[arg-type]  # its home's record says
    assert _servers_relay(SimpleNamespace(remote=None)) is None  # type: ignore[arg-type]


def test_a_leaders_word_older_than_its_reporting_interval_and_a_margin_is_stale() -> None:
    """atk54-25 F1: the leader killed -9 or paused (lease 30 s), a standby's health said
    "publishing" for 28-29 s, and `relay status` there exit 0: its last word had no age limit."""
    assert relay_word_s(30.0) == 10.0 + 3.0
    assert relay_word_s(1.5) == 1.0 + 3.0  # a second at least between reports
    ha = SimpleNamespace(leader_address=lambda: "http://a", relay_word_s=relay_word_s(30.0),
                         leader_relay=lambda: (RelayWord("publishing", 10, ""), 12.6))  # fmt: skip
    assert _leaders_relay(ha)[1] == "publishing"
    ha.leader_relay = lambda: (RelayWord("publishing", 10, ""), 13.4)
    position, state, error = _leaders_relay(ha)
    assert (position, state) == (10, "stale")
    assert error == (
        "the leader's relay (http://a) said publishing 13 s ago, no report since: its server is "
        "down, paused or cut off from the store"
    )
    told = health(role="standby", relay_position=10, relay_lag=0, relay_state=state,
                  relay_error=error)  # fmt: skip
    ctx = SimpleNamespace(remote=SimpleNamespace(get=lambda *_a, **_k: told))
    line, ok, report = _servers_relay(ctx) or ("", True, {})  # type: ignore[arg-type]
    assert line.startswith("relay stale: position 10") and not ok
    assert report["state"] == "stale" and report["stale"] is True


def test_the_leaders_word_ages_while_the_store_does_not_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """atk54-25 F2: PostgreSQL paused, the standby said "as it reported 7 s ago" for 20 s: the
    age was the last read's, no time added since."""
    now = [100.0]
    monkeypatch.setattr(ha_module.time, "monotonic", lambda: now[0])
    ha = object.__new__(Leadership)
    ha.members = [Member("h", "http://a", "leader", 10, 2.0, RelayWord("publishing", 10, ""))]
    ha._members_read_at = 100.0
    monkeypatch.setattr(Leadership, "leader_address", lambda _self: "http://a")
    assert ha.leader_relay() == (RelayWord("publishing", 10, ""), 2.0)
    now[0] = 120.0  # no read since
    assert ha.leader_relay() == (RelayWord("publishing", 10, ""), 22.0)


def test_relay_status_on_a_standbys_home_asks_its_server_in_json_and_over_an_old_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """atk54-25 F3: a standby on the home of a leader killed -9 printed that home's old
    relay.json ("no service updates it", while one served there), not the leader's relay. F4:
    `relay status --json` on a standby's home printed the text line."""
    import json
    import time

    import msgspec
    from click.testing import CliRunner

    from ledger.cli import cli
    from ledger.cli import kafka as kafka_cli
    from ledger.store.relay_health import RelayHealth, health_path

    said = "the leader's relay (http://b), as it reported 1 s ago"
    told = ("relay publishing: position 10, lag 0 behind this standby's log (" + said + ")", True,
            {"state": "publishing", "position": 10, "lag": 0, "error": said,
             "told_by": "standby", "stale": False})  # fmt: skip
    monkeypatch.setattr(kafka_cli, "_servers_relay", lambda _ctx: told)
    old = RelayHealth(state="publishing", bootstrap="b", topic="t", position=7, store_head=7,
                      updated=time.time() - 600)  # fmt: skip
    health_path(tmp_path).write_bytes(msgspec.json.encode(old))
    done = CliRunner().invoke(cli, ["--home", str(tmp_path), "relay", "status"])
    assert done.exit_code == 0 and done.output.strip() == told[0], done.output
    done = CliRunner().invoke(cli, ["--home", str(tmp_path), "relay", "status", "--json"])
    assert done.exit_code == 0 and json.loads(done.output) == told[2], done.output


def test_a_kept_scrape_drops_the_report_age_once_the_leaders_word_is_stale() -> None:
    """atk55-25 F5: a standby's scrape served from the kept figures replaced only the keys
    `service_figures` returned: once the leader's word was stale there was no age key, and the
    kept age (2.302 s) stayed, frozen, beside no lag."""
    import msgspec

    from ledger.server.metrics import Figures, service_figures

    word: list[tuple[RelayWord, float]] = [(RelayWord("publishing", 25, ""), 2.302)]
    ha = SimpleNamespace(leader_relay=lambda: word[0], relay_word_s=relay_word_s(5.0),
                         role="standby", epoch=3, servers=lambda head: [])  # fmt: skip
    service = SimpleNamespace(relay_position=lambda: None, relay_state=lambda: (None, None),
                              relay_checked_s_ago=lambda: None,
                              stats=SimpleNamespace(
        cycles=0, engine_away=None), executor=SimpleNamespace(heard_from=dict))  # fmt: skip
    view = SimpleNamespace(ledger=SimpleNamespace(position=30), moment=100.0)
    kept = Figures(now=100.0, head=30, cycles=0, projection_position=30, projection_lag_s=0.0,
                   relay_lag=None, queue_by_code={}, queue_by_team={}, placements={},
                   preemptions={}, teams=[], heartbeat_ages={})  # fmt: skip
    fresh = msgspec.structs.replace(kept, **service_figures(service, ha, view))
    assert (fresh.relay_lag, fresh.relay_report_age_s) == (5, 2.302)
    word[0] = (RelayWord("publishing", 25, ""), 60.0)  # the leader paused: stale
    stale = msgspec.structs.replace(fresh, **service_figures(service, ha, view))
    assert (stale.relay_lag, stale.relay_report_age_s) == (None, None)


def test_a_server_that_does_not_act_tells_the_leaders_relay_and_a_stopped_relay_is_its_error() -> (
    None
):
    """atk61-ha F6: a server resumed past its lease, before its worker stepped down, said its
    own relay "publishing" while standby; a stopped relay left health's `last_error` None."""
    from ledger.server.app import relay_health

    leaders = SimpleNamespace(leader_relay=lambda: (RelayWord("publishing", 9, ""), 1.0),
                              leader_address=lambda: "http://b", relay_word_s=5.0)  # fmt: skip
    own = SimpleNamespace(
        relay_position=lambda: 7,
        relay_state=lambda: ("publishing", None),
        stats=SimpleNamespace(last_error=None),
        kafka="k:9092",
    )
    resumed = SimpleNamespace(service=own, ha=SimpleNamespace(acting=lambda: False, **vars(
        leaders)))  # fmt: skip
    relay, state, error, _ = relay_health(resumed)
    assert (relay, state) == (9, "publishing") and "http://b" in (error or ""), error
    leading = SimpleNamespace(service=own, ha=SimpleNamespace(acting=lambda: True))
    assert relay_health(leading)[:3] == (7, "publishing", None)
    stopped = SimpleNamespace(
        relay_position=lambda: 7,
        relay_state=lambda: ("stopped", "topic t is ahead of the store"),
        stats=SimpleNamespace(last_error=None),
        kafka="k:9092",
    )
    alone = SimpleNamespace(service=stopped, ha=None)
    assert relay_health(alone)[3] == "the relay stopped: topic t is ahead of the store"
