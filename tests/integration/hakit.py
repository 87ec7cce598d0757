"""Several real `gpuledger serve` processes on one PostgreSQL store (docs/ha.md), for the
leadership and failover tests: each with a home of its own (as on its own host), a fixed port (a
restarted server keeps its URL, as the clients' and agents' lists expect) and a short lease."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration import waits
from tests.integration.serverkit import GPULEDGER, Server, cli, env_for

LEASE = os.environ.get("GPULEDGER_HA_LEASE", "2s")
"""The servers' lease (docs/ha.md measures failover with the default, 5s, too)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Member:
    """One serve process of the group (or none, while it is down)."""

    name: str
    home: Path
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    dsn: str = ""
    """Its own way to the store (through a proxy a test cuts), else the group's."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def server(self) -> Server:
        assert self.proc is not None
        return Server(self.home, self.proc, self.url, self.log)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def health(self) -> dict[str, Any] | None:
        """/v1/health, or None when the server does not answer."""
        try:
            status, body = self.server().request("GET", "/v1/health")
        except OSError:
            return None
        return body if status == 200 else None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)


@dataclass
class Group:
    dsn: str
    members: list[Member]
    args: tuple[str, ...]
    lease: str = LEASE

    @property
    def urls(self) -> str:
        """The list the clients and agents are given (GPULEDGER_URL, agent --url)."""
        return ",".join(m.url for m in self.members)

    def start(self, m: Member) -> Member:
        before = len(m.text())
        with m.log.open("ab") as out:
            m.proc = subprocess.Popen(
                [GPULEDGER, "serve", "--store", m.dsn or self.dsn, "--listen",
                 f"127.0.0.1:{m.port}", "--lease", self.lease, *self.args],
                env=env_for(m.home), stdout=out, stderr=out,
            )  # fmt: skip

        def listening() -> bool:
            if m.proc is not None and m.proc.poll() is not None:
                raise AssertionError(f"{m.name} exited with {m.proc.returncode}:{self.why()}")
            return "listening on" in m.text()[before:]

        waits.wait_for(f"{m.name} to listen", listening, 90, self.why)
        return m

    def leader(self, timeout: float = 60) -> Member:
        """The one member that says it leads (and whom every other live member names)."""

        def one() -> Member | None:
            said = {m.name: m.health() for m in self.members if m.alive()}
            leaders = [m for m in self.members if (said.get(m.name) or {}).get("role") == "leader"]
            if len(leaders) != 1:
                return None
            named = {(h or {}).get("leader") for h in said.values()}
            return leaders[0] if named == {leaders[0].url} else None

        return waits.wait_for("one leader that every server names", one, timeout, self.why)

    def why(self) -> str:
        return "".join(f"\n--- {m.name}\n{m.text()[-2500:]}" for m in self.members)

    def stop(self) -> None:
        for m in self.members:
            with contextlib.suppress(Exception):
                m.kill()


def make_group(root: Path, dsn: str, n: int, *args: str, home: Path | None = None) -> Group:
    """`n` servers on the store `dsn` (one of them may use an existing `home`), not started."""
    members = []
    for i in range(n):
        h = home if (home is not None and i == 0) else root / f"server-{i}"
        h.mkdir(parents=True, exist_ok=True)
        members.append(Member(f"server-{i}", h, free_port(), root / f"server-{i}.log"))
    return Group(dsn, members, args)


def log_events(home: Path, *, store: str = "") -> list[dict[str, Any]]:
    """Every event of the log, read from the store itself (no server)."""
    out = cli(home, "log", "--json", "--limit", "10000", timeout=120)
    return [r["event"] for r in json.loads(out.stdout)]


def wait_cycled_after(g: Group, wall: float, timeout: float = 60) -> tuple[Member, float]:
    """The member that leads and has run a cycle since `wall` (time.time() of a kill), and
    that cycle's time, in seconds after `wall`."""

    def cycled() -> tuple[Member, float] | None:
        for m in g.members:
            h = m.health() if m.alive() else None
            if h and h.get("role") == "leader" and (h.get("last_cycle_at") or 0) > wall:
                return m, float(h["last_cycle_at"]) - wall
        return None

    return waits.wait_for("a new leader's first cycle", cycled, timeout, g.why)


__all__ = ["LEASE", "Group", "Member", "env_for", "free_port", "log_events", "make_group"]
