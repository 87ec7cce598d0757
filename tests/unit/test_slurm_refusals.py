"""What Slurm refuses to run (atk59 F1, `ledger.engines.slurm.refusals`) and a heterogeneous
job's later components (atk59 F3, `ledger.engines.slurm.components`). Slurm's answers are
given (`_run`), as in tests/unit/test_slurm_takeover.py; the real-Slurm side is in
tests/integration/test_slurm_gang.py.

F1: an `sbatch` Slurm refused was retried at every cycle for good (a gang of 4 + 2 GPUs, a
heterogeneous job, under sched/builtin), the job `placed` and its GPUs held; the take-back of a
run Slurm will not start never applied, since nothing reached Slurm. F3: a heterogeneous job's
second component (the same name and comment) was taken for a second copy of the run and
cancelled."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.core.state import Node
from ledger.cycle.executor import Launch, Orders
from ledger.engines.slurm.components import joined
from ledger.engines.slurm.executor import SlurmExecutor
from ledger.engines.slurm.launching import TAKEN_BACK
from ledger.engines.slurm.refusals import het_refusal, runs_het, sbatch_refusal, scheduler_type
from ledger.engines.slurm.stops import resumed_stops, tagged
from ledger.engines.slurm.takeover import duplicates
from ledger.engines.slurm.words import parse_jobs
from schemas.errors import EngineError
from schemas.events import GpuSlot

LID = "0123abcd4567"
NODES = {n: Node(name=n, cluster="c", gpu_type="h100", gpus=4) for n in ("a", "a-2")}
REFUSED = ("sbatch --job-name=gpuledger-5: sbatch: error: Batch job submission failed: "
           "Requested operation not supported on this system")  # fmt: skip
TIMED_OUT = ("sbatch --job-name=gpuledger-5: sbatch: error: Batch job submission failed: "
             "Socket timed out on send/recv operation")  # fmt: skip


def gang(*split: int) -> Launch:
    slots = tuple(GpuSlot(node=n, gpu_indices=tuple(range(k)))
                  for n, k in zip(("a", "a-2"), split, strict=False))  # fmt: skip
    return Launch(5, slots, ("sleep", "9"), None, "alice", "ai2/olmo")


class Slurm:
    """Slurm's answers; every sbatch fails with `refusal` (None: it is accepted)."""

    def __init__(self, refusal: str | None) -> None:
        self.refusal = refusal
        self.calls: list[list[str]] = []

    def __call__(self, args: list[str], stdin: str | None = None, env: object = None) -> str:
        self.calls.append(args)
        if args[0] == "sbatch":
            if self.refusal is not None:
                raise EngineError(self.refusal, hint="is Slurm up? see docs/slurm.md")
            return "42\n"
        if args[:2] == ["scontrol", "show"] and args[2:3] == ["config"]:
            return "ClusterName=c\nSlurmctldHost[0]=h\nSlurmctldPort=1\nStateSaveLocation=/s\n"
        return ""

    def sbatches(self) -> int:
        return sum(1 for a in self.calls if a[0] == "sbatch")


def executor(tmp_path: Path, slurm: Slurm, scheduler: str = "") -> SlurmExecutor:
    ex = SlurmExecutor("gpuledger", LID, tmp_path, run_as="service", start_within_s=300.0)
    ex._run = slurm  # type: ignore[method-assign]
    ex.scheduler = scheduler
    ex.adopt({}, 100.0)
    return ex


# --- F1: pure ---


def test_scheduler_type_and_whether_it_runs_heterogeneous_jobs() -> None:
    config = "ProctrackType           = proctrack/cgroup\nSchedulerType           = sched/builtin\n"
    assert scheduler_type(config) == "sched/builtin" and not runs_het("sched/builtin")
    assert scheduler_type("KillWait = 10 sec\n") == "" and runs_het("")
    assert runs_het("sched/backfill")


@pytest.mark.parametrize(
    ("split", "scheduler", "want_refused"),
    [
        ((4, 2), "sched/builtin", True),
        ((4, 2), "sched/backfill", False),
        ((4, 4), "sched/builtin", False),  # one kind of GRES: no heterogeneous job
        ((3,), "sched/builtin", False),
    ],
)
def test_het_refusal(split: tuple[int, ...], scheduler: str, want_refused: bool) -> None:
    why = het_refusal(gang(*split), {}, scheduler)
    assert bool(why) is want_refused
    if want_refused:
        assert "SchedulerType=sched/builtin" in why and "a: 4, a-2: 2" in why


def test_sbatch_refusal() -> None:
    """Slurm's own refusal: at once, in its words; a failure to reach Slurm: retried until it
    has lasted the take-back time."""
    assert sbatch_refusal(REFUSED, 100.0, 100.0, 300.0) == (
        "Slurm refused to run it: Batch job submission failed: Requested operation not "
        "supported on this system"
    )
    assert sbatch_refusal(TIMED_OUT, 100.0, 399.0, 300.0) == ""
    assert "not retried" in sbatch_refusal(TIMED_OUT, 100.0, 400.0, 300.0)
    assert sbatch_refusal("sbatch failed: [Errno 2] No such file", 100.0, 101.0, 300.0) == ""
    node = "sbatch --x: sbatch: error: Batch job submission failed: Invalid node name specified"
    assert sbatch_refusal(node, 100.0, 101.0, 300.0) == ""  # the node's drain requeues it
    paused = ("sbatch --x: sbatch: error: Batch job submission failed: Required partition not "
              "available (inactive or drain)")  # fmt: skip
    assert sbatch_refusal(paused, 100.0, 101.0, 300.0) == ""  # an admin's pause (atk59b N4)
    assert "not retried" in sbatch_refusal(paused, 100.0, 400.0, 300.0)


# --- F1: the executor ---


def test_a_run_slurm_refuses_is_taken_back_once_with_slurms_words(tmp_path: Path) -> None:
    """One sbatch, refused: the run ends `launch_failed` with Slurm's words, its `taken-back`
    mark made, and is never submitted again (before: retried at every cycle for good)."""
    slurm = Slurm(REFUSED)
    ex = executor(tmp_path, slurm)
    ex.carry_out(Orders(launches=(gang(4, 2),)), 101.0)
    seen = ex.observe(102.0, NODES)
    (x,) = seen.exits
    assert (x.job_id, x.exit_code, x.reason) == (5, -1, "launch_failed")
    assert "Requested operation not supported on this system" in x.note
    assert 5 not in ex._runs and 5 not in seen.running
    assert (tmp_path / "checkpoints" / "5.0" / TAKEN_BACK).exists()
    for t in (103.0, 104.0):
        assert not ex.observe(t, NODES).exits
    assert slurm.sbatches() == 1


def test_an_sbatch_that_cannot_reach_slurm_is_retried_until_the_take_back_time(
    tmp_path: Path,
) -> None:
    slurm = Slurm(TIMED_OUT)
    ex = executor(tmp_path, slurm)
    ex.carry_out(Orders(launches=(gang(4, 2),)), 101.0)
    assert not ex.observe(300.0, NODES).exits and 5 in ex._runs
    (x,) = ex.observe(401.0, NODES).exits
    assert x.reason == "launch_failed" and "Socket timed out" in x.note and 5 not in ex._runs
    sent = slurm.sbatches()
    ex.observe(402.0, NODES)
    assert slurm.sbatches() == sent


def test_a_heterogeneous_gang_is_never_submitted_under_sched_builtin(tmp_path: Path) -> None:
    slurm = Slurm(None)
    ex = executor(tmp_path, slurm, "sched/builtin")
    ex.carry_out(Orders(launches=(gang(4, 2),)), 101.0)
    seen = ex.observe(102.0, NODES)
    (x,) = seen.exits
    assert x.reason == "launch_failed" and "does not run heterogeneous jobs" in x.note
    assert "runs no heterogeneous job" in seen.engine_note  # `status` says so
    assert slurm.sbatches() == 0 and 5 not in ex._runs
    ex = executor(tmp_path / "b", Slurm(None), "sched/backfill")
    ex.carry_out(Orders(launches=(gang(4, 2),)), 101.0)
    assert ex._runs[5].slurm_id == "42" and ex.observe(102.0, NODES).engine_note == ""


# --- F3: a heterogeneous job's components ---


def line(slurm_id: str, node: str, gpus: str, state: str = "RUNNING") -> str:
    return (
        f"JobId={slurm_id} HetJobId=40 HetJobOffset={int(slurm_id) - 40} JobName=gpuledger-5"
        f" UserId=root(0) JobState={state} Reason=None ExitCode=0:0"
        f" StartTime=2026-12-04T21:08:26 Partition=gpuledger NodeList={node} Nodes={node}"
        f" GRES=gpu:{len(gpus.split(','))}(IDX:{gpus}) Comment=gpuledger:{LID}:job=5:run=0"
        " StdOut=/tmp/x"
    )


HET = [line("40", "a", "0-3"), line("41", "a-2", "0-1")]


def test_a_later_component_is_never_a_copy_nor_a_stray_nor_the_run() -> None:
    view = joined(parse_jobs("\n".join(HET)))
    assert [j.het_component for j in view] == [False, True]
    assert duplicates(view, {(5, 0): ("40", True)}, LID, "gpuledger") == []  # before: 41
    byid = {j.slurm_id: j for j in view}
    assert tagged(dict(reversed(byid.items())), LID, 5, 0) == byid["40"]
    stray = resumed_stops(byid, {}, {"40"}, LID, "gpuledger", lambda _: None,
                          lambda _: None, 2.0)  # fmt: skip
    assert stray == []  # before: 41 stopped as a run the ledger no longer runs


def test_the_first_component_holds_every_components_gpus() -> None:
    first, second = joined(parse_jobs("\n".join(HET)))
    assert first.gpus == {"a": (0, 1, 2, 3), "a-2": (0, 1)} and second.gpus == {"a-2": (0, 1)}


def test_the_executor_cancels_no_component_of_its_own_run(tmp_path: Path) -> None:
    """Slurm lists the run's two components: nothing is cancelled (before: 41, at every read,
    "a second copy of job 5 run 0")."""
    slurm = Slurm(None)
    ex = executor(tmp_path, slurm, "sched/backfill")
    ex.carry_out(Orders(launches=(gang(4, 2),)), 101.0)
    ex._run = lambda args, *_, **__: ("\n".join(HET) if args[0] == "scontrol" and "job" in args
                                      else slurm(args))  # type: ignore[method-assign]  # fmt: skip
    ex._runs[5].slurm_id = "40"
    for t in (102.0, 103.0):
        ex.observe(t, NODES)
    assert not [a for a in slurm.calls if a[0] == "scancel"]
    assert not ex._stopping


def test_a_failure_after_a_landed_sbatch_takes_nothing_back(tmp_path: Path) -> None:
    """sbatch answered an id; what failed came after (the landing's read): the run is Slurm's
    job, kept, never taken back for it."""
    ex = executor(tmp_path, Slurm(None))

    def landed(*_: object) -> str:
        raise EngineError("scontrol -d: error: Invalid job id specified")

    ex.cluster.landed = landed  # type: ignore[method-assign]
    ex.carry_out(Orders(launches=(gang(4, 2),)), 101.0)
    assert ex._runs[5].slurm_id == "42" and not ex._exits
