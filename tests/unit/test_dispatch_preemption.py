"""Victim choice, contracts, the preemption margin, squatting, the debug lane and maintenance."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
import pytest

from ledger.dispatch import (
    FairShare,
    Fifo,
    NodeView,
    PendingJob,
    Policy,
    RunningJob,
    Snapshot,
    complete_ranks,
    decide,
)
from ledger.dispatch.preemption import divergence, outranks
from ledger.dispatch.snapshot import NodeState
from schemas.events import GpuSlot

NOW = 100_000.0
PAST = NOW - 7200  # placed two hours ago: a 1 h contract has ended
RANKS = complete_ranks({"lab/a/u": 0, "lab/a/v": 1, "lab/b/u": 2, "lab/c/u": 3})
LEVEL_FS = {"lab/a": 4.0, "lab/b": 1.0, "lab/c": 0.5, "lab/a/u": 2.0, "lab/a/v": 1.0}


def node(
    name: str, gpus: int = 8, *, state: NodeState = "active", gpu_type: str = "h100"
) -> NodeView:
    return NodeView(name=name, cluster="c1", gpu_type=gpu_type, gpus=gpus, state=state)


def run(
    job_id: int,
    where: Mapping[str, Sequence[int]],
    account: str = "lab/b",
    *,
    user: str = "u",
    placed_at: float = PAST,
    min_runtime_s: int = 3600,
    resumable: bool = True,
    checkpoint_at: float | None = None,
    low_util_since: float | None = None,
) -> RunningJob:
    slots = tuple(GpuSlot(node=n, gpu_indices=tuple(ix)) for n, ix in where.items())
    return RunningJob(
        job_id=job_id,
        account=account,
        user=user,
        gpus=sum(len(s.gpu_indices) for s in slots),
        slots=slots,
        placed_at=placed_at,
        min_runtime_s=min_runtime_s,
        resumable=resumable,
        checkpoint_at=placed_at if checkpoint_at is None else checkpoint_at,
        low_util_since=low_util_since,
    )


def pend(
    job_id: int,
    gpus: int,
    account: str = "lab/a",
    *,
    user: str = "u",
    funded: bool = True,
    debug: bool = False,
    gpu_type: str | None = None,
) -> PendingJob:
    return PendingJob(
        job_id=job_id,
        account=account,
        user=user,
        gpus=gpus,
        gpu_type=gpu_type,
        min_runtime_s=(600 if debug else 3600) if funded else 0,
        submitted_at=float(job_id),
        debug=debug,
        time_limit_s=600 if debug else None,
    )


def world(
    nodes: Sequence[NodeView],
    running: Sequence[RunningJob],
    pending: Sequence[PendingJob],
    level_fs: Mapping[str, float] = LEVEL_FS,
) -> Snapshot:
    taken = {(sl.node, i) for r in running for sl in r.slots for i in sl.gpu_indices}
    views = tuple(
        msgspec.structs.replace(n, free=tuple(i for i in range(n.gpus) if (n.name, i) not in taken))
        for n in nodes
    )
    return Snapshot(
        position=7,
        nodes=views,
        running=tuple(running),
        pending=tuple(pending),
        ranks=dict(RANKS),
        level_fs=dict(level_fs),
    )


FULL = range(8)
LOW = range(4)
HIGH = range(4, 8)


@dataclass(frozen=True)
class VictimCase:
    name: str
    nodes: list[NodeView]
    running: list[RunningJob]
    pending: list[PendingJob]
    want_preempted: list[tuple[int, str, int | None]]
    """(job id, reason, for job), in order."""
    want_placed: dict[int, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    want_waiting: dict[int, str] = field(default_factory=dict)
    """job id -> wait code."""
    want_wake_at: float | None = None
    policy: Policy = field(default_factory=FairShare)
    level_fs: Mapping[str, float] = field(default_factory=lambda: LEVEL_FS)


VICTIM_CASES = [
    VictimCase(
        "an unfunded job goes before a funded one",
        nodes=[node("n1")],
        running=[run(91, {"n1": LOW}), run(90, {"n1": HIGH}, min_runtime_s=0)],
        pending=[pend(1, 4)],
        want_preempted=[(90, "fairness", 1)],
        want_placed={1: {"n1": (4, 5, 6, 7)}},
    ),
    VictimCase(
        "a squatter past its contract goes before fair-share victims, whatever its rank",
        nodes=[node("n1")],
        running=[
            run(90, {"n1": LOW}, "lab/a", user="v", low_util_since=NOW - 7200),
            run(91, {"n1": HIGH}, checkpoint_at=NOW - 10),
        ],
        pending=[pend(1, 4)],
        want_preempted=[(90, "squatting", 1)],
        want_placed={1: {"n1": (0, 1, 2, 3)}},
    ),
    VictimCase(
        "low utilisation not yet long enough to squat is first among equals",
        nodes=[node("n1")],
        running=[
            run(90, {"n1": LOW}, checkpoint_at=NOW - 3000, low_util_since=NOW - 600),
            run(91, {"n1": HIGH}, checkpoint_at=NOW - 10),
        ],
        pending=[pend(1, 4)],
        want_preempted=[(90, "fairness", 1)],
        want_placed={1: {"n1": (0, 1, 2, 3)}},
    ),
    VictimCase(
        "resumable victims go by the least work lost since their checkpoint",
        nodes=[node("n1")],
        running=[
            run(90, {"n1": LOW}, checkpoint_at=NOW - 3000),
            run(91, {"n1": HIGH}, checkpoint_at=NOW - 100),
        ],
        pending=[pend(1, 4)],
        want_preempted=[(91, "fairness", 1)],
        want_placed={1: {"n1": (4, 5, 6, 7)}},
    ),
    VictimCase(
        "a non-resumable job is spared while a resumable one frees the space",
        nodes=[node("n1"), node("n2")],
        running=[
            run(90, {"n1": FULL}, resumable=False, placed_at=NOW - 4000),
            run(91, {"n2": HIGH}, checkpoint_at=PAST),
            run(92, {"n2": LOW}, placed_at=NOW - 60),
        ],
        pending=[pend(1, 4)],
        want_preempted=[(91, "fairness", 1)],
        want_placed={1: {"n2": (4, 5, 6, 7)}},
    ),
    VictimCase(
        "a non-resumable job is preempted when nothing else frees the space",
        nodes=[node("n1")],
        running=[run(90, {"n1": FULL}, resumable=False)],
        pending=[pend(1, 8)],
        want_preempted=[(90, "fairness", 1)],
        want_placed={1: {"n1": tuple(FULL)}},
    ),
    VictimCase(
        "a job inside its contract is never preempted: the waiting job learns when",
        nodes=[node("n1")],
        running=[run(90, {"n1": FULL}, placed_at=NOW - 100, min_runtime_s=600)],
        pending=[pend(1, 4)],
        want_preempted=[],
        want_waiting={1: "WAIT_CONTRACT"},
        want_wake_at=NOW + 500,
    ),
    VictimCase(
        "freed GPUs must really fit: a past-contract job beside an in-contract one is spared",
        nodes=[node("n1")],
        running=[
            run(90, {"n1": range(2)}),
            run(91, {"n1": range(2, 8)}, placed_at=NOW - 100, min_runtime_s=900),
        ],
        pending=[pend(1, 4)],
        want_preempted=[],
        want_waiting={1: "WAIT_CONTRACT"},
        want_wake_at=NOW + 800,
    ),
    VictimCase(
        "the margin protects a team whose fair share is close",
        nodes=[node("n1")],
        running=[run(90, {"n1": FULL})],
        pending=[pend(1, 4)],
        level_fs={"lab/a": 1.05, "lab/b": 1.0},
        want_preempted=[],
        want_waiting={1: "WAIT_RESOURCES"},
    ),
    VictimCase(
        "a wider gap than the margin preempts",
        nodes=[node("n1")],
        running=[run(90, {"n1": FULL})],
        pending=[pend(1, 4)],
        level_fs={"lab/a": 1.2, "lab/b": 1.0},
        want_preempted=[(90, "fairness", 1)],
        want_placed={1: {"n1": (0, 1, 2, 3)}},
    ),
    VictimCase(
        "a worse-ranked team never preempts a better-ranked one",
        nodes=[node("n1")],
        running=[run(90, {"n1": FULL}, "lab/a")],
        pending=[pend(1, 4, "lab/c")],
        want_preempted=[],
        want_waiting={1: "WAIT_RESOURCES"},
    ),
    VictimCase(
        "members of one team preempt each other only by their leaf fair shares",
        nodes=[node("n1")],
        running=[run(90, {"n1": FULL}, "lab/a", user="v")],
        pending=[pend(1, 4, "lab/a", user="u")],
        want_preempted=[(90, "fairness", 1)],  # lab/a/u 2.0 > lab/a/v 1.0 x 1.1
        want_placed={1: {"n1": (0, 1, 2, 3)}},
    ),
    VictimCase(
        "a job never preempts its own account",
        nodes=[node("n1")],
        running=[run(90, {"n1": FULL}, "lab/a")],
        pending=[pend(1, 4, "lab/a")],
        want_preempted=[],
        want_waiting={1: "WAIT_RESOURCES"},
    ),
    VictimCase(
        "victims on another GPU type do not help",
        nodes=[node("n1"), node("a1", gpu_type="a100")],
        running=[run(90, {"n1": FULL}), run(91, {"a1": FULL}, placed_at=NOW, min_runtime_s=60)],
        pending=[pend(1, 4, gpu_type="a100")],
        want_preempted=[],
        want_waiting={1: "WAIT_CONTRACT"},
        want_wake_at=NOW + 60,
    ),
    VictimCase(
        "a gang job clears whole nodes and leaves nodes with contracts alone",
        nodes=[node("n1"), node("n2"), node("n3")],
        running=[
            run(90, {"n1": FULL}),
            run(91, {"n2": LOW}, min_runtime_s=0),
            run(92, {"n2": HIGH}, "lab/c"),
            run(93, {"n3": FULL}, placed_at=NOW - 10),
        ],
        pending=[pend(1, 16)],
        want_preempted=[(91, "fairness", 1), (90, "fairness", 1), (92, "fairness", 1)],
        want_placed={1: {"n1": tuple(FULL), "n2": tuple(FULL)}},
    ),
    VictimCase(
        "GPUs freed for one job serve the next job in the same cycle",
        nodes=[node("n1")],
        running=[run(90, {"n1": FULL})],
        pending=[pend(1, 4), pend(2, 4)],
        want_preempted=[(90, "fairness", 1)],
        want_placed={1: {"n1": (0, 1, 2, 3)}, 2: {"n1": (4, 5, 6, 7)}},
    ),
    VictimCase(
        "an unfunded job never preempts",
        nodes=[node("n1")],
        running=[run(90, {"n1": FULL}, min_runtime_s=0)],
        pending=[pend(1, 4, funded=False)],
        want_preempted=[],
        want_waiting={1: "WAIT_RESOURCES"},
    ),
    VictimCase(
        "a debug job preempts past-contract work of a better-ranked team",
        nodes=[node("n1")],
        running=[run(90, {"n1": FULL}, "lab/a")],
        pending=[pend(1, 2, "lab/c", debug=True)],
        want_preempted=[(90, "debug", 1)],
        want_placed={1: {"n1": (0, 1)}},
    ),
    VictimCase(
        "with the debug lane off a debug job waits its turn",
        nodes=[node("n1")],
        running=[run(90, {"n1": FULL}, "lab/a")],
        pending=[pend(1, 2, "lab/c", debug=True)],
        policy=FairShare(debug_lane=False),
        want_preempted=[],
        want_waiting={1: "WAIT_RESOURCES"},
    ),
    VictimCase(
        "a debug job cannot end a contract either",
        nodes=[node("n1")],
        running=[run(90, {"n1": FULL}, "lab/a", placed_at=NOW - 10, min_runtime_s=600)],
        pending=[pend(1, 2, "lab/c", debug=True)],
        want_preempted=[],
        want_waiting={1: "WAIT_CONTRACT"},
        want_wake_at=NOW + 590,
    ),
    VictimCase(
        "maintenance preempts expired jobs on a draining node and wakes at the next expiry",
        nodes=[node("n1", state="draining")],
        running=[
            run(90, {"n1": LOW}, "lab/a"),
            run(91, {"n1": HIGH}, placed_at=NOW - 100, min_runtime_s=1000),
        ],
        pending=[],
        want_preempted=[(90, "maintenance", None)],
        want_wake_at=NOW + 900,
    ),
    VictimCase(
        "maintenance frees a gang job's GPUs on active nodes for this cycle",
        nodes=[node("n1", state="draining"), node("n2")],
        running=[run(90, {"n1": FULL, "n2": FULL}, "lab/a")],
        pending=[pend(1, 8, "lab/c")],
        want_preempted=[(90, "maintenance", None)],
        want_placed={1: {"n2": tuple(FULL)}},
    ),
    VictimCase(
        "fifo never preempts",
        nodes=[node("n1")],
        running=[run(90, {"n1": FULL}, min_runtime_s=0)],
        pending=[pend(1, 4)],
        policy=Fifo(),
        want_preempted=[],
        want_waiting={1: "WAIT_RESOURCES"},
    ),
]


@pytest.mark.parametrize("case", VICTIM_CASES, ids=lambda c: c.name)
def test_victims(case: VictimCase) -> None:
    snap = world(case.nodes, case.running, case.pending, case.level_fs)
    d = decide(snap, case.policy, NOW)
    assert [(p.job_id, p.reason, p.for_job) for p in d.preemptions] == case.want_preempted
    placed = {p.job_id: {s.node: s.gpu_indices for s in p.slots} for p in d.placements}
    assert placed == case.want_placed
    assert {j: w.code for j, w in d.waiting.items()} == case.want_waiting
    assert d.wake_at == case.want_wake_at


def test_preemption_notes_explain_the_margin() -> None:
    snap = world([node("n1")], [run(90, {"n1": FULL})], [pend(1, 4)])
    (p,) = decide(snap, FairShare(), NOW).preemptions
    assert p.note == "level fair share lab/a 4 > lab/b 1 x 1.1"


def test_wait_contract_names_the_time_and_the_jobs() -> None:
    running = [run(90, {"n1": FULL}, placed_at=NOW - 100, min_runtime_s=600)]
    d = decide(world([node("n1")], running, [pend(1, 4), pend(2, 8)]), FairShare(), NOW)
    assert d.waiting[1].text() == (
        f"WAIT_CONTRACT: room at t={NOW + 500:g} when the contracts of jobs 90 end"
    )
    assert d.waiting[1].until == NOW + 500
    assert (
        d.waiting[2].text()
        == f"WAIT_CONTRACT: no room before t={NOW + 500:g} (as for job 1, 4 GPUs)"
    )


def test_search_budget_caps_victim_searches_per_cycle() -> None:
    running = [run(90, {"n1": FULL}, "lab/a")]
    pending = [pend(1, 4, "lab/a", user="v"), pend(2, 4, "lab/b")]  # neither may preempt 90
    d = decide(world([node("n1")], running, pending), FairShare(search_budget=1), NOW)
    assert d.waiting[1].code == "WAIT_RESOURCES"
    assert d.waiting[2].text() == (
        "WAIT_PRIORITY: the cycle's victim searches went to jobs ahead of it in the order"
    )
    assert d.budget_spent
    assert not decide(world([node("n1")], running, pending), FairShare(), NOW).budget_spent


@dataclass(frozen=True)
class OutranksCase:
    name: str
    want: bool
    level_fs: dict[str, float]
    waiting: str = "p/a/u"
    victim: str = "p/b/u"
    ranks: dict[str, int] = field(default_factory=lambda: {"p/a/u": 0, "p/b/u": 1})


INF = math.inf
OUTRANKS_CASES = [
    OutranksCase("parts at the project level", True, {"p/a": 3.0, "p/b": 1.0}),
    OutranksCase("within the margin", False, {"p/a": 1.1, "p/b": 1.0}),
    OutranksCase("just past the margin", True, {"p/a": 1.1001, "p/b": 1.0}),
    OutranksCase("a worse rank never outranks", False, {"p/a": 1.0, "p/b": 3.0}, "p/b/u", "p/a/u"),
    OutranksCase("an unused budget outranks a used one", True, {"p/a": INF, "p/b": 5.0}),
    OutranksCase("two unused budgets never preempt each other", False, {"p/a": INF, "p/b": INF}),
    OutranksCase("without level fair shares the rank gap decides", True, {}),
    OutranksCase("the same account never", False, {}, "p/a/u", "p/a/u"),
    OutranksCase("an unranked victim falls back to the rank gap", True, {"p": 2.0}, victim="q/z/u"),
]


@pytest.mark.parametrize("case", OUTRANKS_CASES, ids=lambda c: c.name)
def test_outranks(case: OutranksCase) -> None:
    ok, note = outranks(case.waiting, case.victim, case.ranks, case.level_fs, 0.1, 1)
    assert ok is case.want, note


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ("p/a/u", "p/b/v", ("p/a", "p/b")),
        ("p/a/u", "p/a/v", ("p/a/u", "p/a/v")),
        ("p/a/u", "q/a/u", ("p", "q")),
        ("p/a", "p/a/u", None),
        ("p/a/u", "p/a/u", None),
    ],
)
def test_divergence(a: str, b: str, want: tuple[str, str] | None) -> None:
    assert divergence(a, b) == want
