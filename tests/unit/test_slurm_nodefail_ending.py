"""How a run Slurm ended NODE_FAIL really ended (`ends.node_fail_ending`, issue 24): a run that
completed is never requeued or failed, and one is taken for gone only once it surely is."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ledger.cycle.executor import Launch
from ledger.engines.slurm.ends import (
    BEAT_EVERY_S,
    UNBEATEN_S,
    Ending,
    OwnEnd,
    beat_window,
    node_fail_ending,
)
from ledger.engines.slurm.launching import MarksSeen
from ledger.engines.slurm.script import batch_script
from schemas.events import GpuSlot

END = 1000.0  # Slurm's EndTime of the NODE_FAIL
START = 900.0
KILL_WAIT = 10.0


@dataclass(frozen=True)
class Case:
    own: OwnEnd | None = None
    signalled_at: float | None = None
    marks_seen: bool = True
    answering_since: float | None = 0.0
    now: float = END + 1.0
    confirm_s: float = 0.0  # SlurmdTimeout: how long a slurmd seen answering may be dead unseen
    beat_at: float | None = None  # its heartbeat's last beat (None: it has none)
    window: float = 15.0  # how long after its last beat it may live (`beat_window`)
    after_term_s: float | None = None  # its script ends it this long after Slurm's TERM
    want: tuple[int, float, str] | None = None  # (exit code, end, reason); None: wait


CASES = {
    # the completion was on its way to slurmctld when the node went DOWN (exit 0.2 s before)
    "completed just before the node went down is completed": Case(
        own=OwnEnd(0, END - 0.2), want=(0, END - 0.2, "exited")
    ),
    # slurmd away: Slurm's kill never reached it; it ran on and finished
    "ran on past NODE_FAIL unsignalled and exited 0 is completed at its own end": Case(
        own=OwnEnd(0, END + 40.0),
        answering_since=None,
        now=END + 41.0,
        want=(0, END + 40.0, "exited"),
    ),
    "ran on past NODE_FAIL and failed by itself is failed with its code": Case(
        own=OwnEnd(3, END + 40.0),
        answering_since=None,
        now=END + 41.0,
        want=(3, END + 40.0, "exited"),
    ),
    "killed by Slurm and exited 0 at SIGTERM is the node's failure": Case(
        own=OwnEnd(0, END + 2.0, signalled=True),
        signalled_at=END,
        now=END + 3.0,
        want=(0, END + 2.0, "node_failure"),
    ),
    # the script passes Slurm's SIGTERM on to the command (atk38-24 F2), which may end within
    # the EndTime's second: its signal's note, at or after the EndTime, says Slurm's kill ended it
    "Slurm's TERM passed on, killed within the second, is the node's failure": Case(
        own=OwnEnd(143, END + 0.4, signalled=True),
        signalled_at=END + 0.3,
        want=(143, END + 0.4, "node_failure"),
    ),
    "Slurm's TERM passed on, checkpointed and exited 0 within the second: node's failure": Case(
        own=OwnEnd(0, END + 0.6, signalled=True),
        signalled_at=END + 0.2,
        want=(0, END + 0.6, "node_failure"),
    ),
    "signalled before NODE_FAIL and ended within its second is its own end": Case(
        own=OwnEnd(143, END + 0.4, signalled=True),
        signalled_at=END - 3.0,
        want=(143, END + 0.4, "exited"),
    ),
    "signalled before its own end and ended before NODE_FAIL is its own end": Case(
        own=OwnEnd(143, END - 5.0, signalled=True), want=(143, END - 5.0, "exited")
    ),
    "an own end record before its start counts from its start": Case(
        own=OwnEnd(0, START - 50.0), want=(0, START, "exited")
    ),
    "an own end record in the future counts from now": Case(
        own=OwnEnd(0, END + 500.0), now=END + 2.0, want=(0, END + 2.0, "exited")
    ),
    "signalled, no record, within KillWait: wait": Case(signalled_at=END + 1.0, now=END + 10.0),
    "signalled, no record, KillWait passed: gone then": Case(
        signalled_at=END + 1.0, now=END + 11.5, want=(0, END + 11.0, "node_failure")
    ),
    # atk38-24 F5: slurmd killed right after an admin's DOWN: its TERM was noted, its SIGKILL
    # KillWait later never came; the processes ran on until the restarted slurmd killed them
    "signalled, no record, KillWait passed, its slurmd not answering: wait": Case(
        signalled_at=END + 1.0, answering_since=None, now=END + 100.0
    ),
    "signalled, no record, its slurmd back later: KillWait from its return": Case(
        signalled_at=END + 1.0,
        answering_since=END + 40.0,
        now=END + 50.5,
        want=(0, END + 50.0, "node_failure"),
    ),
    "signalled, no record, node seen answering, within SlurmdTimeout: wait": Case(
        signalled_at=END + 1.0, now=END + 29.0, confirm_s=30.0
    ),
    "signalled, no record, node still answering SlurmdTimeout later: gone KillWait after": Case(
        signalled_at=END + 1.0,
        now=END + 30.0,
        confirm_s=30.0,
        want=(0, END + 11.0, "node_failure"),
    ),
    "a signal long before NODE_FAIL is not Slurm's kill, node not answering: wait": Case(
        signalled_at=END - 100.0, answering_since=None, now=END + 60.0
    ),
    # atk37-23 F7: the ledger's own stop noted a SIGTERM before the node went DOWN; Slurm's kill
    # (its node answers) ends it by KillWait after Slurm's EndTime (whole seconds: + 1 s)
    "a signal before NODE_FAIL (the ledger's stop), node answering: gone KillWait later": Case(
        signalled_at=END - 100.0, now=END + 60.0, want=(0, END + 11.0, "node_failure")
    ),
    "no record, no signal, marks seen, node not answering: wait": Case(
        answering_since=None, now=END + 600.0
    ),
    # atk37-23 F6: the job made its marks unwritable (no note, no record ever): once its node's
    # slurmd answers, Slurm's kill reaches it; it is never `running` for good
    "no record, no signal, marks seen, node answering: gone KillWait after EndTime": Case(
        now=END + 600.0, want=(0, END + 11.0, "node_failure")
    ),
    "no record, no signal, marks seen, node answering, within KillWait: wait": Case(now=END + 10.5),
    "no record, no signal, marks seen, node answers again later: KillWait from then": Case(
        answering_since=END + 100.0, now=END + 110.0, want=(0, END + 110.0, "node_failure")
    ),
    # an admin's DOWN while its slurmd is dead: Slurm flagged it NOT_RESPONDING only 12 s
    # later; until SlurmdTimeout after the EndTime, "answering" proves nothing
    "no record, no signal, node seen answering, within SlurmdTimeout: wait": Case(
        now=END + 29.0, confirm_s=30.0
    ),
    "no record, no signal, node still answering SlurmdTimeout later: gone KillWait after": Case(
        now=END + 30.0, confirm_s=30.0, want=(0, END + 11.0, "node_failure")
    ),
    "no record, no signal, slurmd back after the EndTime, within SlurmdTimeout: wait": Case(
        answering_since=END + 5.0, now=END + 29.0, confirm_s=30.0
    ),
    "no record, no signal, slurmd back after the EndTime: KillWait from its return": Case(
        answering_since=END + 100.0,
        now=END + 110.0,
        confirm_s=30.0,
        want=(0, END + 110.0, "node_failure"),
    ),
    "marks not shared, node answering, KillWait passed: gone": Case(
        marks_seen=False, now=END + 11.0, want=(0, END + 11.0, "node_failure")
    ),
    "marks not shared, node answering, within KillWait: wait": Case(
        marks_seen=False, now=END + 10.5
    ),
    "marks not shared, node not answering: wait": Case(
        marks_seen=False, answering_since=None, now=END + 600.0
    ),
    "marks not shared, node answers again later: KillWait from then": Case(
        marks_seen=False,
        answering_since=END + 100.0,
        now=END + 110.0,
        want=(0, END + 110.0, "node_failure"),
    ),
    # atk39-24 F5: an admin's DOWN, slurmd killed 0.3 s later (its TERM noted, its SIGKILL never
    # sent) and restarted within seconds: the node returns, Slurm never kills the job, which
    # runs on beating; it was taken for gone KillWait after the note once SlurmdTimeout passed
    "signalled, no record, node answering, SlurmdTimeout passed, beating: wait": Case(
        signalled_at=END + 0.3, now=END + 300.0, confirm_s=30.0, beat_at=END + 299.0
    ),
    "signalled, no record, beat within the bound: wait": Case(
        signalled_at=END + 0.3, now=END + 300.0, confirm_s=30.0, beat_at=END + 285.5
    ),
    "signalled, no record, its heartbeat stopped long after the kill: gone at its next beat": Case(
        signalled_at=END + 0.3,
        now=END + 300.0,
        confirm_s=30.0,
        beat_at=END + 280.0,
        want=(0, END + 282.0, "node_failure"),
    ),
    "signalled, no record, its heartbeat stopped with Slurm's SIGKILL: gone KillWait after": Case(
        signalled_at=END + 1.0,
        now=END + 30.0,
        confirm_s=30.0,
        beat_at=END + 10.0,
        want=(0, END + 11.0, "node_failure"),
    ),
    "no record, no signal, node answering, beating: wait": Case(
        now=END + 600.0, beat_at=END + 598.0
    ),
    "no record, no signal, node answering, heartbeat stopped: gone at its next beat": Case(
        now=END + 600.0, beat_at=END + 500.0, want=(0, END + 502.0, "node_failure")
    ),
    "no record, heartbeat stopped, node not answering: wait (the fence bounds it)": Case(
        answering_since=None, now=END + 600.0, beat_at=END + 5.0
    ),
    # atk40-24 F1b: a script whose mark cannot be written ends its command itself, at most its
    # window after its last beat (`beat_window`: 6 s unwritten, a beat late, then its own end):
    # a stale beat within it is no proof that the run is gone
    "no signal, heartbeat 15 s stale within its script's window: wait": Case(
        now=END + 515.0, beat_at=END + 500.0, window=21.0
    ),
    "no signal, heartbeat stale past its script's window: gone at its next beat": Case(
        now=END + 521.0, beat_at=END + 500.0, window=21.0, want=(0, END + 502.0, "node_failure")
    ),
    # atk40-24 F3: Slurm's TERM noted, the run's script ends it 13 s later; a process of the
    # job's user keeps its mark fresh from outside: the beats past that end are not believed
    "signalled, its mark kept fresh past its script's end: gone at that end": Case(
        signalled_at=END + 0.3,
        now=END + 60.0,
        confirm_s=30.0,
        beat_at=END + 59.0,
        window=21.0,
        after_term_s=13.0,
        want=(0, END + 15.3, "node_failure"),
    ),
    "signalled, its mark fresh, its script's end not passed: wait": Case(
        signalled_at=END + 0.3, now=END + 15.0, beat_at=END + 14.0, window=21.0, after_term_s=13.0
    ),
    "signalled, a script from before the bound: its fresh beats count": Case(
        signalled_at=END + 0.3, now=END + 60.0, confirm_s=30.0, beat_at=END + 59.0, window=21.0
    ),
    # s52: Slurm's TERM at its launch (the DOWN met it there: its `launched` mark, its first
    # beat and its note within a millisecond, no record, its command never run): never its own
    # end; the node's failure once its slurmd answers and KillWait has passed, with its note
    "Slurm's TERM at its launch, no record: the node's failure, never completed": Case(
        signalled_at=END + 0.08,
        beat_at=END + 0.08,
        answering_since=END + 4.0,
        now=END + 30.0,
        confirm_s=30.0,
        after_term_s=13.0,
        want=(0, END + 14.0, "node_failure"),
    ),
    # a record is the run's own end: its heartbeat ended before it was written
    "its own end record while its heartbeat is fresh: its own end": Case(
        own=OwnEnd(0, END + 40.0),
        now=END + 41.0,
        beat_at=END + 39.0,
        want=(0, END + 40.0, "exited"),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_node_fail_ending(name: str) -> None:
    case = CASES[name]
    got = node_fail_ending(case.own, case.signalled_at, case.marks_seen, END, 0, START,
                           case.answering_since, KILL_WAIT, case.now, case.confirm_s,
                           case.beat_at, case.window, case.after_term_s)  # fmt: skip
    if case.want is None:
        assert got is None, got
        return
    assert isinstance(got, Ending)
    assert (got.exit_code, got.at, got.reason) == case.want


def test_a_completed_run_is_never_taken_for_a_node_failure_whatever_slurm_and_the_clock_say() -> (
    None
):
    """Exit 0 and no signal: completed, at any time, whether its node answers or not."""
    for at in (START + 1, END - 0.5, END + 0.5, END + 30.0, END + 3000.0):
        for answering in (None, 0.0, END + 5.0):
            got = node_fail_ending(OwnEnd(0, at), None, True, END, 0, START, answering,
                                   KILL_WAIT, END + 4000.0)  # fmt: skip
            assert got is not None and (got.reason, got.exit_code) == ("exited", 0), (at, got)


def _batch_script(
    tmp_path: Path,
    command: tuple[str, ...],
    fifo: bool = False,
    alive: bool = False,
    after_term_s: int = 61,
    alive_file: Path | None = None,
    own_end_s: int = 31,
) -> Path:
    """The real batch script of a run of `command`, its marks in `tmp_path` (its `launched`
    mark a FIFO with `fifo`: the script is held there)."""
    if fifo:
        os.mkfifo(tmp_path / "launched")
    job = Launch(5, (GpuSlot(node="n1", gpu_indices=(0,)),), command, None, "alice", "ai2/olmo")
    script = tmp_path / "batch"
    beat = str(alive_file or tmp_path / "alive") if alive else ""
    script.write_text(batch_script(job, launched_file=str(tmp_path / "launched"),
                                   ended_file=str(tmp_path / "ended"),
                                   signalled_file=str(tmp_path / "signalled"),
                                   alive_file=beat, after_term_s=after_term_s,
                                   own_end_s=own_end_s))  # fmt: skip
    return script


def test_slurms_kill_at_the_launch_mark_is_noted_never_left_in_doubt(tmp_path: Path) -> None:
    """CI's hang: `scontrol update state=down` while a run's batch script was between its
    `launched` mark and the trap that notes signals killed the script with neither an end record
    nor a note, so `node_fail_ending` waited for good (case 3) and, its node back, the job was
    `running` forever. The real script in bash, held at its launch mark (a FIFO) and SIGTERM'd
    there as Slurm signals every process of a job: it notes the signal and ends; the command
    never runs."""
    marks = {m: tmp_path / m for m in ("launched", "ended", "signalled", "ran")}
    script = _batch_script(tmp_path, ("sh", "-c", f": > {marks['ran']}; sleep 30"), fifo=True)
    bash = subprocess.Popen(["/bin/bash", str(script)], start_new_session=True)
    try:
        time.sleep(0.5)  # held at the FIFO: the launch mark
        assert bash.poll() is None
        os.killpg(bash.pid, signal.SIGTERM)
        with contextlib.suppress(OSError):  # the mark's other end, if it is still wanted
            os.close(os.open(marks["launched"], os.O_RDONLY | os.O_NONBLOCK))
        assert bash.wait(timeout=10) == 143
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGKILL)
    assert marks["signalled"].exists()
    assert not marks["ran"].exists()


def _in_its_wait(pid: int, mark: Path, timeout: float = 30.0) -> None:
    """Until `mark` is there and the batch script `pid` waits for its command (`do_wait`): a
    signal before its wait begins ends it at once, 143, by design (`batch_script`)."""
    deadline = time.monotonic() + timeout
    while not mark.exists() or Path(f"/proc/{pid}/wchan").read_text() != "do_wait":
        assert time.monotonic() < deadline, "the script never began its wait"
        time.sleep(0.02)


@pytest.mark.parametrize("after_s", [0.1, 0.3, 0.6, 1.0, 1.5])
def test_a_command_that_ends_well_on_slurms_term_ends_the_script_well(
    tmp_path: Path, after_s: float
) -> None:
    """CI's red on the preemption test: a resumable job trapping TERM and exiting 0 was FAILED
    in Slurm (its script exited 143), because bash reaped the command inside the signal's trap
    and the wait loop took `kill -0` failing for a command that died of the signal. The real
    script in bash, the job's every process SIGTERM'd as `scancel --signal=TERM --full` does:
    the script ends with the command's own code, and its end record says so, signal noted."""
    marks = {m: tmp_path / m for m in ("launched", "ended", "signalled", "ready")}
    command = ("bash", "-c", f"trap 'echo TERM; exit 0' TERM; : > {marks['ready']}; "
               "while true; do sleep 0.2; done")  # fmt: skip
    script = _batch_script(tmp_path, command)
    bash = subprocess.Popen(["/bin/bash", str(script)], start_new_session=True,
                            stdout=subprocess.PIPE)  # fmt: skip
    try:
        # `after_s` into the command's loop, its trap set and the script in its wait: under
        # load 0.1 s after the start was before them (143: a signal that ends the script)
        _in_its_wait(bash.pid, marks["ready"])
        time.sleep(after_s)
        assert bash.poll() is None
        os.killpg(bash.pid, signal.SIGTERM)
        out, _ = bash.communicate(timeout=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGKILL)
    assert (bash.returncode, out) == (0, b"TERM\n")
    code, _, noted = marks["ended"].read_text().split()
    assert (code, noted) == ("0", "1") and marks["signalled"].exists()


def test_a_command_the_signal_kills_ends_the_script_with_its_signal_code(tmp_path: Path) -> None:
    """The other side of the above: a command that does not catch TERM dies of it, and the
    script ends 143 (128 + SIGTERM) with that code in its end record, the signal noted."""
    marks = {m: tmp_path / m for m in ("launched", "ended", "signalled")}
    script = _batch_script(tmp_path, ("sleep", "30"))
    bash = subprocess.Popen(["/bin/bash", str(script)], start_new_session=True)
    try:
        _in_its_wait(bash.pid, marks["launched"])
        os.killpg(bash.pid, signal.SIGTERM)
        assert bash.wait(timeout=10) == 143
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGKILL)
    code, _, noted = marks["ended"].read_text().split()
    assert (code, noted) == ("143", "1")


def test_the_heartbeat_beats_while_the_command_lives_through_signals_and_stops_with_it(
    tmp_path: Path,
) -> None:
    """atk39-24 F5's outside word: the real script in bash rewrites its `alive` mark every
    `BEAT_EVERY_S` while the command lives, through Slurm's SIGTERM to every process of the job
    (the command here ignores it), and stops beating once the command has ended (its end record
    written)."""
    marks = {m: tmp_path / m for m in ("launched", "ended", "signalled", "alive", "stop")}
    command = ("bash", "-c", f"trap '' TERM; while [ ! -e {marks['stop']} ]; do sleep 0.1; done")
    script = _batch_script(tmp_path, command, alive=True)
    bash = subprocess.Popen(["/bin/bash", str(script)], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not marks["alive"].exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        first = marks["alive"].stat().st_mtime
        while marks["alive"].stat().st_mtime == first and time.monotonic() < deadline:
            time.sleep(0.1)  # a beat of its wait (the first is before the command starts)
        first = marks["alive"].stat().st_mtime
        os.killpg(bash.pid, signal.SIGTERM)  # Slurm's TERM; its SIGKILL never comes
        time.sleep(BEAT_EVERY_S * 2 + 0.5)
        assert bash.poll() is None
        assert marks["alive"].stat().st_mtime > first + BEAT_EVERY_S - 0.5
        marks["stop"].touch()
        assert bash.wait(timeout=10) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGKILL)
    code, _, noted = marks["ended"].read_text().split()
    assert (code, noted) == ("0", "1")
    last = marks["alive"].stat().st_mtime
    time.sleep(BEAT_EVERY_S + 1.0)
    assert marks["alive"].stat().st_mtime == last  # no beat once the command has ended


def test_a_heartbeat_is_its_marks_ctime_no_later_than_the_read_that_saw_it(
    tmp_path: Path,
) -> None:
    """The `alive` mark is the job user's: its mtime is theirs to set to any time, its ctime
    only to now. A beat counts at its ctime, no later than the first read that saw it (a node's
    clock ahead), so it grows stale once it stops changing; a changed mark is a new beat, and a
    mark dated a year ahead or back is a beat now (`MarksSeen.beat`)."""
    seen = MarksSeen()
    assert seen.beat(tmp_path, "7", 100.0) is None  # no heartbeat: the old rules alone
    alive = tmp_path / "alive"
    alive.touch()
    os.utime(alive, (1e10, 1e10))
    assert seen.beat(tmp_path, "7", 100.0) == 100.0  # a read "before" its ctime
    assert seen.beat(tmp_path, "7", 200.0) == 100.0
    os.utime(alive, (150.0, 150.0))  # dated back: its ctime is now, a new beat at this read
    assert seen.beat(tmp_path, "7", 210.0) == 210.0
    now = time.time()
    assert seen.beat(tmp_path, "7", now + 5.0) == 210.0  # unchanged: still that beat
    seen.forget("7")
    assert seen.beat(tmp_path, "7", now + 5.0) == pytest.approx(alive.stat().st_ctime)
    assert alive.stat().st_mtime == 150.0 and alive.stat().st_ctime > now - 60
    seen.forget("7")
    assert seen.beats == {} and seen.notes == {}


def test_the_heartbeat_beats_on_when_the_job_kills_its_sleep(tmp_path: Path) -> None:
    """atk40-24 F1: the heartbeat's loop ended when its `sleep` failed (`|| break`, so it never
    spins without one), and a job's own `pkill -9 sleep` (an honest clean-up) stopped it for good
    while the command lived: the run was then judged by the older rules and its GPUs given to
    another job beside it. A `sleep` a signal ended is slept again."""
    marks = {m: tmp_path / m for m in ("launched", "ended", "signalled", "alive", "stop")}
    command = ("bash", "-c", f"while [ ! -e {marks['stop']} ]; do sleep 0.1; done")
    script = _batch_script(tmp_path, command, alive=True)
    bash = subprocess.Popen(["/bin/bash", str(script)], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not marks["alive"].exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(3):  # the job kills every `sleep` of its session, the heartbeat's too
            subprocess.run(["pkill", "-9", "-s", str(bash.pid), "-x", "sleep"], check=False)
            time.sleep(0.3)
        killed = time.time()
        time.sleep(BEAT_EVERY_S * 2 + 0.5)
        assert marks["alive"].stat().st_mtime > killed, "the heartbeat stopped"
        marks["stop"].touch()
        assert bash.wait(timeout=10) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGKILL)


def _run_script(script: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["/bin/bash", str(script)], start_new_session=True)


def _wait_for(path: Path, timeout: float = 10.0) -> None:
    """Until `path` exists, and half a second more: the script sets its traps for its wait
    just after it starts the command (a signal before ends it at once, 143)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path.name}"
        time.sleep(0.05)
    time.sleep(0.5)


def _ignoring_term(marks: dict[str, Path]) -> tuple[str, ...]:
    """A command that notes each SIGTERM and ignores it, living until killed."""
    return ("bash", "-c", f"trap 'date +%s.%N >> {marks['term']}' TERM;"
            f" echo $$ > {marks['pid']}; while :; do sleep 0.1; done")  # fmt: skip


def _gone(pid: int) -> bool:
    """Whether `pid` has ended (reaped, or a zombie its new parent has yet to reap)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def test_a_mark_the_script_cannot_write_makes_it_end_its_command_itself(tmp_path: Path) -> None:
    """atk40-24 F1b: a job that made its `alive` mark unwritable (or killed the heartbeat's
    process) was judged by the older rules and seen alive beside the next job. The script is
    its own heartbeat now: a mark it cannot write for `UNBEATEN_S` makes it SIGTERM the command,
    and end it `after_term_s` later whatever the command does, so a run never lives more than
    `beat_window` after its last beat. The real script in bash; the mark's directory replaced by
    a file (what no account, root included, can write through)."""
    marks = {m: tmp_path / m for m in ("launched", "ended", "signalled", "term", "pid")}
    run = tmp_path / "run"
    run.mkdir()
    script = _batch_script(tmp_path, _ignoring_term(marks), alive=True, after_term_s=30,
                           alive_file=run / "alive", own_end_s=3)  # fmt: skip
    bash = _run_script(script)
    try:
        _wait_for(marks["pid"])
        _wait_for(run / "alive")
        shutil.rmtree(run)
        run.write_text("not a directory\n")  # the mark cannot be written any more
        unwritable = time.time()
        assert bash.wait(timeout=UNBEATEN_S + 2 * BEAT_EVERY_S + 3 + 5) is not None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGKILL)
    ended = time.time()
    termed = float(marks["term"].read_text().split()[0])  # the command got the script's TERM
    # whole seconds from its last beat, up to a beat before the mark became unwritable
    assert UNBEATEN_S - 1 - BEAT_EVERY_S <= termed - unwritable <= UNBEATEN_S + 2 * BEAT_EVERY_S + 1
    assert ended - termed >= 3 - 1  # its grace and KillWait, then its end
    assert _gone(int(marks["pid"].read_text()))
    assert ended - unwritable <= beat_window(2.0)


def test_the_script_ends_its_run_after_its_first_sigterm_whatever_the_command_does(
    tmp_path: Path,
) -> None:
    """Slurm's TERM (a node DOWN) signals the batch shell alone; a slurmd killed before its
    SIGKILL never sends that (atk39-24 F5). The script now ends its run itself `after_term_s`
    after its first SIGTERM, the command killed, so the executor can bound the run from outside
    by the note the script made (`ends.beat_bound`). The real script in bash."""
    marks = {m: tmp_path / m for m in ("launched", "ended", "signalled", "term", "pid")}
    script = _batch_script(tmp_path, _ignoring_term(marks), alive=True, after_term_s=3)
    bash = _run_script(script)
    try:
        _wait_for(marks["pid"])
        bash.send_signal(signal.SIGTERM)  # the batch shell alone, as Slurm's own kill
        termed = time.time()
        code = bash.wait(timeout=3 + BEAT_EVERY_S + 5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGKILL)
    assert 3 - 1 <= time.time() - termed <= 3 + BEAT_EVERY_S + 1
    assert code == 137  # the command ignored it (it is passed on with a `stopping` path)
    assert _gone(int(marks["pid"].read_text()))
    words = marks["ended"].read_text().split()  # killed by its own end (atk59b N3): `0 1`
    assert [words[0], words[2], words[4]] == ["137", "1", "1"], words


def test_a_signal_note_the_script_did_not_make_starts_its_end(tmp_path: Path) -> None:
    """The executor believes a run's signal note as Slurm's TERM and no beat past the end the
    script then keeps (`ends.beat_bound`: atk40-24 F3, a dead run's mark kept fresh from
    outside): a note another process of the job's user made starts the script's end as its own
    SIGTERM would, so a forged note ends only the forger's run."""
    marks = {m: tmp_path / m for m in ("launched", "ended", "signalled", "term", "pid")}
    script = _batch_script(tmp_path, _ignoring_term(marks), alive=True, after_term_s=3)
    bash = _run_script(script)
    try:
        _wait_for(marks["pid"])
        marks["signalled"].touch()
        noted = time.time()
        bash.wait(timeout=3 + 2 * BEAT_EVERY_S + 5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGKILL)
    assert time.time() - noted <= 3 + 2 * BEAT_EVERY_S + 1
    assert _gone(int(marks["pid"].read_text()))
