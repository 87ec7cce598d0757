"""`gpuledger up` (its default, `--executor agents`): one command runs the server and a local node
agent for the node, and jobs run through that agent (its node token made by `up`). Stopping or
killing `up` never kills a job; the next `up` adopts them through its agent."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.engines.supervised import live_processes
from tests.integration.serverkit import workdir
from tests.integration.test_up_jobs_survive import (
    Service,
    cli,
    events,
    held_twice,
    jobs,
    stop_started,
    submit,
    until_released,
    wait_for,
)
from tests.integration.userkit import shared_dir


def state(home: Path, node: str = "local") -> Path:
    return home / "agents" / node


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    cli(home, "init", "--admin", "root")
    budget = tmp_path / "b.toml"
    budget.write_text(
        '[accounts."ai2"]\nkind = "program"\n'
        '[accounts."ai2/olmo"]\nkind = "project"\nmembers = ["alice", "bob"]\n'
    )
    cli(home, "budget", "apply", str(budget))
    cli(home, "node", "add", "local", "--gpus", "2", "--gpu-type", "sim")
    yield home
    stop_started()
    for d in (home / "agents").glob("*"):  # nor any of its jobs
        for p in live_processes(d):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)


def test_up_runs_a_job_through_its_local_agent(home: Path) -> None:
    show = 'echo "$GPULEDGER_NODE $CUDA_VISIBLE_DEVICES $GPULEDGER_JOB_ID"; exit 3'
    submit(home, "bob", 1, show, "--min-runtime", "1h")
    up = Service(home, "--until-idle")
    assert up.proc.wait(timeout=60) == 0, up.log.read_text()
    said = up.log.read_text()
    assert "registered node local (2 GPUs, sim; node active)" in said  # the agent's own words
    [job] = jobs(home).values()
    assert (job["outcome"], job["exit_code"]) == ("failed", 3)
    [entry] = job["logs"]
    out = workdir(home) / "gpuledger-1.out"  # sbatch's default: where it was submitted from
    assert entry == f"local:{out}"  # NODE:PATH, as an agent reports it
    assert Path(entry.split(":", 1)[1]).read_text().split() == ["local", "0", "1"]
    assert entry in cli(home, "explain", "1").stdout
    [ended] = events(home, "job.engine_ended.v2")
    assert (ended["engine"], ended["engine_job_id"], ended["exit_code"]) == ("agent", "1.1", 3)
    [token] = [t for t in events(home, "token.issued.v1") if t["scope"] == "node"]
    assert (token["scope_node"], token["name"]) == ("local", "local agent of local")
    assert (state(home) / "token").stat().st_mode & 0o777 == 0o600
    assert f"job 1 (ai2/olmo, bob, 1 GPU) failed (exit code 3); output: {out}" in said
    # `serve` on the data directory's socket: no TCP listener unless asked (`--listen`)
    assert f"listening on unix:{home / 'gpuledger.sock'} (ledger" in said and "http" not in said


def test_up_listens_on_tcp_only_when_asked(home: Path) -> None:
    up = Service(home, "--listen", "127.0.0.1:0", "--for", "1s")
    assert up.proc.wait(timeout=60) == 0, up.log.read_text()
    said = up.log.read_text()
    assert re.search(r"listening on http://127\.0\.0\.1:\d+ and unix:", said), said


@pytest.fixture
def shared() -> Iterator[Path]:
    """Where jobs of other users (run as nobody: `run_as` service) see the test's triggers."""
    with shared_dir() as top:
        yield top


def test_sigterm_and_kill_9_of_up_leave_jobs_running_and_the_next_up_adopts_them(
    home: Path, shared: Path
) -> None:
    go1, go2 = shared / "go1", shared / "go2"
    submit(home, "bob", 1, until_released(go1, 6), "--min-runtime", "1h")
    submit(home, "alice", 1, until_released(go2, 0), "--min-runtime", "1h")
    up = Service(home)
    wait_for("both jobs running", lambda: {r["status"] for r in jobs(home).values()} == {"running"},
             home=home)  # fmt: skip
    pids = {p.job_id: p.pid for p in live_processes(state(home))}
    assert set(pids) == {1, 2}
    assert up.signal(signal.SIGTERM) == 0
    assert {p.job_id: p.pid for p in live_processes(state(home))} == pids
    assert {r["status"] for r in jobs(home).values()} == {"running"}
    assert cli(home, "audit", "check").returncode == 0  # its live processes agree with the ledger
    up = Service(home)
    wait_for("the agent to take work again", lambda: up.log.read_text().count("registered") == 1)
    assert "node local: adopted 2 job(s): 1, 2" in up.log.read_text()
    assert up.signal(signal.SIGKILL) == -signal.SIGKILL
    go1.touch()  # job 1 ends (exit 6) while nothing watches it
    wait_for("job 1 to end", lambda: 1 not in {p.job_id for p in live_processes(state(home))})
    up = Service(home, "--until-idle")
    wait_for("job 1's exit", lambda: jobs(home)[1]["status"] == "finished", home=home)
    assert {p.job_id: p.pid for p in live_processes(state(home))} == {2: pids[2]}  # adopted
    go2.touch()
    assert up.proc.wait(timeout=60) == 0
    finished = {
        e["job_id"]: (e["outcome"], e["exit_code"]) for e in events(home, "job.finished.v2")
    }
    assert finished == {1: ("failed", 6), 2: ("completed", 0)}
    assert len(events(home, "job.placed.v1")) == 2  # each launched once
    assert len([t for t in events(home, "token.issued.v1") if t["scope"] == "node"]) == 1
    log = json.loads(cli(home, "log", "--json", "--limit", "10000").stdout)
    assert held_twice([r["event"] for r in log]) == []


def _gpus(home: Path) -> tuple[list[int], int]:
    """(the GPUs `node list --json` shows stopping, the free ones) of node `local`."""
    [row] = json.loads(cli(home, "node", "list", "--json").stdout)
    return row["stopping_gpus"], row["free_gpus"]


def test_a_cancel_whose_grace_outlives_a_kill_9_of_up_keeps_its_gpu_stopping(home: Path) -> None:
    """atk36-23 F1 as found: a job that ignores SIGTERM (`--grace 25s`) is cancelled and `up`
    is killed -9 and started again inside the grace. While its process lives, `node list`
    shows its GPU `stopping`, not free (before: free for the whole grace after the restart);
    once it is killed at the end of its grace, free."""
    submit(home, "bob", 1, "trap '' TERM; while :; do sleep 0.2; done", "--grace", "25s")
    up = Service(home)
    wait_for("job 1 running", lambda: jobs(home)[1]["status"] == "running", home=home)
    [part] = live_processes(state(home))
    cli(home, "cancel", "1")
    wait_for("its GPU stopping", lambda: _gpus(home) == ([0], 1), home=home)
    assert up.signal(signal.SIGKILL) == -signal.SIGKILL
    up = Service(home)
    assert _gpus(home) == ([0], 1), up.log.read_text()[-2000:]
    wait_for("the agent to register", lambda: "registered node local" in up.log.read_text())
    assert _gpus(home) == ([0], 1), up.log.read_text()[-2000:]
    assert [p.pid for p in live_processes(state(home))] == [part.pid]  # still in its grace
    wait_for("its process to end", lambda: not live_processes(state(home)), home=home)
    wait_for("its GPU free", lambda: _gpus(home) == ([], 2), home=home)
    assert [e for e in events(home, "job.run_ended.v2") if e["job_id"] == 1]


def test_up_refuses_to_start_while_the_other_executor_has_unfinished_runs(
    home: Path, shared: Path
) -> None:
    """The local executor (`--executor local`, HOME/agent) and the local agents keep their runs
    apart: switching while a run is unfinished is one clear error, and nothing is launched."""
    go = shared / "go"
    submit(home, "bob", 1, until_released(go, 0), "--min-runtime", "1h")
    up = Service(home, "--executor", "local")
    wait_for("job 1 running", lambda: jobs(home)[1]["status"] == "running", home=home)
    assert up.signal(signal.SIGTERM) == 0
    refused = cli(home, "up", "--for", "1s", ok=False)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "error: jobs 1 run under the local executor (keep using `--executor local` (serve or "
        "up) until they end) [invalid]"
    ]
    assert procs_of(state(home)) == [] and not (home / "agents").exists()
    go.touch()
    assert Service(home, "--executor", "local", "--until-idle").proc.wait(timeout=60) == 0
    assert jobs(home)[1]["outcome"] == "completed"
    assert Service(home, "--until-idle").proc.wait(timeout=60) == 0  # nothing left: it starts


def test_serve_keeps_the_runs_of_ups_agents_and_one_server_per_data_directory(
    home: Path, tmp_path: Path, shared: Path
) -> None:
    """The rule is the composition root's, so `serve` keeps it too: after `up` (its agents) stops
    with a job running, `serve --executor local` refuses instead of recording the job lost while
    its process runs on; and a second server on a data directory is refused at once, whatever
    its socket."""
    go = shared / "go"  # bob's job runs as nobody: pytest's tmp_path is root's alone
    submit(home, "bob", 1, until_released(go, 0), "--min-runtime", "1h")
    up = Service(home)
    wait_for("job 1 running", lambda: jobs(home)[1]["status"] == "running", home=home)
    other = cli(home, "serve", "--socket", str(tmp_path / "s2.sock"), "--listen", "", ok=False)
    assert other.returncode == 1
    assert (
        other.stderr.strip().splitlines()[-1].startswith(f"error: a server already runs on {home}")
    )
    assert up.signal(signal.SIGTERM) == 0
    refused = cli(home, "serve", "--executor", "local", "--listen", "", ok=False)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: jobs 1 run under the agents executor (keep using `--executor agents` (serve or "
        "up) until they end) [invalid]"
    )
    assert jobs(home)[1]["status"] == "running"  # not recorded lost
    go.touch()
    assert Service(home, "--until-idle").proc.wait(timeout=60) == 0
    assert jobs(home)[1]["outcome"] == "completed"


def procs_of(d: Path) -> list[int]:
    return [p.job_id for p in live_processes(d)]


def _gpu_of(row: dict[str, object]) -> list[int]:
    [slot] = row["slots"]  # type: ignore[misc]
    return list(slot["gpu_indices"])  # type: ignore[index]


def test_a_new_job_goes_to_a_free_gpu_not_one_a_cancelled_job_is_stopping_on(home: Path) -> None:
    """atk47-23 F8 as found: a job that ignores SIGTERM (`--grace 60s`) is cancelled and
    another job submitted at once, the node's other GPU idle. It is placed on the idle GPU and
    starts at once (before: on the stopping GPU, started a whole grace later). A third job finds
    no free GPU: it waits, and `explain` says for which GPU and whose SIGKILL; a second cancel
    kills the first at once, and the third starts on its GPU."""
    submit(home, "bob", 1, "trap '' TERM; while :; do sleep 0.2; done", "--grace", "60s")
    up = Service(home)
    wait_for("job 1 running", lambda: jobs(home)[1]["status"] == "running", home=home)
    first = _gpu_of(jobs(home)[1])
    cli(home, "cancel", "1", actor="bob")
    submit(home, "alice", 1, "sleep 600")
    wait_for("job 2 running", lambda: jobs(home)[2]["status"] == "running", timeout=30, home=home)
    assert _gpu_of(jobs(home)[2]) != first
    assert [p.job_id for p in live_processes(state(home))].count(1) == 1  # 1 is in its grace
    submit(home, "alice", 1, "sleep 600")
    said = ""

    def waits() -> bool:
        nonlocal said
        said = cli(home, "explain", "3").stdout
        return "it waits for GPUs of stopped runs still in their grace" in said

    wait_for("explain 3 to say what it waits for", waits, timeout=30, home=home)
    assert f"local GPUs {first[0]} (job 1's SIGKILL by " in said, said
    assert jobs(home)[3]["status"] == "pending"
    cli(home, "cancel", "1", actor="bob")  # killed at once
    wait_for("job 3 running", lambda: jobs(home)[3]["status"] == "running", timeout=30, home=home)
    assert _gpu_of(jobs(home)[3]) == first
    assert up.proc.poll() is None


def test_a_cancel_whose_sigterm_a_restart_cut_off_gets_no_new_grace_after_it(home: Path) -> None:
    """atk47-23 F3: `up` dies between a cancel and its SIGTERM (here: the cancel is recorded
    while `up` is down). Its SIGKILL is due at the recorded cancel plus the grace, as every
    read says; before, the restarted `up` sent SIGTERM and gave a whole new grace, the reads
    showing a SIGKILL time already past. Now the run is killed at once once that time has
    passed, and its recorded end is then."""
    submit(home, "bob", 1, "trap '' TERM; while :; do sleep 0.2; done", "--grace", "20s")
    up = Service(home)
    wait_for("job 1 running", lambda: jobs(home)[1]["status"] == "running", home=home)
    [part] = live_processes(state(home))
    assert up.signal(signal.SIGKILL) == -signal.SIGKILL
    cli(home, "cancel", "1", actor="bob")  # recorded; nothing carries it out yet
    [row] = json.loads(cli(home, "queue", "--state", "running", "--json").stdout)
    kill_at = row["kill_at"]
    assert row["state"] == "stopping" and kill_at is not None
    time.sleep(max(0.0, kill_at - time.time()) + 1)
    assert [p.pid for p in live_processes(state(home))] == [part.pid]  # not signalled yet
    restarted = time.time()
    up = Service(home)
    wait_for("its process to end", lambda: not live_processes(state(home)), timeout=60, home=home)
    assert time.time() - restarted < 15, up.log.read_text()[-2000:]  # was 20 s and more
    wait_for("its end recorded", lambda: events(home, "job.run_ended.v2") != [], home=home)
    [ended] = events(home, "job.run_ended.v2")
    assert ended["job_id"] == 1 and ended["ended_at"] < restarted + 15


def test_a_time_limit_stop_spanning_a_restart_with_another_grace_gets_its_placements_grace(
    home: Path,
) -> None:
    """atk49-23 F1 (time-limit variant): a job placed under `up --grace 20s` passes its limit
    while `up` is down and `up --grace 3s` starts. The agent keeps the grace it launched with
    (20 s); before, every read said SIGKILL at limit + 3 s, a time already past while the
    processes lived 17 s more. Now the reads count the grace in force when the run was placed,
    the one its agent applies: SIGKILL at limit + 20 s, and its processes are gone then."""
    submit(home, "bob", 1, "trap '' TERM; while :; do sleep 0.2; done", "-t", "8s")
    up = Service(home, "--grace", "20s")
    wait_for("job 1 running", lambda: jobs(home)[1]["status"] == "running", home=home)
    assert up.signal(signal.SIGKILL) == -signal.SIGKILL
    up = Service(home, "--grace", "3s")
    started = jobs(home)[1]["started_at"]
    limit = started + 8
    time.sleep(max(0.0, limit + 5 - time.time()))
    [row] = json.loads(cli(home, "queue", "--state", "running", "--json").stdout)
    assert row["state"] == "stopping"
    assert abs(row["kill_at"] - (limit + 20)) < 1.5, row  # was limit + 3, already past
    assert jobs(home)[1]["kill_at"] == row["kill_at"]
    assert [p.job_id for p in live_processes(state(home))] == [1]  # the agent keeps its 20 s
    wait_for("its process to end", lambda: not live_processes(state(home)), timeout=60, home=home)
    assert time.time() < row["kill_at"] + 6, up.log.read_text()[-2000:]
