"""Which Slurm cluster answers is asked again when slurmctld answers after being away (atk43ha
F5; `ledger.engines.slurm.cluster.Watch`): a controller back as another cluster (another
`StateSaveLocation`, the same name and port) was used as this server's, its runs recorded
lost and new work placed there. Now nothing of it is read, placed or stopped, every node is
unobserved and says why, until this server's cluster answers again."""

from __future__ import annotations

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
