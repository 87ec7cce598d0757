"""atk52-23 F2 from outside, through `gpuledger up` and its real agent: a job whose command exits
0 after a second, leaving a child that ignores SIGTERM (its supervisor reaps it: SIGTERM, the
job's grace, SIGKILL), and then, in that grace, a stop of the ledger's arrives. The command
completed before the stop: the job ends `completed` (exit 0) and never runs again. Before, a
preempted resumable job was requeued (and ran again once its node could take it), a cancel
recorded `cancelled`, and a time limit that passed in the grace recorded `time_limit`. A
command that failed (atk53-23 F3) ends its job `failed` with its code, never run again.

Every case is checked from /proc too: the child is gone by its SIGKILL (the command's end plus
the grace) and no second launch ever started (each launch writes its number to a file)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_node_lost_stopping_up import _alive, _row, _session, home
from tests.integration.test_up_jobs_survive import Service, cli, jobs, procs, submit, wait_for
from tests.integration.userkit import shared_dir

__all__ = ["home"]  # the fixture

GRACE_S = 20


@pytest.fixture
def runs() -> Iterator[Path]:
    """The file each launch writes its number to (the jobs run as nobody: `up --run-as service`)."""
    with shared_dir() as top:
        f = top / "runs"
        f.touch()
        f.chmod(0o666)
        yield f


def _left(runs: Path) -> str:
    """The command: it notes its launch, leaves a child that ignores SIGTERM, exits 0."""
    return (f"echo $GPULEDGER_LAUNCH >> {runs}; (trap '' TERM; while :; do sleep 0.2; done) &"
            " sleep 1; exit 0")  # fmt: skip


def _reaping(home: Path, job: int) -> tuple[list[int], float]:
    """Once the job's command has ended (it reads `stopping`): its live leftovers (/proc) and
    their SIGKILL time."""
    seen: dict[str, object] = {}

    def ended() -> bool:  # one read, the row and its kill time both (a second read for the
        seen.clear()  # kill time, at load ~20, got a row without it: KeyError 'kill_at')
        seen.update(_row(home, job))
        return "its command exited" in str(seen.get("reason", "")) and "kill_at" in seen

    wait_for(f"job {job}'s command ended", ended, timeout=60, home=home)
    kill_at = float(seen["kill_at"])  # type: ignore[arg-type]
    left = [p for lp in procs(home) for p in _session(lp.pid) if _alive(p)]
    assert left, "its child was already gone"
    return left, kill_at


def _gone_by(left: list[int], kill_at: float) -> None:
    while any(_alive(p) for p in left):
        assert time.time() < kill_at + 5, "its leftovers outlived their SIGKILL"
        time.sleep(0.3)


def _completed_once(home: Path, job: int, runs: Path) -> None:
    wait_for(f"job {job} finished", lambda: jobs(home)[job]["status"] == "finished",
             timeout=30, home=home)  # fmt: skip
    got = jobs(home)[job]
    assert (got["outcome"], got["finish_reason"], got["exit_code"]) == (
        "completed", "completed", 0), got  # fmt: skip
    time.sleep(3)  # cycles pass: nothing runs it again
    assert runs.read_text().split() == ["1"], runs.read_text()
    assert jobs(home)[job]["status"] == "finished", jobs(home)[job]


def test_a_resumable_job_preempted_after_its_command_exited_0_is_completed_not_run_again(
    home: Path, runs: Path
) -> None:
    submit(home, "bob", 1, _left(runs), "--resumable", "--min-runtime", "0",
           "--grace", f"{GRACE_S}s")  # fmt: skip
    up = Service(home)
    left, kill_at = _reaping(home, 1)
    # maintenance: its contract (none: unfunded) is over, so it is preempted at once, requeued
    cli(home, "node", "drain", "local", "--reason", "maintenance")
    wait_for("job 1 preempted", lambda: jobs(home)[1]["status"] != "running"
             or jobs(home)[1].get("finish_reason") is not None, home=home)  # fmt: skip
    _gone_by(left, kill_at)
    _completed_once(home, 1, runs)
    cli(home, "node", "return", "local")  # the old code: it ran again here, launch 2
    time.sleep(3)
    assert runs.read_text().split() == ["1"], runs.read_text()
    assert up.proc.poll() is None


@pytest.mark.parametrize(("end", "code"), [("exit 3", 3), ("kill -KILL $$", None)])
def test_a_resumable_job_preempted_after_its_command_failed_by_itself_fails_not_run_again(
    home: Path, runs: Path, end: str, code: int | None
) -> None:
    """atk53-23 F3: the command exits 3 (or dies by a signal of its own) leaving a child, and a
    preemption comes in that child's grace: its exit is its outcome, `failed` with its code,
    and it never runs again. Before, it was requeued and ran its whole command a second time."""
    submit(home, "bob", 1, _left(runs).replace("exit 0", end), "--resumable",
           "--min-runtime", "0", "--grace", f"{GRACE_S}s")  # fmt: skip
    up = Service(home)
    left, kill_at = _reaping(home, 1)
    cli(home, "node", "drain", "local", "--reason", "maintenance")
    _gone_by(left, kill_at)
    wait_for("job 1 finished", lambda: jobs(home)[1]["status"] == "finished", timeout=30,
             home=home)  # fmt: skip
    got = jobs(home)[1]
    assert (got["outcome"], got["finish_reason"]) == ("failed", "failed"), got
    assert got["exit_code"] == code if code is not None else got["exit_code"] != 0, got
    cli(home, "node", "return", "local")  # the old code: it ran again here, launch 2
    time.sleep(3)
    assert runs.read_text().split() == ["1"], runs.read_text()
    assert jobs(home)[1]["status"] == "finished", jobs(home)[1]
    assert up.proc.poll() is None


def test_a_resumable_job_preempted_in_its_time_limits_grace_ends_time_limit_not_run_again(
    home: Path, runs: Path
) -> None:
    """atk53-23 F5: past its time limit, in that limit's grace (its command ignores SIGTERM), a
    resumable job is preempted: it timed out, `time_limit`, and never runs again; the
    preemption only cuts its grace. Before, it was recorded `preempted` and run again."""
    submit(home, "bob", 1, f"echo $GPULEDGER_LAUNCH >> {runs}; trap '' TERM;"
           " while :; do sleep 0.2; done", "--resumable", "--min-runtime", "0", "-t", "3s",
           "--grace", f"{GRACE_S}s")  # fmt: skip
    up = Service(home)
    wait_for("job 1 past its limit", lambda: _row(home, 1).get("state") == "stopping",
             timeout=60, home=home)  # fmt: skip
    cli(home, "preempt", "1", "--reason", "maintenance")
    wait_for("job 1 finished", lambda: jobs(home)[1]["status"] == "finished", timeout=30,
             home=home)  # fmt: skip
    got = jobs(home)[1]
    assert (got["outcome"], got["finish_reason"]) == ("failed", "time_limit"), got
    time.sleep(4)  # cycles pass: nothing runs it again
    assert runs.read_text().split() == ["1"], runs.read_text()
    assert up.proc.poll() is None


def test_a_time_limit_that_passes_after_the_command_exited_0_leaves_the_job_completed(
    home: Path, runs: Path
) -> None:
    submit(home, "bob", 1, _left(runs), "-t", "4s", "--grace", f"{GRACE_S}s")
    up = Service(home)
    left, kill_at = _reaping(home, 1)
    started = float(jobs(home)[1]["started_at"])
    while time.time() < started + 5:  # its limit passes while its leftovers are reaped
        time.sleep(0.3)
    assert any(_alive(p) for p in left), "its leftovers died before its limit"
    _gone_by(left, kill_at)
    _completed_once(home, 1, runs)  # the old code: failed, time_limit
    assert up.proc.poll() is None


def test_a_cancel_after_the_command_exited_0_leaves_the_job_completed_and_kills_its_leftovers(
    home: Path, runs: Path
) -> None:
    submit(home, "bob", 1, _left(runs), "--grace", f"{GRACE_S}s")
    submit(home, "bob", 1, "true", "-d", "afterok:1")  # job 2: runs only if job 1 completed
    up = Service(home)
    left, kill_at = _reaping(home, 1)
    said = cli(home, "cancel", "1", actor="bob")
    cancelled = time.time()
    assert said.returncode == 0, said.stderr
    assert "had completed (its command exited 0)" in said.stdout, said.stdout
    # what it left is killed at once (the cancel cuts their grace), not at `kill_at`
    while any(_alive(p) for p in left):
        assert time.time() < min(kill_at, cancelled + 6), "its leftovers outlived the cancel"
        time.sleep(0.3)
    _completed_once(home, 1, runs)  # the old code: cancelled
    wait_for("its afterok dependent completed", lambda: jobs(home)[2].get("outcome")
             == "completed", timeout=30, home=home)  # fmt: skip
    assert "cancelled by bob" in cli(home, "explain", "1").stdout
    assert up.proc.poll() is None


def test_a_cancel_after_the_command_exited_3_keeps_its_exit_code(home: Path, runs: Path) -> None:
    """atk54-23 F4: a cancel after the command exited 3 (recorded: the job reads `stopping`),
    while its leftovers live out their grace: the job ends `cancelled`, as docs/agent.md says,
    with its command's own code, 3, in `jobs`, `explain` and the cancel's answer. Before: exit
    code null, the code lost."""
    submit(home, "bob", 1, _left(runs).replace("exit 0", "exit 3"), "--grace", f"{GRACE_S}s")
    up = Service(home)
    left, kill_at = _reaping(home, 1)
    said = cli(home, "cancel", "1", actor="bob")
    assert said.returncode == 0, said.stderr
    assert "1's command had exited 3: recorded cancelled with exit code 3" in said.stdout, said
    _gone_by(left, kill_at)
    wait_for("job 1 finished", lambda: jobs(home)[1]["status"] == "finished", timeout=30,
             home=home)  # fmt: skip
    got = jobs(home)[1]
    assert (got["outcome"], got["finish_reason"], got["exit_code"]) == (
        "cancelled", "cancelled", 3), got  # fmt: skip
    explained = cli(home, "explain", "1").stdout
    assert "cancelled by bob, exit code 3 (its command exited 3 at" in explained, explained
    assert runs.read_text().split() == ["1"], runs.read_text()
    assert up.proc.poll() is None


def test_a_supervisor_killed_in_its_leftovers_grace_gives_them_no_new_grace(
    home: Path, runs: Path
) -> None:
    """atk52-23 F7: the per-job supervisor killed with -9 while the processes a command left
    live out their grace: the agent takes its part over (`run_ends.orphaned`) and SIGKILLs them
    at the SIGKILL the supervisor had set (`RUNDIR/reaping`), which every read shows, not a
    whole grace after the supervisor's death (the old code: `kill -9` time + the grace)."""
    submit(home, "bob", 1, _left(runs), "--grace", f"{GRACE_S}s")
    up = Service(home)
    left, kill_at = _reaping(home, 1)
    (rundir,) = (home / "agents").glob("*/runs/1.1/0")
    supervisor = int((rundir / "supervisor").read_text().split()[0])
    while time.time() < kill_at - GRACE_S / 2:  # well into the grace
        time.sleep(0.3)
    os.kill(supervisor, signal.SIGKILL)
    while any(_alive(p) for p in left):
        assert time.time() < kill_at + 4, "its leftovers got a new grace"
        time.sleep(0.3)
    _completed_once(home, 1, runs)  # its command's exit 0 stands
    assert up.proc.poll() is None


def test_leftovers_whose_supervisor_and_up_were_killed_are_not_adopted_as_a_running_job(
    home: Path, runs: Path
) -> None:
    """atk53-23 F1: the supervisor and `up` both killed -9 while what a command (exit 0) left
    lives out its grace, and `up` started again after that grace's SIGKILL: the agent found the
    leftovers by their processes, made their run directory anew (`spec.json` `found`, `job` a
    leftover's pid), adopted them as a running job and never killed them. They are SIGKILLed at
    once (their SIGKILL is past), the run directory stays the one the supervisor made, and the
    job ends `completed`, its end once they are gone."""
    submit(home, "bob", 1, _left(runs), "--grace", f"{GRACE_S}s")
    up = Service(home)
    left, kill_at = _reaping(home, 1)
    (rundir,) = (home / "agents").glob("*/runs/1.1/0")
    spec, job = (rundir / "spec.json").read_bytes(), (rundir / "job").read_bytes()
    supervisor = int((rundir / "supervisor").read_text().split()[0])
    os.kill(supervisor, signal.SIGKILL)
    up.proc.kill()
    up.proc.wait(timeout=30)
    while time.time() < kill_at + 1:  # `up` comes back after their SIGKILL time
        time.sleep(0.3)
    assert any(_alive(p) for p in left), "its leftovers died with nobody to kill them"
    up = Service(home)
    back = time.time()
    while any(_alive(p) for p in left):
        assert time.time() < back + 8, "its leftovers outlived their SIGKILL"
        time.sleep(0.3)
    assert (rundir / "spec.json").read_bytes() == spec
    assert (rundir / "job").read_bytes() == job
    _completed_once(home, 1, runs)
    assert float(jobs(home)[1]["finished_at"]) >= back - 1, jobs(home)[1]
    assert up.proc.poll() is None


def test_a_cancelled_gang_run_ends_only_once_every_parts_leftovers_are_gone(
    home: Path, runs: Path
) -> None:
    """atk53-23 F2: a gang run over two nodes whose rank 0 exits 0 leaving a child that ignores
    SIGTERM while rank 1 runs on, then cancelled: rank 1 ends at once, rank 0's child lives on
    until its SIGKILL. The ledger recorded the run ended (its GPUs free, a next gang placed on
    that node) as soon as rank 1 was gone; it ends only once every part's processes are."""
    cli(home, "node", "add", "a", "--gpus", "2", "--gpu-type", "sim")
    cli(home, "node", "add", "b", "--gpus", "2", "--gpu-type", "sim")
    left = runs.with_name("left")
    left.touch()
    left.chmod(0o666)
    child = f"sh -c 'trap \"\" TERM; echo $$ > {left}; while :; do sleep 0.2; done'"
    submit(home, "bob", 4, f'if [ "$NODE_RANK" = 0 ]; then {child} & sleep 1; exit 0; fi;'
           " exec sleep 600", "--grace", f"{GRACE_S}s")  # fmt: skip
    up = Service(home)
    wait_for("rank 0's child", lambda: left.read_text().strip() != "", home=home)
    pid = int(left.read_text())
    time.sleep(3)  # rank 0's command has exited; rank 1 runs on
    assert _alive(pid) and jobs(home)[1]["status"] == "running", jobs(home)[1]
    cli(home, "cancel", "1", actor="bob")
    cancelled = alive_at = time.time()
    # the run's end may never be dated before a moment rank 0's child was seen alive (a CLI
    # read takes seconds on a loaded machine: the child is looked at before each read)
    while _alive(pid):
        alive_at = time.time()
        got = jobs(home)[1]
        ended = got.get("finished_at")
        assert ended is None or float(ended) >= alive_at - 1, f"ended while it lived: {got}"
        assert time.time() < cancelled + GRACE_S + 10, "rank 0's child outlived its SIGKILL"
        time.sleep(0.5)
    wait_for("job 1 finished", lambda: jobs(home)[1].get("finished_at") is not None,
             timeout=30, home=home)  # fmt: skip
    assert float(jobs(home)[1]["finished_at"]) >= alive_at - 1, (alive_at, jobs(home)[1])
    assert up.proc.poll() is None
