"""While the store is away (atk28 F1, F6), against small real HTTP servers on 127.0.0.1: an
agent's client hears a server's keep of its node lease at once, and an agent renews its lease by
it only for the newest leader epoch it has seen; `status` says when the leader does not answer."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ledger.wire.client import Client
from schemas import api
from schemas.errors import Unavailable
from tests.unit.test_follow_leader import Fake


@pytest.fixture
def fake() -> Iterator[Fake]:
    f = Fake()
    yield f
    f.close()


def keeping(epoch: int) -> Any:
    problem = {"title": "unavailable", "status": 503, "detail": "store", "code": "unavailable",
               "message": "the store does not answer; keeping the lease"}  # fmt: skip
    return lambda *_: (503, {"X-Gpuledger-Keep": str(epoch)}, json.dumps(problem).encode())


def test_a_keep_is_heard_at_once_and_renews_the_lease_only_for_the_newest_epoch(
    fake: Fake, tmp_path: Path
) -> None:
    from ledger.agent.node import NodeAgent

    fake.answer = keeping(7)
    client = Client(fake.url, "tok")
    kept: list[tuple[float, int]] = []
    client.on_keep = lambda sent, epoch: kept.append((sent, epoch))
    with pytest.raises(Unavailable):
        client.request("POST", "/v1/agent/heartbeat", b"{}")
    assert [e for _, e in kept] == [7]
    agent = NodeAgent.__new__(NodeAgent)  # only its lease: no server, no executor
    agent.seen = type("Seen", (), {"epoch": 8})()
    agent.fence_s, agent.lost_after_s = 10.0, 5.0
    agent.lease_path, agent._lease_until, agent._keeping = tmp_path / "lease", 0.0, False
    agent._kept(time.monotonic(), 7)  # a deposed leader's keep: ignored
    assert not agent.lease_path.exists()
    agent._kept(time.monotonic(), 8)
    until = json.loads(agent.lease_path.read_bytes())["until"]
    assert until > time.time() + 5


def test_status_says_the_leader_does_not_answer(fake: Fake, tmp_path: Path) -> None:
    health = api.Health(
        status="ok", version="x", started_at=0.0, head=10, cycles=1, last_cycle_at=None,
        last_cycle_s=None, projection_position=10, projection_lag=0, relay_position=None,
        relay_lag=None, role="standby", leader="http://dead:1", epoch=13, store="postgresql",
        servers=[
            api.ServerState(address="http://dead:1", role="standby", position=10, lag=0,
                            seen_s_ago=42.0),
            api.ServerState(address=fake.url, role="standby", position=10, lag=0, seen_s_ago=0.5),
        ],
    )  # fmt: skip
    fake.answer = lambda *_: (
        200,
        {"Content-Type": "application/json"},
        msgspec.json.encode(health),
    )
    out = subprocess.run(
        [str(Path(sys.executable).with_name("gpuledger")), "status"],
        capture_output=True, text=True, timeout=60,
        env={"GPULEDGER_URL": fake.url, "GPULEDGER_TOKEN": "t", "GPULEDGER_HOME": str(tmp_path),
             "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert "leader http://dead:1 (does not answer: not heard from for 42 s" in out.stdout, out
    assert "server        http://dead:1 leader, lag 0 events, not heard from for 42 s" in out.stdout


def test_a_store_refused_for_its_form_never_shows_its_password(tmp_path: Path) -> None:
    from ledger.store.locate import store_of
    from schemas.errors import InvalidCommand

    with pytest.raises(InvalidCommand) as got:
        store_of(tmp_path, "user=gpuledger password=WRONGPASS123 host=127.0.0.1 dbname=x")
    assert "WRONGPASS123" not in got.value.line() and "invalid store" in got.value.line()
