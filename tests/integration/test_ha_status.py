"""`gpuledger status` on one of several servers says when the leader's lease was last renewed
and when it expires, and says so when the leader itself does not answer (a paused or cut-off
leader still holds an unexpired lease: the standby's word alone would name it as healthy)."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ledger.store.lease import SERVERS_TABLE
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
    said: list[str] = []

    def answering() -> bool:  # it answers: nothing said about it (a loaded host: a late report)
        said[:] = [cli(standby.home, "status", GPULEDGER_URL=standby.url).stdout]
        return f"leader {leader.url}\n" in said[0]

    waits.wait_for("status to show the leader answering", answering, 60, lambda: "".join(said))
    out = said[0]
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
    # (under load the paused leader may also be "not heard from for N s" first: said before it)
    assert f"leader {leader.url} (does not answer: " in out, out
    assert f"cannot reach the server at {leader.url}" in out, out
    assert "  lease         20 s, renewed " in out, out


def test_status_calls_only_the_server_that_holds_the_lease_leader(
    tmp_path: Path, pg_store: str
) -> None:
    """A leader paused past its lease last reported "leader": its row says ex-leader beside the
    one that leads now (atk33-28 F11: two "leader" rows)."""
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    g = make_group(tmp_path, pg_store, 2, "--interval", "0.5s", home=home)
    g.lease = "2s"
    try:
        for m in g.members:
            g.start(m)
        old = g.leader()
        new = next(m for m in g.members if m is not old)
        assert old.proc is not None

        def reported() -> str:
            """What `old` last reported of itself, as its row in the store has it."""
            with psycopg.connect(pg_store, autocommit=True) as con:
                row = con.execute(
                    f"SELECT role FROM {SERVERS_TABLE} WHERE address = %s", (old.url,)
                ).fetchone()
            return str(row[0]) if row else ""

        # its own row says "leader" before it is paused (it reports once a second: a pause
        # before its first report as leader left its row "standby")
        waits.wait_for("the leader's row to say so", lambda: reported() == "leader", 30, g.why)
        old.proc.send_signal(signal.SIGSTOP)
        try:
            waits.wait_for("the other server to lead", lambda: (new.health() or {}).get(
                "role") == "leader", 30, g.why)  # fmt: skip
            waits.wait_for("its table to list both", lambda: len((new.health() or {}).get(
                "servers") or []) == 2, 30, g.why)  # fmt: skip
            out = cli(new.home, "status", GPULEDGER_URL=new.url).stdout
            health = new.health() or {}
        finally:
            old.proc.send_signal(signal.SIGCONT)
        assert {s["address"]: s["role"] for s in health["servers"]} == {
            new.url: "leader",
            old.url: "ex-leader",
        }, health
        assert f"  server        {new.url} leader, " in out, out
        assert f"  server        {old.url} ex-leader, " in out, out
        assert out.count(" leader, lag ") == 1, out
    finally:
        g.stop()


def test_status_says_nobody_takes_the_lease_when_every_standby_is_refused(
    tmp_path: Path, pg_store: str
) -> None:
    """atk43ha F4: the leader killed, its only standby refused by its settings (it runs with
    the ones the leader replaced by `--new-settings`): nobody takes the lease, and `status`
    says so and why, where it said "a standby takes it at its next try"."""
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_store)
    g = make_group(tmp_path, pg_store, 2, "--grace", "30s", home=home)
    s0, s1 = g.members
    try:
        g.start(s0)
        assert g.leader() is s0
        assert s0.proc is not None
        s0.proc.send_signal(signal.SIGSTOP)  # frozen past its lease: nobody leads
        try:
            time.sleep(2.0 + 1.5)
            g.args = ("--grace", "5s", "--new-settings")
            g.start(s1)  # records its settings: s0's are the replaced ones
        finally:
            s0.proc.send_signal(signal.SIGCONT)
        assert g.leader() is s1
        waits.wait_for("s0 to say it will not lead", lambda: (s0.health() or {}).get(
            "settings_error") is not None, 30, g.why)  # fmt: skip
        s1.kill(signal.SIGKILL)
        said: list[str] = []

        def expired() -> bool:
            said[:] = [cli(home, "status", GPULEDGER_URL=s0.url).stdout]
            return " s ago: the leader does not renew it" in said[0]

        waits.wait_for("status to see the lease expired", expired, 60, lambda: "".join(said))
        # it says so from then on (s1's last report may have said standby: it is the holder)
        waits.wait_for("status to say nobody takes it", lambda: expired() and "no server takes "
                       "it: every running standby is refused" in said[0], 20,
                       lambda: "".join(said))  # fmt: skip
        out = said[0]
        assert "a standby takes it" not in out, out
        assert s0.url in out.split("  lease ")[1], out
        assert f"  server        {s0.url} refused, " in out, out
        assert "this server will not lead" in out, out
        assert (s0.health() or {}).get("role") == "standby"  # and it takes none
    finally:
        g.stop()
