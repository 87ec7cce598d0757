"""Slurm as the execution engine: a real Slurm cluster (Debian's slurm-wlm, started by
scripts/slurm/slurm), fake GPU devices, real jobs, `gpuledger up --executor slurm` as a process.

Every test owns the partition while it runs: it cancels what is left and resumes the node before
and after itself.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SLURM_CONF_OF, slurm_conf, slurm_group
from tests.integration.serverkit import Server, make_token, socket_read, start_server
from tests.integration.slurmd_steps import end_orphans

ROOT = Path(__file__).resolve().parents[2]
SLURM_SCRIPT = ROOT / "scripts" / "slurm" / "slurm"
GPULEDGER = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"
BUDGET = (
    '[accounts."ai2"]\nkind = "program"\n'
    '[accounts."ai2/olmo"]\nkind = "project"\nmembers = ["alice", "bob", "nobody"]\n'
)


@dataclass
class Cluster:
    conf: str
    partition: str
    node: str
    group: str = "slurm-a"
    others: tuple[str, ...] = ()  # its nodes after `node` (cluster g's: GPULEDGER_SLURM_NODES)

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.node, *self.others)

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": self.conf}

    def run(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(args, env=self.env(), capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise AssertionError(f"{args}: {done.stderr}")
        return done.stdout

    def daemon_pid(self, name: str) -> int:
        """The pid of this cluster's daemon `name` (`slurm up`'s pid file), checked to be that
        daemon still (`running`); not running: an AssertionError."""
        pid = self._recorded(name)
        assert self.running(name), f"{name} of {self.conf} is not running (its pid file: {pid})"
        return pid

    def running(self, name: str) -> bool:
        """Whether the process of `name`'s pid file is this cluster's daemon still: its
        environment names this cluster's config, as `slurm up` started it. A pid file outlives a
        daemon killed -9, and its pid may be another process's by now (pids wrap fast in the
        suite): a kill by it would hit that one."""
        try:
            env = Path(f"/proc/{self._recorded(name)}/environ").read_bytes().split(b"\0")
        except OSError:
            return False
        key = b"SLURM_CONF="
        return Path(self.conf) in [Path(v[len(key) :].decode()) for v in env if v.startswith(key)]

    def _recorded(self, name: str) -> int:
        return int((Path(self.conf).parent / f"{name}.pid").read_text().split()[0])

    def up(self, **extra: str) -> None:
        """(Re)start whichever Slurm daemon is not running (a node a test left DOWN or drained
        is resumed by `slurm up`), with `extra` in `slurm up`'s environment."""
        # the data dir's own config says its ports, GPUs and node (the suite's cluster's are in the
        # environment, and another cluster, e.g. an unpinned one, must not take them)
        own = ("GPULEDGER_SLURMCTLD_PORT", "GPULEDGER_SLURMD_PORT", "GPULEDGER_SLURM_PINNED",
               "GPULEDGER_SLURM_NODE")  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in own}
        env["GPULEDGER_SLURM_DATA"] = str(Path(self.conf).parent)
        env.update(extra)
        done = subprocess.run(
            [str(SLURM_SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr

    def jobs(self) -> dict[str, dict[str, str]]:
        """Slurm's own view: job id -> name, state, comment."""
        out = self.run("squeue", "-h", "-t", "all", "-p", self.partition, "-o", "%i|%j|%T|%k")
        rows = (line.split("|", 3) for line in out.splitlines() if line.strip())
        return {r[0]: {"name": r[1], "state": r[2], "comment": r[3]} for r in rows}

    def clean(self) -> None:
        # a launch a test held CONFIGURING (the prolog's `hold-launches` flag) keeps its GPUs
        # until its prolog ends, cancelled or not: no flag outlives its test
        (Path(self.conf).parent / "hold-launches").unlink(missing_ok=True)
        self.run("scancel", "-p", self.partition, check=False)
        for node in self.nodes:
            self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        deadline = time.monotonic() + 60
        busy = ("RUNNING", "COMPLETING", "CONFIGURING")
        while time.monotonic() < deadline:
            live = [j for j in self.jobs().values() if j["state"] in busy]
            states = self.run("sinfo", "-h", "-N", "-p", self.partition, "-o", "%T", check=False)
            if not live and states.split() and all("idle" in s for s in states.split()):
                self.heal_gres()
                # a step slurmctld forgot (killed -9 before it saved the job, here or in
                # heal_gres) whose id it hands out again: its launch "Duplicate jobid"
                for node in self.nodes:
                    end_orphans(self.conf, node)
                return
            time.sleep(0.3)
        raise AssertionError(f"the partition did not empty: {self.jobs()}")

    def heal_gres(self) -> None:
        """With no job left, Slurm 22.05 may still count a GPU allocated (a test that killed
        slurmctld while a job Slurm requeued itself ran: `SlurmExecutor._hold_leaked`): the
        next test would find one GPU fewer. Once no job of any partition runs, completes or
        configures, a restarted slurmctld counts from its jobs again (restarted while one
        completes, it may leak again: up to three tries, then a clear failure)."""
        for _ in range(3):
            if not re.search(r"\(IDX:[0-9]", self.gres_used()):
                return
            deadline = time.monotonic() + 60
            busy = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED")
            while time.monotonic() < deadline and any(
                st in busy for st in self.run("squeue", "-h", "-o", "%T", check=False).split()
            ):
                time.sleep(0.3)
            if not re.search(r"\(IDX:[0-9]", self.gres_used()):
                return
            os.kill(self.daemon_pid("slurmctld"), signal.SIGKILL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.running("slurmctld"):
                time.sleep(0.1)  # gone before `slurm up` starts another
            self.up()
            time.sleep(1)
        raise AssertionError(f"Slurm counts GPUs with no job holding them: {self.gres_used()}")

    def strays(self, top: Path) -> list[str]:
        """The jobs of the other Slurm group's cluster whose working directory is under `top` (a
        test's own directory): a test of this group that reached the other cluster (none while
        both groups run on one cluster, as without xdist). A controller that does not answer is
        not asked: a test of the other group stops its own (test_slurm_faults: 40 s)."""
        found = []
        for group in SLURM_CONF_OF.keys() - {self.group}:
            try:
                conf = slurm_conf(group, os.environ)
            except LookupError:
                continue
            if conf == self.conf:
                continue
            done = subprocess.run(
                ["squeue", "-h", "-t", "all", "-o", "%i|%Z"],
                env={**os.environ, "SLURM_CONF": conf}, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if done.returncode != 0:
                continue
            found += [f"{group}: {line}" for line in done.stdout.splitlines()
                      if line.split("|", 1)[-1].startswith(str(top))]  # fmt: skip
        return found

    def gres_used(self) -> str:  # each node's `GresUsed=` (of its own slurmctld), space separated
        text = self.run("scontrol", "-d", "-o", "show", "node", check=False)
        return " ".join(w for w in text.split() if w.startswith("GresUsed="))


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Cluster:
    """The Slurm cluster of this file's group (tests/conftest.py: `slurm_group`, `slurm_conf`),
    one of the two scripts/test started; the test fails if there is none."""
    group = slurm_group(request.path)
    if group is None:
        pytest.fail(f"{request.path.name} is not a Slurm test file (test_slurm*.py)", pytrace=False)
    try:
        conf = slurm_conf(group, os.environ)
    except LookupError as exc:
        pytest.fail(str(exc), pytrace=False)
    if not Path(conf).is_file():
        pytest.fail(f"{conf} (the {group} tests' slurm.conf) is not a file", pytrace=False)
    partition = os.environ.get("GPULEDGER_SLURM_PARTITION", "gpuledger")
    env = {**os.environ, "SLURM_CONF": conf}
    done = subprocess.run(
        ["sinfo", "-h", "-N", "-p", partition, "-o", "%N"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0 or not done.stdout.strip():
        pytest.fail(f"Slurm at {conf} does not answer: {done.stderr.strip()}", pytrace=False)
    nodes = list(dict.fromkeys(done.stdout.split()))
    return Cluster(conf, partition, nodes[0], group, tuple(nodes[1:]))


@pytest.fixture
def slurm(cluster: Cluster) -> Iterator[Cluster]:
    cluster.up()
    cluster.clean()
    yield cluster
    cluster.up()
    cluster.clean()


class Ledger:
    """A ledger home driven through the CLI, and its `gpuledger up --executor slurm` process."""

    def __init__(self, home: Path, cluster: Cluster) -> None:
        self.home = home
        self.cluster = cluster
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._logs: list[Any] = []

    def env(self, actor: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
        return env | {
            "GPULEDGER_HOME": str(self.home),
            "GPULEDGER_USER": actor,
            "SLURM_CONF": self.cluster.conf,
        }

    def cli(self, *args: str, actor: str = "root") -> str:
        done = subprocess.run(
            [GPULEDGER, *args],
            env=self.env(actor),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.work,
        )
        assert done.returncode == 0, f"{args}: {done.stderr}"
        return done.stdout

    def submit(self, actor: str, gpus: int, script: str, *opts: str) -> None:
        self.cli("submit", "-A", "ai2/olmo", "-G", str(gpus), *opts, "--", "bash", "-c", script,
                 actor=actor)  # fmt: skip

    def up(self, run_as: str = "service", nodes: bool = True,
           files: tuple[int, int] | None = None, interval: str = "0.2s",
           **env: str) -> None:  # fmt: skip
        """`gpuledger up --executor slurm`, with `env` added to its own environment (and
        `files`: its soft and hard open-files limits; `interval`: its cycle's); waits until the
        partition's nodes are registered (`nodes`), else until it answers."""
        self.starts += 1
        log = open(self.home.parent / f"up-{self.starts}.log", "wb")  # noqa: SIM115
        self._logs.append(log)
        self.proc = subprocess.Popen(
            [GPULEDGER, "up", "--executor", "slurm", "--partition", self.cluster.partition,
             "--interval", interval, "--grace", "2s", "--log-level", "INFO", "--run-as", run_as],
            env=self.env("root") | env, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=None if files is None else functools.partial(
                resource.setrlimit, resource.RLIMIT_NOFILE, files),
        )  # fmt: skip
        if not nodes:
            self.wait("the service", lambda: (self.home / "gpuledger.sock").exists())
            return
        self.wait("the partition's nodes", lambda: bool(self.nodes()))

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        for log in self._logs:
            log.close()

    def service_log(self) -> str:
        return "".join(p.read_text() for p in sorted(self.home.parent.glob("up-*.log")))

    def read(self, query: str, *cli_args: str) -> Any:
        """Root's `GET /v1/QUERY` of the running service over its Unix socket: the rows the
        CLI's `CLI_ARGS --json` prints through it, without a `gpuledger` process a read (the
        waits poll every 0.3 s: a process of ~0.2 s of CPU each, its imports); while no service
        answers there (stopped, killed, restarting), the CLI's, which reads the store."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                return socket_read(self.home, f"/v1/{query}")
            except OSError:  # not listening yet, or it went away mid-read
                pass
        return json.loads(self.cli(*cli_args, "--json"))

    def nodes(self) -> list[dict[str, Any]]:
        """`node list --json`'s rows (`read`)."""
        return list(self.read("nodes", "node", "list"))

    def events(self) -> list[dict[str, Any]]:
        rows = self.read("log?limit=10000", "log", "--limit", "10000")
        return [r["event"] for r in rows]

    def of(self, kind: str, job_id: int | None = None) -> list[dict[str, Any]]:
        return [
            ev
            for ev in self.events()
            if ev["type"] == kind and (job_id is None or ev.get("job_id") == job_id)
        ]

    def jobs(self) -> dict[int, dict[str, Any]]:
        return {j["job_id"]: j for j in self.read("jobs?limit=200", "jobs")}

    @property
    def work(self) -> Path:
        """Where the CLI submits from (a job's directory and output, as under sbatch): open to
        the jobs' users as /tmp is."""
        work = self.home.parent / "work"
        if not work.exists():
            work.mkdir()
            work.chmod(0o1777)
        return work

    def log_of(self, job_id: int) -> str:
        """The job's output: `gpuledger-<id>.out` where it was submitted from, or the service's
        file for a job with no working directory (submitted over HTTP)."""
        for path in (
            self.work / f"gpuledger-{job_id}.out",
            self.home / "jobs" / f"job-{job_id}.log",
        ):
            if path.exists():
                return path.read_text()
        return ""

    def wait(self, what: str, pred: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"`gpuledger up` exited ({self.proc.returncode}) while waiting for {what}\n"
                    f"{self.service_log()[-3000:]}"
                )
            if pred():
                return
            time.sleep(0.3)
        raise AssertionError(
            f"timed out waiting for {what}; jobs: {self.jobs()}\n{self.service_log()[-3000:]}"
        )


@pytest.fixture
def ledger(slurm: Cluster) -> Iterator[Ledger]:
    # job users (--uid) open their logs themselves: the home must be reachable by them
    # named for the group, so a job of one group on the other's cluster is told (`Cluster.strays`)
    tmp_path = Path(tempfile.mkdtemp(prefix=f"gpuledger-{slurm.group}-"))
    tmp_path.chmod(0o755)
    led = Ledger(tmp_path / "home", slurm)
    led.cli("init", "--admin", "root")
    (tmp_path / "budget.toml").write_text(BUDGET)
    led.cli("budget", "apply", str(tmp_path / "budget.toml"))
    try:
        yield led
    finally:
        led.stop()
        strays = slurm.strays(tmp_path)
        shutil.rmtree(tmp_path, ignore_errors=True)
    assert strays == [], f"this test's jobs ran on the other group's cluster: {strays}"


def held_twice(events: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """GPUs placed while another job of the ledger held them (read from the log alone)."""
    holder: dict[tuple[str, int], int] = {}
    slots: dict[int, list[tuple[str, int]]] = {}
    clashes = []
    for ev in events:
        if ev["type"] == "job.placed.v1":
            gpus = [(sl["node"], i) for sl in ev["slots"] for i in sl["gpu_indices"]]
            clashes += [g for g in gpus if g in holder]
            holder.update(dict.fromkeys(gpus, ev["job_id"]))
            slots[ev["job_id"]] = gpus
        elif ev["type"] in ("job.preempted.v1", "job.finished.v2"):
            for g in slots.pop(ev["job_id"], []):
                holder.pop(g, None)
    return clashes


def cuda_devices(log: str) -> list[int]:
    """The node's GPU indices the job holds: Slurm's SLURM_JOB_GPUS (the job's own
    CUDA_VISIBLE_DEVICES counts from 0 inside its device cgroup, ConstrainDevices)."""
    line = next(ln for ln in log.splitlines() if ln.startswith("CVD="))
    return [int(i) for i in line.removeprefix("CVD=").split(",")]


def status(led: Ledger, job_id: int) -> str:
    return str(led.jobs()[job_id]["status"])


SHOW = 'echo "CVD=$SLURM_JOB_GPUS"; echo "user=$(id -un) run=$GPULEDGER_RUN"; '


def test_jobs_run_on_the_gpus_the_ledger_chose_and_their_endings_are_recorded(
    ledger: Ledger,
) -> None:
    ledger.up()
    ledger.submit("alice", 2, SHOW + "sleep 3; exit 3")
    # a Unix user: submitted with --uid
    ledger.submit("nobody", 1, SHOW + "sleep 5; exit 0")
    # the executor stops it at its limit (SIGTERM, its grace; Slurm's --time is a backstop)
    ledger.submit("bob", 1, SHOW + "sleep 600", "-t", "1m")
    ledger.submit("alice", 1, SHOW + "sleep 600")  # cancelled in Slurm, outside the ledger
    ledger.wait("the fourth job to run", lambda: status(ledger, 4) == "running", timeout=120)
    (run4,) = ledger.of("job.engine_linked.v1", 4)
    ledger.cluster.run("scancel", run4["engine_job_id"])
    ledger.wait(
        "every job to end",
        lambda: all(j["outcome"] for j in ledger.jobs().values()),
        timeout=240,
    )
    events = ledger.events()
    placed = {ev["job_id"]: ev["slots"] for ev in events if ev["type"] == "job.placed.v1"}
    for job_id in (1, 2, 3):
        (slot,) = placed[job_id]
        assert cuda_devices(ledger.log_of(job_id)) == slot["gpu_indices"], ledger.service_log()
    assert "user=nobody" in ledger.log_of(2)
    ended = {ev["job_id"]: ev for ev in events if ev["type"] == "job.engine_ended.v2"}
    assert {j: (ev["exit_code"], ev["reason"], ev["engine_state"]) for j, ev in ended.items()} == {
        1: (3, "exited", "FAILED"),
        2: (0, "exited", "COMPLETED"),
        3: (143, "time_limit", "FAILED"),  # it died of the SIGTERM (Slurm: FAILED, 0:15)
        4: (ended[4]["exit_code"], "cancelled", "CANCELLED"),
    }
    jobs = ledger.jobs()
    assert [jobs[j]["outcome"] for j in (1, 2, 3, 4)] == [
        "failed", "completed", "failed", "cancelled"
    ]  # fmt: skip
    # what a sacct user reads: why each ended, where it ran, its Slurm job id
    assert [jobs[j]["finish_reason"] for j in (1, 2, 3, 4)] == [
        "failed", "completed", "time_limit", "cancelled"
    ]  # fmt: skip
    assert all(jobs[j]["nodes"] == [ledger.cluster.node] for j in (1, 2, 3, 4)), jobs
    assert all(jobs[j]["started_at"] is not None for j in (1, 2, 3, 4)), jobs
    assert "was stopped at its time limit" in ledger.cli("explain", "3")
    assert "was cancelled outside the ledger (in its engine)" in ledger.cli("explain", "4")
    links = {ev["job_id"]: ev for ev in events if ev["type"] == "job.engine_linked.v1"}
    # Slurm says it gave the chosen GPUs (it stops saying once a run ended: job 2 is too short)
    said = {j: ev["gpus"] for j, ev in links.items() if ev["gpus"]}
    assert said == {j: placed[j] for j in said} and {1, 3} <= set(said)
    linked = {j: ev["engine_job_id"] for j, ev in links.items()}
    assert sorted(linked) == [1, 2, 3, 4] and len(set(linked.values())) == 4
    assert {j: jobs[j]["engine_job_id"] for j in linked} == linked
    slurm_jobs = ledger.cluster.jobs()
    assert all(slurm_jobs[linked[j]]["name"] == f"gpuledger-{j}" for j in (1, 2, 3, 4))
    assert held_twice(events) == []
    configured = [ev for ev in events if ev["type"] == "service.configured.v2"]
    assert configured and configured[-1]["executor"] == "slurm", configured


def test_a_hundred_runs_see_exactly_the_gpus_the_ledger_recorded(ledger: Ledger) -> None:
    """Each fake GPU is its own GRES type (scripts/slurm/slurm), so each sbatch asks Slurm for
    exactly the indices the ledger chose, whichever are free: jobs of random sizes and lengths
    leave holes anywhere, and in 100/100 runs the GPUs the job sees (its own log) are the ones
    the ledger placed it on and the ones Slurm reported (job.engine_linked.v1)."""
    import random

    rng = random.Random(24)
    runs = 100
    ledger.up()
    specs = [(rng.choice((1, 1, 2, 3)), rng.choice((0.2, 0.5, 1.0, 2.0))) for _ in range(runs)]

    def submit(gpus: int, secs: float) -> subprocess.Popen[bytes]:
        script = f'echo "CVD=$SLURM_JOB_GPUS"; sleep {secs}'
        return subprocess.Popen(
            [GPULEDGER, "submit", "-A", "ai2/olmo", "-G", str(gpus), "--", "bash", "-c", script],
            env=ledger.env("alice"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            cwd=ledger.work,
        )  # fmt: skip

    for start in range(0, runs, 10):  # ten submissions at a time, each its own CLI process
        procs = [submit(gpus, secs) for gpus, secs in specs[start : start + 10]]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
    ledger.wait(
        "every run to end",
        lambda: len(jobs := ledger.jobs()) == runs and all(j["outcome"] for j in jobs.values()),
        timeout=900,
    )
    events = ledger.events()
    placed = {ev["job_id"]: ev["slots"] for ev in events if ev["type"] == "job.placed.v1"}
    linked = {ev["job_id"]: ev["gpus"] for ev in events if ev["type"] == "job.engine_linked.v1"}
    same = [
        j
        for j in sorted(placed)
        if len(placed[j]) == 1 and cuda_devices(ledger.log_of(j)) == placed[j][0]["gpu_indices"]
    ]
    report = os.environ.get("GPULEDGER_KILL_REPORT")  # scripts/kill_matrix
    if report:
        with open(report, "a") as f:
            gpus = os.environ.get("GPULEDGER_SLURM_GPUS", "4")
            f.write(f"slurm: the GPUs the job sees == the ledger's record in {len(same)}/{runs} "
                    f"runs on {gpus} GPUs\n")  # fmt: skip
    assert len(same) == runs, (sorted(set(placed) - set(same)), ledger.service_log()[-3000:])
    said = {j: g for j, g in linked.items() if g}  # Slurm stops saying once a run has ended
    assert said == {j: placed[j] for j in said} and len(said) >= runs // 2
    assert sum(p[0]["gpu_indices"][0] > 0 for p in placed.values()) >= 10  # holes anywhere
    assert held_twice(events) == []
    assert all(j["outcome"] == "completed" for j in ledger.jobs().values())


def test_a_funded_job_preempts_an_unfunded_resumable_one_which_runs_again_under_a_new_slurm_job(
    ledger: Ledger,
) -> None:
    victim = (
        SHOW + "trap 'echo \"TERM in run $GPULEDGER_RUN\"; exit 0' TERM; "
        "while true; do sleep 0.2; done"
    )
    ledger.up()
    ledger.submit("bob", 4, victim, "--min-runtime", "0", "--resumable")
    ledger.wait("the unfunded job to run", lambda: status(ledger, 1) == "running")
    ledger.submit("alice", 4, SHOW + "sleep 2; exit 0", "--min-runtime", "1h")
    ledger.wait(
        "the victim to run again",
        lambda: len(ledger.of("job.engine_linked.v1", 1)) == 2 and status(ledger, 1) == "running",
        timeout=90,
    )
    preempted = ledger.of("job.preempted.v1", 1)
    assert [(p["reason"], p["for_job"]) for p in preempted] == [("fairness", 2)]
    assert len(ledger.of("job.requeued.v1", 1)) == 1
    runs = ledger.of("job.engine_linked.v1", 1)
    assert [r["run"] for r in runs] == [0, 1]
    assert runs[0]["engine_job_id"] != runs[1]["engine_job_id"]  # a new Slurm job, linked
    log = ledger.log_of(1)
    assert "TERM in run 0" in log and "run=1" in log
    assert ledger.jobs()[2]["outcome"] == "completed"
    assert cuda_devices(ledger.log_of(2)) == [0, 1, 2, 3]
    # the first run ended before the funded job's Slurm job started: never both on the GPUs
    first, funded = runs[0]["engine_job_id"], ledger.of("job.engine_linked.v1", 2)[0]
    assert ledger.cluster.jobs()[first]["state"] in ("COMPLETED", "CANCELLED")
    assert held_twice(ledger.events()) == []
    # a cancel in the ledger stops the Slurm job
    ledger.cli("cancel", "1")
    ledger.wait(
        "the cancelled run to leave Slurm",
        lambda: ledger.cluster.jobs()[runs[1]["engine_job_id"]]["state"] not in ("RUNNING",),
    )
    assert funded["engine_job_id"] not in (first, runs[1]["engine_job_id"])


def test_while_slurmctld_is_away_nothing_is_preempted_or_placed_and_an_exit_meanwhile_counts(
    ledger: Ledger,
) -> None:
    """Outage mode: an unfunded job fills the node, slurmctld is killed, the job exits 0 and a
    funded job that would preempt it is submitted. While the controller is away nothing is
    preempted or placed, `status` says so and a submission answers at once; once it is back the
    first job is recorded completed (never preempted, never run again) and the second runs."""
    cluster, flags = ledger.cluster, ledger.home.parent
    ledger.up()
    ledger.submit("alice", 4, SHOW + f"until [ -e {flags / 'end'} ]; do sleep 0.2; done; exit 0",
                  "--min-runtime", "0", "--resumable")  # fmt: skip
    ledger.wait("the first job to run", lambda: status(ledger, 1) == "running", timeout=120)
    # slurmctld saves its state a few seconds after a change: killed sooner, it comes back
    # without the run (Slurm then cancels it as a duplicate job id, whatever the ledger does)
    time.sleep(8)
    os.kill(cluster.daemon_pid("slurmctld"), signal.SIGKILL)
    (flags / "end").touch()
    ledger.wait("the outage to be seen", lambda: "outage" in ledger.cli("status"), timeout=90)
    t0 = time.monotonic()
    ledger.submit("bob", 4, SHOW + "exit 0", "--min-runtime", "1h")
    submit_s = time.monotonic() - t0
    time.sleep(3)  # many cycles: the funded job would preempt the unfunded one if it could
    assert ledger.of("job.preempted.v1") == [] and len(ledger.of("job.placed.v1")) == 1
    assert status(ledger, 1) == "running" and status(ledger, 2) == "pending"
    assert submit_s < 10, f"a submission took {submit_s:.1f} s during the outage"
    cluster.up()
    ledger.wait("the first job's exit", lambda: status(ledger, 1) == "finished", timeout=180)
    ledger.wait("the second job to end", lambda: status(ledger, 2) == "finished", timeout=180)
    jobs = ledger.jobs()
    assert (jobs[1]["outcome"], jobs[1]["exit_code"]) == ("completed", 0)
    assert jobs[2]["outcome"] == "completed"
    assert ledger.of("job.preempted.v1") == []
    assert sorted(ev["job_id"] for ev in ledger.of("job.engine_linked.v1")) == [1, 2]
    assert "outage" not in ledger.cli("status")
    assert "outage over after" in ledger.service_log()


def test_kill_9_of_the_service_of_slurmctld_and_of_slurmd_loses_and_double_books_nothing(
    ledger: Ledger,
) -> None:
    cluster = ledger.cluster
    flags = ledger.home.parent
    until = "until [ -e {} ]; do sleep 0.2; done; exit {}"  # runs until the test says so
    ledger.up()
    ledger.submit("alice", 2, SHOW + until.format(flags / "end-1", 0))
    ledger.submit("bob", 1, SHOW + until.format(flags / "end-2", 5))
    ledger.submit("alice", 2, SHOW + "exit 0")  # waits for the second job's GPU

    def running(*job_ids: int) -> bool:
        jobs = ledger.jobs()
        return all(jobs[j]["status"] == "running" for j in job_ids)

    def seen() -> str:  # what a failure shows: the ledger's, Slurm's and the service's view
        slurmctld = Path(cluster.conf).parent / "log" / "slurmctld.log"
        return (
            f"ledger: {ledger.jobs()}\nslurm: {cluster.jobs()}\n"
            f"nodes: {cluster.run('sinfo', '-h', '-N', '-o', '%N %T', check=False)}\n"
            f"service: {ledger.service_log()[-3000:]}\nslurmctld: {slurmctld.read_text()[-3000:]}"
        )

    ledger.wait("two jobs to run", lambda: running(1, 2))
    # 1. the service dies; the second job ends while it is away
    ledger.kill9()
    slurm_ids = {ev["job_id"]: ev["engine_job_id"] for ev in ledger.of("job.engine_linked.v1")}
    (flags / "end-2").touch()
    deadline = time.monotonic() + 60
    while cluster.jobs()[slurm_ids[2]]["state"] != "FAILED":
        assert time.monotonic() < deadline, cluster.jobs()
        time.sleep(0.2)
    assert running(1, 2), seen()  # as the ledger last knew
    ledger.up()
    ledger.wait("the exit seen while away", lambda: ledger.jobs()[2]["outcome"] == "failed")
    assert ledger.of("job.engine_ended.v2", 2)[0]["exit_code"] == 5
    ledger.wait("the third job to run and end", lambda: ledger.jobs()[3]["outcome"] is not None)
    assert running(1), seen()
    # 2. slurmctld dies and comes back: the running job is neither lost nor run twice (it saves
    #    its state a few seconds after a change: killed within ~4 s of the first job's submit,
    #    it came back without it, CI; a Slurm job it never saved is gone for good)
    time.sleep(8)
    os.kill(cluster.daemon_pid("slurmctld"), signal.SIGKILL)
    time.sleep(3)
    assert running(1), seen()
    cluster.up()
    # 3. so does slurmd
    os.kill(cluster.daemon_pid("slurmd"), signal.SIGKILL)
    time.sleep(1)
    cluster.up()
    time.sleep(2)
    assert running(1), seen()
    # a controller that has just restarted may answer before it lists every job again
    ledger.wait(
        "Slurm to list the first job running again",
        lambda: cluster.jobs().get(slurm_ids[1], {}).get("state") == "RUNNING",
    )
    assert running(1), seen()
    (flags / "end-1").touch()
    ledger.wait("the first job to complete", lambda: status(ledger, 1) == "finished", timeout=60)
    jobs = ledger.jobs()
    assert [jobs[j]["outcome"] for j in (1, 2, 3)] == ["completed", "failed", "completed"]
    events = ledger.events()
    assert held_twice(events) == []
    assert [
        ev for ev in events if ev["type"] == "job.engine_ended.v2" and ev["reason"] == "lost"
    ] == []
    linked = [ev["job_id"] for ev in events if ev["type"] == "job.engine_linked.v1"]
    assert sorted(linked) == [1, 2, 3]  # every job ran exactly once
    assert ledger.of("job.engine_linked.v1", 1)[0]["engine_job_id"] == slurm_ids[1]


def test_a_node_slurm_drains_is_drained_in_the_ledger_and_returns_with_it(ledger: Ledger) -> None:
    cluster = ledger.cluster
    ledger.up()
    ledger.wait("the node to be registered", lambda: bool(ledger.nodes()))

    def node() -> dict[str, Any]:
        (n,) = ledger.nodes()
        return dict(n)

    cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=drain", "reason=fan swap")
    ledger.wait("the ledger to drain the node", lambda: node()["state"] == "drained")
    assert node()["drain_reason"].startswith("slurm: ") and "fan swap" in node()["drain_reason"]
    ledger.submit("alice", 1, SHOW + "exit 0")
    time.sleep(2)
    assert status(ledger, 1) == "pending"
    cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume")
    ledger.wait("the node to return", lambda: node()["state"] == "active")
    ledger.wait("the job to run once the node is back", lambda: status(ledger, 1) == "finished")
    check = json.loads(ledger.cli("audit", "check", "--json"))
    assert check["violations"] == []  # an engine may drain and return nodes


def test_a_node_slurm_marks_down_is_lost_its_jobs_end_or_requeue_and_it_returns(
    ledger: Ledger,
) -> None:
    cluster = ledger.cluster
    forever = "while true; do sleep 0.2; done"
    ledger.up()
    ledger.submit("alice", 2, SHOW + forever, "--min-runtime", "1h", "--resumable")
    ledger.submit("bob", 1, SHOW + forever, "--min-runtime", "1h")
    ledger.wait("both jobs to run", lambda: status(ledger, 1) == status(ledger, 2) == "running")
    first = {ev["job_id"]: ev["engine_job_id"] for ev in ledger.of("job.engine_linked.v1")}

    def node() -> dict[str, Any]:
        (n,) = ledger.nodes()
        return dict(n)

    cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=down", "reason=psu")
    ledger.wait("the ledger to lose the node", lambda: node()["state"] == "lost")
    why = node()["lost_reason"]  # Slurm adds who and when: "psu [root@2026-...]"
    assert why.startswith("slurm: DOWN (psu")
    # Slurm ends both NODE_FAIL; their runs end when Slurm's kill reaches them (its slurmd
    # answers): each notes the SIGTERM and its end (docs/slurm.md, "Nodes")
    ledger.wait("both runs to end", lambda: node()["jobs"] == [])
    jobs = ledger.jobs()
    assert (jobs[1]["status"], jobs[2]["status"], jobs[2]["outcome"]) == (
        "pending",
        "finished",
        "failed",
    )
    # the resumable job is requeued inside its contract, the other fails with the node: the
    # ledger loses the node (its runs in doubt) before it records the runs' NODE_FAIL ends, and
    # places nothing on it meanwhile
    assert [(p["reason"], p["note"]) for p in ledger.of("job.preempted.v1", 1)] == [
        ("node_failure", "its run ended with its node (NODE_FAIL)")
    ]
    assert len(ledger.of("job.requeued.v1", 1)) == 1
    (ended,) = ledger.of("job.engine_ended.v2", 2)
    assert (ended["reason"], ended["engine_job_id"]) == ("node_failure", first[2])
    lost = jobs[2]  # as sacct shows it: NODE_FAIL on its node, with its Slurm job id
    assert (lost["finish_reason"], lost["nodes"], lost["engine_job_id"]) == (
        "node_lost", [cluster.node], first[2]
    )  # fmt: skip
    said = ledger.cli("explain", "2")
    assert "finished (node lost)" in said and "ended with its node, which was lost" in said, said
    assert [cluster.jobs()[first[j]]["state"] for j in (1, 2)] == ["NODE_FAIL", "NODE_FAIL"]
    time.sleep(1)
    assert status(ledger, 1) == "pending"  # nothing is placed on a lost node
    cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume")
    ledger.wait("the node to return", lambda: node()["state"] == "active")
    ledger.wait(
        "the requeued job to run again",
        lambda: len(ledger.of("job.engine_linked.v1", 1)) == 2 and status(ledger, 1) == "running",
    )
    runs = ledger.of("job.engine_linked.v1", 1)
    assert [r["run"] for r in runs] == [0, 1] and runs[1]["engine_job_id"] != first[1]
    assert "run=1" in ledger.log_of(1)
    assert held_twice(ledger.events()) == []
    check = json.loads(ledger.cli("audit", "check", "--json"))
    assert check["violations"] == [] and check["noted"] == []
    ledger.cli("cancel", "1")


def test_a_foreign_slurm_jobs_gpus_are_never_given_to_a_ledger_job(ledger: Ledger) -> None:
    cluster = ledger.cluster
    foreign = cluster.run(
        "sbatch", "--parsable", "-p", cluster.partition, "--gres=gpu:3", "-J", "train",
        "-o", "/dev/null", "--wrap", "sleep 120",
    ).strip()  # fmt: skip
    deadline = time.monotonic() + 30
    while cluster.jobs()[foreign]["state"] != "RUNNING":
        assert time.monotonic() < deadline, cluster.jobs()
        time.sleep(0.2)
    ledger.up()
    ledger.submit("alice", 2, SHOW + "exit 0")
    ledger.submit("bob", 1, SHOW + "exit 0")
    ledger.wait("the 1-GPU job to run on the free GPU", lambda: status(ledger, 2) == "finished")
    assert cuda_devices(ledger.log_of(2)) == [3]
    time.sleep(2)
    assert status(ledger, 1) == "pending"  # only one GPU is not the foreign job's
    assert cluster.jobs()[foreign]["state"] == "RUNNING"  # never touched
    (node,) = json.loads(ledger.cli("node", "list", "--json"))  # capacity says so too
    assert (node["foreign_gpus"], node["free_gpus"]) == ([0, 1, 2], 1), node
    assert "GPUs 0,1,2 held outside the ledger" in ledger.cli("node", "list")
    # the queue counts them as the dispatcher does (not "placed next cycle"), and says so
    (row,) = json.loads(ledger.cli("queue", "--json"))
    assert (row["job_id"], row["code"]) == (1, "WAIT_RESOURCES"), row
    shown_queue = ledger.cli("queue")
    held_line = f"Held outside the ledger (counted busy): {cluster.node} GPUs 0,1,2"
    assert held_line in shown_queue, shown_queue
    shown = json.loads(ledger.cli("slurm", "jobs", "--partition", cluster.partition, "--json"))
    assert {(r["slurm_job_id"], r["foreign"]) for r in shown} >= {(foreign, True)}
    cluster.run("scancel", foreign)
    ledger.wait(
        "the 2-GPU job to run once the foreign job ends", lambda: status(ledger, 1) == "finished"
    )
    assert cuda_devices(ledger.log_of(1)) == [0, 1]
    assert held_twice(ledger.events()) == []


def test_serve_runs_http_submissions_under_slurm_and_a_kill_9_of_it_loses_nothing(
    ledger: Ledger,
) -> None:
    """The server (`serve --executor slurm`, HTTP and bearer tokens) runs what people submit as
    Slurm jobs with their exit codes; killed with -9 mid-run and started again, it adopts the
    run Slurm kept: the job is still running in both, once, and no GPU is held twice."""
    cluster, home, flag = ledger.cluster, ledger.home, ledger.home.parent / "end"
    alice = make_token(home, "--user", "alice")
    root = make_token(home, "--user", "root")
    args = ("--executor", "slurm", "--partition", cluster.partition, "--interval", "0.2s")
    on_cluster = {"SLURM_CONF": cluster.conf}  # this group's cluster, not the default one

    def submit(server: Server, gpus: int, script: str) -> int:
        body = {"actor": "", "account": "ai2/olmo", "gpus": gpus,
                "command": ["bash", "-c", SHOW + script]}  # fmt: skip
        code, answer = server.request("POST", "/v1/commands/submit", body, alice)
        assert code == 200, answer
        return int(answer["events"][0]["job_id"])

    def jobs(server: Server) -> dict[int, dict[str, Any]]:
        code, rows = server.request("GET", "/v1/jobs", token=alice)
        assert code == 200, rows
        return {r["job_id"]: r for r in rows}

    def events(server: Server) -> list[dict[str, Any]]:
        code, rows = server.request("GET", "/v1/log?limit=10000", token=root)
        assert code == 200, rows
        return [r["event"] for r in rows]

    def wait(server: Server, what: str, pred: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert server.proc.poll() is None, server.log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, f"{what}: {server.log_path.read_text()[-3000:]}"
            time.sleep(0.3)

    server = start_server(home, *args, env=on_cluster)
    try:
        failing = submit(server, 2, "sleep 1; exit 7")
        long = submit(server, 1, f"until [ -e {flag} ]; do sleep 0.2; done; exit 0")
        wait(server, "the first job to end", lambda: jobs(server)[failing]["outcome"] is not None)
        wait(server, "the second job to run", lambda: jobs(server)[long]["status"] == "running")
        row = jobs(server)[failing]
        assert (row["outcome"], row["exit_code"]) == ("failed", 7)
        history = events(server)
        ended = [ev for ev in history if ev["type"] == "job.engine_ended.v2"]
        assert [(ev["job_id"], ev["exit_code"], ev["engine_state"]) for ev in ended] == [
            (failing, 7, "FAILED")
        ]
        placed = {ev["job_id"]: ev["slots"] for ev in history if ev["type"] == "job.placed.v1"}
        assert cuda_devices(ledger.log_of(failing)) == placed[failing][0]["gpu_indices"]
        # F8: no working directory (HTTP): the service's own directory, which nobody else may
        # write, and a file made for the job's user (nobody here: run_as service) alone
        out = home / "jobs" / f"job-{failing}.log"
        assert (home / "jobs").stat().st_mode & 0o777 == 0o755
        assert (out.stat().st_uid, out.stat().st_mode & 0o777) == (
            pwd.getpwnam("nobody").pw_uid,
            0o600,
        )
        linked = {ev["job_id"]: ev["engine_job_id"] for ev in history
                  if ev["type"] == "job.engine_linked.v1"}  # fmt: skip
        # the server dies mid-run: Slurm keeps the job
        server.stop(signal.SIGKILL)
        assert cluster.jobs()[linked[long]]["state"] == "RUNNING"
        server = start_server(home, *args, log_name="serve2.log", env=on_cluster)
        time.sleep(1.5)  # a few cycles after the restart
        assert jobs(server)[long]["status"] == "running"
        assert cluster.jobs()[linked[long]]["state"] == "RUNNING"
        flag.touch()
        wait(
            server, "the adopted job to complete", lambda: jobs(server)[long]["outcome"] is not None
        )
        row = jobs(server)[long]
        assert (row["outcome"], row["exit_code"]) == ("completed", 0)
        history = events(server)
        runs = [ev for ev in history if ev["type"] == "job.engine_linked.v1"]
        assert sorted(ev["job_id"] for ev in runs) == [failing, long]  # each ran exactly once
        assert held_twice(history) == []
        assert "adopted Slurm job" in (home.parent / "serve2.log").read_text()
        configured = [ev for ev in history if ev["type"] == "service.configured.v2"]
        assert [ev["executor"] for ev in configured] == ["slurm"]  # once: same settings again
    finally:
        assert server.stop() == 0


SACCTMGR = """root||root|1
ai2|root||100
olmo|ai2||60
olmo|ai2|alice|2
olmo|ai2|bob|1
tulu|ai2|dan|parent
"""


def test_slurm_shares_become_a_budget_the_ledger_applies(tmp_path: Path, cluster: Cluster) -> None:
    """`slurm import-shares` from saved sacctmgr output, then `budget apply`; without Slurm
    accounting (the test cluster has none) asking sacctmgr is one clear error line."""
    led = Ledger(tmp_path / "home", cluster)
    led.cli("init", "--admin", "root")
    saved, budget = tmp_path / "assoc.txt", tmp_path / "budget.toml"
    saved.write_text(SACCTMGR)
    led.cli("slurm", "import-shares", "--from", str(saved), "-o", str(budget))
    led.cli("budget", "apply", str(budget))
    tree = {a["path"]: a for a in json.loads(led.cli("account", "tree", "--json"))}
    assert (tree["ai2"]["kind"], tree["ai2"]["shares"]) == ("program", 100)
    assert (tree["ai2/olmo"]["kind"], tree["ai2/olmo"]["shares"]) == ("project", 60)
    assert tree["ai2/olmo"]["members"] == ["alice", "bob"]
    assert tree["ai2/olmo/alice"]["shares"] == 2
    done = subprocess.run(
        [GPULEDGER, "slurm", "import-shares"], env=led.env("root"), capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error: sacctmgr failed: ") and done.stdout == ""


def test_a_partition_gpu_ledger_cannot_own_is_refused_with_one_line(ledger: Ledger) -> None:
    before = ledger.events()
    done = subprocess.run(
        [GPULEDGER, "up", "--executor", "slurm", "--partition", "nope", "--for", "1s"],
        env=ledger.env("root"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr == (
        "error: Slurm partition 'nope' cannot be run by gpu-ledger: Slurm has no partition 'nope' "
        "(see docs/slurm.md, 'Partition settings') [engine]\n"
    )
    assert ledger.events() == before  # nothing registered, nothing appended
    served = subprocess.run(
        [GPULEDGER, "serve", "--executor", "slurm", "--partition", "nope", "--listen",
         "127.0.0.1:0"],
        env=ledger.env("root"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert served.returncode == 1
    assert served.stderr.splitlines()[-1:] == done.stderr.splitlines()
    assert "listening" not in served.stderr
    assert not (ledger.home / "gpuledger.sock").exists()
    assert ledger.events() == before
