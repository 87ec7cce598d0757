"""fairshare-17's rules by the time queued so far, every wait counted (s63-policy, issue 26): the
target is the all-waits queued time per job, and a requeue keeps its submit time, so "oldest"
puts a job that ran for days ahead of one that has only waited. `free_order` "waited" orders
the free tier by submit time plus the seconds its runs held GPUs (`Job.ran_s`);
`free_age_queued` prices an unfunded victim by its time queued, not its age; and
`funded_queued_bound_s` spares a funded run whose job queued that long already from fairness
takebacks. Each a versioned field, off in a record without it. Pure dispatch on small worlds,
and the fold that sums the runs' held time."""

from __future__ import annotations

import msgspec

from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.cycle.inputs import pending_view
from ledger.dispatch import decide, registry
from ledger.dispatch.fairshare17 import FairShare17
from ledger.dispatch.snapshot import PendingJob, RunningJob
from schemas import commands as c
from schemas import events as e
from schemas.policy import AnyPolicyConfig, FairShare17Config
from tests.unit.test_audit_check import T0, history, placed
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, preempted, run, world


def test_the_fold_sums_the_seconds_each_preempted_run_held_its_gpus() -> None:
    events = history(
        [
            (T0, c.InitLedger(actor="root", admin="root")),
            (T0, c.OpenAccount(actor="root", path="ai2", kind="program")),
            (T0, c.OpenAccount(actor="root", path="ai2/tulu", kind="project", shares=1)),
            (T0, c.AddMember(actor="root", user="dan", project="ai2/tulu")),
            (T0, c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8)),
            (T0, c.SubmitJob(actor="dan", account="ai2/tulu", gpus=4, min_runtime_s=0)),
        ]
    )
    state = State()
    for ev in events:
        evolve(state, ev)
    assert state.jobs[1].ran_s == 0.0
    for start, held in ((100, 500), (2_000, 3_000)):  # two runs: 500 s and 3,000 s
        evolve(state, placed(1, (0, 1, 2, 3), at=T0 + start))
        evolve(state, e.JobPreempted(event_id=f"p{start}", at=T0 + start + held,
                                     actor="@dispatcher", job_id=1, reason="fairness"))  # fmt: skip
    assert state.jobs[1].ran_s == 3_500.0
    view = pending_view(state.jobs[1])
    assert view.ran_s == 3_500.0  # queued so far at T0 + 6,000: 6,000 - 3,500 = 2,500 s


def _free_pending(job_id: int, submitted_at: float, ran_s: float) -> PendingJob:
    return msgspec.structs.replace(
        pend(job_id, 8, "lab/b", funded=False), submitted_at=submitted_at, ran_s=ran_s
    )


def test_waited_orders_the_free_tier_by_the_time_queued_so_far() -> None:
    # job 1 was submitted first but ran 20 h of its 27.8 h (queued 7.8 h); job 2, submitted
    # 10 h later, never ran (queued 17.8 h). "oldest" places 1 on the one free node, "waited" 2
    ran = _free_pending(1, 0.0, 20 * H)
    fresh = _free_pending(2, 10 * H, 0.0)
    snap = world([node("n1")], [], [ran, fresh])
    oldest = registry.build("fairshare-17", {})
    waited = msgspec.structs.replace(oldest, free_order="waited")  # type: ignore[type-var]
    assert [j.job_id for _, j in oldest.order(snap)] == [1, 2]
    assert [j.job_id for _, j in waited.order(snap)] == [2, 1]
    assert [p.job_id for p in decide(snap, waited, NOW).placements] == [2]
    assert [p.job_id for p in decide(snap, oldest, NOW).placements] == [1]
    # funded work still goes first, and ties go by job id
    funded = pend(3, 8)
    twin = _free_pending(4, 10 * H, 0.0)
    both = world([node("n1")], [], [twin, fresh, funded, ran])
    assert [j.job_id for _, j in waited.order(both)] == [3, 2, 4, 1]


def _free_run(job_id: int, where: str, submitted_ago_s: float, ran_s: float) -> RunningJob:
    """An unfunded 8-GPU run placed an hour ago, submitted `submitted_ago_s` ago, its earlier
    runs having held GPUs `ran_s`."""
    r = run(job_id, {where: range(8)}, "lab/b", min_runtime_s=0, placed_ago_s=H, lost_s=H)
    return msgspec.structs.replace(r, submitted_at=NOW - submitted_ago_s, ran_s=ran_s)


def test_the_age_price_by_queued_time_takes_back_the_run_that_waited_least() -> None:
    # 10 was submitted 50 h ago and ran 48 h of it (queued 1 h); 11, 10 h ago (queued 9 h).
    # By age since submission 11 is the newest and is taken back; by time queued, 10
    old = _free_run(10, "n1", 50 * H, 48 * H)
    waited = _free_run(11, "n2", 10 * H, 0.0)
    assert old.queued_s == H and waited.queued_s == 9 * H
    snap = world([node("n1"), node("n2")], [old, waited], [pend(1, 8)])
    built = registry.build("fairshare-17", {})
    queued = msgspec.structs.replace(built, free_age_queued=True)  # type: ignore[type-var]
    assert preempted(snap, built) == [11]
    assert preempted(snap, queued) == [10]


def _funded_run(queued_s: float) -> RunningJob:
    """lab/b's funded resumable 8-GPU run on n1, placed 2 h ago after queueing `queued_s`."""
    r = run(10, {"n1": range(8)}, "lab/b")
    return msgspec.structs.replace(r, submitted_at=r.placed_at - queued_s)


def test_a_funded_run_whose_job_queued_the_bound_is_no_fairness_victim() -> None:
    bound = FairShare17(funded_queued_bound_s=24 * H)
    assert preempted(world([node("n1")], [_funded_run(30 * H)], [pend(1, 8)]), FairShare17()) == [
        10
    ]
    assert preempted(world([node("n1")], [_funded_run(30 * H)], [pend(1, 8)]), bound) == []
    assert preempted(world([node("n1")], [_funded_run(20 * H)], [pend(1, 8)]), bound) == [10]
    # its earlier runs' held time is not queued time: 30 h since submission, 12 h of it run
    ran = msgspec.structs.replace(_funded_run(30 * H), ran_s=12 * H)
    assert preempted(world([node("n1")], [ran], [pend(1, 8)]), bound) == [10]
    # a debug job still preempts it (the debug lane's victims are not fairness's)
    debug = pend(2, 8, debug=True)
    assert preempted(world([node("n1")], [_funded_run(30 * H)], [debug]), bound) == [10]


def test_a_record_without_the_settings_decodes_to_them_off() -> None:
    config = registry.default_config("fairshare-17")
    assert isinstance(config, FairShare17Config)
    raw = msgspec.to_builtins(config)
    for key in ("free_age_queued", "funded_queued_bound_s", "free_order"):
        raw.pop(key, None)  # a record made before
    old = msgspec.convert(raw, AnyPolicyConfig)
    assert isinstance(old, FairShare17Config)
    assert old.free_age_queued is False and old.funded_queued_bound_s == 0.0
    assert old.free_order == "oldest"
    waited = msgspec.convert({**raw, "free_order": "waited"}, AnyPolicyConfig)
    assert isinstance(waited, FairShare17Config) and waited.free_order == "waited"
