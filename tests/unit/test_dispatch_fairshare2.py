"""fairshare-2: fairness between teams only, least GPU-seconds lost, the cost model, the debug
lane with its own searches, and the debug reserve."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from ledger.dispatch import FairShare, NodeView, PendingJob, RunningJob, Snapshot, decide
from ledger.dispatch.fairshare2 import FairShare2, fs_ratio, team_fs, team_of
from ledger.dispatch.ordering import Ordered, SortKey
from ledger.dispatch.placement import FreeIndex
from ledger.dispatch.preemption import Ask, plan_gang, plan_gang_least
from ledger.dispatch.registry import default_config, policy_from_config
from ledger.dispatch.snapshot import complete_ranks
from schemas.events import GpuSlot

NOW = 100_000.0
H = 3600.0
RANKS = complete_ranks({"lab/a/u": 0, "lab/a/v": 1, "lab/b/u": 2, "lab/c/u": 3})
LEVEL_FS = {"lab/a": 4.0, "lab/b": 1.0, "lab/c": 0.5, "lab/a/u": 2.0, "lab/a/v": 1.0}


def node(name: str, gpus: int = 8) -> NodeView:
    return NodeView(name=name, cluster="c1", gpu_type="h100", gpus=gpus)


def run(
    job_id: int,
    where: Mapping[str, Sequence[int]],
    account: str = "lab/b",
    *,
    user: str = "u",
    lost_s: float = 0.5 * H,
    min_runtime_s: int = 3600,
    resumable: bool = True,
    placed_ago_s: float = 2 * H,
) -> RunningJob:
    """A running job placed `placed_ago_s` ago (past a 1 h contract) whose last checkpoint was
    `lost_s` ago (non-resumable: `lost_s` is ignored, it loses its whole run)."""
    slots = tuple(GpuSlot(node=n, gpu_indices=tuple(ix)) for n, ix in where.items())
    placed = NOW - max(placed_ago_s, lost_s)
    return RunningJob(
        job_id=job_id,
        account=account,
        user=user,
        gpus=sum(len(s.gpu_indices) for s in slots),
        slots=slots,
        placed_at=placed,
        min_runtime_s=min_runtime_s,
        resumable=resumable,
        checkpoint_at=NOW - lost_s,
    )


def pend(
    job_id: int,
    gpus: int,
    account: str = "lab/a",
    *,
    user: str = "u",
    debug: bool = False,
    funded: bool = True,
) -> PendingJob:
    return PendingJob(
        job_id=job_id,
        account=account,
        user=user,
        gpus=gpus,
        min_runtime_s=(600 if debug else 3600) if funded else 0,
        submitted_at=float(job_id),
        debug=debug,
        time_limit_s=600 if debug else None,
    )


def world(
    nodes: Sequence[NodeView], running: Sequence[RunningJob], pending: Sequence[PendingJob]
) -> Snapshot:
    taken = {(sl.node, i) for r in running for sl in r.slots for i in sl.gpu_indices}
    views = tuple(
        msgspec.structs.replace(n, free=tuple(i for i in range(n.gpus) if (n.name, i) not in taken))
        for n in nodes
    )
    return Snapshot(
        position=7,
        taken_at=NOW,
        nodes=views,
        running=tuple(running),
        pending=tuple(pending),
        ranks=dict(RANKS),
        level_fs=dict(LEVEL_FS),
    )


def preempted(snap: Snapshot, policy: object) -> list[int]:
    d = decide(snap, policy, NOW)  # type: ignore[arg-type]
    return [p.job_id for p in d.preemptions]


def test_teams_are_the_configured_level_and_ratios_are_taken_where_teams_part() -> None:
    assert team_of("lab/a/x", 2) == "lab/a" and team_of("lab/a", 2) == "lab/a"
    assert team_of("lab/a/x", 1) == "lab"
    assert fs_ratio("lab/a", "lab/b", LEVEL_FS) == 4.0
    assert fs_ratio("lab/a", "lab/a", LEVEL_FS) is None


def test_no_fairness_preemption_inside_a_team() -> None:
    # user u of lab/a outranks teammate v by far more than the margin: v1 preempts, v2 does not
    snap = world([node("n1")], [run(10, {"n1": range(8)}, "lab/a", user="v")], [pend(1, 8)])
    assert preempted(snap, FairShare()) == [10]
    assert preempted(snap, FairShare2()) == []
    # another team that lab/a outranks by the margin is preempted
    other = world([node("n1")], [run(10, {"n1": range(8)}, "lab/b")], [pend(1, 8)])
    assert preempted(other, FairShare2()) == [10]


def test_victims_minimise_gpu_seconds_not_seconds() -> None:
    # n1: an 8-GPU job checkpointed 10 min ago (1.33 GPU-h); n2: a 2-GPU job checkpointed 30 min
    # ago (1 GPU-h) beside a job inside its contract. v1 takes the fewest seconds, v2 GPU-seconds.
    running = [
        run(10, {"n1": range(8)}, lost_s=600),
        run(11, {"n2": range(2)}, lost_s=1800),
        run(12, {"n2": range(2, 8)}, placed_ago_s=60, lost_s=60),
    ]
    snap = world([node("n1"), node("n2")], running, [pend(1, 2)])
    assert preempted(snap, FairShare()) == [10]
    assert preempted(snap, FairShare2()) == [11]


def test_a_plan_losing_more_than_it_gains_is_not_taken_and_says_why() -> None:
    snap = world([node("n1")], [run(10, {"n1": range(8)}, lost_s=3 * H)], [pend(1, 8)])
    d = decide(snap, FairShare2(), NOW)
    assert not d.preemptions
    assert "lose 24.00 GPU-h of funded work, more than the 8.00 GPU-h gained" in d.waiting[1].reason
    longer = FairShare2(gain_horizon_s=4 * H)
    (p,) = decide(snap, longer, NOW).preemptions
    assert p.job_id == 10 and "loses 24.00 GPU-h" in p.note and "level fair share" in p.note


def test_fairshare_4_credits_half_the_gain_of_fairshare_3() -> None:
    # an 8-GPU victim that loses 6 GPU-h: below fairshare-3's 8 GPU-h gain, above fairshare-4's 4
    snap = world([node("n1")], [run(10, {"n1": range(8)}, lost_s=0.75 * H)], [pend(1, 8)])
    v3 = policy_from_config(default_config("fairshare-3"))
    v4 = policy_from_config(default_config("fairshare-4"))
    assert preempted(snap, v3) == [10]
    d = decide(snap, v4, NOW)
    assert not d.preemptions
    assert "lose 6.00 GPU-h of funded work, more than the 4.00 GPU-h gained" in d.waiting[1].reason
    assert "(8 GPUs x 1800 s)" in d.waiting[1].reason


def test_fairshare_5_gives_unfunded_jobs_that_never_ran_a_turn_first() -> None:
    # one free node; unfunded job 1 (the better team, ran before) and unfunded job 2 (a worse
    # team, never ran) wait: fairshare-4 places 1 (team order), fairshare-5 places 2
    ran = msgspec.structs.replace(pend(1, 8, "lab/a", funded=False), runs=1)
    fresh = pend(2, 8, "lab/c", funded=False)
    funded = pend(3, 8, "lab/b")
    snap = world([node("n1"), node("n2")], [], [ran, fresh, funded])
    v4 = policy_from_config(default_config("fairshare-4"))
    v5 = policy_from_config(default_config("fairshare-5"))
    assert [j.job_id for _, j in v4.order(snap)] == [3, 1, 2]
    assert [j.job_id for _, j in v5.order(snap)] == [3, 2, 1]  # funded work still goes first
    assert {p.job_id for p in decide(snap, v5, NOW).placements} == {3, 2}
    assert {p.job_id for p in decide(snap, v4, NOW).placements} == {3, 1}


def test_funded_non_resumable_jobs_are_spared_unless_by_the_wide_margin() -> None:
    running = [run(10, {"n1": range(8)}, resumable=False, placed_ago_s=1.5 * H)]
    snap = world([node("n1")], running, [pend(1, 8)])
    generous = FairShare2(gain_horizon_s=10 * H)
    assert preempted(snap, generous) == []  # lab/a over lab/b is 4x, below the 5x wide margin
    wide = msgspec.structs.replace(generous, spare_ratio=3.0)
    d = decide(snap, wide, NOW)
    assert [p.job_id for p in d.preemptions] == [10]
    assert "not resumable: ratio 4 >= 3" in d.preemptions[0].note


def test_debug_jobs_first_own_searches_small_unfunded_or_resumable_victims() -> None:
    running = [
        run(10, {"n1": range(4)}, "lab/a", resumable=False),  # funded non-resumable: never
        run(11, {"n1": range(4, 8)}, "lab/a", lost_s=600),  # resumable, 4 GPUs: a victim
        run(12, {"n2": range(8)}, "lab/a", min_runtime_s=0),  # unfunded but 8 GPUs: too big
    ]
    pending = [pend(1, 4, "lab/a"), pend(2, 2, "lab/c", debug=True)]
    policy = FairShare2(search_budget=0)
    d = decide(world([node("n1"), node("n2")], running, pending), policy, NOW)
    assert d.order[0][1].job_id == 2  # worst team, first in the order
    assert [(p.job_id, p.reason, p.for_job) for p in d.preemptions] == [(11, "debug", 2)]
    assert "debug lane: resumable, 4 GPUs" in d.preemptions[0].note
    assert d.waiting[1].code == "WAIT_PRIORITY"  # the fair-share budget is 0


def test_the_debug_reserve_is_kept_from_funded_work_and_lent_to_unfunded_work() -> None:
    nodes = [node(f"n{i}") for i in range(1, 9)]
    busy = [run(10 + i, {f"n{i}": range(8)}, "lab/a") for i in range(1, 8)]
    policy = FairShare2()
    assert policy.reserved(world(nodes, [], [])) == frozenset({"n8"})
    assert FairShare2(debug_reserve_per=0).reserved(world(nodes, [], [])) == frozenset()
    assert policy.reserved(world(nodes[:7], [], [])) == frozenset()  # too small a pool
    # a funded job waits although n8 is free; an unfunded one borrows it
    d = decide(world(nodes, busy, [pend(1, 8), pend(2, 8, funded=False)]), policy, NOW)
    assert 1 in d.waiting and [p.job_id for p in d.placements] == [2]
    assert {s.node for p in d.placements for s in p.slots} == {"n8"}
    # a debug job takes the reserve back from unfunded work; funded jobs never pick victims there
    lent = [*busy, run(30, {"n8": range(8)}, "lab/c", min_runtime_s=0)]
    d = decide(world(nodes, lent, [pend(1, 8, "lab/c"), pend(3, 4, debug=True)]), policy, NOW)
    assert [(p.job_id, p.for_job) for p in d.preemptions] == [(30, 3)]
    assert [p.job_id for p in d.placements] == [3] and 1 in d.waiting


def test_a_least_loss_plan_puts_back_victims_it_does_not_need() -> None:
    # n1: a 1-GPU job (0.5 GPU-h) and a 4-GPU job (2 GPU-h) hold 5 of 8 GPUs, 3 more are held
    # inside a contract; a 4-GPU job needs only the 4-GPU victim, not the cheaper 1-GPU one too
    running = [
        run(10, {"n1": [0]}, lost_s=1800),
        run(11, {"n1": range(1, 5)}, lost_s=1800),
        run(12, {"n1": range(5, 8)}, placed_ago_s=60, lost_s=60),
    ]
    d = decide(world([node("n1")], running, [pend(1, 4)]), FairShare2(), NOW)
    assert [p.job_id for p in d.preemptions] == [11]
    assert d.placements[0].slots[0].gpu_indices == (1, 2, 3, 4)


def test_gang_victims_minimise_gpu_seconds_where_greedy_would_not() -> None:
    # a 16-GPU gang job needs n3 (free) and one cleared node: n1 holds four 2-GPU jobs, each
    # losing 1 GPU-h (4 GPU-h to clear it), n2 one 8-GPU job losing 1.33 GPU-h. The victims in
    # victim order (cheapest first) clear n1 first, so a greedy plan takes n1; the least-cost
    # plan takes n2.
    running = [
        *(run(10 + i, {"n1": (2 * i, 2 * i + 1)}, lost_s=1800) for i in range(4)),
        run(20, {"n2": range(8)}, lost_s=600),
    ]
    snap = world([node("n1"), node("n2"), node("n3")], running, [pend(1, 16)])
    greedy = msgspec.structs.replace(FairShare2(), debug_reserve_per=0)
    d = decide(snap, greedy, NOW)
    assert [p.job_id for p in d.preemptions] == [20]
    assert {sl.node for sl in d.placements[0].slots} == {"n2", "n3"}
    # the same victims through the greedy search clear n1, losing three times as much
    pools = FreeIndex(snap.nodes)
    victims = sorted(greedy.victims(pend(1, 16), snap.running, snap, NOW), key=lambda v: v.cost)
    first = plan_gang(Ask(16, pools.pools_for(None, None), pools, NOW), victims)
    least = plan_gang_least(Ask(16, pools.pools_for(None, None), pools, NOW), victims)
    assert first is not None and least is not None
    assert sorted(v.job.job_id for v in first.victims) == [10, 11, 12, 13]
    assert sum(v.cost[1] for v in first.victims) == 4 * 2 * 1800
    assert [v.job.job_id for v in least.victims] == [20] and least.victims[0].cost[1] == 8 * 600
    assert set(least.nodes) == {"n2", "n3"}


def test_gang_least_cost_prefers_a_lower_class_then_fewer_gpu_seconds() -> None:
    # n1: an unfunded job (class 0) losing a lot; n2, n3: resumable funded jobs (class 2)
    # losing little. One node to clear: the unfunded one, whatever it loses. Two: a resumable
    # job must go either way (the highest class is 2), so the two that lose least, n2 and n3.
    running = [
        run(10, {"n1": range(8)}, lost_s=4 * H, min_runtime_s=0),
        run(11, {"n2": range(8)}, lost_s=600),
        run(12, {"n3": range(8)}, lost_s=300),
    ]
    snap = world([node("n1"), node("n2"), node("n3")], running, [])
    policy = msgspec.structs.replace(FairShare2(), debug_reserve_per=0)
    idx = FreeIndex(snap.nodes)
    victims = sorted(policy.victims(pend(1, 8), snap.running, snap, NOW), key=lambda v: v.cost)
    one = plan_gang_least(Ask(8, idx.pools_for(None, None), idx, NOW), victims)
    two = plan_gang_least(Ask(16, idx.pools_for(None, None), idx, NOW), victims)
    assert one is not None and [v.job.job_id for v in one.victims] == [10]
    assert two is not None and sorted(v.job.job_id for v in two.victims) == [11, 12]
    assert plan_gang_least(Ask(32, idx.pools_for(None, None), idx, NOW), victims) is None


def test_a_team_under_its_share_is_no_fairness_victim_whatever_its_program() -> None:
    # prog q as a whole uses far more than prog p (p outranks q), but team q/small uses less
    # than its share of the tree (2 x 0.6 = 1.2 > 1): p's job may take q/big's GPUs, not q/small's
    ranks = complete_ranks({"p/x/u": 0, "q/small/u": 1, "q/big/u": 2})
    level_fs = {"p": 3.0, "q": 0.6, "p/x": 1.0, "q/small": 2.0, "q/big": 0.5}
    running = [
        run(10, {"n1": range(8)}, "q/small", lost_s=60),
        run(11, {"n2": range(8)}, "q/big", lost_s=1800),
    ]
    snap = msgspec.structs.replace(
        world([node("n1"), node("n2")], running, [pend(1, 8, "p/x")]),
        ranks=ranks,
        level_fs=level_fs,
    )
    policy = msgspec.structs.replace(FairShare2(), debug_reserve_per=0)
    assert team_fs("q/small", level_fs) == 2.0 * 0.6 and team_fs("q/big", level_fs) == 0.3
    d = decide(snap, policy, NOW)
    assert [p.job_id for p in d.preemptions] == [11]  # not 10, though it loses less
    assert d.preemptions[0].note.startswith("team share p/x 3 > q/big 0.3 x 1.1")
    # with q/small alone in the way, the job waits
    alone = msgspec.structs.replace(snap, running=(running[0],), nodes=snap.nodes[:1])
    assert decide(alone, policy, NOW).preemptions == ()


def test_the_order_is_one_sort_of_every_key_and_decide_pauses_the_collector() -> None:
    """The order sorts jobs in groups of equal key heads (a speed-up): the same order as one
    sort of all the keys. `decide()` pauses the cyclic collector while it runs (its tuples are
    freed by reference counting) and leaves it as it found it."""
    import gc
    import random

    rng = random.Random(11)
    pending = tuple(
        PendingJob(
            job_id=i,
            account=rng.choice(("a/x", "a/y", "b/z")),
            user=rng.choice(("u1", "u2")),
            gpus=rng.choice((1, 2, 8)),
            min_runtime_s=rng.choice((0, 600)),
            submitted_at=float(rng.randrange(50)),
            priority=rng.randrange(3),
            debug=rng.random() < 0.2,
            runs=rng.randrange(2),
        )
        for i in range(1, 400)
    )
    snap = Snapshot(
        position=1,
        taken_at=100.0,
        nodes=(
            NodeView(
                name="n1",
                cluster="c",
                gpu_type="h100",
                gpus=8,
                state="active",
                free=tuple(range(8)),
            ),
        ),
        running=(),
        pending=pending,
        ranks={"a": 0, "b": 1, "a/x": 0, "a/y": 1, "b/z": 2},
        level_fs={},
    )
    seen: list[bool] = []

    class Watched(FairShare2, frozen=True, kw_only=True):
        def order(self, snapshot: Snapshot) -> list[tuple[SortKey, PendingJob]]:
            seen.append(gc.isenabled())
            return super().order(snapshot)

    for version in ("fairshare-3", "fairshare-6"):
        keyed = FairShare2(version=version).order(snap)
        assert keyed == sorted(keyed, key=lambda kj: kj[0])
        assert [j.job_id for _, j in keyed] != sorted(j.job_id for j in pending)
    assert gc.isenabled()
    d = decide(snap, Watched(version="fairshare-6"), 100.0)
    assert seen == [False] and gc.isenabled()
    # the cycle reads the jobs alone: the (key, job) pairs are built when a reader asks
    order = d.order
    assert isinstance(order, Ordered) and order._pairs is None
    d.summary()
    assert order._pairs is not None and list(order) == FairShare2(version="fairshare-6").order(snap)


def test_a_job_blocked_by_a_protected_victim_is_told_so_at_read_time() -> None:
    """atk34-26 F4: a job whose only way in is a non-resumable victim below the wide margin was
    told "no node with 8 free GPUs" alone. Reads (`explain`, `queue`) name the victim and the
    rule; the decision, and so the record, keeps the dispatcher's reason byte for byte."""
    from ledger.core.state import Job
    from ledger.reads.explain import explain_pending, protected_note
    from schemas.events import JobSubmitted

    running = [run(10, {"n1": range(8)}, resumable=False, placed_ago_s=1.5 * H)]
    snap = world([node("n1")], running, [pend(1, 8)])
    policy = policy_from_config(default_config("fairshare-7"))
    d = decide(snap, policy, NOW)
    wait = d.waiting.get(1)
    assert d.preemptions == () and wait is not None
    assert wait.reason == "no node with 8 free GPUs; at most 0 free on one node"
    note = protected_note(policy, snap, snap.pending[0], wait, NOW)
    assert note == (
        "; preempting would make room, but the victims are protected: job 10 (lab/b, 8 GPUs): "
        "not resumable: ratio 4 < 5 (policy fairshare-7: a job that is not resumable is "
        "preempted for fairness only when the ratio of the teams' fair shares is at least "
        "spare_ratio 5; it waits until then, or until they end)"
    )
    spec = JobSubmitted(event_id="s", at=1.0, actor="u", job_id=1, account="lab/a", user="u",
                        gpus=8, min_runtime_s=3600)  # fmt: skip
    lines = explain_pending(Job(spec=spec), d, snap, NOW, policy)
    assert lines[-1] == f"It waits: WAIT_RESOURCES: {wait.reason}{note}."
    # past the wide margin the victim is not protected (the cost model judges it); fifo has no
    # such rule
    wide = msgspec.structs.replace(policy, spare_ratio=3.0)
    assert protected_note(wide, snap, snap.pending[0], wait, NOW) == ""
    assert protected_note(policy_from_config(default_config("fifo-1")), snap,
                          snap.pending[0], wait, NOW) == ""  # fmt: skip
