"""The relay's health record (`<home>/relay.json`, `gpuledger relay status`): bounded whatever a
topic writer sends, and no word when it is dated in the future (atk49-25 F7, F10)."""

from __future__ import annotations

import msgspec

from ledger.store.relay_health import SKIPPED_SHOWN, RelayHealth
from ledger.store.relay_service import RelayService


def test_a_record_from_the_future_is_as_stale_as_an_old_one() -> None:
    """F10: `updated` set ahead of now (an edit, a clock stepped back) said `publishing`, exit 0,
    with no service running: a stale record is one whose age is off either way."""
    now = 1_000_000.0
    fresh = RelayHealth(state="publishing", bootstrap="b", topic="t", updated=now - 1)
    assert not fresh.stale(now)
    future = RelayHealth(state="publishing", bootstrap="b", topic="t", updated=9e9)
    assert future.stale(now)
    assert "ahead of this host's clock: no service updates it" in future.line(now)
    assert RelayHealth(state="publishing", bootstrap="b", topic="t", updated=now - 60).stale(now)


def test_the_health_names_a_few_foreign_offsets_and_counts_the_rest(tmp_path: object) -> None:
    """F7: every skipped offset was kept in relay.json (2.1 MB for 300,000 junk records,
    rewritten every few seconds); it names the first few and counts them all."""
    from pathlib import Path
    from types import SimpleNamespace

    assert isinstance(tmp_path, Path)
    service = RelayService(tmp_path, "127.0.0.1:9", topic="t")
    relay = SimpleNamespace(
        skipped=tuple(range(100, 300_100)),
        position=5,
        remakes=0,
        remade_note="",
        remade_from=1,
        mark=None,
    )
    relay.store_head = lambda: 5
    service.relay = relay  # type: ignore[assignment]
    service._set("publishing", head=5)
    health = service.health
    assert health.skipped == tuple(range(100, 100 + SKIPPED_SHOWN)) and health.foreign == 300_000
    assert len(msgspec.json.encode(health)) < 1_000
    assert "300,000 foreign record(s) skipped (offsets 100, 101," in health.line()
    assert f"... ({300_000 - SKIPPED_SHOWN:,} more)" in health.line()


def test_a_row_rewritten_as_text_is_read_as_the_bytes_verify_reads(org_ledger: object) -> None:
    """F5: `update stored_events set state = cast(state as text)` on one row (the same bytes):
    the relay handed a str to the Kafka client, a TypeError for good, nothing of the batch
    published. It reads the row's bytes as `audit verify` does (which names the row)."""
    import sqlite3

    from ledger.store import EVENTS_DB
    from ledger.store.application import Ledger
    from ledger.store.relay import open_store, read_raw

    assert isinstance(org_ledger, Ledger)
    home = org_ledger.home
    before = read_raw(open_store(home), 0, 1_000)
    with sqlite3.connect(home / EVENTS_DB) as db:
        db.execute("UPDATE stored_events SET state = CAST(state AS TEXT) WHERE rowid = 3")
        assert db.execute("SELECT typeof(state) FROM stored_events WHERE rowid = 3").fetchone() == (
            "text",
        )
    after = read_raw(open_store(home), 0, 1_000)
    assert all(isinstance(r.data, bytes) for r in after)
    assert after == before


def test_a_start_scans_a_row_stored_as_text_for_its_key() -> None:
    """F5: the server's start scans the newest rows for keyed requests; a row stored as TEXT
    stopped it with `internal error: TypeError: cannot use a bytes pattern on a string-like
    object`. It reads the text's bytes, as `audit verify` does (which names the row)."""
    from ledger.store.requests import Requests, keyed_id

    event_id = keyed_id("alice", "k1", b"req")
    seen = Requests()
    seen.scan([(7, '{"event_id":"' + event_id + '","x":1}')])
    assert seen.find(event_id) == 7


def test_a_send_the_clients_connection_was_not_ready_for_is_retried_without_a_word(
    tmp_path: object, caplog: object
) -> None:
    """CI, stop 50: right after the broker came back (it had just answered the watcher's
    probe: `publishing`), the relay's first send got kafka-python's NodeNotReadyError (its own
    connection still in its reconnect backoff) and the service said `unavailable`, with a
    warning, for a moment. It is retried quietly (for up to `connect_timeout_s` in a row); any
    other error, or one that lasts, is reported as before."""
    import logging
    import threading
    from pathlib import Path
    from types import SimpleNamespace

    import pytest
    from kafka.errors import KafkaConnectionError, NodeNotReadyError

    from ledger.store.relay_tail import unavailable

    assert isinstance(tmp_path, Path) and isinstance(caplog, pytest.LogCaptureFixture)
    states: list[str] = []

    def run(errors: list[BaseException], connect_timeout_s: float = 3.0) -> RelayService:
        service = RelayService(
            tmp_path, "127.0.0.1:9", topic="t", connect_timeout_s=connect_timeout_s
        )
        service.health = msgspec.structs.replace(service.health, state="publishing")
        done = threading.Event()

        def publish_pending(*_: object) -> int:
            states.append(service.health.state)
            if errors:
                error = errors.pop(0)
                try:
                    raise error
                except Exception as e:
                    raise unavailable("127.0.0.1:9", e) from e
            done.set()
            service._stop.set()
            return 1

        service.relay = SimpleNamespace(  # type: ignore[assignment]
            publish_pending=publish_pending,
            position=1,
            store_head=lambda: 1,
            reconnects=False,
            remakes=0,
            remade_note="",
            remade_from=1,
            skipped=(),
            mark=None,
        )
        thread = threading.Thread(target=service._publish_until_stopped)
        thread.start()
        assert done.wait(20)
        thread.join(5)
        return service

    with caplog.at_level(logging.WARNING, logger="gpuledger.relay"):
        run([NodeNotReadyError("No node_id provided")] * 2)
    assert set(states) == {"publishing"}  # was: unavailable after the first
    assert not [r for r in caplog.records if "paused" in r.getMessage()]
    states.clear()
    run([KafkaConnectionError("111 ECONNREFUSED")])
    assert states == ["publishing", "unavailable"]  # another error: said at once
    states.clear()
    run([NodeNotReadyError("No node_id provided")] * 4, connect_timeout_s=0.15)
    assert "unavailable" in states  # one that lasts: said


def test_the_lag_is_never_0_where_the_position_is_not_the_topics() -> None:
    """atk51-25 F3: "0 behind the store" from the record's own head: 0 while the relay connects
    (it wrote the log again to a topic deleted while it was stopped, the record keeping its old
    position), old once no service updates it. Where the position is not the topic's for sure,
    the lag is a floor, and none is claimed where it would be 0."""
    now = 1_000_000.0
    base = {"bootstrap": "b", "topic": "t", "updated": now - 1}
    connecting = RelayHealth(state="connecting", position=52_824, store_head=0, **base)
    assert "0 behind" not in connecting.line(now)
    assert "cannot tell how far behind the store" in connecting.line(now, 52_824)
    assert "at least 3 behind the store" in connecting.line(now, 52_827)
    publishing = RelayHealth(state="publishing", position=28, store_head=28, **base)
    assert "position 28, 1 behind the store" in publishing.line(now, 29)  # the store's head, now
    stale = publishing.line(now + 60, 28)
    assert "no service updates it" in stale and "cannot tell how far behind" in stale
    stopped = RelayHealth(state="stopped", position=29, store_head=29, error="e", **base)
    assert "0 behind" not in stopped.line(now, 29)
    assert "cannot tell how far behind the store (no store)" in publishing.line(
        now, None, "no store"
    )


def test_relay_status_counts_the_lag_against_the_stores_head_read_now(org_ledger: object) -> None:
    """atk51-25 F3 (a): the service killed (-9: its record says publishing, fresh), one event
    appended since in embedded mode: `relay status` said "0 behind the store", exit 0, from the
    record's head. It reads the home's store."""
    import time

    from click.testing import CliRunner

    from ledger.cli import cli
    from ledger.store.application import Ledger
    from ledger.store.relay_health import health_path

    assert isinstance(org_ledger, Ledger)
    home = org_ledger.home
    head = org_ledger.position
    record = RelayHealth(
        state="publishing", bootstrap="b", topic="t", position=head - 1, store_head=head - 1,
        updated=time.time(),
    )  # fmt: skip
    health_path(home).write_bytes(msgspec.json.encode(record))
    done = CliRunner().invoke(cli, ["--home", str(home), "relay", "status"])
    assert f"position {head - 1:,}, 1 behind the store" in done.output, done.output


def test_a_stopped_relay_stays_stopped_whatever_the_watcher_writes_after(tmp_path: object) -> None:
    """s51: the watcher's check read `publishing`, the relay stopped (a topic compacted under
    it), and the check then wrote `publishing` back with the stop's error: `relay status` said
    publishing, exit 0, over a relay that had stopped for good."""
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    service = RelayService(tmp_path, "127.0.0.1:9", topic="t")
    service._set("stopped", error="why", head=0)
    service._set("publishing", error="why", head=0)
    assert service.health.state == "stopped" and service.health.error == "why"


def test_relay_status_json_carries_the_lag_read_from_the_store(org_ledger: object) -> None:
    """s51 open item: `relay status --json` printed relay.json as the service wrote it, its own
    `store_head` (0 while connecting, old once no service updates it): a script read "0 behind"
    where the line said "cannot tell". It carries the lag the line tells, from the store's head
    read now: exact only where the relay watches its topic."""
    import json
    import time

    from click.testing import CliRunner

    from ledger.cli import cli
    from ledger.store.application import Ledger
    from ledger.store.relay_health import health_path

    assert isinstance(org_ledger, Ledger)
    home = org_ledger.home
    head = org_ledger.position
    for state, position, want in [
        ("publishing", head - 1, {"lag": 1, "lag_at_least": None, "lag_known": "exact"}),
        ("connecting", head, {"lag": None, "lag_at_least": None, "lag_known": "unknown"}),
        ("connecting", head - 2, {"lag": None, "lag_at_least": 2, "lag_known": "floor"}),
    ]:
        record = RelayHealth(
            state=state, bootstrap="b", topic="t", position=position, store_head=0,  # type: ignore[arg-type]
            updated=time.time(),
        )  # fmt: skip
        health_path(home).write_bytes(msgspec.json.encode(record))
        done = CliRunner().invoke(cli, ["--home", str(home), "relay", "status", "--json"])
        got = json.loads(done.output)
        assert got["head"] == head and got["store_head"] == 0, got  # the head read now
        assert {k: got[k] for k in want} == want, got
        assert got["behind"] in done.output and not got["stale"]
        line = CliRunner().invoke(cli, ["--home", str(home), "relay", "status"]).output
        assert got["behind"] in line, (got, line)


def test_gpuledger_status_tells_the_relay_lag_by_the_rule_relay_status_follows() -> None:
    """s51 open item: `gpuledger status` said "relay lag 0 events, connecting" while the relay
    wrote the whole log again to a topic found deleted (its position the last one published).
    The lag is exact only where the relay watches its topic, a floor above 0 elsewhere, and
    unknown where it would be 0."""
    from ledger.cli.serve import _relay_lag
    from schemas.api import Health

    def health(state: str, lag: int) -> Health:
        return Health(
            status="up", version="v", started_at=0.0, head=100, cycles=0, last_cycle_at=None,
            last_cycle_s=None, projection_position=100, projection_lag=0,
            relay_position=100 - lag, relay_lag=lag, relay_state=state,
        )  # fmt: skip

    assert _relay_lag(health("publishing", 0)) == "0 events"
    assert _relay_lag(health("unavailable", 3)) == "3 events"
    assert _relay_lag(health("connecting", 0)).startswith("unknown (")  # was "0 events"
    assert _relay_lag(health("stopped", 4)).startswith("at least 4 events")


def test_a_live_service_rewrites_the_health_of_a_stopped_or_connecting_relay(
    tmp_path: object,
) -> None:
    """atk52-25 F3: the watcher rewrote relay.json only while the relay published: a live
    service whose relay had stopped (or connected, through a 52k-event republish) left it to go
    stale, and `relay status` called it one no service updates. It is rewritten each check with
    its state and error kept (a stopped relay still reads stopped, never healthy), and never
    over a state the publishing thread set since the watcher read it."""
    from pathlib import Path

    from ledger.store.relay_health import health_path, read_health

    assert isinstance(tmp_path, Path)
    clock = _Clock(1_000_000.0)
    for state in ("stopped", "connecting"):
        service = RelayService(tmp_path, "127.0.0.1:9", topic="t")
        service.clock = clock  # type: ignore[assignment]
        service._set(state, error="why", head=3, again=True)  # type: ignore[arg-type]
        since = service.health.since
        clock.t += 60
        service._check(head=5)
        written = read_health(tmp_path)
        assert written is not None and written == service.health
        assert written.state == state and written.error == "why", written
        assert written.updated == clock.t and written.store_head == 5, written  # was 60 s old
        assert written.since == since  # the state's start kept
        assert not written.stale(clock.t) and "no service updates it" not in written.line(clock.t)
        health_path(tmp_path).unlink()
    # the watcher read `connecting`, then the publishing thread said `publishing`: kept
    service = RelayService(tmp_path, "127.0.0.1:9", topic="t")
    service._set("publishing", head=5)
    service._set("connecting", head=5, expect="connecting")
    assert service.health.state == "publishing"


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t
