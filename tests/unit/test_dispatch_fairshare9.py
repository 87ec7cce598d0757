"""fairshare-9: a funded job that has waited `starve_after_s` takes a plan whatever its victims
lose (a non-resumable job with no time limit held a whole cluster for days: atk33-26 F3), the
jobs refused for the cost wait with the refusal and when it ends, squat notes give readable
times; fairshare-7 decides as before."""

from __future__ import annotations

import msgspec

from ledger.dispatch import decide
from ledger.dispatch.fairshare7 import FairShare7
from ledger.dispatch.fairshare9 import FairShare9
from ledger.dispatch.registry import config_of, default_config, policy_from_config
from schemas.units import when
from tests.unit.test_dispatch_fairshare2 import NOW, H, node, pend, run, world

WHOLE = {"n1": range(8)}


def waiting_for(waited_s: float) -> list:  # type: ignore[type-arg]
    """Two 1-GPU jobs of lab/a (far ahead of lab/c by its share) that have waited `waited_s`."""
    return [msgspec.structs.replace(pend(i, 1), submitted_at=NOW - waited_s + i) for i in (1, 2)]


def blocked(waited_s: float) -> object:
    """One 8-GPU node held for 30 h by lab/c's funded non-resumable job with no time limit
    (past its 1 h contract): its loss (240 GPU-h) outweighs any 1-GPU job's gain."""
    holder = run(12, WHOLE, "lab/c", resumable=False, placed_ago_s=30 * H)
    return world([node("n1")], [holder], waiting_for(waited_s))


def test_fairshare_9_is_registered_with_its_setting() -> None:
    nine = policy_from_config(default_config("fairshare-9"))
    assert type(nine) is FairShare9 and nine.starve_after_s == 24 * H
    assert policy_from_config(config_of(FairShare9(starve_after_s=60.0))).starve_after_s == 60.0


def test_a_job_that_waited_long_enough_preempts_a_job_whose_loss_had_no_bound() -> None:
    snap = blocked(25 * H)
    # fairshare-7: never, however long the wait (the loss grows with the holder's run)
    assert decide(snap, FairShare7(), NOW).preemptions == ()
    d = decide(snap, FairShare9(), NOW)
    assert [(p.job_id, p.reason, p.for_job) for p in d.preemptions] == [(12, "fairness", 1)]
    assert [p.job_id for p in d.placements] == [1, 2]


def test_a_job_refused_for_the_cost_waits_with_the_refusal_and_when_it_ends() -> None:
    snap = blocked(2 * H)
    d = decide(snap, FairShare9(), NOW)
    assert d.preemptions == ()
    first, second = d.waiting[1], d.waiting[2]
    ends = NOW - 2 * H + 1 + 24 * H  # job 1's submission + starve_after_s
    assert first.code == "WAIT_RESOURCES" and first.until == ends
    assert first.reason.startswith("preempting jobs 12 would lose 240.00 GPU-h of funded work")
    assert first.reason.endswith("it takes the plan anyway once it has waited 86400 s")
    assert second.code == "WAIT_RESOURCES" and second.until == ends
    assert second.reason == f"as for job 1 (1 GPUs), {first.reason}"
    assert d.wake_at == ends  # the cycle wakes when it may take the plan
    # fairshare-7: the second job names only the shortfall, and no time
    old = decide(snap, FairShare7(), NOW)
    assert old.waiting[1].until is None and old.waiting[2].until is None
    assert "preempting" not in old.waiting[2].reason


def test_a_squatters_note_gives_its_time_as_the_cli_does() -> None:
    since = NOW - 3 * H
    squatter = msgspec.structs.replace(
        run(12, WHOLE, "lab/c", placed_ago_s=30 * H), low_util_since=since
    )
    snap = world([node("n1")], [squatter], waiting_for(60.0))
    (p,) = decide(snap, FairShare9(), NOW).preemptions
    assert (p.reason, p.note) == ("squatting", f"low utilisation since {when(since)}")
    (old,) = decide(snap, FairShare7(), NOW).preemptions
    assert old.note == f"low utilisation since t={since:g}"  # recorded as it was: replay
