"""A stop whose end Slurm decided without its processes' word (atk43s F8, F8b), and the end of a
run the executor stopped once slurmctld answered again after an outage (atk43s F9). The
executor reads Slurm's own words (`scontrol` lines, fed to `_run`), pure rules decide."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ledger.core.state import Node
from ledger.engines.slurm.executor import SlurmExecutor
from ledger.engines.slurm.stops import (
    Stopping,
    earlier_alive,
    note_unanswered,
    outage_of,
    stopping_gpus,
    unseen_end,
)
from ledger.engines.slurm.tracked import Run
from ledger.engines.slurm.words import parse_jobs

LID = "0123abcd4567"
START = float(int(time.time()) - 300)  # the run's StartTime (whole seconds)
GPUS = "GRES=gpu:fake_0:1(IDX:0),gpu:fake_1:1(IDX:1),gpu:fake_2:1(IDX:2),gpu:fake_3:1(IDX:3)"
KILL_WAIT = 10.0


def at(seconds: float) -> str:
    """Slurm's word for START + seconds (whole seconds, local time)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(START + seconds))


def job(state: str, end: float | None = None, code: str = "0:0") -> str:
    """Our run (job 1, run 0) on node vm's 4 GPUs, as `scontrol -d -o show job` says it."""
    ends = f"EndTime={at(end)}" if end is not None else "EndTime=Unknown"
    line = (
        f"JobId=7 JobName=gpuledger-1 UserId=bob(1001) JobState={state} Reason=None"
        f" ExitCode={code} StartTime={at(0)} {ends} Partition=gpuledger NodeList=vm"
        f" Comment=gpuledger:{LID}:job=1:run=0"
    )
    return line + (f" Nodes=vm CPU_IDs=0 Mem=0 {GPUS}" if state == "RUNNING" else "")


def node_line(state: str) -> str:
    """Node vm (4 pinned GPUs) in `state`: `MIXED*` its slurmd unreachable, `DOWN*` given up."""
    return (
        "NodeName=vm Gres=gpu:fake_0:1,gpu:fake_1:1,gpu:fake_2:1,gpu:fake_3:1 GresDrain=N/A"
        f" GresUsed=gpu:fake_0:0(IDX:N/A) State={state} Partitions=gpuledger"
    )


class Slurm:
    """What Slurm says to each read (`SlurmExecutor._run`), as the test sets it."""

    def __init__(self) -> None:
        self.jobs = job("RUNNING")
        self.node = node_line("MIXED")
        self.said: list[list[str]] = []

    def run(self, args: list[str], stdin: str | None = None, env: object = None) -> str:
        self.said.append(args)
        if args[-2:] == ["show", "job"]:
            return self.jobs
        if args[-2:] == ["show", "node"]:
            return self.node
        return ""


NODES = {"vm": Node(name="vm", cluster="c", gpu_type="fake", gpus=4)}


def executor(tmp_path: Path, slurm: Slurm) -> SlurmExecutor:
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    ex._run = slurm.run  # type: ignore[method-assign]
    ex.kill_wait_s, ex.slurmd_timeout_s = KILL_WAIT, 30.0
    return ex


def test_a_cancelled_run_slurm_ends_on_a_node_whose_slurmd_is_dead_holds_its_gpus() -> None:
    """atk43s F8 (pure): a run the executor stops while its node's slurmd is dead is ended by
    Slurm CANCELLED (not NODE_FAIL) when it gives the node up. That end is Slurm's word alone:
    in doubt, its GPUs held and the launch fence closed, as a NODE_FAIL stop's."""
    running, cancelled = (
        parse_jobs(job("RUNNING"))[0],
        parse_jobs(job("CANCELLED", 40, "0:15"))[0],
    )
    st = Stopping(since=START + 10, grace_s=2.0, run=(1, 0), cancelled=True, killed=True)
    note_unanswered({"7": st}, {"7": running}, frozenset())  # the nodes answer (or unread)
    assert not st.unanswered and not unseen_end(st, cancelled)  # its slurmd said it ended
    note_unanswered({"7": st}, {"7": running}, frozenset({"other"}))
    assert not st.unanswered
    note_unanswered({"7": st}, {"7": running}, frozenset({"vm"}))  # vm's slurmd unheard, or DOWN
    assert st.unanswered and unseen_end(st, cancelled)
    note_unanswered({"7": st}, {"7": cancelled}, frozenset({"vm"}))  # Slurm ends it so
    note_unanswered({"7": st}, {"7": cancelled}, frozenset())  # it answers again later:
    assert st.unanswered  # Slurm's end stays its word alone, for good
    pending = parse_jobs(job("PENDING").replace("NodeList=vm", "NodeList=(null)"))[0]
    waiting = Stopping(since=START + 10, grace_s=2.0, run=(1, 0))
    note_unanswered({"7": waiting}, {"7": pending}, frozenset({"vm"}))
    assert not waiting.unanswered  # never started: nothing of it on vm
    st.gpus = {"vm": (0, 1, 2, 3)}
    view = {"7": cancelled}
    assert stopping_gpus({"7": st}, view, {}) == {"vm": frozenset({0, 1, 2, 3})}
    st.in_doubt = True
    assert earlier_alive(view, LID, 1, 1, {"7": st}) is cancelled
    # its own exit (the command ended, the batch script with it) is the processes' end
    completed = parse_jobs(job("COMPLETED", 40))[0]
    assert not unseen_end(st, completed)
    assert unseen_end(Stopping(since=0.0), parse_jobs(job("NODE_FAIL", 40))[0])
    assert not unseen_end(None, cancelled)


def test_a_stop_whose_node_answers_again_before_slurm_s_end_is_judged_by_its_state_now(
    tmp_path: Path,
) -> None:
    """A stop whose node's slurmd is unheard at one read (a loaded or briefly unreachable
    slurmd: `MIXED*`) and answers again before the grace passes: Slurm's kill reaches the run,
    its CANCELLED end is the processes' end, recorded at once. The old executor marked the
    stop `unanswered` for good at the first flag and held its end in doubt by the NODE_FAIL
    rules (its GPUs `stopping`, its end waiting for KillWait after the node answered)."""
    slurm = Slurm()
    ex = executor(tmp_path, slurm)
    ex._stopping["7"] = Stopping(since=START + 10.0, grace_s=2.0, run=(1, 0))
    slurm.node = node_line("MIXED*")  # flagged: this read's nodes
    ex.observe(START + 11.0, NODES)
    ex.observe(START + 11.5, NODES)  # the next read's runs see it flagged
    assert ex._stopping["7"].unanswered
    slurm.node = node_line("MIXED")  # it answers again
    ex.observe(START + 12.0, NODES)
    ex.observe(START + 13.0, NODES)  # past the grace: `scancel`, the node answering
    assert ["scancel", "--name=gpuledger-1", "7"] in slurm.said
    assert not ex._stopping["7"].unanswered
    slurm.jobs = job("CANCELLED", 14, "0:15")
    seen = ex.observe(START + 15.0, NODES)
    (x,) = seen.stopped
    assert (x.job_id, x.run, x.at) == (1, 0, START + 14.0), x
    assert "7" not in ex._stopping


def test_a_cancel_slurm_ends_while_the_slurmd_is_dead_is_held_until_the_run_is_gone(
    tmp_path: Path,
) -> None:
    """atk43s F8 (the executor): cancelled with its node's slurmd dead (the stop's SIGTERM and
    Slurm's kill reach nothing), the run is ended CANCELLED when Slurm gives the node up. It
    was recorded ended at once and its GPUs given to the next job, which ran beside it once
    the node returned. Now its GPUs stay `stopping` and its end waits for Slurm's kill to
    reach it (its slurmd answering, then KillWait), as a NODE_FAIL stop's."""
    slurm = Slurm()
    ex = executor(tmp_path, slurm)
    slurm.node = node_line("MIXED*")  # slurmd killed
    ex._stopping["7"] = Stopping(since=START + 10.0, grace_s=2.0, run=(1, 0))
    ex.observe(START + 11.0, NODES)
    ex.observe(START + 13.0, NODES)  # past the grace: `scancel`
    assert ["scancel", "--name=gpuledger-1", "7"] in slurm.said
    slurm.jobs = job("CANCELLED", 13, "0:15")
    slurm.node = node_line("DOWN*")  # given up: Slurm ends its COMPLETING job CANCELLED
    seen = ex.observe(START + 50.0, NODES)
    assert seen.stopped == (), seen.stopped
    assert seen.stopping == {"vm": frozenset({0, 1, 2, 3})}
    assert earlier_alive(ex.view, LID, 1, 1, ex._stopping) is not None  # fenced (F8b)
    slurm.node = node_line("IDLE")  # slurmd back: Slurm's kill reaches it now
    back = START + 80.0
    assert ex.observe(back, NODES).stopped == ()
    assert ex.observe(back + KILL_WAIT - 0.5, NODES).stopping == {"vm": frozenset({0, 1, 2, 3})}
    seen = ex.observe(back + KILL_WAIT + 0.5, NODES)
    (end,) = seen.stopped
    assert (end.job_id, end.run, end.engine_state) == (1, 0, "KILLED"), end
    assert end.at == back + KILL_WAIT, end  # not Slurm's EndTime (13 s), nor the DOWN (50 s)
    assert "CANCELLED: killed" in end.note, end
    assert seen.stopping == {}


def test_a_run_stopped_at_its_limit_that_slurm_ends_unseen_stays_running_until_gone(
    tmp_path: Path,
) -> None:
    """atk43s F8 as found: the run stopped at its limit (the executor's stop, slurmd dead),
    ended CANCELLED at the node's DOWN, was recorded ended `time_limit` then. It stays the
    ledger's running run (in doubt on its lost node) until it is gone, then ends `time_limit`
    at that end."""
    slurm = Slurm()
    ex = executor(tmp_path, slurm)
    slurm.node = node_line("MIXED*")
    ex._runs[1] = Run(1, 0, None, slurm_id="7", started=True, started_at=START, limited=True,
                      stop_sent_at=START + 10.0)  # fmt: skip
    ex._stopping["7"] = Stopping(since=START + 10.0, grace_s=2.0)  # a limit's: no `run`
    ex.observe(START + 11.0, NODES)
    ex.observe(START + 13.0, NODES)
    slurm.jobs = job("CANCELLED", 13, "0:15")
    slurm.node = node_line("DOWN*")
    seen = ex.observe(START + 50.0, NODES)
    assert seen.exits == () and seen.running == frozenset({1}), seen
    slurm.node = node_line("IDLE")
    back = START + 80.0
    assert ex.observe(back, NODES).exits == ()
    (end,) = ex.observe(back + KILL_WAIT + 0.5, NODES).exits
    assert (end.job_id, end.reason, end.at) == (1, "time_limit", back + KILL_WAIT), end


def test_a_cancel_its_slurmd_confirmed_ends_as_slurm_says(tmp_path: Path) -> None:
    """The other side: a node that answered all along. Slurm ends a COMPLETING job once its
    slurmd says its processes are gone, so the stop ends as before, at once."""
    slurm = Slurm()
    ex = executor(tmp_path, slurm)
    ex._stopping["7"] = Stopping(since=START + 10.0, grace_s=2.0, run=(1, 0))
    ex.observe(START + 11.0, NODES)
    ex.observe(START + 13.0, NODES)
    slurm.jobs = job("CANCELLED", 13, "0:15")
    (end,) = ex.observe(START + 14.0, NODES).stopped
    assert end.at == START + 13.0 and not ex._stopping


def test_outage_of() -> None:
    away = (START + 10.0, START + 60.0)
    assert outage_of(away, 30.0, None) == (away, 30.0)  # not stopped by the executor
    assert outage_of(away, 30.0, START + 5.0) == (away, 30.0)  # stopped before the outage
    assert outage_of(away, 30.0, START + 60.0) == (None, 30.0)  # at the controller's return
    assert outage_of(None, 30.0, START + 60.0) == (None, 30.0)


@pytest.mark.parametrize("state", ["CANCELLED", "FAILED"])
def test_a_run_stopped_at_its_limit_after_a_slurmctld_outage_ends_at_its_real_end(
    tmp_path: Path, state: str
) -> None:
    """atk43s F9: last seen running before a slurmctld outage (reads answered until 10 s, and
    again from 60 s), its limit passed in the outage; the executor stopped it at the return
    (60.2 s) and it ended at 61 s (Slurm's EndTime of that stop, exact: slurmctld answered).
    It was recorded ended at its last sighting (8 s), 53 s of its running uncharged."""
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    ex._runs = {1: Run(1, 0, None, slurm_id="7", started=True, started_at=START, limited=True,
                       seen_running_at=START + 8.0, stop_sent_at=START + 60.2)}  # fmt: skip
    ex._away = (START + 10.0, START + 60.0)
    ex._view = {j.slurm_id: j for j in parse_jobs(job(state, 61, "0:15"))}
    ex._read_runs(START + 63.0)
    assert [(x.reason, x.at - START) for x in ex._exits] == [("time_limit", 61.0)]


def test_a_restart_takes_up_a_stop_slurm_ended_on_an_unheard_node_in_doubt(tmp_path: Path) -> None:
    """F8 across a restart of the service: the stop lives in its memory, so the restarted
    executor finds the run CANCELLED in Slurm (`State.stopped_runs` says the ledger stopped it)
    and its node given up. `adopt` reads the nodes first: the stop is in doubt, its GPUs held,
    not ended at once as the service's first read would have had it."""
    from ledger.core.state import StoppedRun
    from schemas.events import GpuSlot

    slurm = Slurm()
    slurm.jobs = job("CANCELLED", 13, "0:15")
    slurm.node = node_line("DOWN*")
    ex = executor(tmp_path, slurm)
    slots = (GpuSlot(node="vm", gpu_indices=(0, 1, 2, 3)),)
    ex.stopped_runs = lambda: {(1, 0): StoppedRun(job_id=1, run=0, slots=slots, at=START + 10)}
    assert ex.adopt({}, START + 50.0) == set()
    seen = ex.observe(START + 51.0, NODES)
    assert seen.stopped == () and seen.stopping == {"vm": frozenset({0, 1, 2, 3})}, seen
