"""The dispatcher cycle against the real store and projection, and the service with real
subprocesses (the supervised executor)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

from ledger.core.state import Node
from ledger.cycle.dispatcher import Dispatcher, ProjectionRanks, preview
from ledger.cycle.executor import NodeChange, Observed, Orders, Start
from ledger.dispatch.policy import FairShare
from ledger.sim.kernel import KernelExecutor
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from ledger.store.embedded import EmbeddedSource
from projections.projector import Projector
from projections.store import Store
from schemas import commands as c
from schemas import events as e
from schemas.errors import Conflict
from schemas.policy import FairShareConfig
from tests.integration.serverkit import workdir
from tests.integration.waits import wait_for

GPULEDGER = shutil.which("gpuledger", path=str(Path(sys.executable).parent)) or "gpuledger"


def org(ledger: Ledger, nodes: int = 2, gpus: int = 8) -> None:
    ledger.execute(c.InitLedger(actor="root", admin="root"))
    cmds: list[c.AnyCommand] = [
        c.OpenAccount(actor="root", path="ai2", kind="program"),
        c.OpenAccount(actor="root", path="ai2/olmo", kind="project", shares=1),
        c.OpenAccount(actor="root", path="ai2/tulu", kind="project", shares=1),
        c.AddMember(actor="root", user="alice", project="ai2/olmo"),
        c.AddMember(actor="root", user="dan", project="ai2/tulu"),
    ]
    cmds += [
        c.RegisterNode(actor="root", node=f"n{i}", gpu_type="h100", gpus=gpus) for i in range(nodes)
    ]
    ledger.execute_all(cmds)


def submit(user: str, account: str, gpus: int, **kw: object) -> c.SubmitJob:
    return c.SubmitJob(actor=user, account=account, gpus=gpus, **kw)  # type: ignore[arg-type]


def held_twice(events: list[e.AnyEvent]) -> list[tuple[str, int]]:
    """Replays placements and releases independently of the domain: GPUs placed while held."""
    holder: dict[tuple[str, int], int] = {}
    slots: dict[int, list[tuple[str, int]]] = {}
    clashes = []
    for ev in events:
        if isinstance(ev, e.JobPlaced):
            gpus = [(sl.node, i) for sl in ev.slots for i in sl.gpu_indices]
            clashes += [g for g in gpus if g in holder]
            for g in gpus:
                holder[g] = ev.job_id
            slots[ev.job_id] = gpus
        elif isinstance(ev, e.JobPreempted | e.JobFinished):
            for g in slots.pop(ev.job_id, []):
                holder.pop(g, None)
    return clashes


def test_a_cycle_places_by_fair_share_and_records_the_decision(tmp_path: Path) -> None:
    clock = SimClock(1_000.0)
    ledger = Ledger(tmp_path, clock, seeded_ids(1))
    org(ledger, nodes=1)
    # alice used the whole node for 10 h: dan's team now ranks first
    ledger.execute(submit("alice", "ai2/olmo", 8, min_runtime_s=60, duration_s=36_000))
    with Store.open(tmp_path) as store:
        d = Dispatcher(
            ledger,
            ProjectionRanks(Projector(store, EmbeddedSource(tmp_path))),
            FairShare(),
            KernelExecutor(),
        )
        assert [p.job_id for p in d.cycle(clock.now()).decision.placements] == [1]
        clock.advance_to(1_000.0 + 36_000)
        ledger.execute_all(
            [
                submit("alice", "ai2/olmo", 8, min_runtime_s=60),
                submit("dan", "ai2/tulu", 8, min_runtime_s=60),
            ]
        )
        result = d.cycle(clock.now())
    assert result.appended and result.finished == 1
    assert [p.job_id for p in result.decision.placements] == [3]
    assert [cd.job_id for cd in result.decision.considered()] == [3, 2]
    decided = [ev for _, ev in ledger.read(0, 1000) if isinstance(ev, e.CycleDecided)]
    assert decided[-1].based_on == result.position and decided[-1].placed == (3,)
    # job 3 took the free GPUs
    assert decided[-1].waiting.first == (e.WaitingJob(2, "WAIT_PRIORITY"),)
    assert decided[-1].waiting.considered == 2
    ranks = decided[-1].ranks
    assert ranks is not None and ranks.position == result.position
    assert ranks.usage == e.UsageSettings(window_s=7 * 24 * 3600.0)
    assert decided[-1].policy == FairShareConfig()


def test_cycles_that_decide_nothing_are_recorded_as_counts_at_a_bounded_rate(
    tmp_path: Path,
) -> None:
    clock = SimClock(1_000.0)
    ledger = Ledger(tmp_path, clock, seeded_ids(1))
    org(ledger, nodes=1)
    ledger.execute(submit("alice", "ai2/olmo", 8, min_runtime_s=28_800))
    with Store.open(tmp_path) as store:
        d = Dispatcher(
            ledger,
            ProjectionRanks(Projector(store, EmbeddedSource(tmp_path))),
            FairShare(),
            KernelExecutor(),
            idle_record_s=60.0,
        )
        assert d.cycle(clock.now()).appended  # job 1 holds the node inside its contract
        ledger.execute(submit("dan", "ai2/tulu", 8, min_runtime_s=60))
        appended = []
        for t in range(10, 200, 10):  # 19 cycles, 10 s apart, that cannot place job 2
            clock.advance_to(1_000.0 + t)
            appended.append(d.cycle(clock.now()).appended)
    decided = [ev for _, ev in ledger.read(0, 1000) if isinstance(ev, e.CycleDecided)]
    assert appended.count(True) == len(decided) - 1 == 3  # at t = 60, 120, 180
    idle = decided[1:]
    assert [ev.decided_at for ev in idle] == [1_060.0, 1_120.0, 1_180.0]
    assert [ev.skipped_cycles for ev in idle] == [5, 5, 5]
    assert all(ev.placed == () and ev.preempted == () for ev in idle)
    assert all(ev.waiting.first == (e.WaitingJob(2, "WAIT_CONTRACT"),) for ev in idle)


class Scripted(KernelExecutor):
    """The kernel's executor, counting the cycle's calls, with node changes and foreign GPUs
    said by the test (what Slurm or the agents' timeout would say)."""

    def __init__(self) -> None:
        super().__init__({1: None, 2: None})
        self.calls: list[str] = []
        self.nodes: tuple[NodeChange, ...] = ()
        self.foreign: dict[str, frozenset[int]] = {}

    def observe(self, now: float, nodes: Mapping[str, Node]) -> Observed:
        self.calls.append("observe")
        seen = super().observe(now, nodes)
        changes, self.nodes = self.nodes, ()
        return dataclasses.replace(seen, nodes=changes, foreign=self.foreign)

    def carry_out(self, orders: Orders, now: float) -> tuple[Start, ...]:
        self.calls.append("carry_out")
        return super().carry_out(orders, now)


def test_a_cycle_observes_once_and_carries_out_once_and_a_lost_node_is_an_observation(
    tmp_path: Path,
) -> None:
    clock = SimClock(1_000.0)
    ledger = Ledger(tmp_path, clock, seeded_ids(1))
    org(ledger, nodes=2)
    ledger.execute(submit("alice", "ai2/olmo", 8, min_runtime_s=60, resumable=True))
    ex = Scripted()
    ex.foreign = {"n0": frozenset({0})}  # work outside the ledger holds a GPU of n0
    with Store.open(tmp_path) as store:
        d = Dispatcher(
            ledger, ProjectionRanks(Projector(store, EmbeddedSource(tmp_path))), FairShare(), ex
        )
        result = d.cycle(clock.now())
        assert ex.calls == ["observe", "carry_out"]
        (placed,) = result.decision.placements
        assert [sl.node for sl in placed.slots] == ["n1"] and result.started == 1
        # the engine says n1 is lost: recorded before anything else, the job is requeued and
        # (n0 still holding a foreign GPU) waits
        ex.calls.clear()
        ex.nodes = (NodeChange("n1", "lost", "no word from its agent for 61s"),)
        clock.advance_to(1_100.0)
        result = d.cycle(clock.now())
        assert ex.calls == ["observe", "carry_out"]  # the lost run is stopped
        assert ledger.state.nodes["n1"].state == "lost"
        assert ledger.state.jobs[1].status == "pending" and not result.decision.placements
        assert ex.observe(clock.now(), {}).running == set()
    lost = [ev for _, ev in ledger.read(0, 1000) if isinstance(ev, e.NodeLost)]
    assert [(ev.node, ev.reason) for ev in lost] == [("n1", "no word from its agent for 61s")]


def test_two_dispatchers_deciding_on_the_same_position_never_double_book(tmp_path: Path) -> None:
    clock = SimClock(1_000.0)
    first = Ledger(tmp_path, clock, seeded_ids(1))
    org(first, nodes=1)
    first.execute(submit("alice", "ai2/olmo", 8, min_runtime_s=60))
    second = Ledger(tmp_path, clock, seeded_ids(2))
    with Store(":memory:") as store:
        ranks = ProjectionRanks(Projector(store, EmbeddedSource(tmp_path)))
        _, d1 = preview(first, ranks, FairShare(), clock.now())
        _, d2 = preview(second, ranks, FairShare(), clock.now())
    assert d1.placements and d1.placements == d2.placements
    first.execute(d1.to_command("@dispatcher", "c1"))
    with pytest.raises(Conflict) as err:
        second.execute(d2.to_command("@dispatcher", "c2"))
    assert err.value.fields["expected"] == d2.based_on
    assert held_twice([ev for _, ev in second.read(0, 1000)]) == []


def test_racing_dispatcher_threads_never_double_book(tmp_path: Path) -> None:
    clock = SimClock(1_000.0)
    setup = Ledger(tmp_path, clock, seeded_ids(1))
    org(setup, nodes=2, gpus=4)
    setup.execute_all(
        [
            submit(
                "alice" if i % 2 else "dan",
                "ai2/olmo" if i % 2 else "ai2/tulu",
                1 + i % 3,
                min_runtime_s=0,
                duration_s=1.0,
            )
            for i in range(40)
        ]
    )
    errors: list[BaseException] = []

    def run(seed: int) -> None:
        try:
            ledger = Ledger(tmp_path, clock, seeded_ids(seed))
            with Store(":memory:") as store:
                d = Dispatcher(
                    ledger,
                    ProjectionRanks(Projector(store, EmbeddedSource(tmp_path))),
                    FairShare(),
                    KernelExecutor(),
                )
                for _ in range(25):
                    d.cycle(clock.now())
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    events = [ev for _, ev in Ledger(tmp_path, clock, seeded_ids(9)).read(0, 100_000)]
    placed = [ev for ev in events if isinstance(ev, e.JobPlaced)]
    assert placed, "the racing dispatchers placed nothing"
    assert held_twice(events) == []


def run_cli(
    home: Path, *args: str, actor: str = "root", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env |= {"GPULEDGER_HOME": str(home), "GPULEDGER_USER": actor}
    proc = subprocess.run(
        [GPULEDGER, *args], env=env, capture_output=True, text=True, timeout=timeout,
        cwd=workdir(home),  # a submission's directory: never the repository
    )  # fmt: skip
    assert proc.returncode == 0, f"{args}: {proc.stderr}"
    return proc


def test_up_runs_real_processes_with_their_gpus_and_preempts_unfunded_work(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run_cli(home, "init", "--admin", "root")
    budget = tmp_path / "b.toml"
    budget.write_text(
        '[accounts."ai2"]\nkind = "program"\n'
        '[accounts."ai2/olmo"]\nkind = "project"\nmembers = ["alice", "bob"]\n'
    )
    run_cli(home, "budget", "apply", str(budget))
    run_cli(home, "node", "add", "local", "--gpus", "4", "--gpu-type", "sim")
    # an unfunded job holds every GPU; `sleep` exits on SIGTERM
    run_cli(
        home,
        "submit",
        "-A",
        "ai2/olmo",
        "-G",
        "4",
        "--min-runtime",
        "0",
        "--",
        "sleep",
        "60",
        actor="bob",
    )
    up = ("up", "--run-as", "service", "--interval", "0.2s", "--log-level", "WARNING")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env |= {"GPULEDGER_HOME": str(home), "GPULEDGER_USER": "root"}
    first = subprocess.Popen([GPULEDGER, *up], env=env, stderr=subprocess.DEVNULL)
    try:  # once the job runs (the CLI asks the service on its socket), the service is stopped
        wait_for("the service's socket", (home / "gpuledger.sock").exists)
        wait_for("job 1 to run", lambda: '"running"' in run_cli(home, "jobs", "--json").stdout)
        first.terminate()
        assert first.wait(timeout=60) == 0
    finally:
        first.kill()
    jobs = {j["job_id"]: j for j in json.loads(run_cli(home, "jobs", "--json").stdout)}
    assert jobs[1]["status"] == "running"  # the service stopped; its job did not
    # the next service adopts it; a funded job arrives while it runs and preempts it
    script = 'echo "gpus=$CUDA_VISIBLE_DEVICES job=$GPULEDGER_JOB_ID"; exit 7'
    up_log = (tmp_path / "up.log").open("w")
    proc = subprocess.Popen(
        [GPULEDGER, *up, "--grace", "1s", "--until-idle", "--for", "60s", "--log-level", "info"],
        env=env,
        stderr=up_log,
    )
    try:
        import time

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait until the unfunded job runs
            if (workdir(home) / "gpuledger-1.out").exists():
                break
            time.sleep(0.1)
        run_cli(
            home,
            "submit",
            "-A",
            "ai2/olmo",
            "-G",
            "2",
            "--min-runtime",
            "1h",
            "--",
            "sh",
            "-c",
            script,
            actor="alice",
        )
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        up_log.close()
    jobs = {j["job_id"]: j for j in json.loads(run_cli(home, "jobs", "--json").stdout)}
    assert jobs[1]["outcome"] == "preempted"
    assert jobs[2]["outcome"] == "failed"
    said = (tmp_path / "up.log").read_text()
    out = workdir(home) / "gpuledger-2.out"  # sbatch's default: where it was submitted from
    assert f"job 2 (ai2/olmo, alice, 2 GPUs) failed (exit code 7); output: {out}" in said
    assert "job 1 preempted (fairness)" in said
    log = (workdir(home) / "gpuledger-2.out").read_text()
    assert log.strip() in ("gpus=0,1 job=2", "gpus=2,3 job=2")
    why = run_cli(home, "explain", "1").stdout
    assert "preempted for fairness (unfunded) to make room for job 2" in why
    assert "it was unfunded (no contract)" in why
    finished = [
        r["event"]
        for r in json.loads(run_cli(home, "log", "--json", "--limit", "1000").stdout)
        if r["event"]["type"] == "job.finished.v2"
    ]
    assert {(f["job_id"], f["outcome"], f.get("exit_code")) for f in finished} >= {(2, "failed", 7)}
