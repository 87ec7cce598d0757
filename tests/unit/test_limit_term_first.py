"""A stop at a time limit always gives the job its SIGTERM first, and its SIGKILL no sooner
than min(grace, 10 s) after the SIGTERM really sent (s56: under load the Slurm executor noticed
a `-t 1 --grace 15s` job's limit 38 s late; the grace counted from the limit had run out, so the
job was SIGKILLed at once, with no SIGTERM and no chance to checkpoint). One rule
(`reads.stopping.limit_sigkill_at`) for the reads, the Slurm executor and the node agents."""

from __future__ import annotations

from ledger.engines.runs import Handle
from ledger.engines.slurm.stops import Stopping, kill_due
from ledger.engines.supervised import kill_at
from ledger.reads.stopping import LATE_TERM_GRACE_S, limit_kill_at, limit_sigkill_at


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
