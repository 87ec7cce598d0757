"""`gpuledger up` with real shell jobs under supervisors, run by its local node agent (one per
node, `HOME/agents/NODE`): stopping or killing the service never kills or double-books a job;
limits, checkpoints, utilisation and gang jobs work live."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger.engines.supervised import live_processes
from tests.integration import waits
from tests.integration.serverkit import read_served, workdir
from tests.integration.userkit import shared_dir

GPULEDGER = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"
UP = ("up", "--run-as", "service", "--interval", "0.2s", "--grace", "2s", "--log-level", "INFO")


def env_for(home: Path, actor: str = "root") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    return env | {"GPULEDGER_HOME": str(home), "GPULEDGER_USER": actor}


def cli(home: Path, *args: str, actor: str = "root", ok: bool = True) -> Any:
    proc = subprocess.run(
        [GPULEDGER, *args],
        env=env_for(home, actor),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=workdir(home),
    )
    if ok:
        assert proc.returncode == 0, f"{args}: {proc.stderr}"
    return proc


def procs(home: Path) -> list[Any]:
    """The job processes alive under `up`'s local agents (every node's state directory)."""
    return [p for d in sorted((home / "agents").glob("*")) for p in live_processes(d)]


def output(entry: str) -> Path:
    """A job's output file from its `jobs` entry (`NODE:PATH`)."""
    return Path(entry.split(":", 1)[1])


def jobs(home: Path) -> dict[int, dict[str, Any]]:
    """`jobs --json`'s rows (the newest 200, its default)."""
    return {j["job_id"]: j for j in read_served(home, "jobs?limit=200", "jobs")}


def events(home: Path, tag: str) -> list[dict[str, Any]]:
    rows = read_served(home, "log?limit=10000", "log", "--limit", "10000")
    return [r["event"] for r in rows if r["event"]["type"] == tag]


def wait_for(
    what: str, cond: Callable[[], bool], timeout: float = 90, home: Path | None = None
) -> None:
    def seen() -> str:  # what the service said and the log's tail, to see why
        if home is None:
            return ""
        said = "".join(p.read_text()[-3000:] for p in sorted(home.glob("up-*.log")))
        return said + cli(home, "log", "--tail", "15", ok=False).stdout

    waits.wait_for(what, cond, timeout, seen)


STARTED: list[subprocess.Popen[bytes]] = []
"""Every `up` a test started: the fixture kills those a failed test left running."""


def stop_started() -> None:
    """No service of a test outlives it, even a failed test's."""
    while STARTED:
        up = STARTED.pop()
        if up.poll() is None:
            up.kill()
            up.wait(timeout=30)


class Service:
    def __init__(self, home: Path, *extra: str) -> None:
        self.log = home / f"up-{time.monotonic_ns()}.log"
        with self.log.open("wb") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [GPULEDGER, *UP, *extra],
                env=env_for(home),
                stdout=out,
                stderr=out,
                start_new_session=True,  # its own process group, as a terminal's foreground job
            )
        STARTED.append(self.proc)
        # read commands open the projection themselves until a service holds it: start them
        # once this one does (it also retries while a reader holds the file)
        wait_for("the service to start", lambda: self.proc.poll() is not None
                 or " up: " in self.log.read_text())  # fmt: skip

    def signal(self, sig: signal.Signals) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    cli(home, "init", "--admin", "root")
    budget = tmp_path / "b.toml"
    budget.write_text(
        '[accounts."ai2"]\nkind = "program"\n'
        '[accounts."ai2/olmo"]\nkind = "project"\nmembers = ["alice", "bob", "root"]\n'
        '[accounts."ai2/tulu"]\nkind = "project"\nmembers = ["dan"]\n'
    )
    cli(home, "budget", "apply", str(budget))
    yield home
    stop_started()
    for p in procs(home):  # nor any of its jobs
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)


def submit(home: Path, user: str, gpus: int, script: str, *opts: str, account: str = "ai2/olmo"
           ) -> None:  # fmt: skip
    cli(home, "submit", "-A", account, "-G", str(gpus), *opts, "--", "sh", "-c", script,
        actor=user)  # fmt: skip


def until_released(trigger: Path, code: int) -> str:
    """A job that runs until the test creates `trigger`, then exits with `code`."""
    return f"while [ ! -e {trigger} ]; do sleep 0.1; done; exit {code}"


def held_twice(finished_and_placed: list[dict[str, Any]]) -> list[tuple[str, int]]:
    holder: dict[tuple[str, int], int] = {}
    clashes = []
    for ev in finished_and_placed:
        if ev["type"] == "job.placed.v1":
            gpus = [(s["node"], i) for s in ev["slots"] for i in s["gpu_indices"]]
            clashes += [g for g in gpus if g in holder]
            holder.update(dict.fromkeys(gpus, ev["job_id"]))
        elif ev["type"] in ("job.finished.v2", "job.preempted.v1"):
            holder = {g: j for g, j in holder.items() if j != ev["job_id"]}
    return clashes


@pytest.fixture
def shared() -> Iterator[Path]:
    """Where jobs of other users (run as nobody: `run_as` service) see the test's triggers."""
    with shared_dir() as top:
        yield top


def test_sigterm_and_kill_9_of_up_leave_jobs_running_and_a_restart_adopts_them(
    home: Path, shared: Path
) -> None:
    cli(home, "node", "add", "local", "--gpus", "4", "--gpu-type", "sim")
    go1, go2, go3 = shared / "go1", shared / "go2", shared / "go3"
    submit(home, "bob", 2, until_released(go1, 6), "--min-runtime", "1h", "--resumable")
    submit(home, "alice", 2, until_released(go2, 3), "--min-runtime", "1h")
    up = Service(home)
    wait_for("jobs 1 and 2 running", lambda: {1, 2} <= {
        j for j, r in jobs(home).items() if r["status"] == "running"})  # fmt: skip
    pids = {p.job_id: p.pid for p in procs(home)}
    # 1. SIGTERM (as Ctrl-C would): the service exits, the jobs do not, nothing is recorded
    assert up.signal(signal.SIGTERM) == 0
    assert {j: r["status"] for j, r in jobs(home).items()} == {1: "running", 2: "running"}
    assert {p.job_id: p.pid for p in procs(home)} == pids
    # a job waits for the GPUs; job 2 ends (exit 3) while no service runs
    submit(home, "bob", 2, until_released(go3, 0), "--min-runtime", "1h")
    go2.touch()
    wait_for("job 2 to end", lambda: 2 not in {p.job_id for p in procs(home)})
    # 2. restart: job 1 adopted (same process), job 2's exit recorded with its real code,
    # job 3 placed on job 2's GPUs only
    up = Service(home)
    wait_for("job 3 running", lambda: jobs(home)[3]["status"] == "running")
    assert jobs(home)[2]["outcome"] == "failed"
    live = {p.job_id: p.pid for p in procs(home)}
    assert live[1] == pids[1] and set(live) == {1, 3}
    assert cli(home, "audit", "check").returncode == 0  # live processes agree with the ledger
    # 3. kill -9: the jobs live on; both end while the service is dead
    assert up.signal(signal.SIGKILL) == -signal.SIGKILL
    assert {p.job_id for p in procs(home)} == {1, 3}
    go1.touch()
    go3.touch()
    wait_for("jobs 1 and 3 to end", lambda: not procs(home))
    assert {j: r["status"] for j, r in jobs(home).items() if r["status"] != "finished"} == {
        1: "running", 3: "running"}  # fmt: skip
    # 4. restart once more: their exits are recorded with their real codes; nothing is lost
    up = Service(home, "--until-idle")
    assert up.proc.wait(timeout=60) == 0
    finished = {
        ev["job_id"]: (ev["outcome"], ev["exit_code"]) for ev in events(home, "job.finished.v2")
    }
    assert finished == {1: ("failed", 6), 2: ("failed", 3), 3: ("completed", 0)}
    ended = {
        ev["job_id"]: (ev["engine"], ev["engine_job_id"], ev["reason"], ev["exit_code"])
        for ev in events(home, "job.engine_ended.v2")
    }
    assert ended == {
        1: ("agent", "1.1", "exited", 6),
        2: ("agent", "2.1", "exited", 3),
        3: ("agent", "3.1", "exited", 0),
    }
    assert sorted(ev["job_id"] for ev in events(home, "job.started.v1")) == [1, 2, 3]
    log = json.loads(cli(home, "log", "--json", "--limit", "10000").stdout)
    assert held_twice([r["event"] for r in log]) == []
    assert cli(home, "audit", "check").returncode == 0


def test_ctrl_c_on_up_leaves_its_jobs_running(home: Path) -> None:
    """A terminal's Ctrl-C is SIGINT to the whole foreground process group of `up`."""
    cli(home, "node", "add", "local", "--gpus", "1", "--gpu-type", "sim")
    submit(home, "bob", 1, "exec sleep 60", "--min-runtime", "0", "--resumable")
    up = Service(home)
    wait_for("job 1 running", lambda: jobs(home)[1]["status"] == "running")
    [before] = procs(home)
    os.killpg(up.proc.pid, signal.SIGINT)
    assert up.proc.wait(timeout=30) == 0
    assert jobs(home)[1]["status"] == "running"  # not failed, not requeued: still running
    assert procs(home) == [before]
    assert events(home, "job.finished.v2") == [] and events(home, "job.requeued.v1") == []


def test_a_service_that_lost_its_handles_finds_the_live_run_and_books_no_gpu_twice(
    home: Path, tmp_path: Path
) -> None:
    """The handles are gone (the agent's state file deleted while the service was down): the
    agent finds the live run from the machine before it reports or launches (issue 24's attack,
    F3), so the ledger never calls it lost nor gives its GPUs to another job while it runs; the
    job ends with its real exit and `audit check` finds nothing."""
    cli(home, "node", "add", "local", "--gpus", "2", "--gpu-type", "sim")
    submit(home, "bob", 2, "exec sleep 8", "--min-runtime", "1h")
    up = Service(home)
    wait_for("job 1 running", lambda: jobs(home)[1]["status"] == "running")
    up.signal(signal.SIGKILL)
    (home / "agents" / "local" / "state.json").unlink()  # the handles are gone
    submit(home, "alice", 2, "exec sleep 1", "--min-runtime", "1h")
    up = Service(home)
    wait_for("job 2 running", lambda: jobs(home)[2]["status"] == "running", 120)
    up.signal(signal.SIGTERM)
    kept = jobs(home)[1]  # found, not lost: it ran to its end before job 2 had its GPUs
    assert (kept["outcome"], kept["finish_reason"]) == ("completed", "completed"), kept
    assert jobs(home)[2]["started_at"] >= kept["finished_at"]
    check = cli(home, "audit", "check", ok=False)
    assert check.returncode == 0, check.stdout


def test_time_limits_and_the_debug_limit_stop_jobs_and_say_why(home: Path) -> None:
    cli(home, "node", "add", "local", "--gpus", "2", "--gpu-type", "sim")
    trap = "trap 'echo got SIGTERM; exit 143' TERM; sleep 60 & wait"
    submit(home, "bob", 1, trap, "--min-runtime", "1h", "-t", "2s")
    submit(home, "alice", 1, "exec sleep 60", "-t", "15m")  # a debug job
    assert jobs(home)[2]["debug"]
    up = Service(home, "--debug-limit", "3s", "--until-idle")
    assert up.proc.wait(timeout=60) == 0
    got = jobs(home)
    assert (got[1]["outcome"], got[1]["finish_reason"]) == ("failed", "time_limit")
    assert (got[2]["outcome"], got[2]["finish_reason"]) == ("failed", "time_limit")
    finished = {ev["job_id"]: ev for ev in events(home, "job.finished.v2")}
    started = {ev["job_id"]: ev for ev in events(home, "job.started.v1")}
    assert finished[1]["exit_code"] == finished[2]["exit_code"] == 128 + signal.SIGTERM
    placed = {ev["job_id"]: ev for ev in events(home, "job.placed.v1")}
    # a limit counts from the launch, which lies between the placement and the recorded start
    assert finished[1]["at"] - placed[1]["at"] >= 2 and finished[1]["at"] - started[1]["at"] < 6
    assert finished[2]["at"] - placed[2]["at"] >= 3 and finished[2]["at"] - started[2]["at"] < 7
    assert "got SIGTERM" in output(got[1]["logs"][0]).read_text()
    why = cli(home, "explain", "1").stdout
    assert "stopped at its time limit" in why and f"Output: {got[1]['logs'][0]}" in why


def test_checkpoints_by_file_and_by_cli_from_inside_a_job(home: Path, tmp_path: Path) -> None:
    cli(home, "node", "add", "local", "--gpus", "1", "--gpu-type", "sim")
    script = (
        'touch "$GPULEDGER_CHECKPOINT_FILE"; sleep 1; '
        f"{GPULEDGER} checkpoint && echo reported; exec sleep 60"
    )
    submit(home, "root", 1, script, "--min-runtime", "1h", "--resumable")  # runs the CLI: root's
    up = Service(home)
    try:
        wait_for("two checkpoints", lambda: len(events(home, "job.checkpointed.v1")) == 2)
        # another user may not report for this job; nothing is appended
        before = len(json.loads(cli(home, "log", "--json", "--limit", "10000").stdout))
        denied = cli(home, "checkpoint", "1", actor="dan", ok=False)
        assert denied.returncode == 1 and denied.stderr.startswith("error: 'dan' may not")
        after = json.loads(cli(home, "log", "--json", "--limit", "10000").stdout)
        assert len(after) == before
    finally:
        up.signal(signal.SIGTERM)
    actors = [ev["actor"] for ev in events(home, "job.checkpointed.v1")]
    assert actors == ["@executor", "@job:1"]  # the file, then the job's own token
    assert "reported" in output(jobs(home)[1]["logs"][0]).read_text()


def test_an_idle_job_is_listed_by_squatters_and_preempted_after_its_contract(
    home: Path,
) -> None:
    cli(home, "node", "add", "local", "--gpus", "2", "--gpu-type", "sim")
    util = home / "utilisation"
    util.mkdir()
    submit(home, "bob", 2, 'echo "launch $GPULEDGER_LAUNCH"; exec sleep 60', "--min-runtime",
           "2s", "--resumable")  # fmt: skip
    (util / "1").write_text("0")  # the test source: job 1's GPUs sit idle
    up = Service(home, "--sample-every", "0.3s", "--squat-after", "3s")
    try:  # idle for as long as --squat-after: the next arrival preempts it for squatting
        wait_for("job 1 listed as a squatter", lambda: [
            r["job_id"] for r in json.loads(
                cli(home, "squatters", "--after", "3s", "--json").stdout)] == [1],
            home=home)  # fmt: skip
        out = cli(home, "squatters", "--after", "1s").stdout
        assert "job 1 ai2/olmo bob 2 GPUs idle since" in out
        submit(home, "dan", 2, "exec sleep 60", "--min-runtime", "1h", account="ai2/tulu")
        wait_for("job 2 running", lambda: jobs(home)[2]["status"] == "running")
        [pre] = events(home, "job.preempted.v1")
        assert (pre["job_id"], pre["reason"], pre["for_job"]) == (1, "squatting", 2)
        assert jobs(home)[1]["status"] == "pending"  # resumable: requeued
        # once the GPUs are free again it is relaunched with its original command
        cli(home, "cancel", "2", actor="dan")
        wait_for("job 1 running again", lambda: jobs(home)[1]["status"] == "running")
        log = output(jobs(home)[1]["logs"][0])
        wait_for("its second launch", lambda: "launch 2" in log.read_text())
    finally:
        up.signal(signal.SIGTERM)
    assert log.read_text().split("\n")[:2] == ["launch 1", "launch 2"]
    samples = events(home, "job.utilisation_sampled.v1")
    assert samples and all(s["gpu_utilisation"] == [0.0, 0.0] for s in samples)


def test_a_gang_job_over_two_nodes_gets_disjoint_gpus_and_ranks_and_a_failed_part_stops_all(
    home: Path,
) -> None:
    cli(home, "node", "add", "a", "--gpus", "2", "--gpu-type", "sim")
    cli(home, "node", "add", "b", "--gpus", "2", "--gpu-type", "sim")
    show = 'echo "$GPULEDGER_NODE $CUDA_VISIBLE_DEVICES $NODE_RANK $WORLD_SIZE $MASTER_ADDR"'
    submit(home, "bob", 4, show, "--min-runtime", "1h")
    fail = 'if [ "$NODE_RANK" = 1 ]; then sleep 1; exit 9; fi; exec sleep 60'
    submit(home, "alice", 4, fail, "--min-runtime", "1h")
    up = Service(home, "--until-idle")
    assert up.proc.wait(timeout=60) == 0
    got = jobs(home)
    # both parts write the job's one output file, as an srun's tasks do
    [out] = {output(log) for log in got[1]["logs"]}
    lines = sorted(out.read_text().strip().splitlines())
    assert lines == ["a 0,1 0 2 127.0.0.1", "b 0,1 1 2 127.0.0.1"]
    assert (got[1]["outcome"], got[2]["outcome"]) == ("completed", "failed")
    finished = {ev["job_id"]: ev for ev in events(home, "job.finished.v2")}
    assert finished[2]["exit_code"] == 9
    started = {ev["job_id"]: ev for ev in events(home, "job.started.v1")}
    assert finished[2]["at"] - started[2]["at"] < 10  # rank 0 did not run its 60 s
    assert procs(home) == []
