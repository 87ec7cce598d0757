"""Simulations through the real ledger: tiny hand-made workloads whose outcome is worked out by
hand, determinism of the event log, and equivalence of the two rank sources."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from ledger.core.budget import BudgetAccount, BudgetFile
from ledger.dispatch import registry
from ledger.history.replay import find_decisions, replay_home
from ledger.sim.ranks import IncrementalRanks
from ledger.sim.runner import START_AT, Cluster, Drain, RunResult, SimConfig, simulate
from ledger.sim.workload import SimJob, Synthetic, Workload, synthetic
from ledger.store.application import Ledger
from ledger.store.clock import SimClock
from ledger.store.embedded import EmbeddedSource
from projections import fairshare as fs
from projections import queries
from projections.fairshare import UsagePolicy
from projections.projector import Projector
from projections.store import Store
from projections.testing import reference
from projections.usage import FOLD, UsageFold
from schemas import events as e

H = 3600
POLICY_NAMES = registry.NAMES


def two_teams() -> BudgetFile:
    """lab/a (alice) and lab/b (bob), 50/50."""
    return BudgetFile(
        accounts={
            "lab": BudgetAccount(kind="program"),
            "lab/a": BudgetAccount(kind="project", shares=1, members=["alice"]),
            "lab/b": BudgetAccount(kind="project", shares=1, members=["bob"]),
        }
    )


def job(
    key: str, team: str, at: float, gpus: int, hours: float, min_rt: float, **kw: bool
) -> SimJob:
    user = {"lab/a": "alice", "lab/b": "bob"}[team]
    return SimJob(
        key=key,
        account=team,
        user=user,
        submit_s=int(at * H),
        duration_s=int(hours * H),
        gpus=gpus,
        min_runtime_s=int(min_rt * H),
        resumable=kw.get("resumable", True),
    )


def run(tmp_path: Path, jobs: list[SimJob], **cfg: object) -> tuple[RunResult, list[e.AnyEvent]]:
    workload = Workload(name="hand", jobs=tuple(jobs), budget=two_teams())
    config = SimConfig(**{"cluster": Cluster(nodes=2), "days": 0.5, **cfg})  # type: ignore[arg-type]
    result = simulate(workload, config, tmp_path / "home")
    ledger = Ledger(tmp_path / "home", SimClock(START_AT))
    try:
        events = [ev for _, ev in ledger.read(0, 1_000_000)]
    finally:
        ledger.close()
    return result, events


def by_key(events: list[e.AnyEvent]) -> dict[str, list[int]]:
    """Trace key -> ledger job ids (resubmissions add ids)."""
    out: dict[str, list[int]] = {}
    for ev in events:
        if isinstance(ev, e.JobSubmitted):
            out.setdefault(ev.labels["trace_id"], []).append(ev.job_id)
    return out


def hours_of(events: list[e.AnyEvent], kind: type[e.Event], job_id: int) -> list[float]:
    return [
        (ev.at - START_AT) / H
        for ev in events
        if isinstance(ev, kind) and getattr(ev, "job_id", None) == job_id
    ]


@pytest.mark.parametrize(
    ("case", "contract_h", "want_b_placed_h"),
    [
        ("contracts already over: b gets its half at once", 1.0, 2.0),
        ("contracts still running: b gets its half when they end", 4.0, 4.0),
    ],
)
def test_idle_team_returns_and_gets_its_share_back(
    tmp_path: Path, case: str, contract_h: float, want_b_placed_h: float
) -> None:
    # a bursts to the whole cluster (16 GPUs) while b is idle; b returns at 2 h asking its half.
    jobs = [job(f"a{i}", "lab/a", 0, 4, 10, contract_h) for i in range(4)]
    jobs += [job(f"b{i}", "lab/b", 2, 4, 5, 1) for i in range(2)]
    result, events = run(tmp_path, jobs)
    ids = by_key(events)
    for k in ("b0", "b1"):
        assert hours_of(events, e.JobPlaced, ids[k][0]) == [want_b_placed_h], case
        assert hours_of(events, e.JobFinished, ids[k][0]) == [want_b_placed_h + 5]
    preempted = [ev for ev in events if isinstance(ev, e.JobPreempted)]
    a_ids = {ids[f"a{i}"][0] for i in range(4)}
    assert len(preempted) == 2
    assert {p.job_id for p in preempted} <= a_ids
    assert all(p.reason == "fairness" for p in preempted)
    assert {p.for_job for p in preempted} == {ids["b0"][0], ids["b1"][0]}
    assert all((p.at - START_AT) / H == want_b_placed_h for p in preempted)
    # the preempted (resumable) jobs are requeued and placed again when b's jobs end
    for p in preempted:
        assert hours_of(events, e.JobPlaced, p.job_id) == [0.0, want_b_placed_h + 5]
    # b got exactly its half from its return on: 8 GPUs for 5 h
    m = result.metrics
    delivered = {t.team: t.delivered_gpu_h for t in m.team_rows}
    assert delivered["lab/b"] == pytest.approx(8 * 5)


def test_drain_preempts_when_the_contract_ends_and_the_job_comes_back(tmp_path: Path) -> None:
    jobs = [job("x", "lab/a", 0, 8, 10, 2), job("y", "lab/a", 0, 8, 10, 2)]
    drain = Drain(node="n001", at_s=1 * H, back_after_s=5 * H)
    result, events = run(tmp_path, jobs, drains=(drain,))
    ids = by_key(events)
    on_n001 = [
        ev.job_id
        for ev in events
        if isinstance(ev, e.JobPlaced) and ev.slots[0].node == "n001" and ev.at == START_AT
    ]
    assert len(on_n001) == 1
    victim = on_n001[0]
    pre = [ev for ev in events if isinstance(ev, e.JobPreempted)]
    assert [(p.job_id, p.reason, (p.at - START_AT) / H) for p in pre] == [
        (victim, "maintenance", 2.0)
    ]
    drained = [(ev.at - START_AT) / H for ev in events if isinstance(ev, e.NodeDrained)]
    assert drained == [2.0]
    # back at 6 h, the requeued job is placed again on n001
    assert hours_of(events, e.JobPlaced, victim) == [0.0, 6.0]
    other = ids["y"][0] if victim == ids["x"][0] else ids["x"][0]
    assert hours_of(events, e.JobPreempted, other) == []
    assert result.metrics.preemptions_by_reason == {"maintenance": 1}


@pytest.mark.parametrize(
    ("policy", "want_funded_placed_h", "want_lost_gpu_h"),
    [
        ("fairshare", 1.0, 8.0),
        ("slurm", 10.0, 0.0),  # Slurm's default: no preemption
        ("slurm-1", 1.0, 8.0),  # funded over unfunded (a scavenger tier)
        ("legacy", 1.0, 8.0),
        ("legacy-1", 1.0, 8.0),
        ("fifo", 10.0, 0.0),
    ],
)
def test_unfunded_job_is_preempted_by_a_funded_one(
    tmp_path: Path, policy: str, want_funded_placed_h: float, want_lost_gpu_h: float
) -> None:
    # a's unfunded non-resumable job holds the one 8-GPU node; b's funded 4-GPU job comes at 1 h
    jobs = [
        job("u", "lab/a", 0, 8, 10, 0, resumable=False),
        job("f", "lab/b", 1, 4, 2, 1),
    ]
    result, events = run(tmp_path, jobs, policy=policy, cluster=Cluster(nodes=1))
    ids = by_key(events)
    f = ids["f"][0]
    assert hours_of(events, e.JobPlaced, f) == [want_funded_placed_h]
    # the preempted job's whole run (8 GPUs x 1 h) and, counted though its run still goes at
    # the end (12 h; atk53-26 F4), its resubmission's restart (8 GPUs x 5 min)
    restart = 8 * 300 / H if want_lost_gpu_h else 0.0
    assert result.metrics.lost_gpu_h == pytest.approx(want_lost_gpu_h + restart)
    if want_lost_gpu_h:
        u = ids["u"]
        assert len(u) == 2, "the preempted non-resumable job is resubmitted"
        finished = [ev for ev in events if isinstance(ev, e.JobFinished) and ev.job_id == u[0]]
        assert [(x.outcome, (x.at - START_AT) / H) for x in finished] == [("preempted", 1.0)]
        assert hours_of(events, e.JobPlaced, u[1]) == [3.0]  # when f ends
    else:
        assert result.metrics.preemptions == 0


def stored_states(home: Path) -> list[bytes]:
    with sqlite3.connect(home / "events.sqlite") as con:
        return [bytes(r[0]) for r in con.execute("SELECT state FROM stored_events ORDER BY rowid")]


SMALL = Synthetic(seed=3, teams=4, users=12, programs=2, days=1.0, capacity_gpus=32)


def test_same_seed_gives_a_byte_identical_event_log(tmp_path: Path) -> None:
    workload = synthetic(SMALL)
    config = SimConfig(cluster=Cluster(nodes=4), days=1.0, seed=5)
    simulate(workload, config, tmp_path / "one")
    simulate(workload, config, tmp_path / "two")
    one, two = stored_states(tmp_path / "one"), stored_states(tmp_path / "two")
    assert len(one) > 150
    assert one == two


@pytest.mark.parametrize("policy", ["fairshare", "fairshare-10"])
def test_projection_and_incremental_ranks_give_the_same_run(tmp_path: Path, policy: str) -> None:
    """The two rank sources give the same ranks (and, to fairshare-10, the same usage and
    shares behind them: the projection's Fair Tree rows and the fold's tree)."""
    workload = synthetic(SMALL)
    cfg = SimConfig(policy=policy, cluster=Cluster(nodes=4), days=0.5, seed=5)
    simulate(workload, cfg, tmp_path / "inc")
    simulate(workload, SimConfig(**{**cfg.__dict__, "ranks": "projection"}), tmp_path / "proj")
    inc, proj = stored_states(tmp_path / "inc"), stored_states(tmp_path / "proj")
    # the same run, except that each decision names the computation that ranked it
    assert inc != proj
    assert [_computed_by_left_out(x) for x in inc] == [_computed_by_left_out(x) for x in proj]


def _computed_by_left_out(stored: bytes) -> bytes:
    """The stored bytes less the decision's `computed_by` and the hash chain that covers it."""
    out = stored.replace(b',"computed_by":"fold"', b"").replace(b',"computed_by":""', b"")
    return re.sub(rb'"prev_hash":"[^"]*"', b"", out)  # v1 hex or v2:hex


@pytest.mark.parametrize(
    ("case", "policy"),
    [
        ("seven-day window", fs.UsagePolicy()),
        ("seven-day half-life", fs.UsagePolicy(half_life_s=7 * 86_400.0)),
        ("one-hour window (intervals leave it)", fs.UsagePolicy(window_s=3600.0)),
    ],
)
def test_incremental_usage_equals_the_reference_math(
    tmp_path: Path, case: str, policy: fs.UsagePolicy
) -> None:
    workload = synthetic(SMALL)
    simulate(workload, SimConfig(cluster=Cluster(nodes=4), days=1.0, seed=5), tmp_path / "h")
    ledger = Ledger(tmp_path / "h", SimClock(START_AT))
    try:
        ref = reference.fold(ledger.read(0, 1_000_000))
        intervals = ref.usage_intervals()
        inc = IncrementalRanks(ledger, policy)
        for hours in (24.0, 24.5, 26.0, 40.0, 200.0):  # times move forward, as in a run
            at = START_AT + hours * H
            got = inc.usage(at)
            want = fs.leaf_usage(intervals, at, policy)
            assert got.keys() == want.keys(), case
            for leaf, u in want.items():
                assert got[leaf] == pytest.approx(u, rel=1e-9), (case, hours, leaf)
    finally:
        ledger.close()


def test_jobs_running_when_the_simulation_ends_stop_being_charged(tmp_path: Path) -> None:
    # a's job would run for 20 h, past the 12 h simulated period
    result, events = run(tmp_path, [job("a1", "lab/a", 0.0, 8, 20.0, 1.0)])
    end = START_AT + 12 * H
    finished = [ev for ev in events if isinstance(ev, e.JobFinished)]
    assert [(ev.outcome, ev.at, ev.actor) for ev in finished] == [("cancelled", end, "@sim")]
    with Store(":memory:") as store, EmbeddedSource(tmp_path / "home") as source:
        Projector(store, source).catch_up()
        week = UsagePolicy(window_s=7 * 24 * H)
        at_end = {r.name: r.gpu_seconds for r in queries.usage(store, end, policy=week)}
        a_day_later = {
            r.name: r.gpu_seconds for r in queries.usage(store, end + 24 * H, policy=week)
        }
    assert at_end["lab/a"] == a_day_later["lab/a"] == 8 * 12 * H
    assert result.metrics is not None


@pytest.mark.parametrize(
    ("policy", "want_preempted_h"),
    [("fairshare-7", []), ("fairshare-9", [24.1])],
)
def test_a_funded_job_with_no_time_limit_holds_the_cluster_until_a_team_starves(
    tmp_path: Path, policy: str, want_preempted_h: list[float]
) -> None:
    """atk33-26 F3: b's funded non-resumable 8-GPU job with no time limit holds the one node;
    a's 1-GPU jobs come at 0.1 h. Its loss (its whole run) outweighs any 1-GPU job's gain from
    its contract's end on, and grows: under fairshare-7 it holds the node for good. Under
    fairshare-9 a's first job, refused until it has waited a day (`starve_after_s`), takes the
    plan then (its refusal names that time, and the cycle wakes for it)."""
    jobs = [job("x", "lab/b", 0, 8, 100, 1, resumable=False)]
    jobs += [job(f"a{i}", "lab/a", 0.1, 1, 1, 1) for i in range(4)]
    _, events = run(tmp_path, jobs, policy=policy, cluster=Cluster(nodes=1), days=1.5)
    x = by_key(events)["x"][0]
    assert hours_of(events, e.JobPreempted, x) == pytest.approx(want_preempted_h)
    if want_preempted_h:
        (p,) = [ev for ev in events if isinstance(ev, e.JobPreempted)]
        assert p.reason == "fairness" and p.for_job == by_key(events)["a0"][0]


@pytest.mark.parametrize(
    ("policy", "want_first_cycle"),
    [("fairshare-10", {"lab/a": 16, "lab/b": 16}), ("fairshare-9", {"lab/a": 32})],
)
def test_two_job_arrays_at_zero_usage_share_an_idle_cluster_in_the_first_cycle(
    tmp_path: Path, policy: str, want_first_cycle: dict[str, int]
) -> None:
    """Two teams with equal shares and no usage each submit a 64-job array of 1-GPU jobs (1 h
    contracts) onto an idle 32-GPU cluster at once. fairshare-10 charges each placement to its
    team before ranking the next job: the first cycle gives each team half. fairshare-9 ranks
    once per cycle: the first team takes every GPU. The run replays identically."""
    jobs = [job(f"{t}{i}", f"lab/{t}", 0, 1, 2, 1) for t in "ab" for i in range(64)]
    _, events = run(tmp_path, jobs, policy=policy, cluster=Cluster(nodes=4), days=0.2)
    team = {ev.job_id: ev.account for ev in events if isinstance(ev, e.JobSubmitted)}
    first = next(ev for ev in events if isinstance(ev, e.CycleDecided))
    placed: dict[str, int] = {}
    for job_id in first.placed:
        placed[team[job_id]] = placed.get(team[job_id], 0) + 1
    assert placed == want_first_cycle
    replays = list(replay_home(tmp_path / "home"))
    assert replays and not [r.position for r in replays if r.differences or r.error]


@pytest.mark.parametrize(
    "policy",
    [
        *sorted(POLICY_NAMES),
        "slurm-lab-1",
        "fairshare-7",
        "fairshare-8",
        "fairshare-9",
        "fairshare-10",
        "fairshare-11",
        "fairshare-12",
        "fairshare-13",
        "fairshare-14",
        "fairshare-16",
        "fairshare-17",
    ],
)
def test_every_simulated_decision_of_every_policy_replays_identically(
    tmp_path: Path, policy: str
) -> None:
    """The simulator's ranks come from the in-memory usage fold; replay folds the same events
    and gets the same floats (half-life usage included: the slurm baselines' rank digests
    differed from the projection's SQL in the last bits)."""
    workload = synthetic(SMALL)
    simulate(workload, SimConfig(policy=policy, cluster=Cluster(nodes=4), days=1.0, seed=5),
             tmp_path / "h")  # fmt: skip
    decisions = find_decisions(tmp_path / "h")
    assert len(decisions) > 10
    ranked = [d for _, d in decisions if d.ranks is not None]
    if registry.ranked(registry.default_config(policy)):
        assert ranked and all(d.ranks.computed_by == FOLD for d in ranked if d.ranks)
    replays = list(replay_home(tmp_path / "h"))
    differ = [(r.position, r.differences) for r in replays if r.differences or r.error]
    assert not differ


def test_the_fold_gives_the_same_floats_whenever_it_was_asked_before(tmp_path: Path) -> None:
    """Half-life and window usage at a time depend on the events folded, not on the times the
    fold was asked at before (a replay asks only at the recorded decisions)."""
    workload = synthetic(SMALL)
    simulate(workload, SimConfig(cluster=Cluster(nodes=4), days=1.0, seed=5), tmp_path / "h")
    ledger = Ledger(tmp_path / "h", SimClock(START_AT))
    try:
        events = [ev for _, ev in ledger.read(0, 1_000_000)]
    finally:
        ledger.close()
    for policy in (fs.UsagePolicy(half_life_s=7 * 86_400.0), fs.UsagePolicy(window_s=3 * H)):
        often, once = UsageFold(policy), UsageFold(policy)
        for ev in events:
            often.apply(ev)
            once.apply(ev)
            if isinstance(ev, e.JobPlaced):
                often.usage(ev.at)  # asked at every placement
        at = START_AT + 30 * H
        assert often.usage(at) == once.usage(at)
