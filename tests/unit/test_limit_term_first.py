"""A stop at a time limit always gives the job its SIGTERM first, and its SIGKILL no sooner
than min(grace, 10 s) after the SIGTERM really sent (s56: under load the Slurm executor noticed
a `-t 1 --grace 15s` job's limit 38 s late; the grace counted from the limit had run out, so the
job was SIGKILLed at once, with no SIGTERM and no chance to checkpoint). One rule
(`reads.stopping.limit_sigkill_at`) for the reads, the Slurm executor and the node agents."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ledger.cycle.executor import Launch
from ledger.engines.runs import Handle
from ledger.engines.slurm import SlurmExecutor, parse_jobs
from ledger.engines.slurm.launching import SIGNALLED
from ledger.engines.slurm.stops import Stopping, kill_due
from ledger.engines.slurm.tracked import Run
from ledger.engines.supervised import kill_at
from ledger.reads.stopping import LATE_TERM_GRACE_S, limit_kill_at, limit_sigkill_at
from schemas.events import GpuSlot

LID = "0123abcd4567"


def test_a_term_sent_in_time_changes_nothing() -> None:
    # limit at 100, grace 15: TERM at the limit or a few seconds late, SIGKILL at 115
    assert limit_sigkill_at(100.0, 15.0, None) == 115.0
    assert limit_sigkill_at(100.0, 15.0, 100.0) == 115.0
    assert limit_sigkill_at(100.0, 15.0, 105.0) == 115.0
    assert limit_kill_at(40.0, 60.0, 15.0, 30.0, termed_at=101.0) == 115.0
    assert limit_kill_at(40.0, 60.0, None, 30.0) == 130.0  # the service's grace


def test_a_term_sent_late_gets_its_grace_up_to_ten_seconds() -> None:
    # noticed 38 s late: the grace counted from the limit has run out; TERM now, KILL 10 s on
    assert LATE_TERM_GRACE_S == 10.0
    assert limit_sigkill_at(100.0, 15.0, 138.0) == 148.0
    assert limit_sigkill_at(100.0, 15.0, 110.0) == 120.0  # 5 s left of 15: 10 s from the TERM
    assert limit_sigkill_at(100.0, 4.0, 138.0) == 142.0  # a grace under 10 s: the grace
    assert limit_sigkill_at(100.0, 0.0, 138.0) == 138.0  # none: at once after the TERM
    assert limit_kill_at(40.0, 60.0, 120.0, 30.0, termed_at=500.0) == 510.0  # capped grace


def test_the_slurm_executor_never_kills_a_limit_stop_before_its_term() -> None:
    st = Stopping(100.0, grace_s=15.0, limit=True)
    assert not kill_due(st, 138.0)  # noticed late, no TERM yet: TERM first, never SIGKILL
    st.termed_at = 138.0
    assert not kill_due(st, 147.9)
    assert kill_due(st, 148.0)
    ledger_stop = Stopping(100.0, grace_s=15.0)  # a cancel's stop: its grace from the cancel
    assert not kill_due(ledger_stop, 114.9) and kill_due(ledger_stop, 115.0)


def test_a_node_agent_keeps_the_same_rule() -> None:
    h = Handle(job_id=1, launch=1, launched_at=0.0, time_limit_s=100.0, grace_s=15.0,
               parts=[], stop_at=100.0, stop_reason="time_limit", termed_at=138.0)  # fmt: skip
    assert kill_at(h) == 148.0
    h.termed_at = 101.0
    assert kill_at(h) == 115.0
    cancelled = Handle(job_id=2, launch=1, launched_at=0.0, time_limit_s=None, grace_s=15.0,
                       parts=[], stop_at=100.0, stop_reason="ledger", termed_at=138.0)  # fmt: skip
    assert kill_at(cancelled) == 115.0  # the ledger's stop: from the stop the log recorded


def test_the_sigterm_counts_from_the_jobs_own_note_of_it_within_the_request_and_the_read() -> None:
    from ledger.engines.slurm.stops import real_term

    assert real_term(100.0, None, 104.0) == (100.0, False)  # no note yet: the request's
    assert real_term(100.0, 97.0, 104.0) == (100.0, False)  # an older signal's note
    assert real_term(100.0, 103.2, 104.0) == (103.2, True)  # the job's: seen after it
    assert real_term(100.0, 105.0, 104.0) == (104.0, False)  # made in the read's cycle


def test_a_late_limits_sigkill_counts_from_the_sigterm_the_job_noted(tmp_path: Path) -> None:
    """s57's closing note: the Slurm executor kept its cycle's start (before its read and the
    `scancel`) as the SIGTERM's time; at load the job saw the TERM seconds later, and its
    SIGKILL came `LATE_TERM_GRACE_S` after the request, that much less after the TERM. Here the
    job notes the TERM 4 s after the request: its SIGKILL comes 10 s after the note."""
    ex, calls = _limited(tmp_path)
    real = time.time()
    asked = real - 4.0  # the cycle that asked the SIGTERM began 4 s before the job got it
    _read(ex, asked)
    assert [a for a in calls if "--signal=TERM" in a], calls  # its SIGTERM first
    (tmp_path / "checkpoints" / "1.0" / SIGNALLED).touch()  # the job's note: its ctime
    noted = os.lstat(tmp_path / "checkpoints" / "1.0" / SIGNALLED).st_ctime
    for t in (real + 1.0, asked + LATE_TERM_GRACE_S + 0.5, noted + LATE_TERM_GRACE_S - 0.2):
        _read(ex, t)
        assert not [a for a in calls if "--signal=KILL" in a], (t - noted, calls)
    (st,) = ex._stopping.values()
    assert st.term_seen and st.termed_at == noted
    _read(ex, noted + LATE_TERM_GRACE_S)
    assert [a for a in calls if "--signal=KILL" in a], calls


START = float(int(time.time()) - 300)


def _limited(tmp_path: Path) -> tuple[SlurmExecutor, list[list[str]]]:
    """An executor whose run (`-t 30s --grace 15s`, started at `START`) is past its limit and
    its grace: a limit noticed late. `scancel` recorded, never run."""
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    job = Launch(1, (GpuSlot(node="n1", gpu_indices=(0,)),), ("true",), None, "bob", "ai2/olmo",
                 time_limit_s=30, grace_s=15.0)  # fmt: skip
    ex._runs[1] = Run(1, 0, job, slurm_id="7")
    (tmp_path / "checkpoints" / "1.0").mkdir(parents=True)
    calls: list[list[str]] = []
    ex._run = lambda args, stdin=None, env=None: calls.append(args) or ""  # type: ignore[method-assign]
    ex.cluster.confirm = lambda now, within_s=1.0: True  # type: ignore[method-assign]
    _read(ex, START + 1.0)
    assert ex._runs[1].started_at == START
    return ex, calls


def _read(ex: SlurmExecutor, now: float) -> None:
    begun = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(START))
    line = (f"JobId=7 JobName=gpuledger-1 UserId=bob(1001) JobState=RUNNING Reason=None"
            f" ExitCode=0:0 StartTime={begun} EndTime=Unknown Partition=gpuledger NodeList=n1"
            f" Comment=gpuledger:{LID}:job=1:run=0:grace=15 StdOut=/tmp/y")  # fmt: skip
    ex._view = {j.slurm_id: j for j in parse_jobs(line)}
    ex._read_runs(now)
