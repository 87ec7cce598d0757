"""PostgreSQL itself fails, for real: a private primary with a synchronous streaming standby
(`scripts/postgres/postgres up --standby`), two servers on its multi-host DSN
(target_session_attrs=read-write) and clients submitting through both. kill -9 of the primary and
promotion of the standby: the servers reconnect through the DSN on their own and no acknowledged
command is lost; PostgreSQL down: writes are refused with one clear line, reads still answer, and
the servers resume alone once it is back."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ledger.wire.client import Client
from schemas import commands as c
from schemas.errors import LedgerError
from tests.integration import waits
from tests.integration.hakit import Group, free_port, log_events, make_group, wait_cycled_after
from tests.integration.serverkit import BUDGET, cli, make_token

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "postgres" / "postgres"


@dataclass
class Pg:
    data: Path
    env: dict[str, str]
    dsn: str

    def run(self, *args: str) -> str:
        out = subprocess.run([str(SCRIPT), *args], env=self.env, capture_output=True, text=True,
                             timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def pids(self, which: str) -> list[int]:
        """The postmaster of `which` (primary or standby) and every process it started."""
        pid_file = self.data / which / "postmaster.pid"
        if not pid_file.exists():
            return []
        pm = int(pid_file.read_text().split()[0])
        kids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pm:
                        kids.append(int(d.name))
        return [pm, *kids]

    def kill(self, which: str) -> None:
        """kill -9 of the whole server: its postmaster and its backends (a lost machine)."""
        for pid in self.pids(which):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def pg_pair() -> Iterator[Pg]:
    """A primary and its synchronous standby on free ports, in a directory of their own."""
    with own_pair() as pg:
        yield pg


@contextlib.contextmanager
def own_pair() -> Iterator[Pg]:
    """A primary and its synchronous standby on free ports, in a directory of their own."""
    data = Path(tempfile.mkdtemp(prefix="gpuledger-pgpair-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_PG")}
    env |= {"GPULEDGER_PG_DATA": str(data), "GPULEDGER_PG_PORT": str(free_port()),
            "GPULEDGER_PG_STANDBY_PORT": str(free_port())}  # fmt: skip
    pg = Pg(data, env, "")
    try:
        pg.dsn = pg.run("up", "--standby")
        assert "target_session_attrs=read-write" in pg.dsn and pg.dsn.count(":") >= 4
        yield pg
    finally:
        subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True, timeout=300)
        subprocess.run(["rm", "-rf", str(data)], check=False)


@pytest.fixture
def pair_group(tmp_path: Path, pg_pair: Pg) -> Iterator[tuple[Group, str]]:
    home = tmp_path / "server-0"
    cli(home, "init", "--admin", "root", "--store", pg_pair.dsn)
    budget = tmp_path / "budget.toml"
    budget.write_text(BUDGET)
    cli(home, "budget", "apply", str(budget), GPULEDGER_USER="root")
    cli(home, "node", "add", "n1", "--gpus", "8", "--gpu-type", "h100", GPULEDGER_USER="root")
    token = make_token(home, "--user", "alice")
    g = make_group(tmp_path, pg_pair.dsn, 2, "--interval", "0.5s", home=home)
    try:
        for m in g.members:
            g.start(m)
        g.leader()
        yield g, token
    finally:
        g.stop()


class Submitters:
    """Clients submitting through the group's list until stopped; what was acknowledged."""

    def __init__(self, g: Group, token: str, n: int = 4) -> None:
        self.acked: list[int] = []
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(g.urls, token), daemon=True)
                        for _ in range(n)]  # fmt: skip
        for t in self.threads:
            t.start()

    def _loop(self, urls: str, token: str) -> None:
        client = Client(urls, token, timeout=30)
        while not self.stop.is_set():
            cmd = c.SubmitJob(actor="", account="ai2/olmo", gpus=1, min_runtime_s=3600)
            try:
                got = client.execute(cmd)
            except LedgerError as err:
                self.failed.append(str(err))
                self.stop.wait(0.5)
                continue
            self.acked.append(got.events[0].job_id)  # type: ignore[union-attr]
            self.stop.wait(0.05)
        client.close()

    def more(self, n: int, what: str, why: object) -> None:
        want = len(self.acked) + n
        waits.wait_for(what, lambda: len(self.acked) >= want, 120, why)  # type: ignore[arg-type]

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)


def test_kill_9_of_the_primary_and_promotion_of_the_standby_lose_no_acknowledged_command(
    pg_pair: Pg, pair_group: tuple[Group, str]
) -> None:
    g, token = pair_group
    subs = Submitters(g, token)
    try:
        subs.more(30, "submits before the primary dies", g.why)
        pg_pair.kill("primary")
        wall = time.time()
        pg_pair.run("promote")
        wait_cycled_after(g, wall, timeout=120)
        subs.more(30, "submits on the promoted standby", g.why)
    finally:
        subs.finish()
    g.stop()
    submitted = [e["job_id"] for e in log_events(g.members[0].home)
                 if e["type"] == "job.submitted.v2"]  # fmt: skip
    assert set(subs.acked) <= set(submitted)  # nothing acknowledged is lost
    assert len(submitted) == len(set(submitted)) and len(subs.acked) == len(set(subs.acked))
    # a write whose answer the dead primary swallowed may have been retried with its key: it is
    # in the log once; a write refused outright is in it not at all
    assert len(submitted) - len(subs.acked) <= len(subs.failed), (subs.failed, submitted)
    assert "chain intact" in cli(g.members[0].home, "audit", "verify").stdout


OUTAGE_S = 40.0
"""Past psycopg_pool's doubling pauses between connection attempts passing 16 s (as
test_pg_outage_lead.py's; it was 60 s: 20 s more of the same refusals and reads)."""


def test_postgresql_down_refuses_writes_with_one_line_keeps_reads_and_resumes_alone(
    pg_pair: Pg, pair_group: tuple[Group, str]
) -> None:
    g, token = pair_group
    leader = g.leader()
    client = Client(g.urls, token)
    client.execute(c.SubmitJob(actor="", account="ai2/olmo", gpus=1, min_runtime_s=60))
    waits.wait_for("every server to fold the submit", lambda: all(
        (m.health() or {}).get("projection_position", 0) >= client.position
        for m in g.members), 60, g.why)  # fmt: skip
    pg_pair.run("down")
    down_at = time.monotonic()
    env = {"GPULEDGER_URL": leader.url, "GPULEDGER_TOKEN": token, "GPULEDGER_RETRY_S": "0"}
    while True:
        # reads: every server still answers, from what it has folded
        for m in g.members:
            reader = Client(m.url, token)
            try:
                assert [j["job_id"] for j in reader.get("jobs")] == [1]
            finally:  # its socket never left for a later test's collector
                reader.close()
        # writes: one clear line (503), from the CLI too
        proc = cli(leader.home, "submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "1h",
                   ok=False, **env)  # fmt: skip
        assert proc.returncode != 0 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("error: ") and "[unavailable]" in proc.stderr, proc.stderr
        assert "store does not answer" in proc.stderr, proc.stderr  # atk33-28 F6: not "standby"
        if time.monotonic() - down_at > OUTAGE_S:
            break
        time.sleep(5)
    # health says the store does not answer, and that nobody leads
    for m in g.members:
        h = m.health() or {}
        assert h.get("store_error") and h.get("role") == "standby" and not h.get("leader"), h
    pg_pair.run("up", "--standby")
    wall = time.time()
    wait_cycled_after(g, wall, timeout=120)
    got = client.execute(c.SubmitJob(actor="", account="ai2/olmo", gpus=1, min_runtime_s=60))
    assert got.events[0].job_id == 2  # type: ignore[union-attr]
    waits.wait_for("health to clear", lambda: not any(
        (m.health() or {}).get("store_error") for m in g.members), 60, g.why)  # fmt: skip
    client.close()
