"""`gpuledger status` on one of several servers says when the leader's lease was last renewed
and when it expires, and says so when the leader itself does not answer (a paused or cut-off
leader still holds an unexpired lease: the standby's word alone would name it as healthy)."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import waits
from tests.integration.hakit import Group, make_group
from tests.integration.serverkit import cli


@pytest.fixture
def pair(tmp_path: Path, pg_store: str) -> Iterator[Group]:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    g = make_group(tmp_path, pg_store, 2, "--interval", "0.5s", home=home)
    g.lease = "20s"  # the leader stays paused well within it: nobody takes over meanwhile
    try:
        yield g
    finally:
        g.stop()


def test_status_shows_the_leaders_lease_and_says_when_the_leader_does_not_answer(
    pair: Group,
) -> None:
    for m in pair.members:
        pair.start(m)
    leader = pair.leader()
    standby = next(m for m in pair.members if m is not leader)
    waits.wait_for("the standby to see the lease renewed", lambda: (standby.health() or {}).get(
        "lease_renewed_s_ago") is not None, 30, pair.why)  # fmt: skip
    health = standby.health() or {}
    assert health["lease_s"] == 20.0
    assert 0 <= health["lease_renewed_s_ago"] <= 20 / 3 + 1.5, health
    assert 20 / 3 - 1.5 <= health["lease_expires_in_s"] <= 20, health
    out = cli(standby.home, "status", GPULEDGER_URL=standby.url).stdout
    assert f"leader {leader.url}\n" in out, out  # it answers: nothing said about it
    lease = re.search(
        r"  lease         20 s, renewed (\d+\.\d) s ago, expires in (\d+\.\d) s\n", out
    )
    assert lease is not None, out
    assert leader.proc is not None
    leader.proc.send_signal(signal.SIGSTOP)
    try:
        out = cli(standby.home, "status", GPULEDGER_URL=standby.url).stdout
    finally:
        leader.proc.send_signal(signal.SIGCONT)
    assert f"leader {leader.url} (does not answer: cannot reach the server at {leader.url}" in out
    assert "  lease         20 s, renewed " in out, out
