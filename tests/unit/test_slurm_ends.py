"""When a run the Slurm executor stops really ends, and how long Slurm's own limit waits (atk33
F1, F2, F7), and which GPUs stopped runs hold meanwhile. Pure but for the noted stops."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.cycle.executor import Launch
from ledger.engines.slurm import SbatchUser, parse_jobs, sbatch_args
from ledger.engines.slurm.ends import (
    BEAT_EVERY_S,
    BEAT_STALE_S,
    UNBEATEN_S,
    Ending,
    OwnEnd,
    beat_bound,
    beat_window,
    ends_after_term_s,
    node_fail_ending,
)
from ledger.engines.slurm.stops import (
    Stopping,
    completing,
    earlier_alive,
    node_failed,
    stopped_end,
    stopping_gpus,
)
from ledger.engines.slurm.tracked import (
    forget_stop,
    note_killed,
    note_stop,
    noted_killed,
    noted_stop,
)
from ledger.engines.slurm.words import backstop_minutes, processes_end
from schemas import events as e
from schemas.events import GpuSlot

END = 1_796_211_614.0  # Slurm's EndTime of the scancel (whole seconds)


@pytest.mark.parametrize(
    ("case", "state", "completing_seen", "now", "want"),
    [
        # atk33 F1: scancel at END, the processes ignore SIGTERM and die at KillWait (10 s):
        # the job was COMPLETING until then; the first read that saw it gone is the end
        ("cancelled, seen completing later", "CANCELLED", END + 9.6, END + 10.2, END + 10.0),
        ("time limit, seen completing later", "TIMEOUT", END + 5.0, END + 5.5, END + 5.0),
        ("node failure, seen completing", "NODE_FAIL", END + 3.0, END + 8.9, END + 8.0),
        # never seen COMPLETING after the EndTime: Slurm's EndTime is all the ledger knows
        ("cancelled, never seen completing", "CANCELLED", None, END + 3.0, END),
        ("cancelled, completing only before its EndTime", "CANCELLED", END - 0.5, END + 3.0, END),
        # the job's own end (exit, crash): EndTime is when its batch script ended; a
        # COMPLETING after it is Slurm's epilog, no process of the job
        ("completed, completing for its epilog", "COMPLETED", END + 2.0, END + 3.0, END),
        ("failed, completing for its epilog", "FAILED", END + 2.0, END + 3.0, END),
    ],
)
def test_a_run_slurm_ended_ends_when_its_processes_were_gone(
    case: str, state: str, completing_seen: float | None, now: float, want: float
) -> None:
    assert processes_end(END, state, now, completing_seen) == want, case


def test_a_run_without_an_end_time_has_none() -> None:
    assert processes_end(None, "CANCELLED", END, END - 1) is None


@pytest.mark.parametrize(
    ("case", "limit_s", "grace_s", "max_time_s", "want"),
    [
        ("a whole minute and a 30 s grace", 60, 30.0, None, 3),
        ("90 s, no grace", 90, 0.0, None, 3),
        ("two hours, the default grace", 7200, 30.0, None, 122),
        ("capped at the partition's MaxTime", 3600, 30.0, 3600.0, 60),
        ("a MaxTime below a minute still asks one", 30, 0.0, 30.0, 1),
    ],
)
def test_slurms_limit_is_a_backstop_past_the_limit_and_the_grace(
    case: str, limit_s: int, grace_s: float, max_time_s: float | None, want: int
) -> None:
    assert backstop_minutes(limit_s, grace_s, max_time_s) == want, case


def test_sbatch_asks_slurm_for_the_backstop_with_the_jobs_grace() -> None:
    """F7: `-t 1 --grace 30s` asked Slurm for `--time=1`: Slurm's TIMEOUT came first, with
    KillWait instead of the job's grace."""
    job = Launch(5, (GpuSlot(node="n1", gpu_indices=(0,)),), ("true",), None, "alice",
                 "ai2/olmo", 0, 60, grace_s=30.0)  # fmt: skip
    args = sbatch_args(job, "gpu", "/l", SbatchUser(), "0123abcd4567", None, "", 30.0, None)
    assert "--time=3" in args


KILLED = (
    "JobId=41 JobName=gpuledger-7 JobState=CANCELLED Reason=None ExitCode=0:9"
    " StartTime=2026-12-02T01:11:47 EndTime=2026-12-02T01:12:10 Partition=gpuledger NodeList=vm"
    " Comment=x"
)


def test_a_stopped_run_killed_after_its_grace_ends_when_its_processes_did() -> None:
    """F1: its EndTime is the scancel; it was COMPLETING (alive) 9.5 s after it."""
    (j,) = parse_jobs(KILLED)
    assert j.end_time is not None
    st = Stopping(since=j.end_time - 2, grace_s=2.0, run=(7, 0), cancelled=True, killed=True)
    end = stopped_end(st, j, j.end_time + 10.3, completing_seen=j.end_time + 9.5)
    assert (end.at, end.engine_state) == (j.end_time + 10.0, "KILLED")
    assert stopped_end(st, j, j.end_time + 10.3).at == j.end_time  # not seen: Slurm's


def test_a_killed_gang_ends_when_a_read_found_it_ended_not_at_its_batch_steps_end() -> None:
    """s56-gang (open until s57): a preempted gang's batch step was SIGKILLed after its grace;
    Slurm's EndTime is that kill, its ranks on the other node die by Slurm's end of the job
    after it, and a read under load saw none of it COMPLETING: it was recorded ended at the
    EndTime while a rank was alive 1.8-5.4 s later (test_slurm_gang, load 20-59). Its end is
    the read that found it ended (whole seconds); a one-node run keeps Slurm's."""
    (j,) = parse_jobs(KILLED.replace("NodeList=vm", "NodeList=vm-g,vm-g-2"))
    assert j.end_time is not None
    st = Stopping(since=j.end_time - 3, grace_s=3.0, run=(1, 0), cancelled=True, killed=True)
    assert stopped_end(st, j, j.end_time + 1.4).at == j.end_time + 1.0
    (one,) = parse_jobs(KILLED)
    assert stopped_end(st, one, j.end_time + 1.4).at == j.end_time  # its batch step is all
    alive = Stopping(since=j.end_time - 3, grace_s=3.0, run=(1, 0))  # ended in its grace
    assert stopped_end(alive, j, j.end_time + 1.4).at == j.end_time + 1.0  # (below)


def test_a_gang_that_ends_in_its_grace_ends_when_a_read_found_it_ended() -> None:
    """s57's open point: a stopped gang whose batch script ended inside its grace (its command
    out at the SIGTERM) kept Slurm's EndTime, the batch step's end, while its ranks on the
    other node, ending by Slurm's end of the job after it, lived on. Its end is the read that
    found the job ended, as a killed gang's; Slurm's own end of it (FAILED 143) is its code. A
    one-node run's processes are its batch step's: Slurm's EndTime stays."""
    line = KILLED.replace("JobState=CANCELLED", "JobState=FAILED").replace("0:9", "143:0")
    (j,) = parse_jobs(line.replace("NodeList=vm", "NodeList=vm-g,vm-g-2"))
    assert j.end_time is not None
    st = Stopping(since=j.end_time - 3, grace_s=30.0, run=(1, 0), cancelled=True)
    end = stopped_end(st, j, j.end_time + 2.6)
    assert (end.at, end.exit_code, end.engine_state) == (j.end_time + 2.0, 143, "FAILED")
    assert stopped_end(st, j, j.end_time + 0.4).at == j.end_time  # never before Slurm's
    (one,) = parse_jobs(line)
    assert stopped_end(st, one, j.end_time + 2.6).at == j.end_time


def test_a_gang_no_read_saw_alive_since_a_restart_ends_by_slurms_end_of_the_job() -> None:
    """atk59 F4: a stopped gang whose ranks died while the service was down (killed -9 once
    Slurm showed it COMPLETING after the SIGKILL, back 60 s later) was recorded ended at the
    restart's read (62.4 s late, ~500 GPU-s charged for nothing) and, the SIGKILL forgotten,
    `killed: false`, "Slurm: FAILED". Now no read of this service saw it alive since it took the
    stop up: it ended by Slurm's end of the job, KillWait after the batch step's whole-second
    EndTime and a kill's landing; the SIGKILL is kept on disk (`note_killed`)."""
    (j,) = parse_jobs(KILLED.replace("NodeList=vm", "NodeList=vm-g,vm-g-2"))
    assert j.end_time is not None
    resumed = Stopping(since=j.end_time - 3, grace_s=3.0, run=(1, 0), cancelled=True, killed=True)
    assert stopped_end(resumed, j, j.end_time + 62.4, kill_wait_s=10.0).at == j.end_time + 16.0
    assert stopped_end(resumed, j, j.end_time + 3.2, kill_wait_s=10.0).at == j.end_time + 3.0
    watched = Stopping(since=j.end_time - 3, grace_s=3.0, run=(1, 0), cancelled=True,
                       killed=True, seen_running_at=j.end_time - 1)  # fmt: skip
    assert stopped_end(watched, j, j.end_time + 62.4, kill_wait_s=10.0).at == j.end_time + 62.0


def test_the_stops_sigkill_is_kept_for_a_restart_and_forgotten_with_the_stop(
    tmp_path: Path,
) -> None:
    assert noted_killed(tmp_path, "41") is None
    note_killed(tmp_path, "41", 1796211610.25)
    assert noted_killed(tmp_path, "41") == 1796211610.25
    forget_stop(tmp_path, "41")
    assert noted_killed(tmp_path, "41") is None


def _submitted(job_id: int) -> e.JobSubmitted:
    return e.JobSubmitted(event_id=f"s{job_id}", at=10.0, actor="alice", job_id=job_id,
                          user="alice", account="ai2/olmo", gpus=1, min_runtime_s=0,
                          command=("true",))  # fmt: skip


def test_a_stop_is_dated_by_the_sigterm_the_executor_noted(tmp_path: Path) -> None:
    """F2: a run found alive after a restart gets the rest of its grace from when the executor
    sent its SIGTERM (noted beside the service, private); none noted: none was sent, and the
    run gets its whole grace from the restart (atk36-23 F2)."""
    assert noted_stop(tmp_path, "77") is None
    note_stop(tmp_path, "77", 200.25)
    assert noted_stop(tmp_path, "77") == 200.25
    assert (tmp_path / "stops" / "77").stat().st_mode & 0o777 == 0o600
    forget_stop(tmp_path, "77")
    assert noted_stop(tmp_path, "77") is None


def test_completing_keeps_the_last_read_that_saw_each_of_our_jobs_completing() -> None:
    view = {j.slurm_id: j for j in parse_jobs(KILLED.replace("CANCELLED", "COMPLETING"))}
    seen = {"41": 5.0, "40": 4.0, "39": 3.0}
    assert completing(view, {"41", "40"}, seen, 9.0) == {"41": 9.0, "40": 4.0}


GRACE = (
    "JobId=42 JobName=gpuledger-8 JobState=RUNNING Reason=None ExitCode=0:0"
    " StartTime=2026-12-02T01:11:47 EndTime=2026-12-02T01:21:47 Partition=gpuledger NodeList=vm"
    " Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:fake_2:1(IDX:2)"
)
COMPLETING = KILLED.replace("JobId=41", "JobId=43").replace("CANCELLED", "COMPLETING") + (
    " JOB_GRES=gpu:fake_0:0,gpu:fake_1:1,gpu:fake_2:0,gpu:fake_3:0 NodeList=vm"
)


def test_the_gpus_of_stopped_runs_slurm_has_not_ended_are_held() -> None:
    """A cancelled run in its grace (RUNNING) or ignoring SIGTERM (COMPLETING until KillWait)
    holds its GPUs in Slurm: `node list` shows them `stopping`, not free. A run stopped at its
    limit is still the ledger's (no `run`), and an ended one holds nothing."""
    view = {j.slurm_id: j for j in parse_jobs("\n".join((GRACE, COMPLETING, KILLED)))}
    pinned = {"vm": ("fake_0", "fake_1", "fake_2", "fake_3")}
    stopping = {
        "42": Stopping(since=0.0, run=(8, 0)),
        "43": Stopping(since=0.0, run=(9, 0), cancelled=True),
        "41": Stopping(since=0.0, run=(7, 0), cancelled=True),
    }
    assert stopping_gpus(stopping, view, pinned) == {"vm": frozenset({1, 2})}
    stopping["42"] = Stopping(since=0.0)  # its limit: the ledger still runs it
    assert stopping_gpus(stopping, view, pinned) == {"vm": frozenset({1})}


def test_a_runs_comment_keeps_its_jobs_grace_for_a_service_that_restarts() -> None:
    """atk34-23 F2: a job with `--grace 60s` cancelled across a restart of the service got the
    service's 30 s (and one with 5 s the service's 90 s): the live state holds no finished job,
    so the restarted service could not say the job's grace. Its run's Slurm comment says it."""
    from ledger.engines.slurm.stops import grace_of

    job = Launch(5, (GpuSlot(node="n1", gpu_indices=(0,)),), ("true",), None, "alice",
                 "ai2/olmo", 0, 60, grace_s=60.0)  # fmt: skip
    args = sbatch_args(job, "gpu", "/l", SbatchUser(), "0123abcd4567", None, "", 60.0, None)
    comment = next(a for a in args if a.startswith("--comment="))
    assert comment == "--comment=gpuledger:0123abcd4567:job=5:run=0:grace=60"
    line = (
        "JobId=41 JobName=gpuledger-5 JobState=RUNNING Reason=None ExitCode=0:0"
        " StartTime=2026-12-02T01:11:47 EndTime=2026-12-02T02:12:10 Partition=gpuledger"
        f" NodeList=vm Comment={comment.split('=', 1)[1]}"
    )
    (adopted,) = parse_jobs(line)
    assert adopted.tag("0123abcd4567") == (5, 0) and adopted.grace_s == 60.0
    (older,) = parse_jobs(line.replace(":grace=60", ""))  # a run submitted before: as it was
    assert older.tag("0123abcd4567") == (5, 0) and older.grace_s is None
    never = lambda: None  # noqa: E731 (the ledger's word: a finished job is not in its state)
    assert grace_of(None, adopted, never, 90.0) == 60.0
    assert grace_of(None, older, never, 90.0) == 90.0
    assert grace_of(None, older, lambda: 45.0, 90.0) == 45.0
    assert grace_of(job, None, never, 90.0) == 60.0


LEDGER = "0123abcd4567"
NODE_FAILED = (
    "JobId=44 JobName=gpuledger-10 JobState=NODE_FAIL Reason=NodeDown ExitCode=0:0"
    " StartTime=2026-12-02T01:11:47 EndTime=2026-12-02T01:12:10 Partition=gpuledger NodeList=vm"
    f" Comment=gpuledger:{LEDGER}:job=10:run=0"
    " JOB_GRES=gpu:fake_0:1,gpu:fake_1:1,gpu:fake_2:0,gpu:fake_3:0"
)


def test_a_stopped_run_its_node_failed_is_held_until_known_gone() -> None:
    """atk37-23 F7: a run the ledger was stopping (its grace) whose node Slurm set DOWN was
    recorded ended at Slurm's NODE_FAIL EndTime and its GPUs freed at once, ~7-10 s before
    Slurm's SIGKILL: the next job started on them while it lived. Now while its processes may
    live the stop goes on: its GPUs `stopping` (and held by the executor: Slurm would start
    the next job there), the launch fence closed to its job's next run; its end is the one
    `ends.node_fail_ending` gives (KillWait after Slurm's kill), killed."""
    (j,) = parse_jobs(NODE_FAILED)
    assert j.end_time is not None
    view = {j.slurm_id: j for j in (j,)}
    pinned = {"vm": ("fake_0", "fake_1", "fake_2", "fake_3")}
    st = Stopping(since=j.end_time - 3, grace_s=60.0, run=(10, 0), gpus={"vm": (0, 1)})
    assert node_failed(st, j)
    # held from the stop on, not from the read that finds it in doubt (atk38-24 F7: a cancel
    # of a run in doubt gave its GPUs to the next job in the cancel's own cycle)
    assert stopping_gpus({"44": st}, view, pinned) == {"vm": frozenset({0, 1})}
    st.in_doubt = True
    assert stopping_gpus({"44": st}, view, pinned) == {"vm": frozenset({0, 1})}
    st.gpus = {}  # never seen holding: its JOB_GRES on a pinned node
    assert stopping_gpus({"44": st}, view, pinned) == {"vm": frozenset({0, 1})}
    assert earlier_alive(view, LEDGER, 10, 1, {"44": st}) is j
    assert earlier_alive(view, LEDGER, 10, 1, {}) is None  # ended and not in doubt
    assert earlier_alive(view, LEDGER, 10, 0, {"44": st}) is None  # not an earlier run
    gone = Ending(0, j.end_time + 11.0, "node_failure", "NODE_FAIL: killed")
    end = stopped_end(st, j, j.end_time + 12.0, None, gone)
    assert (end.at, end.engine_state, end.run) == (j.end_time + 11.0, "KILLED", 0), end
    assert stopped_end(st, j, j.end_time + 12.0).at == j.end_time  # as it was: Slurm's word
    own = Ending(143, j.end_time - 1.0, "exited", "its own end record")  # died of the stop's TERM
    end = stopped_end(st, j, j.end_time + 12.0, None, own)
    assert (end.at, end.exit_code, end.engine_state) == (j.end_time - 1.0, 143, "NODE_FAIL")
    cancelled = parse_jobs(NODE_FAILED.replace("NODE_FAIL", "CANCELLED"))[0]
    assert not node_failed(st, cancelled) and not node_failed(Stopping(since=0.0), j)


def test_a_node_failed_runs_own_end_record_keeps_its_gpus_until_slurms_kill_has_landed() -> None:
    """atk38-24 F1: a job's own end record is its user's word (the user may write it while the
    run lives). A NODE_FAIL run ended by its record is recorded as the record says, but its GPUs
    stay held until its nodes' slurmd answers and KillWait has passed since Slurm's kill could
    reach it (its EndTime, rounded down, or that answer, whichever is later)."""
    from ledger.engines.slurm.ends import surely_gone
    from ledger.engines.slurm.stops import Quarantine

    (j,) = parse_jobs(NODE_FAILED)
    assert j.end_time is not None
    end, kw = j.end_time, 10.0
    forged = node_fail_ending(OwnEnd(0, end + 2.0), None, True, end, 0, end - 60, end, kw,
                              end + 2.0)  # fmt: skip
    assert forged is not None and forged.own_record and forged.reason == "exited"
    assert node_fail_ending(None, end + 0.5, True, end, 0, end - 60, end, kw, end + 20.0)
    assert not node_fail_ending(None, end + 0.5, True, end, 0, end - 60, end, kw,
                                end + 20.0).own_record  # fmt: skip
    assert not surely_gone(end, None, kw, end + 1000.0)  # its slurmd has not answered
    assert not surely_gone(end, end, kw, end + 10.5)  # EndTime is whole seconds: +1 s
    assert surely_gone(end, end, kw, end + 11.0)
    assert not surely_gone(end, end + 30.0, kw, end + 39.0)  # answered later: from then
    q = Quarantine()
    q.hold(forged, j, {"vm": (0, 1)})
    assert q.held == {"vm": (0, 1)}  # at once: a launch may be tried before the next refresh
    q.hold(Ending(0, end, "exited", "Slurm's word"), j, {"vm": (2,)})  # not a record: not held
    q.refresh({}, kw, end + 100.0)  # vm's slurmd not answering
    assert q.held == {"vm": (0, 1)}
    q.refresh({"vm": end + 5.0}, kw, end + 14.0)
    assert q.held == {"vm": (0, 1)}
    q.refresh({"vm": end + 5.0}, kw, end + 15.0)
    assert q.held == {} and q.runs == {}
    # atk39-24 F5: Slurm's kill never came and the run, its record forged, still beats
    q.hold(forged, j, {"vm": (0, 1)})
    beats = {j.slurm_id: end + 50.0}
    q.refresh({"vm": end + 5.0}, kw, end + 60.0, lambda sid, now: beats.get(sid))
    assert q.held == {"vm": (0, 1)}  # beat 10 s ago
    q.refresh({"vm": end + 5.0}, kw, end + 65.0, lambda sid, now: beats.get(sid))
    assert q.held == {} and q.runs == {}  # its heartbeat stopped 15 s ago
    # atk40-24 F1b: a script whose mark cannot be written lives up to its window after it
    windowed = node_fail_ending(OwnEnd(0, end + 2.0), None, True, end, 0, end - 60, end, kw,
                                end + 2.0, beat_stale_s=beat_window(kw))  # fmt: skip
    assert windowed is not None and windowed.beat_window_s == 19.0
    q.hold(windowed, j, {"vm": (0, 1)})
    q.refresh({"vm": end + 5.0}, kw, end + 68.0, lambda sid, now: beats.get(sid))
    assert q.held == {"vm": (0, 1)}  # its last beat 18 s ago: within its window
    q.refresh({"vm": end + 5.0}, kw, end + 69.0, lambda sid, now: beats.get(sid))
    assert q.held == {} and q.runs == {} and q.windows == {}


@pytest.mark.parametrize(
    ("beat", "term", "after", "want"),
    [
        (None, 10.0, 13.0, None),  # no heartbeat
        (50.0, None, 13.0, 50.0),  # no TERM proven: every beat counts
        (50.0, 10.0, None, 50.0),  # a script from before the bound
        (20.0, 10.0, 13.0, 20.0),  # within its script's end
        (50.0, 10.0, 13.0, 25.0),  # past it (and a beat late): kept fresh from outside
    ],
)
def test_a_beat_past_the_end_its_script_keeps_after_slurms_term_is_not_believed(
    beat: float | None, term: float | None, after: float | None, want: float | None
) -> None:
    """atk40-24 F3: any process of the job's user can keep a dead run's `alive` mark fresh
    from outside Slurm; the run's script ends it `ends_after_term_s` after Slurm's TERM (its
    note), so a beat after that (one beat late) is not its script's (`ends.beat_bound`)."""
    assert beat_bound(beat, term, after) == want


def test_a_scripts_own_bounds_come_from_the_jobs_grace_and_slurms_killwait() -> None:
    """Its end after a SIGTERM is past the executor's stop (grace, then Slurm's KillWait) and
    Slurm's own; its window past its own end for a mark it cannot write (`UNBEATEN_S` and a
    beat late), never less than `BEAT_STALE_S`."""
    assert ends_after_term_s(2.0, 10.0) == 13
    assert ends_after_term_s(0.5, 10.0) == 12
    assert beat_window(10.0) == UNBEATEN_S + BEAT_EVERY_S + 11
    assert beat_window(0.0) == BEAT_STALE_S


def test_the_executor_holds_what_the_quarantine_holds(tmp_path: Path) -> None:
    """The wiring: GPUs the quarantine holds are among those the executor will not submit
    onto (`_held`), and leave it once Slurm's kill has surely landed."""
    from ledger.engines.slurm.executor import SlurmExecutor

    (j,) = parse_jobs(NODE_FAILED)
    assert j.end_time is not None
    ex = SlurmExecutor("gpuledger", LEDGER, tmp_path)
    ex._quarantine.hold(Ending(0, j.end_time, "exited", "its own end record", True), j,
                        {"vm": (0, 1)})  # fmt: skip
    ex._quarantine.refresh({"vm": j.end_time}, 10.0, j.end_time + 1.0)
    assert ex._held().get("vm") == {0, 1}
    ex._quarantine.refresh({"vm": j.end_time}, 10.0, j.end_time + 12.0)
    assert not ex._held().get("vm")


def test_a_stopped_run_that_ends_by_itself_in_an_outage_ends_when_last_seen_running() -> None:
    """atk39-24 F6: a run requeued while slurmctld was away ended by itself then; the returning
    controller gave it the EndTime at which it heard (here 7 s after its real end, inside the
    settle time). It is recorded ended when last seen running, as any run so ending is
    (`real_end`); not one the executor's `scancel` killed, nor one a stop begun after the
    outage ended, nor an end after the settle time."""
    (j,) = parse_jobs(KILLED.replace("CANCELLED", "COMPLETED").replace("0:9", "0:0"))
    assert j.end_time is not None
    seen, away = j.end_time - 20.0, (j.end_time - 19.0, j.end_time - 1.0)
    st = Stopping(since=j.end_time - 15.0, grace_s=60.0, run=(7, 0), seen_running_at=seen)
    now = j.end_time + 3.0
    assert stopped_end(st, j, now, by_itself=True, outage=(away, 30.0)).at == seen
    assert stopped_end(st, j, now, by_itself=True).at == j.end_time  # no outage: Slurm's
    late = Stopping(since=away[1] + 0.5, grace_s=60.0, run=(7, 0), seen_running_at=seen)
    assert stopped_end(late, j, now, outage=(away, 30.0)).at == j.end_time
    assert stopped_end(late, j, now, by_itself=True, outage=(away, 30.0)).at == seen
    killed = Stopping(since=st.since, grace_s=2.0, run=(7, 0), seen_running_at=seen,
                      cancelled=True, killed=True)  # fmt: skip
    assert stopped_end(killed, j, now, outage=(away, 30.0)).at == j.end_time
    long_ago = (j.end_time - 100.0, j.end_time - 60.0)  # the EndTime after its settle time
    old = Stopping(since=j.end_time - 90.0, grace_s=60.0, run=(7, 0), seen_running_at=seen - 90)
    assert stopped_end(old, j, now, outage=(long_ago, 30.0)).at == j.end_time
