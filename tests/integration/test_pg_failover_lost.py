"""A failover to a standby that never got the last commit (atk51-ha F2): the synchronous standby
frozen, a submit's commit waits for it and is cancelled (PostgreSQL then shows the row to every
session on the primary: both servers fold it; the CLI says the outcome is unknown), the
standby's buffered WAL dropped and the primary killed -9, the standby promoted. Before, the new
leader appended on top of the position the store no longer had: a gap in the log, `audit
verify` "chain BROKEN", every cycle failing with "the projection is at position N but the log
ends at N-1", and the lost job still listed. Now an append checks that the row it builds on is
in the store with the link it folded; a server whose log is behind what it folded reads its
state back and rebuilds its projection; the log stays a gapless prefix."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from projections.kafka_wire import POSITION_HEADER
from tests.integration import waits
from tests.integration.conftest import read_all
from tests.integration.hakit import GPULEDGER, Group, Member, make_group, wait_cycled_after
from tests.integration.serverkit import BUDGET, cli, env_for, make_token, workdir
from tests.integration.test_pg_failover import Pg, own_pair
from tests.integration.test_pg_outage_hung import signal_all

SUBMIT = ("submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "1h", "--")


@pytest.fixture
def lone_pair() -> Iterator[Pg]:
    """A pair of this test's own: it is promoted (the outage tests share theirs)."""
    with own_pair() as pg:
        yield pg


def _walreceivers(pg: Pg) -> list[int]:
    found = []
    for pid in pg.pids("standby"):
        with contextlib.suppress(OSError):
            if b"walreceiver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def _positions(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as con:
        rows = con.execute("SELECT notification_id FROM gpuledger_events ORDER BY 1").fetchall()
    return [int(r[0]) for r in rows]


def _words(home: Path, url: str, token: str) -> list[str]:
    """The commands' last words of the jobs server `url` lists (its folded state)."""
    out = cli(home, "jobs", "--json", "-S", "2000-01-01", GPULEDGER_URL=url,
              GPULEDGER_TOKEN=token, GPULEDGER_RETRY_S="5", timeout=120)  # fmt: skip
    return [str((j.get("command") or [""])[-1]) for j in json.loads(out.stdout)]


def _leader_of(m: Member) -> str:
    return str((m.health() or {}).get("leader"))


def _lose_the_last_commit(
    pg: Pg,
    g: Group,
    home: Path,
    env: dict[str, str],
    token: str,
    leader: Member,
    settle_s: float = 0.0,
) -> float:
    """A submit (`echo lost`) committed on the primary only (the standby frozen: its wait is
    cancelled, the CLI says the outcome is unknown, both servers list it), then the standby's
    unwritten WAL and the primary lost, the standby promoted: the log is shorter. The time of
    the promote."""
    frozen = pg.pids("standby")
    signal_all(frozen, signal.SIGSTOP)
    proc = subprocess.run(
        [GPULEDGER, *SUBMIT, "echo", "lost"], text=True, cwd=workdir(home),
        capture_output=True, timeout=180,
        env=env | {"GPULEDGER_URL": leader.url, "GPULEDGER_RETRY_S": "4"},
    )  # fmt: skip
    assert proc.returncode == 1 and "outcome is unknown" in proc.stderr, proc
    for m in g.members:  # both servers fold it
        waits.wait_for(f"{m.name} to list the unconfirmed job",
                       lambda m=m: "lost" in _words(home, m.url, token), 60, g.why)  # fmt: skip
    # the primary shows the unconfirmed row to every session; read once it is there: a leader
    # whose lease ran out while its append was queued says the outcome unknown before the
    # append reaches the primary (atk60-ha F1), so the row may come after the CLI's answer
    before = _positions(pg.dsn)
    time.sleep(settle_s)  # a relay beside them had the time to publish it
    # the standby host is lost with what its walreceiver had not written; then the primary
    for pid in _walreceivers(pg):
        os.kill(pid, signal.SIGKILL)
    pg.kill("primary")
    signal_all(frozen, signal.SIGCONT)
    wall = time.time()
    pg.run("promote")
    after = _positions(pg.dsn)
    assert after == list(range(1, len(after) + 1)) and len(after) < len(before), (before, after)
    return wall


def _ledger(tmp_path: Path, pg: Pg) -> tuple[Path, dict[str, str]]:
    """server-0's home on the pair's store (its budget, one 8-GPU node) and alice's CLI env."""
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg.dsn)
    budget = tmp_path / "budget.toml"
    budget.write_text(BUDGET)
    cli(home, "budget", "apply", str(budget), GPULEDGER_USER="root")
    cli(home, "node", "add", "n1", "--gpus", "8", "--gpu-type", "h100", GPULEDGER_USER="root")
    return home, env_for(home, GPULEDGER_TOKEN=make_token(home, "--user", "alice"))


def test_a_failover_to_a_standby_without_the_last_commit_leaves_a_gapless_log(
    tmp_path: Path, lone_pair: Pg
) -> None:
    pg = lone_pair
    home, env = _ledger(tmp_path, pg)
    token = env["GPULEDGER_TOKEN"]
    g: Group = make_group(tmp_path, pg.dsn, 2, "--interval", "0.5s", home=home)
    g.lease = "10s"
    try:
        for m in g.members:
            g.start(m)
        leader = g.leader(timeout=60)
        cli(home, *SUBMIT, "echo", "kept", GPULEDGER_URL=leader.url, GPULEDGER_TOKEN=token)
        wall = _lose_the_last_commit(pg, g, home, env, token, leader)
        after = _positions(pg.dsn)
        wait_cycled_after(g, wall, timeout=120)
        # a new write after the failover is taken, on top of the log the store holds
        again = subprocess.run(
            [GPULEDGER, *SUBMIT, "echo", "after"], text=True, cwd=workdir(home),
            capture_output=True, timeout=180, env=env | {"GPULEDGER_URL": g.urls},
        )  # fmt: skip
        assert again.returncode == 0, (again.stdout, again.stderr, g.why())
        positions = _positions(pg.dsn)
        assert positions == list(range(1, len(positions) + 1)), (after, positions, g.why())
        verify = cli(home, "audit", "verify", ok=False, timeout=120)
        assert "chain intact" in verify.stdout, (verify.stdout, verify.stderr)
        for m in g.members:  # no server answers from a state or projection ahead of its log
            waits.wait_for(f"{m.name} to list the new job and not the lost one",
                           lambda m=m: (w := _words(home, m.url, token)) and "after" in w
                           and "lost" not in w and "kept" in w, 60, g.why)  # fmt: skip
        since = [len(m.text()) for m in g.members]
        time.sleep(4.0)  # cycles and follows run meanwhile: none fails (before: every 2 s)
        said = "".join(m.text()[at:] for m, at in zip(g.members, since, strict=True))
        assert "cycle failed" not in said and "cannot follow the log" not in said, g.why()
        assert len({_leader_of(m) for m in g.members}) == 1
    finally:
        signal_all(pg.pids("standby"), signal.SIGCONT)
        g.stop()


def _states(dsn: str) -> list[tuple[int, bytes]]:
    with psycopg.connect(dsn, autocommit=True) as con:
        rows = con.execute(
            "SELECT notification_id, state FROM gpuledger_events ORDER BY 1"
        ).fetchall()
    return [(int(r[0]), bytes(r[1])) for r in rows]


def _topic(bootstrap: str, topic: str) -> list[tuple[int, bytes]]:
    return [(int(dict(r.headers)[POSITION_HEADER]), bytes(r.value))
            for r in read_all(bootstrap, topic)]  # fmt: skip


def test_the_relay_never_publishes_a_commit_the_failover_loses(
    tmp_path: Path, lone_pair: Pg, kafka_bootstrap: str, kafka_topic: str, transactional_id: str
) -> None:
    """atk52-ha F1: the relay published the row whose wait for the standby was cancelled; after
    the failover the topic held an event at a position the new log holds another one at (the
    new leader's relay published that one after it): every reader stopped for good at the fork,
    `store restore --from-kafka` was refused, `audit verify --kafka` said DIFFERS. Now the relay
    publishes only rows the standby confirmed: the topic stays a gapless copy of the new log."""
    pg = lone_pair
    home, env = _ledger(tmp_path, pg)
    token = env["GPULEDGER_TOKEN"]
    kafka = {"GPULEDGER_KAFKA_TOPIC": kafka_topic,
             "GPULEDGER_KAFKA_TRANSACTIONAL_ID": transactional_id}  # fmt: skip
    g: Group = make_group(tmp_path, pg.dsn, 2, "--interval", "0.5s", "--kafka", kafka_bootstrap,
                          home=home)  # fmt: skip
    g.lease, g.env = "10s", kafka
    try:
        for m in g.members:
            g.start(m)
        leader = g.leader(timeout=60)
        cli(home, *SUBMIT, "echo", "kept", GPULEDGER_URL=leader.url, GPULEDGER_TOKEN=token)
        head = len(_positions(pg.dsn))
        waits.wait_for("the relay to publish the log", lambda: len(_topic(kafka_bootstrap,
                       kafka_topic)) >= head, 60, g.why)  # fmt: skip
        wall = _lose_the_last_commit(pg, g, home, env, token, leader, settle_s=3.0)
        wait_cycled_after(g, wall, timeout=120)
        again = subprocess.run(
            [GPULEDGER, *SUBMIT, "echo", "after"], text=True, cwd=workdir(home),
            capture_output=True, timeout=180, env=env | {"GPULEDGER_URL": g.urls},
        )  # fmt: skip
        assert again.returncode == 0, (again.stdout, again.stderr, g.why())
        log = _states(pg.dsn)

        def copied() -> list[tuple[int, bytes]] | None:
            got = _topic(kafka_bootstrap, kafka_topic)
            return got if len(got) >= len(log) else None

        got = waits.wait_for("the relay to publish the new log", copied, 90, g.why)
        assert [p for p, _ in got] == list(range(1, len(got) + 1)), ([p for p, _ in got], g.why())
        assert got == log, ("the topic is not a copy of the log", g.why())
        reader = tmp_path / "reader"  # a reader of the topic follows it to the end (before: a fork)
        read = cli(reader, "project", "follow", "--kafka", kafka_bootstrap, "--topic",
                   kafka_topic, "--once", "--home", str(reader), ok=False, timeout=120)  # fmt: skip
        assert read.returncode == 0 and f"position {len(log)}" in read.stdout + read.stderr, read
    finally:
        signal_all(pg.pids("standby"), signal.SIGCONT)
        g.stop()
