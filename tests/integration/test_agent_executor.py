"""The supervised executor with real processes: supervisors, the state file, adoption, stops,
time limits, gang parts, checkpoints and the test utilisation source."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.cycle.executor import Launch, Orders, Sample
from ledger.engines.gpu_util import FileSource
from ledger.engines.proc import start_time
from ledger.engines.supervised import SupervisedExecutor, live_processes
from schemas.errors import InvalidCommand
from tests.integration.execkit import (
    KILLED,
    TERMED,
    executor,
    job,
    kill_leftovers,
    launch,
    observe,
    run_dirs,
    stop,
    until,
    wait_starts,
)


def env_of(log: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in log.read_text().splitlines() if "=" in line)


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    yield from run_dirs(tmp_path)


def test_a_gang_job_runs_one_process_per_node_with_that_nodes_gpus_and_rendezvous_env(
    dirs: tuple[Path, Path],
) -> None:
    ex = executor(dirs)
    show = "env | grep -E '^(CUDA_VISIBLE_DEVICES|MASTER_|WORLD_SIZE|NNODES|NODE_RANK|GPULEDGER_)'"
    launch(ex, job(7, show, (("a", (0, 1)), ("b", (2, 3)))))
    started = wait_starts(ex)
    assert [s.job_id for s in started] == [7] and len(started[0].logs) == 2
    [x] = until(ex, lambda x: len(x) == 1)
    assert (x.job_id, x.exit_code, x.reason, x.engine_job_id) == (7, 0, "exited", "7.1")
    a, b = (env_of(Path(log)) for log in started[0].logs)
    assert (a["CUDA_VISIBLE_DEVICES"], b["CUDA_VISIBLE_DEVICES"]) == ("0,1", "2,3")
    assert (a["NODE_RANK"], b["NODE_RANK"]) == ("0", "1")
    for env in (a, b):
        assert env["WORLD_SIZE"] == env["NNODES"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == a["MASTER_PORT"]
        assert env["GPULEDGER_NODELIST"] == "a,b" and env["GPULEDGER_JOB_ID"] == "7"
        assert Path(env["GPULEDGER_CHECKPOINT_FILE"]).parts[-2:] == ("work", "checkpoint")
    assert a["GPULEDGER_CHECKPOINT_FILE"] != b["GPULEDGER_CHECKPOINT_FILE"]


def test_a_failed_part_stops_the_others_and_the_job_ends_with_its_code(
    dirs: tuple[Path, Path],
) -> None:
    ex = executor(dirs, grace_s=5)
    launch(
        ex,
        job(3, 'if [ "$NODE_RANK" = 1 ]; then sleep 0.5; exit 5; fi; exec sleep 60',
            (("a", (0,)), ("b", (0,)), ("c", (0,)))),
    )  # fmt: skip
    t0 = time.monotonic()
    [ex3] = until(ex, lambda x: len(x) == 1)
    assert (ex3.job_id, ex3.exit_code, ex3.reason) == (3, 5, "exited")
    assert time.monotonic() - t0 < 5  # the others ended on SIGTERM, not at the grace's end
    ends = [json.loads(p.read_text()) for p in (dirs[0] / "runs" / "3.1").glob("*/exit")]
    assert sorted(x["code"] for x in ends) == [5, TERMED, TERMED]
    assert live_processes(dirs[0]) == []


def test_the_time_limit_is_sigterm_then_sigkill_after_the_jobs_grace(
    dirs: tuple[Path, Path],
) -> None:
    ex = executor(dirs, grace_s=30)
    launch(ex, job(1, "exec sleep 60", time_limit_s=1))
    # job 2 ignores SIGTERM: it is killed when its own grace (1 s, not the default 30 s) ends
    launch(
        ex,
        job(2, "trap '' TERM; sleep 60 & wait; sleep 60", (("n0", (1,)),), time_limit_s=1,
            grace_s=1),
    )  # fmt: skip
    t0 = time.monotonic()
    exits = {x.job_id: x for x in until(ex, lambda x: len(x) == 2)}
    assert (exits[1].exit_code, exits[1].reason) == (TERMED, "time_limit")
    assert (exits[2].exit_code, exits[2].reason) == (KILLED, "time_limit")
    assert 2 <= time.monotonic() - t0 < 10


def test_a_run_first_seen_past_its_limit_and_grace_gets_its_sigterm_and_ten_seconds(
    dirs: tuple[Path, Path],
) -> None:
    """atk48-23 F1: a run whose limit passed while its executor did not look (the service or
    the agent down) got a whole new grace from the first look: SIGKILL 28 s after the `kill_at`
    every read showed (its limit plus its grace). Its grace counts from its limit; but (s56) a
    limit noticed late still gets its SIGTERM first and min(grace, 10 s) before its SIGKILL:
    it was killed at once with no SIGTERM (`reads.stopping.limit_sigkill_at`)."""
    ex = executor(dirs, grace_s=30)
    termed = dirs[1] / "termed-late"
    launch(ex, job(3, f"trap 'touch {termed}' TERM; while :; do sleep 0.1; done",
                   time_limit_s=1, grace_s=20))  # fmt: skip
    [st] = wait_starts(ex)
    assert st.started_at is not None
    time.sleep(max(0.0, st.started_at + 1 + 20 + 0.5 - time.time()))  # nobody looks meanwhile
    looked = time.time()
    [x] = until(ex, lambda x: len(x) == 1, 40)
    assert (x.exit_code, x.reason) == (KILLED, "time_limit")
    assert termed.exists(), "SIGKILLed with no SIGTERM"  # before: killed at the first look
    assert 9.5 <= x.at - looked < 15.0, x.at - looked  # 10 s from its TERM, not its 20 s


def test_the_time_limit_counts_from_the_commands_own_start(dirs: tuple[Path, Path]) -> None:
    """Counted from the launch's bookkeeping (before the supervisor started the command), a
    `-t 0:20` job ran 19.65-19.8 s: Slurm never stops a job before its limit (atk46-23 F3)."""
    ex = executor(dirs, grace_s=5)
    launch(ex, job(5, "exec sleep 60", time_limit_s=2))
    [st] = wait_starts(ex)
    [x] = until(ex, lambda x: len(x) == 1)
    assert x.reason == "time_limit" and st.started_at is not None
    assert 2.0 <= x.at - st.started_at < 4.0


def test_a_stop_of_a_job_in_its_limits_grace_kills_it_at_once(dirs: tuple[Path, Path]) -> None:
    """A job past its limit ignoring SIGTERM, with an hour's grace (as recorded before the cap):
    a cancel left its GPU `stopping` for the hour; it is killed at once, as scancel does
    (atk46-23 F7)."""
    ex = executor(dirs, grace_s=5)
    termed = dirs[1] / "termed"
    launch(ex, job(6, f"trap 'touch {termed}' TERM; while :; do sleep 0.1; done",
                   time_limit_s=1, grace_s=3600))  # fmt: skip
    wait_starts(ex)
    deadline = time.monotonic() + 20
    while not termed.exists():
        assert time.monotonic() < deadline, "no SIGTERM at the limit"
        observe(ex)
        time.sleep(0.05)
    stop(ex, 6)
    t0 = time.monotonic()
    while not (gone := [x for x in observe(ex).stopped if x.job_id == 6]):
        assert time.monotonic() - t0 < 4, "still in its grace"
        time.sleep(0.05)
    assert gone[0].exit_code == KILLED


def test_a_stopping_job_ordered_killed_is_killed_at_once(dirs: tuple[Path, Path]) -> None:
    """A cancelled job ignoring SIGTERM lived out its whole grace, and a second cancel could not
    cut it (atk46-23 F7): the ledger's kill order (`Orders.kills`) kills it now."""
    ex = executor(dirs, grace_s=5)
    termed = dirs[1] / "termed-again"
    launch(ex, job(7, f"trap 'touch {termed}' TERM; while :; do sleep 0.1; done", grace_s=60))
    wait_starts(ex)
    stop(ex, 7)
    deadline = time.monotonic() + 20
    while not termed.exists():
        assert time.monotonic() < deadline, "no SIGTERM at the stop"
        observe(ex)
        time.sleep(0.05)
    ex.carry_out(Orders(kills=(7, 99)), time.time())  # 99: no such run here, ignored
    t0 = time.monotonic()
    while not (gone := [x for x in observe(ex).stopped if x.job_id == 7]):
        assert time.monotonic() - t0 < 4, "still in its grace"
        time.sleep(0.05)
    assert (gone[0].exit_code, gone[0].engine_state) == (KILLED, "KILLED")


def test_debug_jobs_end_at_the_debug_limit_even_when_they_declare_more(
    dirs: tuple[Path, Path],
) -> None:
    ex = executor(dirs, debug_limit_s=1)
    launch(ex, job(4, "exec sleep 60", time_limit_s=900, debug=True))
    [x] = until(ex, lambda x: len(x) == 1)
    assert (x.exit_code, x.reason) == (TERMED, "time_limit")


def test_a_new_executor_adopts_live_jobs_and_reports_exits_that_happened_meanwhile(
    dirs: tuple[Path, Path],
) -> None:
    first = executor(dirs)
    launch(first, job(1, "exec sleep 60"), job(2, "sleep 1; exit 4", (("n0", (1,)),)))
    deadline = time.monotonic() + 10  # each supervisor names its job once the job has started
    while {p.job_id for p in live_processes(dirs[0])} != {1, 2}:
        assert time.monotonic() < deadline, live_processes(dirs[0])
        time.sleep(0.02)
    # the state file names each job's output path (private): no other host account reads it
    assert (dirs[0] / "state.json").stat().st_mode & 0o777 == 0o600  # atk25c F8
    first.close()  # the service goes away; its jobs do not
    deadline = time.monotonic() + 30  # job 2 ends while no executor watches it
    while 2 in {p.job_id for p in live_processes(dirs[0])}:
        assert time.monotonic() < deadline, "job 2 did not end"
        time.sleep(0.05)
    second = executor(dirs)
    assert second.running() == {1, 2}
    [x] = until(second, lambda x: len(x) == 1)
    assert (x.job_id, x.exit_code, x.reason, x.engine_job_id) == (2, 4, "exited", "2.1")
    assert second.running() == {1}
    assert {p.job_id for p in live_processes(dirs[0])} == {1}
    stop(second, 1)
    assert until(second, lambda x: not second.running()) == []  # a stop is not an exit


def test_adopt_stops_runs_the_ledger_no_longer_has_and_reports_exits_no_handle_remembers(
    dirs: tuple[Path, Path],
) -> None:
    first = executor(dirs)
    launch(
        first,
        job(1, "exec sleep 60"),
        job(2, "exec sleep 60", (("n0", (1,)),)),
        job(3, "exit 5", (("n0", (2,)),)),
    )
    # the exit of job 3 is read, then the service dies before recording it
    assert [x.job_id for x in until(first, lambda x: len(x) == 1)] == [3]
    first.close()
    second = executor(dirs)
    # the ledger still runs jobs 1 and 3 (first placements); job 2 was cancelled meanwhile
    assert second.adopt({1: 0, 3: 0}, time.time()) == {1, 3}
    seen = observe(second)
    assert 3 in {s.job_id for s in seen.starts}
    [x] = seen.exits
    assert (x.job_id, x.exit_code, x.engine_job_id) == (3, 5, "3.1")
    deadline = time.monotonic() + 10
    # a poll after job 2's processes are gone lets go of its handle
    while {p.job_id for p in live_processes(dirs[0])} != {1} or second.running() != {1}:
        observe(second)
        assert time.monotonic() < deadline, "job 2 was not stopped"
        time.sleep(0.05)
    assert {p.job_id for p in live_processes(dirs[0])} == {1}
    # a later placement of job 1 than the one running here: the old run is stopped
    assert second.adopt({1: 1}, time.time()) == set()


def test_a_reused_pid_is_not_mistaken_for_the_supervisor(dirs: tuple[Path, Path]) -> None:
    first = executor(dirs)
    launch(first, job(1, "sleep 0.2; exit 0"))
    first.close()
    time.sleep(0.8)
    # forge the handle: the supervisor's pid now names another process (this test), and its
    # exit file is gone, as if it never wrote one (the leader's own record too)
    state = dirs[0] / "state.json"
    data = json.loads(state.read_text())
    part = data["jobs"][0]["parts"][0]
    rundir = Path(part["rundir"])
    _, started = (int(v) for v in (rundir / "supervisor").read_text().split())
    part["pid"], part["pid_start"] = os.getpid(), started
    (rundir / "exit").unlink()
    (rundir / "job").unlink()
    (rundir / "record").unlink()
    state.write_text(json.dumps(data))
    assert start_time(os.getpid()) != started
    second = executor(dirs)
    [x] = until(second, lambda x: len(x) == 1)
    assert (x.job_id, x.exit_code, x.reason) == (1, -1, "lost")


def test_a_launch_waits_until_a_stopped_job_has_really_left_its_gpus(
    dirs: tuple[Path, Path],
) -> None:
    ex = executor(dirs, grace_s=1.5)
    launch(ex, job(1, "trap '' TERM; sleep 60 & wait; sleep 60", (("n0", (0, 1)),)))
    time.sleep(0.3)
    stop(ex, 1)
    launch(ex, job(2, "exec sleep 60", (("n0", (1,)),)))
    assert observe(ex).starts == ()  # GPU 1 is still held by job 1's process
    t0 = time.monotonic()
    while not (starts := observe(ex).starts):
        time.sleep(0.05)
        assert time.monotonic() - t0 < 10
    assert [s.job_id for s in starts] == [2]
    assert time.monotonic() - t0 >= 1.0
    assert {p.job_id for p in live_processes(dirs[0])} == {2}


def test_checkpoint_file_and_utilisation_files_are_reported(
    dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    util = tmp_path / "util"
    util.mkdir()
    ex = executor(dirs, util=FileSource(util), sample_every_s=0.2)
    launch(ex, job(5, 'sleep 0.3; touch "$GPULEDGER_CHECKPOINT_FILE"; exec sleep 60',
                   (("n0", (0, 1)),)))  # fmt: skip
    assert wait_starts(ex)
    first = observe(ex)
    assert first.samples == () and first.checkpoints == ()  # no file yet
    (util / "5").write_text("3, 97")
    deadline = time.monotonic() + 10
    checkpoints: list[int] = []
    samples: list[Sample] = []
    while time.monotonic() < deadline and not (checkpoints and samples):
        got = observe(ex)
        checkpoints += got.checkpoints
        samples += got.samples
        time.sleep(0.1)
    assert checkpoints == [5]
    assert samples[0] == Sample(5, (3.0, 97.0))


def test_one_executor_per_state_directory(dirs: tuple[Path, Path]) -> None:
    first = executor(dirs)
    with pytest.raises(InvalidCommand, match="another service runs the jobs"):
        executor(dirs)
    first.close()
    executor(dirs).close()


def test_as_root_a_job_runs_as_its_submitting_user() -> None:
    assert os.geteuid() == 0, "this machine runs the suite as root"
    # the user must reach its checkpoint file: pytest's own tmp dirs are private to root
    top = Path(tempfile.mkdtemp(prefix="gpuledger-agent-"))
    top.chmod(0o755)
    dirs = (top / "agent", top / "jobs")
    ex = SupervisedExecutor(dirs[0], dirs[1], run_as="submitter")
    try:
        _run_as_nobody(ex, dirs)
    finally:
        ex.close()
        kill_leftovers(dirs[0])
        shutil.rmtree(top)


def _run_as_nobody(ex: SupervisedExecutor, dirs: tuple[Path, Path]) -> None:
    nine = job(9, 'id -u; touch "$GPULEDGER_CHECKPOINT_FILE" && echo can-checkpoint')
    as_nobody = Launch(**{**nine.__dict__, "user": "nobody"})
    launch(ex, as_nobody, Launch(**{**nine.__dict__, "job_id": 10, "user": "no-such-user-x"}))
    exits = {x.job_id: x for x in until(ex, lambda x: len(x) == 2)}
    assert exits[9].exit_code == 0 and exits[10].exit_code == 127
    out = (dirs[1] / "job-9.log").read_text().split()
    assert out == [str(pwd.getpwnam("nobody").pw_uid), "can-checkpoint"]
    # a user with no OS account is never run as anyone else: the launch fails, and says why
    assert exits[10].reason == "launch_failed"
    assert (
        exits[10].note == "user 'no-such-user-x' has no OS account on this node to run the job as"
    )
    assert not (dirs[1] / "job-10.log").exists()
