"""Which Slurm cluster answers is asked again when slurmctld answers after being away (atk43ha
F5; `ledger.engines.slurm.cluster.Watch`): a controller back as another cluster (another
`StateSaveLocation`, the same name and port) was used as this server's, its runs recorded
lost and new work placed there. Now nothing of it is read, placed or stopped, every node is
unobserved and says why, until this server's cluster answers again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ledger.core.state import Node
from ledger.cycle.executor import Orders
from ledger.engines.slurm.cluster import OtherCluster, Watch
from ledger.engines.slurm.executor import SlurmExecutor
from schemas.errors import EngineError

LID = "0123abcd4567"
RUNNING = (
    "JobId=3 JobName=gpuledger-3 UserId=root(0) JobState=RUNNING Reason=None ExitCode=0:0"
    " StartTime=2026-11-30T18:36:36 EndTime=Unknown Partition=gpuledger NodeList=vm"
    " NumNodes=1 Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:fake:2(IDX:0-1)"
    f" Comment=gpuledger:{LID}:job=3:run=1 StdOut=/tmp/job-3.log"
)
NODES = (
    "NodeName=vm Arch=x86_64 CPUAlloc=0 CPUTot=2 Gres=gpu:fake:4 GresUsed=gpu:fake:2(IDX:0-1)"
    " State=MIXED Partitions=gpuledger"
)


def config(state: str) -> str:
    return (
        "ClusterName              = gpuledger\nSlurmctldHost[0]         = 127.0.0.1\n"
        f"SlurmctldPort            = 27500\nStateSaveLocation        = {state}\n"
    )


def test_the_first_cluster_read_is_expected_unless_one_is_given() -> None:
    w = Watch(lambda: "")
    assert w.learn(config("/x/state")) == ""
    said = w.learn(config("/z/state"))
    assert said == (
        "the slurmctld that answers is another cluster than this server's: slurm_state "
        "/z/state (answering) against /x/state (this server's)"
    )
    given = Watch(lambda: "", {"slurm_cluster": "gpuledger at 127.0.0.1 port 27500",
                               "slurm_state": "/z/state", "slurm_untracked_ok": False})  # fmt: skip
    assert given.learn(config("/z/state")) == "" and given.learn(config("/x/state")) != ""
    assert given.learn("") == ""  # no answer about a cluster: nothing compared


class FakeSlurm:
    """`scontrol`/`scancel`/`sbatch` as the executor runs them: `state` names the cluster
    that answers (None: slurmctld does not answer)."""

    def __init__(self) -> None:
        self.state: str | None = "/x/state"
        self.calls: list[list[str]] = []

    def run(self, args: list[str], stdin: str | None = None, env: object = None) -> str:
        self.calls.append(args)
        if self.state is None:
            raise EngineError("scontrol: Unable to contact slurm controller")
        if args[:3] == ["scontrol", "show", "config"]:
            return config(self.state)
        if args[:5] == ["scontrol", "-d", "-o", "show", "job"]:
            return RUNNING if self.state == "/x/state" else ""  # the other knows none of ours
        if args[:5] == ["scontrol", "-d", "-o", "show", "node"]:
            return NODES
        return ""


def test_a_controller_back_as_another_cluster_is_neither_read_nor_acted_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    slurm = FakeSlurm()
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    ex._run = slurm.run  # type: ignore[method-assign]
    ex.cluster = Watch(ex.cluster.read, {"slurm_cluster": "gpuledger at 127.0.0.1 port 27500",
                                         "slurm_state": "/x/state"})  # fmt: skip
    nodes = {"vm": Node(name="vm", cluster="c", gpus=4, gpu_type="fake")}
    assert ex.adopt({3: 1}, 100.0) == {3}
    ex.observe(100.0, nodes)
    slurm.state = None  # an outage
    assert ex.observe(101.0, nodes).unobserved_why == "slurmctld does not answer"
    slurm.state = "/z/state"  # back, as another cluster of the same name and port
    t = 101.0 + ex.probe_every_s
    ex.observe(t, nodes)  # the probe asks, on a thread of its own
    assert ex._probe.thread is not None
    ex._probe.thread.join(timeout=10)
    for step in range(0, 120, 5):  # long past `vanish_after_s`: its run is not lost
        seen = ex.observe(t + step, nodes)
        if ex._probe.thread is not None:
            ex._probe.thread.join(timeout=10)
        assert seen.exits == () and seen.starts == () and 3 in seen.running, step
        assert seen.unobserved == frozenset({"vm"}), step
        assert seen.unobserved_why.startswith("the slurmctld that answers is another cluster"), seen
    assert "slurm_state /z/state (answering) against /x/state" in caplog.text
    assert sum("another cluster" in r.getMessage() for r in caplog.records) == 1  # said once
    before = len(slurm.calls)
    assert ex.carry_out(Orders(stops=(3,)), t + 121) == ()  # no scancel there
    assert not [a for a in slurm.calls[before:] if a[0] in ("scancel", "sbatch")]
    slurm.state = "/x/state"  # this server's cluster answers again: read as before
    t += 130
    for step in range(0, 20, 5):
        seen = ex.observe(t + step, nodes)
        if ex._probe.thread is not None:
            ex._probe.thread.join(timeout=10)
    assert seen.unobserved_why == "" and 3 in seen.running
    assert "this server's Slurm cluster answers again" in caplog.text


def test_a_take_while_another_cluster_answers_is_refused_by_the_check(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    slurm.state = "/z/state"
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    ex._run = slurm.run  # type: ignore[method-assign]
    ex.cluster = Watch(ex.cluster.read, {"slurm_cluster": "gpuledger at 127.0.0.1 port 27500",
                                         "slurm_state": "/x/state"})  # fmt: skip
    with pytest.raises(OtherCluster, match="slurm_state /z/state"):
        ex.check()


def test_a_change_of_cluster_is_named_and_an_earlier_record_is_none() -> None:
    from ledger.engines.slurm.cluster import changed

    x = {"slurm_cluster": "gpuledger at 127.0.0.1 port 27500", "slurm_state": "/x/state"}
    y = {"slurm_cluster": "gpuledger at 127.0.0.1 port 27502", "slurm_state": "/y/state"}
    assert changed(x, x) == "" and changed({}, y) == ""  # the same; recorded by none
    assert changed(x, y) == (
        "slurm_cluster gpuledger at 127.0.0.1 port 27500 (recorded) against gpuledger at "
        "127.0.0.1 port 27502 here; slurm_state /x/state (recorded) against /y/state here"
    )
    assert changed({"slurm_cluster": x["slurm_cluster"]}, y).startswith("slurm_cluster")


# Another cluster's job under run 3's Slurm id (not of this ledger: no comment), FAILED exit 3.
OTHERS = (
    "JobId=3 JobName=wrap UserId=root(0) JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0"
    " StartTime=2026-11-30T18:30:00 EndTime=2026-11-30T18:30:01 Partition=gpuledger"
    " NodeList=vm NumNodes=1 Nodes=vm CPU_IDs=0 Mem=0 Comment=(null)"
)


class SwappedSlurm(FakeSlurm):
    """The other cluster (`/z/state`) lists its own job 3 (`OTHERS`) under run 3's id."""

    def run(self, args: list[str], stdin: str | None = None, env: object = None) -> str:
        if self.state == "/z/state" and args[:5] == ["scontrol", "-d", "-o", "show", "job"]:
            self.calls.append(args)
            return OTHERS
        if args[0] == "sbatch":
            self.calls.append(args)
            return "9;gpuledger\n"
        return super().run(args, stdin, env)


def test_a_controller_swapped_within_scontrols_retries_is_never_acted_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """atk44ha F1: a controller killed and replaced by another cluster's within scontrol's own
    retries is never an outage, and the identity was asked only every 5 s: meanwhile the
    other's job under the run's Slurm id ended the run (`failed`, exit 3), and sbatch and
    scancel went there. Now a job whose comment is not the run's is not the run (missing), and
    the identity is confirmed before any sbatch or scancel (said once)."""
    from ledger.cycle.executor import Launch
    from schemas.events import GpuSlot

    slurm = SwappedSlurm()
    ex = SlurmExecutor("gpuledger", LID, tmp_path, run_as="service")
    ex._run = slurm.run  # type: ignore[method-assign]
    ex.cluster = Watch(ex.cluster.read, {"slurm_cluster": "gpuledger at 127.0.0.1 port 27500",
                                         "slurm_state": "/x/state"})  # fmt: skip
    nodes = {"vm": Node(name="vm", cluster="c", gpus=4, gpu_type="fake")}
    assert ex.adopt({3: 1}, 100.0) == {3}
    ex.observe(100.0, nodes)  # the identity asked: this server's cluster
    slurm.state = "/z/state"  # swapped at once: no read ever fails
    seen = ex.observe(101.0, nodes)
    assert seen.exits == () and 3 in seen.running  # not ended by another cluster's job
    before = len(slurm.calls)
    launch = Launch(4, (GpuSlot(node="vm", gpu_indices=(2,)),), ("true",), None, "alice", "p")
    ex.carry_out(Orders(stops=(3,), launches=(launch,)), 102.0)
    acted = [a for a in slurm.calls[before:] if a[0] in ("scancel", "sbatch")]
    assert acted == [], acted
    said = [r for r in caplog.records if "another cluster" in r.getMessage()]
    assert len(said) == 1, said
    for step in range(3, 40):  # what this read sees is not the run's: it stays running
        seen = ex.observe(100.0 + step, nodes)
        if ex._probe.thread is not None:
            ex._probe.thread.join(timeout=10)
        assert seen.exits == () and 3 in seen.running, step
    assert not [a for a in slurm.calls[before:] if a[0] in ("scancel", "sbatch")]
    assert sum("another cluster" in r.getMessage() for r in caplog.records) == 1


def test_a_job_under_a_runs_id_whose_comment_is_another_is_never_stopped(tmp_path: Path) -> None:
    """atk44ha F1 (a): on this server's own cluster, a job under the run's Slurm id whose
    comment is not the run's (Slurm gave the id again) is not the run: a stop of the run sends
    it no signal, and its GPUs count as foreign work's."""
    slurm = FakeSlurm()
    ex = SlurmExecutor("gpuledger", LID, tmp_path)
    ex._run = slurm.run  # type: ignore[method-assign]
    nodes = {"vm": Node(name="vm", cluster="c", gpus=4, gpu_type="fake")}
    assert ex.adopt({3: 1}, 100.0) == {3}
    ex.observe(100.0, nodes)
    other = RUNNING.replace("job=3:run=1", "job=3:run=0").replace("gpuledger-3", "x")

    def swapped(args: list[str], stdin: str | None = None, env: object = None) -> str:
        return other if args[:5] == ["scontrol", "-d", "-o", "show", "job"] else slurm.run(args)

    ex._run = swapped  # type: ignore[method-assign]
    seen = ex.observe(100.5, nodes)
    assert seen.exits == () and 3 in seen.running
    assert seen.foreign == {"vm": frozenset({0, 1})}  # another's: its GPUs are busy
    before = len(slurm.calls)
    ex.carry_out(Orders(stops=(3,)), 101.0)
    assert not [a for a in slurm.calls[before:] if a[0] == "scancel"]


def test_sacct_rows_of_another_job_under_a_runs_id_do_not_end_the_run(tmp_path: Path) -> None:
    """atk44ha F1: a run sbatched onto another cluster kept that cluster's Slurm id, and its
    end was read from the job of that id on its own cluster (job 9's `failed 143` ended job
    15). Only rows of the run's own job name count."""
    from ledger.engines.slurm.restarts import vanished
    from ledger.engines.slurm.tracked import Run

    def sacct(state: str, code: str, name: str) -> Callable[[list[str]], str]:
        row = {"State": state, "ExitCode": code, "End": "2026-12-04T18:21:00", "JobName": name}
        return lambda args: "|".join(row[k] for k in args[args.index("-o") + 1].split(",")) + "\n"

    r = Run(15, 0, None, slurm_id="40082000")
    gone = vanished(r, tmp_path, sacct("FAILED", "143:0", "gpuledger-9"), 1000.0)
    assert gone is not None and (gone.exit_code, gone.reason) == (-1, "lost"), gone
    done = vanished(r, tmp_path, sacct("COMPLETED", "0:0", "gpuledger-15"), 1e10)
    assert done is not None and (done.exit_code, done.engine_state) == (0, "COMPLETED"), done


def test_new_settings_counts_the_runs_still_stopping_on_the_recorded_cluster(
    tmp_path: Path,
) -> None:
    """atk44ha F3: `--new-settings` onto another cluster counted placed and running runs only:
    job 10, cancelled while the controller was away (its stop never reached it, still
    stopping in the ledger), was not named and ran on there, out of the ledger's reach."""
    from ledger.engines.slurm.cluster import runs_held, runs_not_on

    held = runs_held([(9, "running", 0), (10, "cancelled", 1), (11, "completed", 0)], {(10, 1)})
    assert held == [(9, 0), (10, 1)]
    scontrol = tmp_path / "scontrol"  # the new cluster: it lists job 9's run, not job 10's
    listed = RUNNING.replace("JobId=3", "JobId=40").replace("job=3:run=1", "job=9:run=0")
    (tmp_path / "jobs").write_text(listed.replace("gpuledger-3", "gpuledger-9") + "\n")
    scontrol.write_text(f"#!/bin/sh\ncat {tmp_path / 'jobs'}\n")
    scontrol.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    assert runs_not_on(env, "gpuledger", LID, held) == [10]


@pytest.mark.parametrize(
    ("case", "answering", "there", "want"),
    [
        ("this server's cluster answers after it", "", None, "here"),
        ("another answers and lists the run under the id", "another cluster", (4, 0), "there"),
        ("another answers, the id is another job there", "another cluster", (7, 0), "here"),
        ("another answers and lists nothing under the id", "another cluster", None, "here"),
        ("nobody answers after it", None, None, "unknown"),
    ],
)
def test_where_an_sbatch_landed(
    case: str, answering: str | None, there: tuple[int, int] | None, want: str
) -> None:
    from ledger.engines.slurm.cluster import landing

    assert landing(answering, there, (4, 0)) == want, case
    if answering:  # the other's record unread: nobody can tell
        assert landing(answering, there, (4, 0), read=False) == "unknown", case


# The other cluster's record of the run sbatched onto it (job 4 run 0, Slurm id 9).
LANDED = (
    "JobId=9 JobName=gpuledger-4 UserId=root(0) JobState=RUNNING Reason=None ExitCode=0:0"
    " StartTime=2026-12-04T21:00:00 EndTime=Unknown Partition=gpuledger NodeList=vm"
    f" NumNodes=1 Nodes=vm CPU_IDs=0 Mem=0 Comment=gpuledger:{LID}:job=4:run=0"
)


class SwappedDuringSbatch(FakeSlurm):
    """The controller is replaced by another cluster's while sbatch retries (`swap`): the job
    lands there (`LANDED`); sbatch answers Slurm id 9 wherever it lands."""

    def __init__(self, swap: str | None) -> None:
        super().__init__()
        self.swap = swap

    def run(self, args: list[str], stdin: str | None = None, env: object = None) -> str:
        if args[0] == "sbatch":
            self.calls.append(args)
            self.state, self.swap = self.swap or self.state, None
            return "9;gpuledger\n"
        if self.state == "/z/state" and args[:5] == ["scontrol", "-d", "-o", "show", "job"]:
            self.calls.append(args)
            return LANDED
        return super().run(args, stdin, env)


def test_an_sbatch_that_landed_on_another_cluster_is_cancelled_there_and_submitted_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 28, left open by atk44ha F1's fix: a swap in the second before an sbatch, or
    during sbatch's own ~9 s retries, put the run on the other cluster, and the run kept that
    cluster's Slurm id: missing once its own cluster answered, then ended as a vanished run,
    while it ran there. Now the identity is asked again after each sbatch: a run the answering
    cluster lists under the id (its comment) landed there, is cancelled there by its id and
    name, and is submitted again once this server's cluster answers."""
    from ledger.cycle.executor import Launch
    from schemas.events import GpuSlot

    slurm = SwappedDuringSbatch("/z/state")
    ex = SlurmExecutor("gpuledger", LID, tmp_path, run_as="service")
    ex._run = slurm.run  # type: ignore[method-assign]
    ex.cluster = Watch(ex.cluster.read, {"slurm_cluster": "gpuledger at 127.0.0.1 port 27500",
                                         "slurm_state": "/x/state"})  # fmt: skip
    nodes = {"vm": Node(name="vm", cluster="c", gpus=4, gpu_type="fake")}
    assert ex.adopt({3: 1}, 100.0) == {3}
    ex.observe(100.0, nodes)
    launch = Launch(4, (GpuSlot(node="vm", gpu_indices=(2,)),), ("true",), None, "alice", "p")
    ex.carry_out(Orders(launches=(launch,)), 100.2)  # confirmed 0.2 s before: no new ask
    acted = [a for a in slurm.calls if a[0] in ("scancel", "sbatch")]
    assert [a[0] for a in acted] == ["sbatch", "scancel"], acted
    assert acted[1] == ["scancel", "--name=gpuledger-4", "9"]  # there, by its id and name
    assert ex._runs[4].slurm_id is None  # never launched here
    assert "was submitted to another cluster" in caplog.text
    for step in range(1, 40):  # the other cluster answers: nothing more is sent there
        seen = ex.observe(101.0 + step, nodes)
        if ex._probe.thread is not None:
            ex._probe.thread.join(timeout=10)
        assert seen.exits == () and seen.starts == (), step
    assert len([a for a in slurm.calls if a[0] in ("scancel", "sbatch")]) == 2
    slurm.state = "/x/state"  # this server's cluster answers again: submitted there
    for step in range(0, 20, 5):
        ex.observe(150.0 + step, nodes)
        if ex._probe.thread is not None:
            ex._probe.thread.join(timeout=10)
    assert [a[0] for a in slurm.calls if a[0] in ("scancel", "sbatch")] == [
        "sbatch",
        "scancel",
        "sbatch",
    ]
    assert ex._runs[4].slurm_id == "9"


def test_an_sbatch_that_landed_here_before_a_swap_is_kept(tmp_path: Path) -> None:
    """The swap came after the sbatch reached this server's cluster: the other lists nothing
    of the run under its id, so the run keeps it (its cluster lists it when it answers)."""
    from ledger.cycle.executor import Launch
    from schemas.events import GpuSlot

    class LandedHere(SwappedDuringSbatch):
        def run(self, args: list[str], stdin: str | None = None, env: object = None) -> str:
            if self.state == "/z/state" and args[:5] == ["scontrol", "-d", "-o", "show", "job"]:
                return ""
            return super().run(args, stdin, env)

    slurm = LandedHere("/z/state")
    ex = SlurmExecutor("gpuledger", LID, tmp_path, run_as="service")
    ex._run = slurm.run  # type: ignore[method-assign]
    nodes = {"vm": Node(name="vm", cluster="c", gpus=4, gpu_type="fake")}
    assert ex.adopt({3: 1}, 100.0) == {3}
    ex.observe(100.0, nodes)  # the first cluster read is this server's (`/x/state`)
    launch = Launch(4, (GpuSlot(node="vm", gpu_indices=(2,)),), ("true",), None, "alice", "p")
    ex.carry_out(Orders(launches=(launch,)), 100.2)
    assert ex._runs[4].slurm_id == "9"
    assert [a[0] for a in slurm.calls if a[0] in ("scancel", "sbatch")] == ["sbatch"]


def test_new_settings_says_what_becomes_of_the_runs_left_on_the_recorded_cluster() -> None:
    """atk44ha L1: `--abandon-runs` said the abandoned runs "run on, unaccounted, where they
    are", but a server that talks to that cluster again stops them; and the refusal named a
    job placed and never submitted as one that runs on the recorded cluster (it is submitted
    again on the new one)."""
    from ledger.engines.slurm.cluster import left_behind

    status = {9: "running", 10: "stopping", 12: "placed"}
    assert left_behind([9, 10, 12], status, False) == (
        "would record lost 1 runs the ledger holds that it does not list (jobs 9): they run on "
        "the recorded one; would leave 1 runs being stopped on the recorded one that it does not "
        "list (jobs 10): their end is recorded once a server talks to it again; would submit "
        "again here 1 placed runs it does not list (jobs 12): one submitted on the recorded one "
        "before may start there too"
    )
    assert left_behind([9], status, True) == (
        "recorded lost 1 runs the ledger holds that it does not list (jobs 9): they run on the "
        "recorded one, out of the ledger's reach until a server talks to it again, which stops "
        "them"
    )
    assert left_behind([12], status, True).startswith("submits again here 1 placed runs")
