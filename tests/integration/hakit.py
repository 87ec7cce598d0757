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
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ledger.wire.client import Client
from schemas import commands as c
from schemas.errors import LedgerError
from tests.integration import waits
from tests.integration.agentkit import Agent
from tests.integration.ports import free_port
from tests.integration.serverkit import GPULEDGER, Server, cli, env_for, init_on_store, make_token
from tests.integration.userkit import marks_dir

LEASE = os.environ.get("GPULEDGER_HA_LEASE", "2s")
"""The servers' lease (docs/ha.md measures failover with the default, 5s, too)."""
JOB = (
    "trap 'echo term >> \"{dir}/$GPULEDGER_JOB_ID\"' TERM; sleep 100000 & "
    'echo "start $$ $!" >> "{dir}/$GPULEDGER_JOB_ID"; while true; do sleep 0.5; done'
)
"""A job whose leader forks a child; it writes both pids, and says so if it is signalled."""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


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
    env: dict[str, str] = field(default_factory=dict)
    """More environment for the servers (`GPULEDGER_KAFKA_TOPIC`, ...)."""

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
                env=env_for(m.home, **self.env), stdout=out, stderr=out,
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


def alices_ledger(tmp_path: Path, store: str) -> tuple[Path, str]:
    """The first server's home on `store` (`init_on_store`: root, the budgets, one node) and a
    token of alice's, as the group tests open."""
    home = tmp_path / "server-0"
    init_on_store(home, tmp_path, store)
    return home, make_token(home, "--user", "alice")


def make_group(root: Path, dsn: str, n: int, *args: str, home: Path | None = None) -> Group:
    """`n` servers on the store `dsn` (one of them may use an existing `home`), not started."""
    members = []
    for i in range(n):
        h = home if (home is not None and i == 0) else root / f"server-{i}"
        h.mkdir(parents=True, exist_ok=True)
        members.append(Member(f"server-{i}", h, free_port(), root / f"server-{i}.log"))
    return Group(dsn, members, args)


def lead_behind(g: Group, via: str) -> tuple[Member, Member]:
    """Group `g`'s first server, on the store through `via` (a proxy the test cuts), started and
    leading, then its second started: (first, second)."""
    first, second = g.members
    first.dsn = via
    g.start(first)
    assert g.leader() is first
    g.start(second)
    return first, second


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


@dataclass
class JobOnAgents:
    """Two servers (`g`; the first leads), real agents on node-a and node-b, and a job of 2
    GPUs (`JOB`: a leader and its child, their pids written to `marks`) running on one of them,
    whose agent is `cut` (a test stops it to put the node out of contact)."""

    g: Group
    agents: dict[str, Agent]
    client: Client
    marks: Path
    job_id: int = 0
    pids: list[int] = field(default_factory=list)
    """The first launch's leader and child."""
    cut: Agent | None = None

    def starts(self) -> list[list[int]]:
        """Each launch's [leader, child] pids, in the order they started."""
        mark = self.marks / str(self.job_id)
        lines = mark.read_text().splitlines() if mark.exists() else []
        return [[int(w) for w in ln.split()[1:3]] for ln in lines if ln.startswith("start")]

    def why(self) -> str:
        return self.g.why() + "".join(
            f"\n--- {n}\n{a.text()[-3000:]}" for n, a in self.agents.items()
        )

    def close(self) -> None:
        """Thaw the cut agent, cancel the job, kill every launch's processes, the agents and
        the servers."""
        if self.cut is not None and self.cut.proc is not None:
            self.cut.proc.send_signal(signal.SIGCONT)
        if self.job_id:
            with contextlib.suppress(LedgerError):
                self.client.execute(c.CancelJob(actor="", job_id=self.job_id))
        for pid in [p for launch in self.starts() for p in launch] or self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.client.close()
        for agent in self.agents.values():
            if agent.proc is not None and agent.proc.poll() is None:
                agent.kill(signal.SIGKILL)
        self.g.stop()


def job_on_agents(root: Path, dsn: str, *args: str) -> JobOnAgents:
    """`JobOnAgents` on the store `dsn`, the servers started with `args`: the first server
    leads, the job runs (its pids read), its node's agent found; the caller `close`s it (also
    when this fails part way: it is handed over as soon as the servers are made)."""
    home = root / "server-0"
    init_on_store(home, root, dsn, "node-a", 2, "sim")
    cli(home, "node", "add", "node-b", "--gpus", "2", "--gpu-type", "sim", GPULEDGER_USER="root")
    token = make_token(home, "--user", "alice")
    marks = marks_dir()  # the job runs as nobody
    g = make_group(root, dsn, 2, *args, home=home)
    agents = {}
    for node in ("node-a", "node-b"):
        node_token = make_token(home, "--node", node, "--name", node)
        agents[node] = Agent(node, root / node, node_token, g.urls, root / f"{node}.log")
    return JobOnAgents(g, agents, Client(g.urls, token, timeout=30), marks)


def run_the_job(w: JobOnAgents) -> JobOnAgents:
    """Start the first server (it leads) and the agents, submit the job, wait for its first
    launch, and find the agent it runs under (`w.cut`)."""
    w.g.start(w.g.members[0])
    w.g.leader()
    for agent in w.agents.values():
        agent.start()
    got = w.client.execute(c.SubmitJob(actor="", account="ai2/olmo", gpus=2, min_runtime_s=60,
                                       resumable=True,
                                       command=("sh", "-c", JOB.format(dir=w.marks))))  # fmt: skip
    w.job_id = got.events[0].job_id  # type: ignore[union-attr]
    w.pids = waits.wait_for("the job to start", lambda: w.starts() or None, 120, w.why)[0]
    row = next(j for j in w.client.get("jobs", {"limit": 100}) if j["job_id"] == w.job_id)
    nodes = row["nodes"] if isinstance(row["nodes"], list) else str(row["nodes"]).split(",")
    w.cut = w.agents.get(str(nodes[0]).strip())
    assert w.cut is not None and w.cut.proc is not None, (row, w.why())
    return w


class PgProxy:
    """A TCP proxy to the PostgreSQL of `dsn`, on a port of its own (`via`: the DSN through it),
    for tests that cut or slow a server's link to the store. Every connection is pumped both
    ways through `passing` (the bytes to send on, or None to swallow them), which a test's
    proxy overrides; `admit` says whether a new connection is answered at all (one that is not
    is held open, never answered: a silent network, not a refused one).

    As a network path does, it passes a close on: a connection PostgreSQL refuses (it is down)
    is closed to its client, and the proxy goes on accepting (it stopped for good at the first
    refusal); one side's close (PostgreSQL killed, the server dropping its connection) closes
    the other's, unless `closing` says the path is silent (before, the other side heard nothing
    for ever: behind it, a PostgreSQL kill -9 was a silent link for good, atk60-ha)."""

    def __init__(self, dsn: str) -> None:
        parts = urlsplit(dsn)
        self.upstream = (parts.hostname or "", parts.port or 5432)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.via = urlunsplit(parts._replace(netloc=parts.netloc.replace(
            f"{parts.hostname}:{parts.port}", f"127.0.0.1:{self.port}")))  # fmt: skip
        self.held: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def admit(self) -> bool:
        return True

    def passing(self, data: bytes, upward: bool, link: threading.Event) -> bytes | None:
        """What of `data` (read from the client when `upward`, else from PostgreSQL) goes on;
        `link` is the connection's own flag, for a proxy that changes once it saw something."""
        return data

    def closing(self, upward: bool) -> bool:
        """Whether a close of one side (the client's when `upward`) reaches the other."""
        return True

    def _hold(self, *socks: socket.socket) -> None:
        with self._lock:
            self.held.extend(socks)

    def _drop(self, *socks: socket.socket) -> None:
        with self._lock:
            for s in socks:
                with contextlib.suppress(ValueError):
                    self.held.remove(s)
                with contextlib.suppress(OSError):
                    s.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._hold(conn)
            if not self.admit():
                continue  # accepted, never answered
            threading.Thread(target=self._connect, args=(conn,), daemon=True).start()

    def _connect(self, conn: socket.socket) -> None:
        try:
            up = socket.create_connection(self.upstream, timeout=10)
        except OSError:  # refused (PostgreSQL down): so is the client
            self._drop(conn)
            return
        up.settimeout(None)
        self._hold(up)
        link, ends = threading.Event(), [2]
        for a, b, upward in ((conn, up, True), (up, conn, False)):
            threading.Thread(target=self._pump, args=(a, b, upward, link, ends),
                             daemon=True).start()  # fmt: skip

    def _pump(self, src: socket.socket, dst: socket.socket, upward: bool,
              link: threading.Event, ends: list[int]) -> None:  # fmt: skip
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                break
            if not data:
                break
            sent = self.passing(data, upward, link)
            if sent is None:
                continue  # swallowed: the other side hears nothing
            try:
                dst.sendall(sent)
            except OSError:
                break
        if not self.closing(upward):
            return  # a silent path: the other side hears nothing (closed with the proxy)
        for s in (dst, src):  # wakes the other direction's pump, which ends too
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        with self._lock:
            ends[0] -= 1
            last = ends[0] == 0
        if last:
            self._drop(src, dst)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept (a close alone leaves it listening)
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        with self._lock:
            held, self.held = self.held, []
        for s in held:
            with contextlib.suppress(OSError):
                s.close()


__all__ = [
    "JOB", "LEASE", "Group", "JobOnAgents", "Member", "PgProxy", "alices_ledger", "alive",
    "env_for", "free_port", "job_on_agents", "log_events", "make_group", "run_the_job",
]  # fmt: skip
