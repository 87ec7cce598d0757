"""A Slurm executor that takes over (a new leader) while the last leader's `sbatch` is in
flight (atk45ha F1; `ledger.engines.slurm.takeover`). Before, the new leader submitted the
placed run again at once, then stopped the late copy as "a run the ledger no longer runs"
through the run's `stopping` mark, which its own copy found: it exited 143 and the job was
recorded `failed`, "the command never ran". Slurm's answers are given (`_run`), as in
tests/unit/test_slurm_pure.py; the real-Slurm side is in the integration suite."""

from __future__ import annotations

from pathlib import Path

from ledger.core.state import Node
from ledger.cycle.executor import Launch, Orders
from ledger.engines.slurm.executor import SlurmExecutor
from ledger.engines.slurm.launching import STOPPING
from ledger.engines.slurm.takeover import (
    MARGIN_S,
    InFlight,
    duplicates,
    hands_over_cleanly,
    held,
    in_flight,
)
from ledger.engines.slurm.words import parse_jobs
from schemas.events import GpuSlot

LID = "0123abcd4567"
NODES = {"vm": Node(name="vm", cluster="c", gpu_type="h100", gpus=8)}


def job(slurm_id: str, state: str, run: int = 0, job_id: int = 5) -> str:
    start = "2026-12-04T21:08:26" if state != "PENDING" else "Unknown"
    gres = " GRES=gpu:h100:1(IDX:0)" if state == "RUNNING" else ""
    return (
        f"JobId={slurm_id} JobName=gpuledger-{job_id} UserId=root(0) JobState={state}"
        f" Reason=None ExitCode=0:0 StartTime={start} Partition=gpuledger NodeList=vm"
        f" Nodes=vm{gres} Comment=gpuledger:{LID}:job={job_id}:run={run} StdOut=/tmp/x"
    )


class Slurm:
    """Slurm's answers: the jobs it lists, every command asked, the id the next sbatch gets."""

    def __init__(self) -> None:
        self.jobs: list[str] = []
        self.calls: list[list[str]] = []
        self.next_id = 42

    def __call__(self, args: list[str], stdin: str | None = None, env: object = None) -> str:
        self.calls.append(args)
        if args[0] == "sbatch":
            self.jobs.append(job(str(self.next_id), "PENDING"))
            return f"{self.next_id}\n"
        if args[:2] == ["scontrol", "show"] and args[2:3] == ["config"]:
            return "ClusterName=c\nSlurmctldHost[0]=h\nSlurmctldPort=1\nStateSaveLocation=/s\n"
        if args[0] == "scontrol" and "job" in args:
            return "\n".join(self.jobs) + "\n"
        return ""

    def sbatches(self) -> int:
        return sum(1 for a in self.calls if a[0] == "sbatch")

    def scancels(self) -> list[list[str]]:
        return [a for a in self.calls if a[0] == "scancel"]


def executor(tmp_path: Path, slurm: Slurm) -> SlurmExecutor:
    ex = SlurmExecutor("gpuledger", LID, tmp_path, run_as="service")
    ex._run = slurm  # type: ignore[method-assign]
    return ex


def placed() -> Orders:
    return Orders(launches=(Launch(5, (GpuSlot(node="vm", gpu_indices=(0,)),), ("sleep", "9"),
                                   None, "alice", "ai2/olmo"),))  # fmt: skip


def test_a_placed_run_the_last_leader_may_have_submitted_waits_and_its_late_sbatch_is_adopted(
    tmp_path: Path,
) -> None:
    """The new leader adopts at 100 (Slurm lists nothing of job 5): it does not submit the
    placed run; the last leader's sbatch lands at 110 (its comment), and is adopted."""
    slurm = Slurm()
    ex = executor(tmp_path, slurm)
    assert ex.adopt({5: 0}, 100.0) == set()
    ex.carry_out(placed(), 100.0)
    ex.observe(105.0, NODES)
    assert slurm.sbatches() == 0  # before: submitted again at once
    slurm.jobs.append(job("40", "RUNNING"))  # the last leader's, landed late
    ex.observe(110.0, NODES)
    ex.observe(130.0, NODES)
    assert slurm.sbatches() == 0 and ex._runs[5].slurm_id == "40"
    assert slurm.scancels() == []
    assert not (tmp_path / "checkpoints" / "5.0" / STOPPING).exists()


def test_a_placed_run_is_submitted_once_no_sbatch_of_the_last_leader_can_land(
    tmp_path: Path,
) -> None:
    slurm = Slurm()
    ex = executor(tmp_path, slurm)
    ex.adopt({5: 0}, 100.0)
    ex.carry_out(placed(), 100.0)
    ex.observe(100.0 + ex.timeout_s + MARGIN_S - 0.5, NODES)
    assert slurm.sbatches() == 0
    ex.observe(100.0 + ex.timeout_s + MARGIN_S, NODES)
    assert slurm.sbatches() == 1 and ex._runs[5].slurm_id == "42"


def test_a_run_placed_after_the_takeover_is_submitted_at_once(tmp_path: Path) -> None:
    slurm = Slurm()
    ex = executor(tmp_path, slurm)
    ex.adopt({}, 100.0)  # job 5 placed by this leader: nobody else submitted it
    ex.carry_out(placed(), 101.0)
    assert slurm.sbatches() == 1


def test_a_late_copy_is_cancelled_without_the_runs_stop_mark_and_nothing_is_recorded(
    tmp_path: Path,
) -> None:
    """The executor runs job 5 run 0 as Slurm job 42 (RUNNING); a copy of the same run lands
    later (40, the last leader's sbatch outlived the wait): it is cancelled by a plain scancel
    of its id and the run's name, the run's directory gets no `stopping` mark (its copy kept
    read it: exit 143, "never ran"), and neither copy's end is recorded of it."""
    slurm = Slurm()
    ex = executor(tmp_path, slurm)
    ex.adopt({}, 100.0)
    ex.carry_out(placed(), 100.0)
    slurm.jobs = [job("42", "RUNNING")]
    ex.observe(101.0, NODES)
    slurm.jobs.append(job("43", "RUNNING"))  # the late copy
    seen = ex.observe(102.0, NODES)
    assert slurm.scancels() == [["scancel", "--name=gpuledger-5", "43"]]  # no --signal
    assert not (tmp_path / "checkpoints" / "5.0" / STOPPING).exists()
    assert ex._runs[5].slurm_id == "42" and not seen.exits and not seen.stopped
    slurm.jobs[1] = job("43", "CANCELLED")
    seen = ex.observe(103.0, NODES)
    assert not seen.exits and not seen.stopped and ex._runs[5].slurm_id == "42"
    assert len(slurm.scancels()) == 1


def test_a_late_copy_that_runs_is_kept_over_the_own_one_still_pending(tmp_path: Path) -> None:
    """The late copy's command has started while the executor's own copy still waits: the
    run is the late copy; the own one is cancelled pending (it never runs)."""
    slurm = Slurm()
    ex = executor(tmp_path, slurm)
    ex.adopt({}, 100.0)
    ex.carry_out(placed(), 100.0)  # 42, PENDING
    slurm.jobs.append(job("40", "RUNNING"))
    ex.observe(101.0, NODES)
    assert slurm.scancels() == [["scancel", "--name=gpuledger-5", "42"]]
    assert ex._runs[5].slurm_id == "40"
    assert not (tmp_path / "checkpoints" / "5.0" / STOPPING).exists()


def test_which_copy_of_a_run_is_kept() -> None:
    lines = [job("40", "RUNNING"), job("42", "PENDING"), job("44", "RUNNING", run=1),
             job("45", "CANCELLED"), job("46", "PENDING", job_id=6)]  # fmt: skip
    view = parse_jobs("\n".join(lines))
    carried = {(5, 0): ("42", False), (6, 0): ("47", False)}
    assert [(j.slurm_id, keep) for j, keep in duplicates(view, carried, LID, "gpuledger")] == [
        ("40", "40"),  # it runs, ours waits: kept
    ]  # 46: ours (47) is not listed: not judged
    lines.append(job("47", "PENDING", job_id=6))
    view = parse_jobs("\n".join(lines))
    assert [(j.slurm_id, keep) for j, keep in duplicates(view, carried, LID, "gpuledger")] == [
        ("40", "40"),
        ("46", "47"),  # both wait: ours kept
    ]
    carried = {(5, 0): ("42", True)}  # ours recorded started: ours kept
    assert [(j.slurm_id, keep) for j, keep in duplicates(view, carried, LID, "gpuledger")] == [
        ("40", "42")
    ]


def test_until_when_a_takeover_waits_for_the_last_holders_sbatch() -> None:
    waiting = in_flight({5: 0, 6: 1, 7: 0}, {6}, 100.0, 20.0)
    assert waiting == {(5, 0): 125.0, (7, 0): 125.0}
    assert held((5, 0), waiting, 124.9) == 125.0
    assert held((5, 0), waiting, 125.0) is None and held((6, 1), waiting, 101.0) is None


def test_after_a_clean_handover_a_placed_run_is_submitted_at_once(tmp_path: Path) -> None:
    """The lease was taken after the last leader's clean stop (`Lease.handed_over`): its worker
    had finished its cycle, no sbatch of its may land. Before, the run waited 25 s all the
    same."""
    slurm = Slurm()
    ex = executor(tmp_path, slurm)
    ex.in_flight.handed_over = True  # as `open_executor(handed_over=True)` sets it
    ex.adopt({5: 0}, 100.0)
    ex.carry_out(placed(), 100.0)
    ex.observe(100.5, NODES)
    assert slurm.sbatches() == 1 and ex._runs[5].slurm_id == "42"


def test_a_stop_inside_its_own_takeover_wait_is_no_clean_handover() -> None:
    """atk46-ha F1: s2 took the lease from a leader cut off in its sbatch (not clean) and began
    its 25 s wait; stopped (SIGTERM) inside it, it handed the lease over as clean and s0
    submitted the run at once, while the first leader's sbatch was still in flight: the job's
    command started twice. A stop is clean only once nothing waits."""
    waits = InFlight(handed_over=False)
    waits.begin({4: 0}, adopted=(), now=100.0, timeout_s=20.0)  # job 4 run 0 waits
    assert not hands_over_cleanly(False, waits, now=101.0)
    assert not hands_over_cleanly(True, waits, now=101.0)  # whatever its own take was
    assert hands_over_cleanly(False, waits, now=100.0 + 20.0 + MARGIN_S + 0.1)  # the wait is over
    nothing = InFlight(handed_over=False)
    nothing.begin({4: 0}, adopted=(4,), now=100.0, timeout_s=20.0)  # Slurm listed it: no wait
    assert hands_over_cleanly(False, nothing, now=101.0)
    # a server that took the lease otherwise than cleanly and never made its executor
    assert not hands_over_cleanly(False, None, now=101.0)
    assert hands_over_cleanly(True, None, now=101.0)


def test_a_takeover_adopts_the_copy_that_ran_never_the_second_copy_cancelled_while_pending(
    tmp_path: Path,
) -> None:
    """atk46-ha F6: after a PostgreSQL restart the next leader listed two Slurm jobs of job 98
    run 0: the run (27917000) and a second copy its predecessor had cancelled while pending
    (27917001: no nodes, Slurm's StartTime its cancel time). It adopted the last listed, the
    cancelled copy, and logged 'Slurm started it again ... (slurmctld lost its state)'. The one
    given nodes is the run, whichever id is higher; among copies alike, one alive, then the
    first."""
    from ledger.engines.slurm.takeover import adoptable

    ran = job("27917000", "COMPLETED")
    cancelled = job("27917001", "CANCELLED").replace("NodeList=vm", "NodeList=(null)")
    for order in ([ran, cancelled], [cancelled, ran]):
        view = parse_jobs("\n".join(order))
        ((tag, chosen),) = adoptable(view, {5: 0}, LID, "gpuledger")
        assert (tag, chosen.slurm_id) == ((5, 0), "27917000")
    # the copy kept by `duplicates` (theirs ran, ours waited) may be the higher id
    waited = job("41", "CANCELLED").replace("NodeList=vm", "NodeList=(null)")
    ((_, chosen),) = adoptable(parse_jobs(f"{waited}\n{job('44', 'RUNNING')}"), {5: 0}, LID,
                               "gpuledger")  # fmt: skip
    assert chosen.slurm_id == "44"
    # both given nodes: the alive one, then the first; another run's or another ledger's: none
    both = parse_jobs(f"{job('50', 'CANCELLED')}\n{job('51', 'RUNNING')}")
    assert [j.slurm_id for _, j in adoptable(both, {5: 0}, LID, "gpuledger")] == ["51"]
    assert adoptable(both, {5: 1}, LID, "gpuledger") == []
    assert adoptable(both, {5: 0}, "ffffffffffff", "gpuledger") == []
    # the executor's own takeover (before: the last listed, 27917001, was adopted)
    slurm = Slurm()
    slurm.jobs = [job("27917000", "RUNNING"), cancelled]
    ex = executor(tmp_path, slurm)
    assert ex.adopt({5: 0}, 100.0) == {5} and ex._runs[5].slurm_id == "27917000"
