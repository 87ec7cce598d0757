"""A live relay's lag is told exact only while its topic was checked lately (atk55-25 F2: an
idle relay under load saw its topic deleted only 4-28 s later, and `relay status` said
"publishing ..., 0 behind the store", exit 0, over a topic that did not exist). The record
keeps when the topic was last found the one the relay published to (`checked`); older than a
few check intervals, the line says how old, claims no exact lag, and exits 1."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from ledger.cli import cli
from ledger.store import relay_topic
from ledger.store.application import Ledger
from ledger.store.relay_health import RelayHealth, health_path
from ledger.store.relay_service import RelayService

NOW = 1_000_000.0


def _record(checked: float, position: int = 7, head: int = 7) -> RelayHealth:
    return RelayHealth(state="publishing", bootstrap="b", topic="t", position=position,
                       store_head=head, updated=NOW - 0.5, checked=checked)  # fmt: skip


def test_a_topic_checked_lately_has_an_exact_lag() -> None:
    fresh = _record(NOW - 0.8)
    assert fresh.line(NOW, 7) == "relay publishing: t at b, position 7, 0 behind the store"
    assert fresh.report(NOW, 7)["lag_known"] == "exact"


@pytest.mark.parametrize("lag", [0, 3])
def test_a_topic_unchecked_for_12_s_says_how_old_its_check_is(lag: int) -> None:
    old = _record(NOW - 12)
    line = old.line(NOW, 7 + lag)
    assert f"{lag} behind the store as of its topic's last check, 12 s ago" in line, line
    assert not line.endswith(f", {lag} behind the store")  # before: all it said
    assert old.report(NOW, 7 + lag)["lag_known"] != "exact"


def test_relay_status_exits_1_over_a_topic_not_checked_lately(org_ledger: Ledger) -> None:
    home, head = org_ledger.home, org_ledger.position
    now = time.time()
    record = RelayHealth(state="publishing", bootstrap="b", topic="t", position=head,
                         store_head=head, updated=now, checked=now - 20)  # fmt: skip
    health_path(home).write_bytes(msgspec.json.encode(record))
    done = CliRunner().invoke(cli, ["--home", str(home), "relay", "status"])
    assert "as of its topic's last check, 20 s ago" in done.output, done.output
    assert done.exit_code == 1  # before: 0, "publishing ..., 0 behind the store"


def test_the_watchers_check_of_the_same_topic_is_kept_in_the_health(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = RelayService(tmp_path, "127.0.0.1:9", topic="t")
    mark = SimpleNamespace(topic_id="id-1")
    relay: Any = SimpleNamespace(published_mark=(mark, 5), position=5, remakes=0,
                                 remade_note="", remade_from=1, mark=None, skipped=())  # fmt: skip
    relay.store_head = lambda: 5
    service.relay = relay
    service._marked_at = time.monotonic()  # the offsets were asked lately: the id alone now
    monkeypatch.setattr(relay_topic, "open_admin", lambda *a: object())
    monkeypatch.setattr(relay_topic, "topic_id_of", lambda admin, topic: "id-1")
    service.health = msgspec.structs.replace(service.health, state="publishing")
    before = time.time()
    service._watch_topic(None)
    service._set("publishing", head=5)
    assert service.health.checked >= before


def test_the_check_s_age_is_one_computation_whatever_the_state() -> None:
    """`relay status` (`unchecked_s`), `/v1/health` (`relay_checked_s_ago`) and `/metrics`
    (`gpuledger_relay_topic_checked_age_seconds`) tell one age (`checked_s_ago`): before, only
    `relay status` said it (stop 59's closing note)."""
    old = _record(NOW - 12)
    assert old.checked_s_ago(NOW) == old.unchecked_s(NOW) == 12.0
    stopped = msgspec.structs.replace(old, state="stopped")
    assert (stopped.checked_s_ago(NOW), stopped.unchecked_s(NOW)) == (12.0, None)
    assert _record(0.0).checked_s_ago(NOW) is None  # a record from before `checked` was kept
    assert _record(NOW - 0.8).unchecked_s(NOW) is None  # checked lately: no age in the line


def test_a_relay_that_never_found_its_topic_counts_its_checks_age_from_its_start() -> None:
    """atk60-ha: a relay stopped at its start ("topic ... is ahead of the store") had
    `relay_checked_s_ago` None in health, which reads as no relay, though kafka.md gives the
    age whatever the state: it counts from the relay's start now, a floor."""
    never = msgspec.structs.replace(_record(0.0), state="stopped", began=NOW - 30)
    assert never.checked_s_ago(NOW) == 30.0
    assert msgspec.structs.replace(never, checked=NOW - 5).checked_s_ago(NOW) == 5.0


def test_the_services_health_keeps_its_start_through_a_stop(tmp_path: Path) -> None:
    before = time.time()
    service = RelayService(tmp_path, "127.0.0.1:9", topic="t")
    service._set("stopped", error="topic t is ahead of the store", head=0)
    assert service.health.state == "stopped" and service.health.checked == 0.0
    assert service.health.began >= before
    age = service.health.checked_s_ago(time.time())
    assert age is not None and age < 60
