"""A stop Slurm ended while its node's slurmd was dead, taken up by a service restarted only after
the node came back (atk44s F2, F2b): the restarted service never saw the slurmd away, so it
judges from what lasts, the run's marks and its own note of an earlier read's judgement. The
executor reads Slurm's own words (`scontrol` lines, fed to `_run`), pure rules decide."""

from __future__ import annotations

import time
from pathlib import Path

from ledger.core.state import StoppedRun
from ledger.engines.slurm.executor import SlurmExecutor
from ledger.engines.slurm.launching import ALIVE, SIGNALLED
from ledger.engines.slurm.stops import Stopping, earlier_alive, outlived, slurmd_restarted
from ledger.engines.slurm.tracked import Run, note_stop, noted_limited, noted_unheard
from ledger.engines.slurm.words import parse_jobs
from schemas.events import GpuSlot
from tests.unit.test_slurm_stop_unseen import (
    KILL_WAIT,
    LID,
    NODES,
    START,
    Slurm,
    at,
    executor,
    job,
    node_line,
)

SLOTS = (GpuSlot(node="vm", gpu_indices=(0, 1, 2, 3)),)


def test_outlived() -> None:
    """Pure: a beat later than Slurm's SIGKILL could be (EndTime + KillWait, a beat and the
    EndTime's rounding), or a signal noted as long after the EndTime: Slurm's end was its word
    alone. Not for the job's own end, nor a run still running, nor marks within the bounds."""
    (cancelled,) = parse_jobs(job("CANCELLED", 13, "0:15"))
    end = START + 13
    assert not outlived(cancelled, None, None, KILL_WAIT)
    assert not outlived(cancelled, end + KILL_WAIT + 5.0, end + 5.0, KILL_WAIT)  # within
    assert outlived(cancelled, end + KILL_WAIT + 5.5, None, KILL_WAIT)  # beat on after the kill
    assert outlived(cancelled, None, end + 5.5, KILL_WAIT)  # a later slurmd's TERM
    (completed,) = parse_jobs(job("COMPLETED", 13))
    assert not outlived(completed, end + 100, end + 100, KILL_WAIT)  # its own end
    (running,) = parse_jobs(job("RUNNING"))
    assert not outlived(running, end + 100, end + 100, KILL_WAIT)
    assert not outlived(None, end + 100, end + 100, KILL_WAIT)


def restarted(tmp_path: Path, end_s: float, beat: bool) -> tuple[Slurm, SlurmExecutor]:
    """A service restarted (`adopt`) with job 1's run 0 stopped by the ledger (a requeue or a
    cancel), which Slurm lists CANCELLED at START + `end_s` on node vm, back and answering; the
    run's `alive` and `signalled` marks made now (~START + 300) when `beat`."""
    slurm = Slurm()
    slurm.jobs = job("CANCELLED", end_s, "0:15")
    slurm.node = node_line("IDLE")  # slurmd back before the service
    ex = executor(tmp_path, slurm)
    note_stop(tmp_path, "7", START + 10.0)  # the stop's SIGTERM, before the service's kill
    run_dir = ex._checkpoint_file(1, 0).parent
    run_dir.mkdir(parents=True)
    if beat:
        (run_dir / SIGNALLED).touch()  # the returned slurmd's TERM
        (run_dir / ALIVE).touch()  # its script beats on: its command lives
    ex.stopped_runs = lambda: {(1, 0): StoppedRun(job_id=1, run=0, slots=SLOTS, at=START + 10)}
    return slurm, ex


def test_a_restart_after_the_node_returned_holds_a_stop_its_marks_show_alive(
    tmp_path: Path,
) -> None:
    """atk44s F2/F2b: requeued (or cancelled) with its slurmd dead, the service killed in the
    stop and back only once the node had returned: Slurm lists the run CANCELLED at its DOWN
    (13 s), its node answering. Its marks, made ~300 s later, show it alive: the stop is in
    doubt, its GPUs held, the job's next run fenced, the judgement kept on disk. It was
    recorded ended at Slurm's EndTime (exit 0, not killed) and the next run, or another
    user's job, launched beside its live processes."""
    _, ex = restarted(tmp_path, 13, beat=True)
    now = time.time()
    assert ex.adopt({}, now) == set()
    seen = ex.observe(now + 0.5, NODES)
    assert seen.stopped == (), seen.stopped  # not ended at Slurm's EndTime
    assert seen.stopping == {"vm": frozenset({0, 1, 2, 3})}, seen
    assert earlier_alive(ex.view, LID, 1, 1, ex._stopping) is not None  # the launch fence
    assert noted_unheard(tmp_path, "7")  # a second restart judges it so too
    assert ex.observe(now + KILL_WAIT + 1, NODES).stopped == ()  # its beat is still fresh


def test_a_second_restart_keeps_the_judgement_of_the_first(tmp_path: Path) -> None:
    """The judgement lasts: a stop an earlier read found unheard (noted on disk) is in doubt for
    a restarted service whatever the marks say now (they may be unwritable: atk37-23 F6)."""
    _, ex = restarted(tmp_path, 295, beat=False)
    (tmp_path / "stops").mkdir(exist_ok=True)
    (tmp_path / "stops" / "7.unheard").touch()
    now = time.time()
    ex.adopt({}, now)
    seen = ex.observe(now + 0.5, NODES)
    assert seen.stopped == () and seen.stopping == {"vm": frozenset({0, 1, 2, 3})}, seen


def test_a_restart_ends_a_stop_slurm_ended_with_its_slurmd_answering_as_slurm_says(
    tmp_path: Path,
) -> None:
    """The other side: Slurm's CANCELLED a few seconds ago (its kill within KillWait), the run's
    last beat and its TERM's note inside it: the processes' end is Slurm's, recorded at once."""
    _, ex = restarted(tmp_path, int(time.time() - START) - 1, beat=True)  # 1 s ago
    now = time.time()
    ex.adopt({}, now)
    (end,) = ex.observe(now + 0.5, NODES).stopped
    assert (end.job_id, end.run, end.engine_state) == (1, 0, "CANCELLED"), end
    assert end.at == START + int(now - START) - 1, end  # Slurm's EndTime
    assert not noted_unheard(tmp_path, "7")


def test_the_unheard_note_is_forgotten_with_the_stop(tmp_path: Path) -> None:
    """The note lives as long as the stop: gone once the run's end is reported."""
    slurm, ex = restarted(tmp_path, 13, beat=True)
    now = time.time()
    ex.adopt({}, now)
    assert noted_unheard(tmp_path, "7")
    st = ex._stopping["7"]
    assert isinstance(st, Stopping) and st.unanswered
    # its heartbeat stopped long ago, for the rules (`ends.node_fail_ending`): gone, ended
    slurm.jobs = ""  # and Slurm purged it (MinJobAge): its stop ends by its marks
    later = now + 3600
    for t in (later, later + 1):
        ex.observe(t, NODES)
    assert "7" not in ex._stopping
    assert not noted_unheard(tmp_path, "7")


def test_a_restart_soon_after_the_node_returned_holds_a_stop_its_slurmd_was_away_for(
    tmp_path: Path,
) -> None:
    """atk44s F2, the tight case: the service back within KillWait of Slurm's CANCELLED, its
    node back too, the run's marks not late enough yet for `outlived`. Slurm's own record
    says its slurmd started again after the stop began (`SlurmdStartTime`): the stop is in
    doubt, its GPUs held. A slurmd that started before the stop changes nothing."""
    end = int(time.time() - START) - 1  # Slurm's CANCELLED 1 s ago
    slurm, ex = restarted(tmp_path, end, beat=True)
    slurm.node += f" SlurmdStartTime={at(end + 0.5)}"  # after the stop's SIGTERM (START + 10)
    now = time.time()
    ex.adopt({}, now)
    seen = ex.observe(now + 0.5, NODES)
    assert seen.stopped == () and seen.stopping == {"vm": frozenset({0, 1, 2, 3})}, seen
    assert noted_unheard(tmp_path, "7")
    slurm2, ex2 = restarted(tmp_path / "before", end, beat=True)
    slurm2.node += f" SlurmdStartTime={at(5)}"  # before the stop
    ex2.adopt({}, now)
    (x,) = ex2.observe(now + 0.5, NODES).stopped
    assert x.engine_state == "CANCELLED", x


def test_slurmd_restarted() -> None:
    (cancelled,) = parse_jobs(job("CANCELLED", 13, "0:15"))
    st = Stopping(since=START + 10.0, run=(1, 0))
    assert slurmd_restarted(st, cancelled, {"vm": START + 12.0})
    assert not slurmd_restarted(st, cancelled, {"vm": START + 9.0})
    assert not slurmd_restarted(st, cancelled, {"other": START + 12.0})
    (completed,) = parse_jobs(job("COMPLETED", 13))
    assert not slurmd_restarted(st, completed, {"vm": START + 12.0})  # its own end
    assert not slurmd_restarted(Stopping(since=0.0), cancelled, {"vm": START + 12.0})


def test_a_restart_after_a_limit_stop_slurm_ended_records_the_time_limit(tmp_path: Path) -> None:
    """atk46-s F2: a run stopped at its time limit (its SIGTERM, then the scancel), the service
    killed -9 after that, back once Slurm ended the job CANCELLED: the restarted executor
    adopted it and took that CANCELLED for a cancel outside the ledger (`Run.limited` lived
    only in the killed service's memory). The limit's stop is kept on disk before its SIGTERM
    (`note_limited`): the run ends `time_limit`, and the note goes with the stop."""
    slurm = Slurm()
    ex = executor(tmp_path, slurm)
    ex.job_limit = lambda job_id: 20.0  # type: ignore[method-assign]
    ex._runs[1] = Run(1, 0, None, slurm_id="7", started=True, started_at=START, adopted=True)
    now = time.time()
    ex.observe(now, NODES)  # 300 s in, past its 20 s: stopped at its limit
    assert ex._runs[1].limited and noted_limited(tmp_path, "7")
    assert any("scancel" in " ".join(a) for a in slurm.said), slurm.said
    # the service killed -9 (its memory gone); Slurm ends the job CANCELLED meanwhile
    slurm.jobs = job("CANCELLED", 27, "0:15")
    again = executor(tmp_path, slurm)
    again.job_limit = lambda job_id: 20.0  # type: ignore[method-assign]
    assert again.adopt({1: 0}, now + 30) == {1}
    (end,) = again.observe(now + 30.5, NODES).exits
    assert (end.job_id, end.reason, end.engine_state) == (1, "time_limit", "CANCELLED"), end
    assert end.at == START + 27, end  # no beat of its after Slurm's EndTime: Slurm's word
    # a restart that no longer runs it forgets the note; a stale note of a Slurm id that came
    # back never makes an end before the limit a limit's
    assert noted_limited(tmp_path, "7")
    slurm.jobs = job("CANCELLED", 10, "0:15")
    third = executor(tmp_path, slurm)
    third.job_limit = lambda job_id: 20.0  # type: ignore[method-assign]
    third.adopt({1: 0}, now + 60)
    (end,) = third.observe(now + 60.5, NODES).exits
    assert end.reason == "cancelled", end
    executor(tmp_path, slurm).adopt({}, now + 90)
    assert not noted_limited(tmp_path, "7")


def test_a_limit_stop_ended_unseen_ends_at_its_last_beat_within_killwait(tmp_path: Path) -> None:
    """atk46-s F2, the end: stopped at its limit, the service killed while Slurm held the job
    COMPLETING (its processes ignore SIGTERM, killed KillWait after the scancel), back after
    Slurm ended it: it was recorded ended at Slurm's EndTime, the scancel, ~10 s before its
    processes died. Its script's heartbeat after the EndTime says they lived: the end is that
    beat, never past EndTime + KillWait."""
    slurm = Slurm()
    run_dir = executor(tmp_path, slurm)._checkpoint_file(1, 0).parent
    run_dir.mkdir(parents=True)
    (tmp_path / "stops").mkdir()
    (tmp_path / "stops" / "7.limited").touch()  # the killed service's limit stop
    (run_dir / ALIVE).touch()  # its last beat: now, 300 s or more after the job started
    beat = (run_dir / ALIVE).stat().st_ctime
    for end_s, want in ((int(beat - START) - 5, beat), (27, START + 27 + KILL_WAIT)):
        slurm.jobs = job("CANCELLED", end_s, "0:15")
        ex = executor(tmp_path, slurm)
        ex.job_limit = lambda job_id: 20.0  # type: ignore[method-assign]
        ex.adopt({1: 0}, beat + 5)
        (end,) = ex.observe(beat + 5.5, NODES).exits
        assert (end.reason, end.at) == ("time_limit", want), (end, want - START)
