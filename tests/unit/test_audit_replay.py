"""Replay's pure parts: the policy and usage a record names (typed since `cycle.decided.v3`;
older records' string settings read once, by the codec), and comparing a recorded decision with
its replay difference by difference."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from ledger.dispatch import registry
from ledger.dispatch.baselines import LegacyCaps, SlurmMultifactor
from ledger.dispatch.decision import Decision
from ledger.dispatch.engine import Unplaceable, WaitRun
from ledger.dispatch.policy import FairShare, Fifo, Policy
from ledger.dispatch.snapshot import PendingJob
from ledger.history.compare import (
    Outcome,
    SkippedBound,
    compare,
    outcome_of,
    recorded_policy,
    recorded_usage,
    squat_threshold,
)
from projections.fairshare import RANKING_VERSION, WEEK_S
from schemas import codec
from schemas import events as e
from schemas.digest import order_digest, rank_digest
from schemas.errors import InvalidCommand, UnknownEntity
from schemas.policy import (
    FairShare7Config,
    FairShare9Config,
    FairShareConfig,
    from_settings,
    settings,
)

POLICIES: dict[str, Policy] = {
    "fair share, defaults": FairShare(),
    "fair share, tuned": FairShare(
        margin=0.25,
        min_rank_gap=2,
        squat_after_s=1800.0,
        squat_util_pct=5.0,
        debug_lane=False,
        search_budget=8,
    ),
    "fifo": Fifo(),
    "slurm": SlurmMultifactor(weight_age=10.0, half_life_s=86_400.0),
    "legacy caps": LegacyCaps(caps={"ai2/olmo": 12, "ai2/tulu": 4}, team_depth=2),
}


def written(policy: Policy) -> dict[str, str]:
    """The string settings a v1 or v2 record wrote for `policy`."""
    return settings(registry.config_of(policy))


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_recorded_policy_is_rebuilt_exactly(name: str) -> None:
    policy = POLICIES[name]
    assert registry.build(registry.config_of(policy)) == policy
    assert registry.build(from_settings(policy.version, written(policy))) == policy


def test_integer_settings_read_back_as_the_same_setting() -> None:
    config = {**written(FairShare()), "squat_after_s": "3600"}
    assert from_settings("fairshare-1", config) == FairShareConfig(squat_after_s=3600.0)


@pytest.mark.parametrize(
    ("version", "config", "error", "words"),
    [
        ("fairshare-0", written(FairShare()), UnknownEntity, "needs policy version 'fairshare-0'"),
        (
            "fairshare-1",
            {**written(FairShare()), "margin": "wide"},
            InvalidCommand,
            "bad or missing setting",
        ),
        ("fairshare-1", {**written(FairShare()), "extra": "1"}, InvalidCommand, "differs in extra"),
        ("fairshare-1", written(Fifo()), InvalidCommand, "bad or missing setting"),
        ("fifo-1", written(FairShare()), InvalidCommand, "differs in"),
    ],
    ids=[
        "unknown version",
        "unreadable value",
        "unknown key",
        "another policy's config",
        "settings the code does not write",
    ],
)
def test_configs_that_no_code_wrote_are_refused_clearly(
    version: str, config: dict[str, str], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as err:
        from_settings(version, config)
    assert words in str(err.value)


def v1(config: dict[str, str], version: str = "fairshare-1") -> e.CycleDecided:
    """A stored v1 record with `config`, as every reader sees it (upcast by the codec)."""
    stored = msgspec.structs.replace(STORED_V1, policy_version=version, config=config)
    return codec.decode(codec.encode(stored))  # type: ignore[return-value]


def test_old_string_settings_are_read_as_typed_ones_once_in_the_codec() -> None:
    recorded = v1({**written(FairShare()), "squat_after_s": "3600", "window_s": "86400"})
    assert recorded.policy == FairShareConfig(squat_after_s=3600.0)
    assert recorded.ranks is not None and recorded.ranks.digest == ""
    assert recorded_usage(recorded, recorded.policy).window_s == 86_400.0
    assert squat_threshold(recorded) == 10.0


def test_usage_and_threshold_come_from_the_record() -> None:
    plain = v1(written(FairShare(squat_util_pct=5.0)))
    assert plain.ranks is None and squat_threshold(plain) == 5.0
    assert recorded_usage(plain, recorded_policy(plain)).window_s == WEEK_S
    slurm = v1(written(SlurmMultifactor()), "slurm-1")
    assert recorded_usage(slurm, recorded_policy(slurm)).half_life_s == WEEK_S
    assert squat_threshold(slurm) == 10.0


@pytest.mark.parametrize(
    ("config", "version", "error", "words"),
    [
        ({**written(FairShare()), "window_s": "-1"}, "fairshare-1", InvalidCommand, "its code"),
        ({**written(FairShare()), "margin": "wide"}, "fairshare-1", InvalidCommand, "its code"),
        (written(FairShare()), "fairshare-0", UnknownEntity, "needs policy version"),
    ],
    ids=["a bad window", "an unreadable setting", "a version this build lacks"],
)
def test_a_record_whose_settings_no_code_wrote_cannot_be_replayed(
    config: dict[str, str], version: str, error: type[Exception], words: str
) -> None:
    recorded = v1(config, version)
    assert recorded.policy is None
    with pytest.raises(error) as err:
        recorded_policy(recorded)
    assert words in str(err.value)


SLOTS = (e.GpuSlot(node="n1", gpu_indices=(0, 1)),)
STORED_V1 = e.CycleDecidedV1(
    event_id="x",
    at=1.0,
    actor="@dispatcher",
    cycle_id="cycle-9",
    based_on=9,
    policy_version="fairshare-1",
    config={"policy": "fairshare"},
    placements=(e.Placement(job_id=1, slots=SLOTS), e.Placement(job_id=2, slots=SLOTS)),
    preemptions=(e.Preemption(job_id=7, reason="fairness", for_job=1, note="fs"),),
    considered=(
        e.Considered(job_id=1, sort_key=(0, 1, 1.5, 1)),
        e.Considered(job_id=2, sort_key=(0, 1, 2.5, 2)),
        e.Considered(
            job_id=3, sort_key=(0, 2, 3.5, 3), reason="WAIT_RESOURCES: full", code="WAIT_RESOURCES"
        ),
    ),
    fragmentation_gpus=2,
    wake_at=50.0,
    decided_at=1.0,
)
RANKS = rank_digest({"a/u": 0}, {"a/u": math.inf})
RECORDED = msgspec.structs.replace(
    codec.upcast(STORED_V1),
    ranks=e.RankInputs(
        position=9,
        digest=RANKS,
        ranking_version=RANKING_VERSION,
        usage=e.UsageSettings(window_s=WEEK_S),
    ),
)
OUTCOME = Outcome(placements=STORED_V1.placements, preemptions=STORED_V1.preemptions)


def decided_as(considered: tuple[e.Considered, ...]) -> dict[str, Any]:
    """A decision's order and waiting runs that expand to `considered` (one run per job)."""
    job = PendingJob(job_id=0, account="a", user="u", gpus=1, min_runtime_s=0, submitted_at=0)
    order = tuple((c.sort_key, msgspec.structs.replace(job, job_id=c.job_id)) for c in considered)
    runs = tuple(
        WaitRun(i, i + 1, Unplaceable(code=c.code, reason=(c.reason or "").split(": ", 1)[1]))  # type: ignore[arg-type]
        for i, c in enumerate(considered)
        if c.code is not None
    )
    return {"order": order, "runs": runs}


def replayed(**changes: object) -> Decision:
    considered = changes.pop("considered", STORED_V1.considered)
    base = Decision(
        based_on=RECORDED.based_on,
        policy_version=RECORDED.policy_version,
        placements=STORED_V1.placements,
        preemptions=STORED_V1.preemptions,
        fragmentation_gpus=RECORDED.fragmentation_gpus,
        wake_at=RECORDED.wake_at,
        **decided_as(considered),  # type: ignore[arg-type]
    )
    assert base.considered() == considered
    return msgspec.structs.replace(base, **changes)


OTHER = (e.GpuSlot(node="n2", gpu_indices=(4, 5)),)
C = STORED_V1.considered
DIGEST = RECORDED.waiting.order_digest[:12]


def _order(considered: tuple[e.Considered, ...]) -> str:
    return (
        f"order: recorded digest {DIGEST}, replayed digest "
        f"{order_digest(considered)[:12]} (sort keys or reasons differ)"
    )


KEYED = (C[0], msgspec.structs.replace(C[1], sort_key=(0, 0, 2.5, 2)), C[2])

DIFFS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "identical": ({}, []),
    "placed elsewhere": (
        {"placements": (e.Placement(job_id=1, slots=OTHER), STORED_V1.placements[1])},
        ["placement of job 1: recorded n1[0,1], replayed n2[4,5]"],
    ),
    "not placed": (
        {"placements": STORED_V1.placements[:1]},
        ["placement of job 2: recorded n1[0,1], replayed no placement"],
    ),
    "placed in another order": (
        {"placements": STORED_V1.placements[::-1]},
        ["placement order: recorded [1, 2], replayed [2, 1]"],
    ),
    "another victim": (
        {"preemptions": (e.Preemption(job_id=8, reason="squatting", for_job=1),)},
        [
            "preemption of job 7: recorded fairness for job 1 (fs), replayed no preemption",
            "preemption of job 8: recorded no preemption, replayed squatting for job 1",
        ],
    ),
    "another sort key (beyond what the record lists)": ({"considered": KEYED}, [_order(KEYED)]),
    "another reason": (
        {
            "considered": (
                C[0],
                C[1],
                msgspec.structs.replace(C[2], reason="WAIT_CONTRACT: later", code="WAIT_CONTRACT"),
            )
        },
        [
            "waiting: recorded 1 WAIT_RESOURCES, replayed 1 WAIT_CONTRACT",
            "reason of job 3: recorded WAIT_RESOURCES, replayed WAIT_CONTRACT",
        ],
    ),
    "considered in another order": (
        {"considered": (C[1], C[0], C[2])},
        [_order((C[1], C[0], C[2]))],
    ),
    "one more job considered": (
        {
            "considered": (
                *C,
                e.Considered(
                    job_id=4, sort_key=(1,), reason="WAIT_PRIORITY: x", code="WAIT_PRIORITY"
                ),
            )
        },
        [
            "considered: recorded 3 jobs, replayed 4 jobs",
            "waiting: recorded 1 WAIT_RESOURCES, replayed 1 WAIT_PRIORITY, 1 WAIT_RESOURCES",
            "waiting order: recorded nothing at place 2, replayed job 4 at place 2",
        ],
    ),
    "fragmentation and wake-up": (
        {"fragmentation_gpus": 0, "wake_at": None},
        ["fragmentation_gpus: recorded 2, replayed 0", "wake_at: recorded 50.0, replayed None"],
    ),
}


@pytest.mark.parametrize("case", list(DIFFS))
def test_compare_names_every_difference(case: str) -> None:
    changes, want = DIFFS[case]
    assert [d.text() for d in compare(RECORDED, OUTCOME, replayed(**changes), RANKS)] == want


def test_other_ranks_are_named_as_the_cause() -> None:
    other = rank_digest({"a/u": 1}, {"a/u": math.inf})
    assert [d.text() for d in compare(RECORDED, OUTCOME, replayed(), other)] == [
        f"ranks: recorded digest {RANKS[:12]} at position 9, replayed digest {other[:12]}"
    ]


def test_the_outcome_comes_from_the_events_of_the_cycle_in_record_order() -> None:
    kw = {"at": 1.0, "actor": "@dispatcher"}
    following = [
        e.JobPreempted(event_id="p", **kw, job_id=7, reason="fairness", for_job=1, note="fs",
                       cycle_id="cycle-9"),
        e.JobRequeued(event_id="r", **kw, job_id=7),
        e.JobPlaced(event_id="b", **kw, job_id=2, slots=SLOTS, cycle_id="cycle-9", based_on=9),
        e.JobPlaced(event_id="a", **kw, job_id=1, slots=SLOTS, cycle_id="cycle-9", based_on=9),
        e.JobPlaced(event_id="z", **kw, job_id=5, slots=OTHER, cycle_id="cycle-10", based_on=9),
    ]  # fmt: skip
    assert outcome_of(RECORDED, following) == OUTCOME
    assert [d.what for d in compare(RECORDED, outcome_of(RECORDED, following[:3]), replayed())] == [
        "record",
        "placement",
    ]


def test_a_record_naming_a_preemption_without_its_event_is_a_difference() -> None:
    """atk33-26 F1: a record edited to name a preemption that never happened (job 5, no
    `JobPreempted` in its cycle) replayed "identical": only `placed` was checked against the
    events. Now the record's `preempted` is too."""
    forged = msgspec.structs.replace(RECORDED, preempted=(*RECORDED.preempted, 5))
    assert [d.text() for d in compare(forged, OUTCOME, replayed(), RANKS)] == [
        "record: recorded preempted [7, 5], replayed preemption events for [7]"
    ]


def test_a_record_whose_ranks_name_another_position_is_a_difference() -> None:
    """atk33-26: `ranks.position` edited (275 -> 200) replayed identical when the ranks there
    were the same. Every dispatcher reads its ranks at its snapshot's position, so a record
    that names another is not one a dispatcher wrote."""
    assert RECORDED.ranks is not None and RECORDED.ranks.position == RECORDED.based_on
    moved = msgspec.structs.replace(
        RECORDED, ranks=msgspec.structs.replace(RECORDED.ranks, position=2)
    )
    assert [d.text() for d in compare(moved, OUTCOME, replayed(), RANKS)] == [
        "ranks position: recorded ranks read at position 2, replayed ranks read at the "
        "snapshot's position 9"
    ]


@pytest.mark.parametrize(
    ("claimed", "want"),
    [
        (0, []),
        (21, []),  # 1 s at 0.05 s apart: 20, and the stopping cycle
        (
            500,
            [
                "skipped_cycles: recorded 500 empty cycles before it, replayed at most 21 in the "
                "1 s since the previous record (cycles are at least 0.05 s apart)"
            ],
        ),
    ],
)
def test_a_record_claiming_more_empty_cycles_than_its_time_allows_is_a_difference(
    claimed: int, want: list[str]
) -> None:
    """atk33-26: `skipped_cycles` edited (0 -> 500) replayed identical; it is the record's
    answer to "why did nothing start between t1 and t2". A service's cycles are at least
    `MIN_CYCLE_GAP_S` apart, so the time since the previous record bounds it."""
    claims = msgspec.structs.replace(RECORDED, skipped_cycles=claimed)
    bound = SkippedBound(since=RECORDED.decided_at - 1.0, until=RECORDED.decided_at)  # type: ignore[operator]
    assert [d.text() for d in compare(claims, OUTCOME, replayed(), RANKS, bound)] == want


SERVED = msgspec.structs.replace(RECORDED, policy_version="fairshare-9", policy=FairShare9Config())
"""A service's record of fairshare-9 with its default settings (as `service.configured` says)."""


@pytest.mark.parametrize(
    ("claims", "want"),
    [
        ({}, []),
        (
            {"policy_version": "fairshare-7", "policy": FairShare7Config()},
            ["policy_version: recorded fairshare-7, replayed fairshare-9 (the service's "
             "configured policy)"],
        ),
        (
            {"policy": FairShare9Config(margin=0.5, spare_ratio=1.0, debug_lane=False)},
            [
                "policy setting debug_lane: recorded False, replayed True (the service's "
                "configured setting)",
                "policy setting margin: recorded 0.5, replayed 0.1 (the service's configured "
                "setting)",
                "policy setting spare_ratio: recorded 1.0, replayed 5.0 (the service's "
                "configured setting)",
            ],
        ),
        (
            {"policy": FairShare7Config()},
            ["policy settings: recorded settings of fairshare-7, replayed the service's "
             "configured fairshare-9 settings"],
        ),
    ],
)  # fmt: skip
def test_a_record_claiming_settings_the_service_did_not_run_with_is_a_difference(
    claims: dict[str, Any], want: list[str]
) -> None:
    """atk34-26 F2: a service's record edited to claim fairshare-7, or margin 0.5, spare_ratio 1
    and no debug lane, replayed identical (the cycle's outcome did not depend on them). The log's
    `service.configured` says what the service ran with at the record's position."""
    record = msgspec.structs.replace(SERVED, **claims)
    decision = replayed(policy_version=record.policy_version)
    found = compare(record, OUTCOME, decision, RANKS, configured=FairShare9Config())
    assert [d.text() for d in found] == want
    # a log that records no settings (the simulator's) is compared as before
    assert compare(record, OUTCOME, decision, RANKS) == []
