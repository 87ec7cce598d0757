"""fairshare-17's `free_drain_gpus` (s60-policy2, issue 26): on Philly the free tier's 8-GPU jobs
waited past the p90 line under every policy, most by their first wait, because its later 4-GPU
jobs took the half-free nodes first. With the setting, the free tier's first waiting
single-node job asking at least that many GPUs holds the node closest to free (the most GPUs
free now): the free tier's later jobs are not placed there, so the node drains toward it (a
reservation by node, not by time). Funded work still goes there. A versioned field: 0 (no
job drains, as before) in a record without it."""

from __future__ import annotations

import msgspec

from ledger.dispatch import registry
from ledger.dispatch.engine import decide
from ledger.dispatch.snapshot import Snapshot
from schemas.policy import AnyPolicyConfig, FairShare17Config
from tests.unit.test_dispatch_fairshare2 import NOW, node, pend, run, world

NODES = [node("n1"), node("n2"), node("n3")]


def _half_free(*pending: int | tuple[int, int, bool]) -> Snapshot:
    """n1: 4 of 8 GPUs free (a free-tier 4-GPU run on the rest); n2: 2 free; n3: full. The
    pending jobs: (id, GPUs, funded) or an id alone, the free tier's 8-GPU job."""
    running = [
        run(10, {"n1": range(4)}, "lab/b", min_runtime_s=0),
        run(11, {"n2": range(6)}, "lab/b", min_runtime_s=0),
        run(12, {"n3": range(8)}, "lab/b"),
    ]
    jobs = []
    for p in pending:
        job_id, gpus, funded = (p, 8, False) if isinstance(p, int) else p
        jobs.append(pend(job_id, gpus, "lab/c", funded=funded))
    return world(NODES, running, jobs)


def _placed(snap: Snapshot, policy: object) -> dict[int, str]:
    d = decide(snap, policy, NOW)  # type: ignore[arg-type]
    return {p.job_id: p.slots[0].node for p in d.placements}


def _drains(gpus: int = 8) -> object:
    built = registry.build("fairshare-17", {})
    return msgspec.structs.replace(built, free_drain_gpus=gpus)  # type: ignore[type-var]


def test_the_free_tiers_later_jobs_leave_the_node_closest_to_free_to_its_waiting_head() -> None:
    # the 8-GPU free-tier job 1 waits (no node has 8 free); job 2, a later free-tier 4-GPU job
    snap = _half_free(1, (2, 4, False), (3, 2, False))
    assert _placed(snap, registry.build("fairshare-17", {})) == {2: "n1", 3: "n2"}
    assert _placed(snap, _drains()) == {3: "n2"}  # n1 (4 free, the most) drains toward job 1


def test_funded_work_still_goes_on_the_drained_node() -> None:
    snap = _half_free(1, (2, 4, False), (5, 4, True))
    assert _placed(snap, _drains()) == {5: "n1"}  # funded first in the order; job 2 waits


def test_only_a_job_asking_at_least_the_setting_drains() -> None:
    snap = _half_free(1, (2, 4, False))
    assert _placed(snap, _drains(16)) == {2: "n1"}  # job 1 asks 8 < 16: no drain
    assert _placed(snap, _drains(4)) == {}  # the first waiting job asking >= 4 is job 1


def test_the_drained_node_is_counted_as_held_not_fragmented() -> None:
    snap = _half_free(1, (2, 4, False))
    d = decide(snap, _drains(), NOW)  # type: ignore[arg-type]
    assert d.idle.held == 4 and d.idle.free == 6
    before = decide(snap, registry.build("fairshare-17", {}), NOW)
    assert before.idle.held == 0


def test_the_same_snapshot_gives_the_same_decision_byte_for_byte() -> None:
    snap = _half_free(1, (2, 4, False), (3, 2, False), (5, 4, True))
    one = decide(snap, _drains(), NOW)  # type: ignore[arg-type]
    two = decide(snap, _drains(), NOW)  # type: ignore[arg-type]
    assert msgspec.json.encode(one.placements) == msgspec.json.encode(two.placements)
    assert msgspec.json.encode(one.idle) == msgspec.json.encode(two.idle)


def test_a_record_without_the_setting_decodes_to_no_drain() -> None:
    config = registry.default_config("fairshare-17")
    assert isinstance(config, FairShare17Config)
    raw = msgspec.to_builtins(config)
    raw.pop("free_drain_gpus", None)  # a record made before
    old = msgspec.convert(raw, AnyPolicyConfig)
    assert isinstance(old, FairShare17Config) and old.free_drain_gpus == 0
    assert _placed(_half_free(1, (2, 4, False)), registry.policy_from_config(old)) == {2: "n1"}


def _takes() -> object:
    return msgspec.structs.replace(_drains(), free_drain_takes=True)  # type: ignore[type-var]


def _newer(snap: Snapshot, *job_ids: int) -> Snapshot:
    """`snap` with running jobs `job_ids` submitted after every pending job (at 100)."""
    running = tuple(
        msgspec.structs.replace(r, submitted_at=100.0) if r.job_id in job_ids else r
        for r in snap.running
    )
    return msgspec.structs.replace(snap, running=running)


def test_with_takes_the_head_takes_back_the_newer_free_tier_runs_of_a_node() -> None:
    # run 10 (n1, 4 GPUs) was submitted after job 1: taken back, job 1 placed on n1
    snap = _newer(_half_free(1, (2, 4, False)), 10)
    d = decide(snap, _takes(), NOW)  # type: ignore[arg-type]
    assert [p.job_id for p in d.preemptions] == [10]
    assert d.preemptions[0].for_job == 1
    assert {p.job_id: p.slots[0].node for p in d.placements} == {1: "n1"}
    # nothing is held with takes: job 2 goes where it fits (n1 is full now; n2 has 2 free)
    assert d.idle.held == 0
    # without takes the drain holds n1; off, job 2 takes n1's half
    assert not decide(snap, _drains(), NOW).preemptions  # type: ignore[arg-type]
    assert _placed(snap, registry.build("fairshare-17", {})) == {2: "n1"}


def test_takes_never_takes_an_older_run_nor_funded_work() -> None:
    # run 10 is older than job 1 (submitted at 0): no node qualifies (n2's run 11 is older
    # too, n3 holds funded work); job 1 waits and nothing is held
    snap = _half_free(1, (2, 4, False))
    d = decide(snap, _takes(), NOW)  # type: ignore[arg-type]
    assert not d.preemptions and {p.job_id for p in d.placements} == {2}
    funded = _newer(_half_free(1), 12)  # n3's funded run, submitted later: still not a victim
    assert not decide(funded, _takes(), NOW).preemptions  # type: ignore[arg-type]


def test_takes_chooses_the_node_losing_the_least_work() -> None:
    # n1's newer run 10 (4 GPUs) lost 0.5 h, n2's newer run 11 (6 GPUs) too: n1 loses less
    snap = _newer(_half_free(1), 10, 11)
    assert [p.job_id for p in decide(snap, _takes(), NOW).preemptions] == [10]  # type: ignore[arg-type]
