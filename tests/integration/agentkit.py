"""The node agents' kit: one `gpuledger serve --executor agents` on 127.0.0.1 (random port) and
three `gpuledger agent` processes, node-a/b/c, each with its own state directory, running real
shell jobs (the `cluster` fixture, module-scoped `template`), and what their tests ask of them.
The tests: test_node_agents.py, test_node_agents_ids.py and the agent files that import this."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ledger.agent.identity import instance_id
from ledger.engines.proc import start_time
from ledger.engines.runs import read_identity
from ledger.engines.supervised import live_processes
from schemas.agent import AGENT_HEADER
from tests.integration import userkit
from tests.integration.ports import free_port
from tests.integration.serverkit import GPULEDGER, Server, cli, env_for, make_token, start_server
from tests.integration.waits import wait_for

NODES = ("node-a", "node-b", "node-c")
GPUS = 2
SERVE = ("--executor", "agents", "--interval", "0.2s", "--node-lost-after", "5s", "--grace", "1s")
BUDGET = """
[accounts."ai2"]
kind = "program"

[accounts."ai2/olmo"]
kind = "project"
members = ["alice", "bob", "root"]
"""


@dataclass
class Agent:
    node: str
    state: Path
    token: str
    url: str
    log: Path
    args: tuple[str, ...] = ()
    """The test's own agent flags, kept across restarts."""
    proc: subprocess.Popen[bytes] | None = None
    prefix: tuple[str, ...] = ()
    """What the agent runs under (e.g. `unshare`: another machine's view of the same path)."""

    def start(self, *extra: str, registered: bool = True) -> Agent:
        """Start it; wait until it registers (not when `registered` is False: no server may
        register it, e.g. while the store is away)."""
        before = len(self.text())
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*self.prefix, GPULEDGER, "agent", "--node", self.node, "--url", self.url,
                 "--gpus", str(GPUS), "--gpu-type", "sim", "--state-dir", str(self.state),
                 "--grace", "1s",
                 "--heartbeat", "0.5s", "--run-as", "service", "--sample-every", "0.5s",
                 "--check-every", "0.1s", *self.args, *extra],
                env=env_for(self.state, GPULEDGER_NODE_TOKEN=self.token),
                stdout=out, stderr=out,
            )  # fmt: skip
        if registered:
            wait_for(f"{self.node} to register",
                     lambda: "registered node" in self.text()[before:], why=self.text)  # fmt: skip
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def named(self) -> dict[str, str]:
        """The header this agent names itself with (`schemas.agent.AGENT_HEADER`): a request
        made with it is this agent's own."""
        return {AGENT_HEADER: instance_id(self.state)}

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self.proc.wait(timeout=30)

    def power_off(self) -> None:
        """The node's host goes down: the agent and every process of its runs (supervisor,
        watchdog, the job's whole process group) killed at once, and gone."""
        self.kill(signal.SIGKILL)

        def gone() -> bool:
            for rundir in (self.state / "runs").glob("*/*"):
                for name in ("supervisor", "watchdog", "job"):
                    ident = read_identity(rundir / name)
                    if ident is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(ident[0], signal.SIGKILL)
            for p in live_processes(self.state):
                for pid in (p.pid, *p.pids):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            return not live_processes(self.state)

        wait_for("the host's processes to go", gone, 30)


@dataclass
class Cluster:
    home: Path
    server: Server
    serve_args: tuple[str, ...] = ()
    """The test's own `serve` flags, kept across restarts (see `setup`)."""
    root: str = ""
    """Root's token (`read`)."""
    agents: dict[str, Agent] = field(default_factory=dict)

    def cli(self, *args: str, user: str = "root", ok: bool = True) -> Any:
        return cli(self.home, *args, ok=ok, GPULEDGER_USER=user)

    def submit(self, gpus: int, script: str, *opts: str, user: str = "root") -> int:
        """As root by default: root's own job runs as root, so it reaches the test's private
        directories and the CLI; another ledger user's job runs as nobody (`run_as` service)."""
        out = self.cli("submit", "-A", "ai2/olmo", "-G", str(gpus), "--min-runtime", "1h", *opts,
                       "--", "sh", "-c", script, user=user)  # fmt: skip
        return int(out.stdout.split()[2].rstrip(":"))

    def read(self, query: str, *cli_args: str) -> Any:
        """Root's read `GET /v1/QUERY` of the server: the rows the CLI's `CLI_ARGS --json`
        prints through it, without a `gpuledger` process a read (the polls below started one
        every ~0.1 s: most of the file's CPU); while no server answers (down for a restart),
        the CLI's, which reads the store; the CLI's too for a cluster made without `root`."""
        try:
            if self.root:
                return self.server.read(f"/v1/{query}", self.root)
        except OSError:
            pass
        return json.loads(self.cli(*cli_args, "--json").stdout)

    def jobs(self) -> dict[int, dict[str, Any]]:
        return {j["job_id"]: j for j in json.loads(self.cli("jobs", "--json").stdout)}

    def job(self, job_id: int) -> dict[str, Any]:
        (row,) = self.read(f"jobs?job_ids={job_id}", "jobs", "--jobs", str(job_id))
        return row  # type: ignore[no-any-return]

    def events(self, tag: str) -> list[dict[str, Any]]:
        rows = self.read("log?limit=10000", "log", "--limit", "10000")
        return [r["event"] for r in rows if r["event"]["type"] == tag]

    def nodes(self) -> dict[str, str]:
        rows = self.read("nodes", "node", "list")
        return {n["node"]: n["state"] for n in rows}

    def restart_server(self, *extra: str) -> None:
        """On the same port: the agents keep their URL."""
        self.server = start_server(self.home, *SERVE, "--listen", f"127.0.0.1:{self.server.port}",
                                   *self.serve_args, *extra,
                                   log_name=f"serve-{time.monotonic_ns()}.log")  # fmt: skip

    def why(self) -> str:
        out = self.server.log_path.read_text(errors="replace")[-3000:]
        for ag in self.agents.values():
            out += f"\n--- {ag.node}\n" + ag.text()[-2000:]
        return out + self.cli("log", "--tail", "20", ok=False).stdout

    def wait_status(self, job_id: int, *status: str, timeout: float = 60) -> dict[str, Any]:
        return wait_for(  # type: ignore[no-any-return]
            f"job {job_id} to be {status}",
            lambda: (j := self.job(job_id)) and j["status"] in status and j,
            timeout, self.why,
        )  # fmt: skip


def part_log(entry: str) -> Path:
    """A job's log as `jobs` shows it: `NODE:PATH`."""
    return Path(entry.split(":", 1)[1])


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A ledger with budgets, three 2-GPU nodes and a node token each, and root's token (made
    once)."""
    home = tmp_path_factory.mktemp("template") / "home"
    cli(home, "init", "--admin", "root")
    budget = home.parent / "budget.toml"
    budget.write_text(BUDGET)
    cli(home, "budget", "apply", str(budget), GPULEDGER_USER="root")
    tokens = {}
    for node in NODES:
        cli(home, "node", "add", node, "--gpus", str(GPUS), "--gpu-type", "sim",
            GPULEDGER_USER="root")  # fmt: skip
        tokens[node] = make_token(home, "--node", node, "--name", node)
    tokens["root"] = make_token(home, "--user", "root")  # (`Cluster.read`)
    return home, tokens


@pytest.fixture
def cluster(
    template: tuple[Path, dict[str, str]], tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    src, tokens = template
    home = tmp_path / "home"
    shutil.copytree(src, home)
    port = free_port()  # a fixed port, so a restarted server has the same URL
    serve, agent = getattr(request, "param", ((), ()))
    server = start_server(home, *SERVE, "--listen", f"127.0.0.1:{port}", *serve)
    c = Cluster(home, server, serve, tokens["root"])
    for node in NODES:
        c.agents[node] = Agent(node, tmp_path / node, tokens[node], c.server.url,
                               tmp_path / f"{node}.log", agent).start()  # fmt: skip
    try:
        yield c
    finally:
        for ag in c.agents.values():
            if ag.proc is not None and ag.proc.poll() is None:
                ag.proc.send_signal(signal.SIGCONT)
                ag.kill(signal.SIGKILL)
        c.server.stop(signal.SIGKILL)
        for ag in c.agents.values():  # no job of a test outlives it
            for p in live_processes(ag.state):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)


def with_flags(serve: tuple[str, ...] = (), agent: tuple[str, ...] = ()) -> pytest.MarkDecorator:
    """A test's own `serve` and `agent` flags for its cluster."""
    return pytest.mark.parametrize("cluster", [(serve, agent)], indirect=True, ids=[""])


def alive(pid: int) -> bool:
    return start_time(pid) is not None  # gone, or a zombie: not alive


def held_twice(events: list[dict[str, Any]]) -> list[tuple[str, int]]:
    holder: dict[tuple[str, int], int] = {}
    clashes = []
    for ev in events:
        if ev["type"] == "job.placed.v1":
            gpus = [(s["node"], i) for s in ev["slots"] for i in s["gpu_indices"]]
            clashes += [g for g in gpus if g in holder]
            holder.update(dict.fromkeys(gpus, ev["job_id"]))
        elif ev["type"] in ("job.finished.v2", "job.preempted.v1"):
            holder = {g: j for g, j in holder.items() if j != ev["job_id"]}
    return clashes


def all_events(c: Cluster) -> list[dict[str, Any]]:
    rows = json.loads(c.cli("log", "--json", "--limit", "10000").stdout)
    return [r["event"] for r in rows]


def until(trigger: Path, code: int) -> str:
    """A job that says its pid, runs until the test creates `trigger`, then exits with `code`."""
    return f"echo $$; while [ ! -e {trigger} ]; do sleep 0.1; done; exit {code}"


def running_pid(c: Cluster, job: int) -> tuple[str, int]:
    """(node, pid) of a running one-node job, from its log."""
    j = c.wait_status(job, "running")
    log = part_log(j["logs"][0])
    pid = int(wait_for(f"job {job}'s pid", lambda: log.read_text().split(), 30, c.why)[0])
    return j["logs"][0].split(":", 1)[0], pid


def audit_check(c: Cluster) -> str:
    """`audit check` over the ledger and every agent's live processes (the server stopped)."""
    states = [a for ag in c.agents.values() for a in ("--agent-state", str(ag.state))]
    return str(c.cli("audit", "check", *states).stdout)


RUNNER = "glrunner"
"""An OS account that submits in the run-as test (made by the test when missing)."""


def os_user(name: str) -> pwd.struct_passwd:
    """The OS account `name`, made with useradd when it does not exist (the test runs as root:
    it fails, never skips, when the account cannot be made)."""
    with userkit.accounts_locked():
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True, text=True,
        )  # fmt: skip
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise AssertionError(
            f"cannot make the OS user {name!r} this test launches jobs as "
            f"(useradd exited {made.returncode}: {made.stderr.strip()}); run the suite as root"
        ) from None


def refused(ag: Agent, node: str, timeout: float = 30) -> str:
    """Start `ag` and expect it refused for the node's holder: one error line, exit 1, nothing
    launched. Returns its last line."""
    ag.start(registered=False)
    assert ag.proc is not None
    try:
        code = ag.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the other agent ran on: {ag.text()[-2000:]}")
    said = ag.text().strip().splitlines()
    assert code == 1 and said and said[-1].startswith("error: "), ag.text()[-2000:]
    assert f"node '{node}' is held by another agent" in said[-1], said[-1]
    assert "launched" not in ag.text() and "Traceback" not in ag.text()
    return said[-1]


def ran_once(c: Cluster, job: int, pid: int, go: Path) -> None:
    """The holder's job lived through the other agent's try: still running, it completes when
    let go, started once."""
    assert alive(pid) and c.job(job)["status"] == "running"
    go.touch()
    j = c.wait_status(job, "finished")
    assert (j["outcome"], j["exit_code"]) == ("completed", 0)
    assert len(c.events("job.started.v1")) == 1


def kill_rest(ag: Agent) -> None:
    if ag.proc is not None and ag.proc.poll() is None:
        ag.kill(signal.SIGKILL)
    for p in live_processes(ag.state):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)


def launches(marks: Path) -> list[list[str]]:
    """The lines each launch of a job wrote at its start (`world_script`)."""
    return [ln.split("|") for ln in marks.read_text().splitlines()] if marks.exists() else []


def world_script(marks: Path) -> str:
    """A job that writes, at each launch: launch, pid, working directory, $MY_VAR, umask,
    whether it has a job token; then ignores SIGTERM (it lives out its grace) and loops."""
    return (
        f'echo "$GPULEDGER_LAUNCH|$$|$(pwd)|$MY_VAR|$(umask)|${{GPULEDGER_JOB_TOKEN:+token}}" '
        f'| tee -a {marks}; trap "" TERM; while :; do sleep 0.2; done'
    )


def take_node_when_free(ag: Agent, watch: Callable[[], None], timeout: float = 90) -> int:
    """Start `ag` again and again (each refused one exits) until it registers, calling `watch`
    meanwhile; returns how many times it was refused."""
    deadline, tries = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        before = len(ag.text())
        ag.start(registered=False)
        assert ag.proc is not None
        while ag.proc.poll() is None and "registered node" not in ag.text()[before:]:
            watch()
            time.sleep(0.1)
        if "registered node" in ag.text()[before:]:
            return tries
        assert "is held by another agent" in ag.text()[before:], ag.text()[-2000:]
        tries += 1
        watch()
        time.sleep(0.5)
    raise AssertionError(f"the agent never took the node: {ag.text()[-2000:]}")


OTHER_MACHINE = (
    'mount -t tmpfs none /sys/fs/cgroup && mount --bind "$1" "$2" && '
    'mount --bind "$3" /proc/sys/kernel/random/boot_id && '
    "mount -t tmpfs -o mode=0755 none /run/gpuledger && "
    'shift 3 && exec "$@"'
)
"""Run as `unshare -m -p -f --kill-child --mount-proc sh -c OTHER_MACHINE sh DISK PATH BOOT_ID
AGENT...`: another machine's view of this one, with DISK (a copy of a state directory) at
PATH, its own processes, cgroups, boot id and /run."""


def limits_of(text: str) -> dict[str, tuple[str, str]]:
    """`/proc/PID/limits` as {name: (soft, hard)}."""
    out = {}
    for line in text.splitlines()[1:]:
        words = line[:26].strip(), line[26:].split()
        if len(words[1]) >= 2:
            out[words[0]] = (words[1][0], words[1][1])
    return out
