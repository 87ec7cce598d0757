"""A Slurm run's own end record is how it ended where Slurm did not see it end (docs/slurm.md,
"Real times"): Slurm's EndTime is when slurmctld heard of the end, late after a slurmd or
slurmctld outage (CI: a run charged 10.9 s past its real end; atk42-24 F3: a run charged only
to its last sighting before an outage), and a restarted slurmctld FAILs a batch job it finds
missing from its node (atk42-24 F2). A record's later beats are not its script's, so a touch of
the mark from outside Slurm no longer holds an ended run's GPUs (atk42-24 F1)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ledger.cycle.executor import Launch
from ledger.engines.slurm import SlurmExecutor, parse_jobs
from ledger.engines.slurm.ends import (
    BEAT_EVERY_S,
    Ending,
    OwnEnd,
    node_fail_ending,
    own_finish,
    record_beat,
)
from ledger.engines.slurm.launching import own_end
from ledger.engines.slurm.script import batch_script
from ledger.engines.slurm.stops import Quarantine, Stopping, stopped_end, vanished_end
from ledger.engines.slurm.tracked import Run
from schemas.events import GpuSlot

LID = "0123abcd4567"
START = 0.0
"""Slurm's StartTime of the run in each test: 30 s before it begins (`_start`), whole
seconds, so a record written now (its ctime: the real clock) ends about 30 s into the run."""


@pytest.fixture(autouse=True)
def _start() -> None:
    global START
    START = float(int(time.time()) - 30)


def at(seconds: float) -> str:
    """Slurm's word for START + seconds (whole seconds, local time)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(START + seconds))


def our_run(state: str, code: str = "0:0", end: float | None = None) -> str:
    ends = f" EndTime={at(end)}" if end is not None else " EndTime=Unknown"
    return (
        f"JobId=7 JobName=gpuledger-1 UserId=bob(1001) JobState={state} Reason=None"
        f" ExitCode={code} StartTime={at(0)}{ends} Partition=gpuledger NodeList=vm"
        f" Comment=gpuledger:{LID}:job=1:run=0 StdOut=/tmp/y"
    )


def record(tmp_path: Path, code: int, when: float, signalled: int = 0) -> float:
    """The run's own end record, as its batch script writes it, saying it ended at START +
    `when`; the end it stands for (- START): a second before it was written at the earliest
    (its ctime, `ends.own_finish`)."""
    run_dir = tmp_path / "checkpoints" / "1.0"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "ended").write_text(f"{code} {START + when:.6f} {signalled}\n")
    return round(max(when, (run_dir / "ended").stat().st_ctime - 1.0 - START), 1)


def ends_of(tmp_path: Path, text: str, now: float) -> list[tuple[int, float, str]]:
    """(exit code, end - START, reason) of what one read of `text` at START + now records."""
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    ex._runs = {1: Run(1, 0, None, slurm_id="7", started=True, started_at=START)}
    ex._view = {j.slurm_id: j for j in parse_jobs(text)}
    ex._read_runs(START + now)
    return [(x.exit_code, round(x.at - START, 1), x.reason) for x in ex._exits]


def test_a_run_that_ended_while_its_slurmd_was_dead_is_recorded_at_its_own_end(
    tmp_path: Path,
) -> None:
    """The CI failure: a run whose command exited 0 while its node's slurmd was dead (its
    processes live on under slurmstepd) reached slurmctld late: COMPLETED with an EndTime
    10.9 s past its real end, charged to it. Its own end record says when it ended."""
    real = record(tmp_path, 0, 30.3)
    assert ends_of(tmp_path, our_run("COMPLETED", end=41.2), 45.0) == [(0, real, "exited")]
    assert real <= 30.3 + 1.5  # (the test's F9 rule; 30.3 unless this test was slow)


def test_a_run_that_ended_on_a_node_slurm_gave_up_is_recorded_at_its_own_end(
    tmp_path: Path,
) -> None:
    """The other outage shape: its node given up (NODE_FAIL at 41 s), the run had exited 0 at
    30.3 s; read long after (its node returned), it ended at its own end."""
    real = record(tmp_path, 0, 30.3)
    assert ends_of(tmp_path, our_run("NODE_FAIL", end=41.0), 100.0) == [(0, real, "exited")]


def test_without_its_own_record_slurms_end_stands(tmp_path: Path) -> None:
    assert ends_of(tmp_path, our_run("COMPLETED", end=41.2), 45.0) == [(0, 41.0, "exited")]


def test_a_record_outside_the_run_is_kept_inside_slurms_word(tmp_path: Path) -> None:
    """The record is the job user's word: never before its start nor a second before it was
    written (its ctime: about 30 s into the run here), never after Slurm's end."""
    early = record(tmp_path, 0, -50.0)
    assert early >= 28.0
    assert ends_of(tmp_path, our_run("COMPLETED", end=41.0), 45.0) == [(0, early, "exited")]
    record(tmp_path, 0, 44.0)
    assert ends_of(tmp_path, our_run("COMPLETED", end=41.0), 45.0) == [(0, 41.0, "exited")]


def test_a_cancel_or_a_limit_keeps_slurms_end(tmp_path: Path) -> None:
    """Where Slurm decided the end (a cancel), its processes' end is Slurm's, not the record's."""
    record(tmp_path, 0, 30.3, signalled=1)
    assert ends_of(tmp_path, our_run("CANCELLED", "0:15", end=41.0), 45.0) == [
        (143, 41.0, "cancelled")
    ]


def test_a_run_that_ended_after_a_slurmctld_outage_is_recorded_at_its_real_end(
    tmp_path: Path,
) -> None:
    """atk42-24 F3: last seen running before a slurmctld outage (reads answered until 10 s, and
    again from 60 s), it ended 12 s after the outage (72 s), inside the settle time: it was
    recorded ended at its last sighting (8 s), 64 s of real running uncharged."""
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    ex._runs = {1: Run(1, 0, None, slurm_id="7", started=True, started_at=START,
                       seen_running_at=START + 8.0)}  # fmt: skip
    ex._away = (START + 10.0, START + 60.0)
    ex._view = {j.slurm_id: j for j in parse_jobs(our_run("COMPLETED", end=73.0))}
    record(tmp_path, 0, 72.4)
    ex._read_runs(START + 75.0)
    assert [(x.exit_code, round(x.at - START, 1)) for x in ex._exits] == [(0, 72.4)]


def test_a_run_a_returning_slurmctld_failed_completed_by_its_own_record(tmp_path: Path) -> None:
    """atk42-24 F2: a job that exited 0 during a slurmctld outage, which the returning
    controller found missing from its node and FAILed, is completed (exit 0), ended when its
    record says; likewise one the controller no longer lists at all."""
    real = record(tmp_path, 0, 30.3)
    assert ends_of(tmp_path, our_run("FAILED", "0:1", end=70.0), 75.0) == [(0, real, "exited")]
    assert ends_of(tmp_path, our_run("FAILED", "1:0", end=70.0), 75.0) == [(0, real, "exited")]
    # its own failure stays one
    real = record(tmp_path, 3, 30.3)
    assert ends_of(tmp_path, our_run("FAILED", "3:0", end=31.0), 75.0) == [(3, real, "exited")]
    r = Run(1, 0, None, slurm_id="7", started=True, started_at=START)
    lost = vanished_end(r, "7", "", START + 90.0)
    assert lost is not None and (lost.reason, lost.exit_code) == ("lost", -1)
    gone = vanished_end(r, "7", "", START + 90.0, OwnEnd(0, START + 30.3), START)
    assert gone is not None and (gone.reason, gone.exit_code, gone.at) == (
        "exited", 0, START + 30.3,
    )  # fmt: skip
    # sacct says NODE_FAIL (the returning controller gave its node up): unsignalled, it ended
    # by itself, as `node_fail_ending` rules
    rows = f"NODE_FAIL|0:0|{at(70.0)}\n"
    failed = vanished_end(r, "7", rows, START + 90.0, OwnEnd(0, START + 30.3), START)
    assert failed is not None and (failed.reason, failed.exit_code) == ("exited", 0)
    killed = vanished_end(r, "7", rows, START + 90.0, OwnEnd(0, START + 30.3, True), START)
    assert killed is not None and killed.reason == "node_failure"


def test_a_run_stopped_at_its_limit_that_slurm_forgot_ends_time_limit_by_its_record() -> None:
    """s56 (reading issue 24's `failed` for a timeout): a run the executor stopped at its
    limit (`Run.limited`) that Slurm no longer lists, without accounting, and whose own end
    record says it was signalled (137: its SIGKILL) was recorded `exited`, outcome `failed`:
    only Slurm's word of an end kept it `time_limit`. One whose record says it exited by
    itself, unsignalled, keeps its own exit."""
    r = Run(1, 0, None, slurm_id="7", started=True, started_at=START, limited=True)
    killed = vanished_end(r, "7", "", START + 90.0, OwnEnd(137, START + 42.0, True), START)
    assert killed is not None and (killed.reason, killed.exit_code) == ("time_limit", 137)
    itself = vanished_end(r, "7", "", START + 90.0, OwnEnd(0, START + 29.0), START)
    assert itself is not None and (itself.reason, itself.exit_code) == ("exited", 0)
    lost = vanished_end(r, "7", "", START + 90.0)
    assert lost is not None and lost.reason == "lost"


@pytest.mark.parametrize(
    ("own", "state", "low", "want"),
    [
        (None, "COMPLETED", 0.0, (1, 40.0, False)),  # no record: as Slurm says
        (OwnEnd(0, 30.0), "COMPLETED", 0.0, (1, 30.0, True)),  # COMPLETED: Slurm saw the exit
        (OwnEnd(0, 30.0), "FAILED", 0.0, (0, 30.0, True)),  # FAILED: perhaps not
        (OwnEnd(0, 30.0), "", 0.0, (0, 30.0, True)),  # no longer listed
        (OwnEnd(0, 30.0), "COMPLETED", 33.0, (1, 33.0, True)),  # its script beat at 33 s
        (OwnEnd(0, 50.0), "COMPLETED", 0.0, (1, 45.0, True)),  # never after Slurm's end
        (OwnEnd(0, 30.0, False, 30.01), "COMPLETED", 0.0, (1, 30.0, True)),  # as written
        (OwnEnd(0, 5.0, False, 38.0), "COMPLETED", 0.0, (1, 37.0, True)),  # rewritten later
    ],
)
def test_own_finish(
    own: OwnEnd | None, state: str, low: float, want: tuple[int, float, bool]
) -> None:
    assert own_finish(own, state, 1, 40.0, low, 45.0) == want


def test_a_stopped_run_that_ended_by_itself_ends_as_its_record_says() -> None:
    """atk42-24 F3 for a run the ledger was stopping: it ended by itself after the outage."""
    (j,) = parse_jobs(our_run("COMPLETED", end=73.0))
    st = Stopping(START + 5.0, run=(1, 0), seen_running_at=START + 8.0)
    outage = ((START + 10.0, START + 60.0), 30.0)
    old = stopped_end(st, j, START + 75.0, None, None, True, outage)
    assert old.at == START + 8.0  # no record: its last sighting
    new = stopped_end(
        st, j, START + 75.0, None, None, True, outage, (OwnEnd(0, START + 72.4), None)
    )
    assert new.at == START + 72.4 and new.exit_code == 0


def test_a_beat_after_its_own_record_does_not_hold_an_ended_runs_gpus() -> None:
    """atk42-24 F1: after an admin's DOWN, runs that had ended by their own end record had their
    mark touched from outside Slurm (as their user may), which held their GPUs 118-196 s. Their
    script beats only before the record (and ends a run whose record it did not write at its
    next beat): later beats do not count."""
    assert record_beat(None, 10.0) is None
    assert record_beat(50.0, None) == 50.0  # no record (or a script from before the rule)
    assert record_beat(11.0, 10.0) == 11.0
    assert record_beat(50.0, 10.0) == 10.0 + BEAT_EVERY_S
    (j,) = parse_jobs(our_run("NODE_FAIL", "0:0", end=20.0))
    assert j.end_time is not None
    end, kw = j.end_time, 5.0
    ended = node_fail_ending(OwnEnd(0, end - 2.0, False, end - 1.0), None, True, end, 0,
                             START, end, kw, end + 1.0, beat_stale_s=15.0)  # fmt: skip
    assert ended is not None and ended.own_record and ended.written == end - 1.0
    q = Quarantine()
    q.hold(ended, j, {"vm": (0,)})
    touched = lambda _sid, now: now  # noqa: E731 (the mark touched at every read)
    q.refresh({"vm": end}, kw, end + 7.0, touched)
    assert q.held == {"vm": (0,)}  # Slurm's kill has not surely landed
    q.refresh({"vm": end}, kw, end + 16.0, touched)
    assert q.held == {}  # its record 17 s old: touched or not


def test_without_its_records_time_a_beating_mark_holds_the_gpus() -> None:
    """A run whose record's time is unknown (`Ending.written` None) is held while it beats
    (atk39-24 F5: Slurm's kill may never come)."""
    (j,) = parse_jobs(our_run("NODE_FAIL", "0:0", end=20.0))
    assert j.end_time is not None
    end = j.end_time
    q = Quarantine()
    q.hold(Ending(0, end - 2.0, "exited", "its own end record", True, 15.0), j, {"vm": (0,)})
    q.refresh({"vm": end}, 5.0, end + 100.0, lambda _sid, now: now)
    assert q.held == {"vm": (0,)}


def _batch(tmp_path: Path, shell: str) -> tuple[Path, dict[str, str]]:
    """The real batch script of a job running `bash -c SHELL`, written to `tmp_path/batch`,
    and its marks' paths."""
    job = Launch(5, (GpuSlot(node="n1", gpu_indices=(0,)),), ("bash", "-c", shell), None,
                 "alice", "ai2/olmo")  # fmt: skip
    marks = {m: str(tmp_path / m) for m in ("launched", "ended", "signalled", "stopping", "alive")}
    script = tmp_path / "batch"
    script.write_text(batch_script(job, launched_file=marks["launched"],
                                   ended_file=marks["ended"], signalled_file=marks["signalled"],
                                   stopping_file=marks["stopping"], alive_file=marks["alive"],
                                   after_term_s=60, own_end_s=10))  # fmt: skip
    return script, marks


def test_the_script_ends_a_run_whose_end_record_it_did_not_write(tmp_path: Path) -> None:
    """The real script, in bash: an end record written from outside while the command lives
    ends the command at the script's next beat; the script's own record replaces it."""
    script, marks = _batch(tmp_path, f"sleep 30; echo survived > {tmp_path / 'out'}")
    bash = subprocess.Popen(["/bin/bash", str(script)], start_new_session=True)
    try:
        time.sleep(1.0)
        assert bash.poll() is None
        Path(marks["ended"]).write_text("0 1.0 0\n")  # forged
        forged_at = time.monotonic()
        code = bash.wait(timeout=20)
        took = time.monotonic() - forged_at
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGKILL)
    assert code == 137 and took < BEAT_EVERY_S + 2.0, (code, took)
    words = Path(marks["ended"]).read_text().split()
    assert words[0] == "137" and float(words[1]) > 1.0
    assert not (tmp_path / "out").exists()


def test_a_directory_at_its_end_record_does_not_end_the_run(tmp_path: Path) -> None:
    """A job that makes its end record a directory, to keep its records unwritable (atk37-23
    F6), is judged by the older rules (its node's), not ended by its script."""
    script, marks = _batch(tmp_path, "sleep 30")
    Path(marks["ended"]).mkdir()
    bash = subprocess.Popen(["/bin/bash", str(script)], start_new_session=True)
    try:
        time.sleep(BEAT_EVERY_S * 2 + 1.0)
        assert bash.poll() is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGKILL)
        bash.wait(timeout=10)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0 100.5 0\n", (0, False, "")),
        (
            "0 100.5 1 2 1\n",
            (
                2,
                True,
                "its command left 2 processes in the job's cgroup, killed after the job's grace",
            ),
        ),
        (
            "3 100.5 0 1 0\n",
            (1, False, "its command left 1 processes in the job's cgroup, ended at SIGTERM"),
        ),
    ],
)
def test_the_end_record_says_what_the_command_left_in_its_cgroup(
    tmp_path: Path, text: str, want: tuple[int, bool, str]
) -> None:
    """atk46-s F4: the batch script ends what its command left in its step's cgroup before its
    record, and the record says how many and whether they were killed (`script_tree`); a record
    without it (nothing left, or an older script's) reads as before; a record of 4 words does
    not read."""
    (tmp_path / "ended").write_text(text)
    own = own_end(tmp_path)
    assert own is not None and own.at == 100.5
    assert (own.left, own.killed, own.tree_note()) == want
    said = node_fail_ending(own, None, True, 200.0, 0, 50.0, None, 10.0, 300.0)
    assert said is not None and said.note.endswith(want[2] or "Slurm said NODE_FAIL")
    (tmp_path / "ended").write_text("0 100.5 0 2\n")
    assert own_end(tmp_path) is None


def test_a_stop_whose_kill_an_outage_held_back_ends_as_its_record_says() -> None:
    """atk48-23 F2: cancelled, then slurmctld killed -9 within the grace: the executor's SIGKILL
    could not be sent, the processes lived through the outage, and the run was recorded ended
    at its last sighting before the outage (the cancel's moment), 27 s before they died; its
    own end record said the real time."""
    (j,) = parse_jobs(our_run("FAILED", "137:0", end=73.0))
    st = Stopping(START + 5.0, run=(1, 0), seen_running_at=START + 8.0, cancelled=True)
    outage = ((START + 10.0, START + 60.0), 30.0)
    old = stopped_end(st, j, START + 75.0, None, None, False, outage)
    assert old.at == START + 8.0  # no record: its last sighting
    new = stopped_end(
        st, j, START + 75.0, None, None, False, outage, (OwnEnd(137, START + 72.4), None)
    )
    assert new.at == START + 72.4 and new.exit_code == 137, new


def test_a_run_slurms_backstop_ended_while_the_service_was_down_ends_time_limit() -> None:
    """CI of stops 55 and 56: `-t 30s`, the service killed -9, Slurm's own TIMEOUT then
    KillWait's SIGKILL ended the job (its record: 137), and the restarted service, finding the
    run no longer listed, recorded `exited`, outcome `failed`. A signalled end at or past the
    limit (from Slurm's start) is `time_limit`; before it, or unsignalled, the run's own."""
    launch = Launch(1, (), ("sleep", "300"), None, "alice", "ai2/olmo", time_limit_s=30)
    r = Run(1, 0, launch, slurm_id="7", started=True, started_at=START)
    late = vanished_end(r, "7", "", START + 90.0, OwnEnd(137, START + 72.0, True), START)
    assert late is not None and (late.reason, late.exit_code) == ("time_limit", 137)
    early = vanished_end(r, "7", "", START + 90.0, OwnEnd(137, START + 12.0, True), START)
    assert early is not None and early.reason == "exited"
    itself = vanished_end(r, "7", "", START + 90.0, OwnEnd(0, START + 40.0), START)
    assert itself is not None and (itself.reason, itself.exit_code) == ("exited", 0)


def test_the_scripts_own_end_after_a_sigterm_says_killed_in_its_record(tmp_path: Path) -> None:
    """atk59b N3: a SIGTERM-ignoring command stopped while the service was down was ended by its
    batch script's own end (`after_term_s` after the SIGTERM: the executor's SIGKILL never
    came), and its record said only `137 <time> 1`: the restart recorded it `killed: false`,
    "Slurm: FAILED". The record now says it was killed (`<left> 1`), nothing left or not."""
    job = Launch(5, (GpuSlot(node="n1", gpu_indices=(0,)),), ("bash", "-c", "trap '' TERM;"
                 " while :; do sleep 0.2; done"), None, "alice", "ai2/olmo")  # fmt: skip
    marks = {m: str(tmp_path / m) for m in ("launched", "ended", "signalled", "stopping", "alive")}
    script = tmp_path / "batch"
    script.write_text(batch_script(job, launched_file=marks["launched"],
                                   ended_file=marks["ended"], signalled_file=marks["signalled"],
                                   stopping_file=marks["stopping"], alive_file=marks["alive"],
                                   after_term_s=2, own_end_s=1))  # fmt: skip
    bash = subprocess.Popen(["/bin/bash", str(script)], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not Path(marks["launched"]).exists():
            assert time.monotonic() < deadline and bash.poll() is None
            time.sleep(0.05)
        time.sleep(0.3)
        bash.send_signal(signal.SIGTERM)
        code = bash.wait(timeout=20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGKILL)
    own = own_end(tmp_path)
    assert code == 137 and own is not None, (code, Path(marks["ended"]).read_text())
    assert (own.exit_code, own.signalled, own.killed) == (137, True, True), own


def test_a_stop_its_script_killed_after_the_grace_is_recorded_killed_at_its_real_end() -> None:
    """atk59b N3: the stop's SIGTERM sent, the service down past the grace: the batch script's
    own end SIGKILLed the command (its record: signalled, killed) and the restart found the job
    ended `FAILED` 137. Recorded killed (as the executor's own SIGKILL, `tracked.note_killed`,
    is), at its record's end on one node; a gang's at Slurm's end of the job (its ranks on the
    other nodes die by it, after the batch script's record), never the restart's read."""
    (j,) = parse_jobs(our_run("FAILED", "137:0", end=41.0))
    st = Stopping(START + 5.0, run=(1, 0), grace_s=15.0)  # taken up at a restart: no SIGKILL
    cut = OwnEnd(137, START + 40.6, True, left=1, killed=True)
    x = stopped_end(st, j, START + 90.0, record=(cut, START + 39.0), kill_wait_s=10.0)
    assert (x.engine_state, x.exit_code, x.at) == ("KILLED", 137, START + 40.6), x
    assert "killed after its grace" in x.note, x
    old = stopped_end(st, j, START + 90.0, record=(OwnEnd(137, START + 40.6, True), None))
    assert old.engine_state == "FAILED" and "killed" not in old.note, old  # nothing killed
    (gang,) = parse_jobs(our_run("FAILED", "137:0", end=41.0).replace("NodeList=vm",
                                                                      "NodeList=vm[1-2]"))  # fmt: skip  # noqa: E501
    g = stopped_end(st, gang, START + 90.0, record=(cut, START + 39.0), kill_wait_s=10.0)
    assert g.engine_state == "KILLED" and g.at == START + 41.0 + 1.0 + 10.0 + 5.0, g


def test_a_single_node_run_whose_step_outlived_its_script_ends_by_slurms_end_of_the_job(
    tmp_path: Path,
) -> None:
    """atk60-slurm F2: a single-node run whose command ran under `srun`, stopped while the service
    was down and cut by its batch script's own end, was recorded ending at the script's record,
    ~10 s before its step's processes died (Slurm's end of the job: KillWait after the batch
    step's end). The script now marks a step still alive as it ends (`steps-left`), and such a
    run ends as a gang's does; one with no step left keeps its record's true end."""
    (j,) = parse_jobs(our_run("FAILED", "137:0", end=41.0))
    st = Stopping(START + 5.0, run=(1, 0), grace_s=15.0)  # taken up at a restart: no SIGKILL
    (tmp_path / "ended").write_text(f"137 {START + 40.6} 1 1 1\n")
    plain = own_end(tmp_path)
    assert plain is not None and (plain.at, plain.killed, plain.steps) == (
        START + 40.6,
        True,
        False,
    )
    (tmp_path / "steps-left").touch()
    cut = own_end(tmp_path)
    assert cut is not None and cut.steps, cut
    x = stopped_end(st, j, START + 90.0, record=(cut, START + 39.0), kill_wait_s=10.0)
    assert (x.engine_state, x.exit_code) == ("KILLED", 137), x
    assert x.at == START + 41.0 + 1.0 + 10.0 + 5.0, (x.at - START, x)  # before: its record's 40.6
    alone = OwnEnd(137, START + 40.6, True, left=1, killed=True)
    y = stopped_end(st, j, START + 90.0, record=(alone, START + 39.0), kill_wait_s=10.0)
    assert y.at == START + 40.6, y


def test_the_batch_script_marks_a_step_of_its_job_alive_as_it_ends(tmp_path: Path) -> None:
    """The mark of atk60-slurm F2, in a fake cgroup tree (`/proc/self/cgroup` cannot be faked:
    the function is run on its own): a process in `step_0` beside the script's `step_batch`
    makes it; none there (or only in `step_extern`) does not."""
    from ledger.engines.slurm.script_tree import steps_left_lines

    job = tmp_path / "job_7"
    for step in ("step_batch", "step_extern", "step_0"):
        (job / step).mkdir(parents=True)
        (job / step / "cgroup.procs").write_text("")
    (job / "step_extern" / "cgroup.procs").write_text("1\n")
    func, call = steps_left_lines(str(tmp_path / "ended"))
    fake = f"gpuledger_group() {{ gpuledger_cg={job}/step_batch; }}\n"

    def run() -> None:
        subprocess.run(["/bin/bash", "-c", f"{func}\n{fake}{call}"], check=False)

    run()
    assert not (tmp_path / "steps-left").exists()
    (job / "step_0" / "cgroup.procs").write_text("4242\n")
    run()
    assert (tmp_path / "steps-left").exists()


def test_slurms_own_end_of_a_gang_unseen_completing_is_no_earlier_than_slurms_end_of_the_job() -> (
    None
):
    """atk60-slurm F3: a gang's TIMEOUT while the service was down was recorded at its batch
    node's last beat (`limit_kill_end`), 1.7 s before its rank on the other node died by Slurm's
    end of the job (KillWait after its EndTime). Now a gang's, or a run's with a step left alive
    (`steps-left`), is no earlier than that end, nor after the read; one node's alone as it was."""
    from ledger.engines.slurm.stops import ended_by_slurm

    (one,) = parse_jobs(our_run("TIMEOUT", "0:15", end=40.0))
    (gang,) = parse_jobs(our_run("TIMEOUT", "0:15", end=40.0).replace("NodeList=vm",
                                                                      "NodeList=vm[1-2]"))  # fmt: skip  # noqa: E501
    beat = START + 48.9
    assert ended_by_slurm(beat, one, START + 90.0, 10.0, False) == beat
    assert ended_by_slurm(beat, one, START + 90.0, 10.0, True) == START + 40.0 + 16.0
    assert ended_by_slurm(beat, gang, START + 90.0, 10.0, False) == START + 40.0 + 16.0
    assert ended_by_slurm(beat, gang, START + 50.0, 10.0, False) == START + 50.0  # the read
