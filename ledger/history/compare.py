"""What a recorded decision says, and how its replay differs from it, difference by difference.

Pure: values in, values out; no I/O. `ledger.history.replay` walks the log and rebuilds what a
decision saw; this module reads the record (the policy's settings, `recorded_policy`; how its
ranks counted usage, `recorded_usage`; its squat threshold, `squat_threshold`; its outcome from
the events after it, `outcome_of`) and compares it with the replay (`compare`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import msgspec

from ledger.core import utilisation
from ledger.cycle.loop import MIN_WAIT_S
from ledger.dispatch import registry
from ledger.dispatch.decision import Decision
from projections.fairshare import (
    CHARGE_PLACEMENT,
    RANKING_VERSION,
    RANKING_VERSIONS,
    WEEK_S,
    UsagePolicy,
    charge_of,
)
from schemas import events as e
from schemas.digest import summary_of
from schemas.errors import InvalidCommand
from schemas.policy import AnyPolicyConfig, unknown_version

# --- the policy and usage a decision recorded -----------------------------------------------------


def usage_of(settings: e.UsageSettings, version: str = "") -> UsagePolicy:
    """Pure: the usage counting a v2 record names, charged as its ranking `version` did
    (`fairtree-3` and `fairtree-2`: from the run's start; `fairtree-1` and older: from the
    placement)."""
    return UsagePolicy(
        window_s=settings.window_s,
        half_life_s=settings.half_life_s,
        weights=settings.weights,
        charge=charge_of(version),
    )


def recorded_policy(recorded: e.CycleDecided) -> AnyPolicyConfig:
    """Pure: the policy settings a decision recorded. UnknownEntity naming the version when
    this build has no code for it; InvalidCommand when the record has no settings its code
    reads (an old record whose string settings were edited, or written by other code)."""
    if recorded.policy is not None:
        return recorded.policy
    if recorded.policy_version not in registry.VERSIONS:
        raise unknown_version(recorded.policy_version)
    raise InvalidCommand(
        f"the recorded config of policy {recorded.policy_version!r} is not one its code wrote",
        hint="the decision's config was edited, or written by other code under this version",
        version=recorded.policy_version,
    )


def recorded_usage(recorded: e.CycleDecided, config: AnyPolicyConfig) -> UsagePolicy:
    """Pure: how the ranks of a decision counted usage: as its rank inputs say, else the 7-day
    window (decayed with the policy's half-life when it has one)."""
    if recorded.ranks is not None:
        return usage_of(recorded.ranks.usage, recorded.ranks.ranking_version)
    return UsagePolicy(
        window_s=WEEK_S, half_life_s=registry.half_life_s(config), charge=CHARGE_PLACEMENT
    )


def squat_threshold(recorded: e.CycleDecided) -> float:
    """Pure: the utilisation % below which a job counted as low for this decision (the rule of
    `ledger.core.utilisation.squat_threshold` over its recorded settings)."""
    return utilisation.squat_threshold(recorded.policy)


# --- comparing a record with a replay -------------------------------------------------------------


class Difference(msgspec.Struct, frozen=True, kw_only=True):
    """One way a replayed decision differs from the recorded one."""

    what: str
    """placement | preemption | considered | order | fragmentation | wake_at | ranks | ..."""
    job_id: int | None = None
    recorded: str
    replayed: str

    def text(self) -> str:
        who = f" of job {self.job_id}" if self.job_id is not None else ""
        return f"{self.what}{who}: recorded {self.recorded}, replayed {self.replayed}"


def slots_text(slots: Sequence[e.GpuSlot]) -> str:
    """Pure: `n1[0,1,2,3]+n2[0,1]`."""
    return "+".join(f"{s.node}[{','.join(map(str, s.gpu_indices))}]" for s in slots) or "-"


def _preemption_text(p: e.Preemption) -> str:
    why = f"{p.reason} for job {p.for_job}" if p.for_job is not None else p.reason
    return f"{why} ({p.note})" if p.note else why


def _absent(what: str) -> str:
    return f"no {what}"


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """A recorded decision's placements and preemptions in full: the `JobPlaced` and
    `JobPreempted` events of its cycle that follow the record (it holds them by reference)."""

    placements: tuple[e.Placement, ...] = ()
    preemptions: tuple[e.Preemption, ...] = ()


def outcome_of(recorded: e.CycleDecided, following: Iterable[e.AnyEvent]) -> Outcome:
    """Pure: the outcome of `recorded` from the events appended with it, in the record's order."""
    placed: dict[int, e.Placement] = {}
    preempted: dict[int, e.Preemption] = {}
    for ev in following:
        if isinstance(ev, e.JobPlaced) and ev.cycle_id == recorded.cycle_id:
            placed[ev.job_id] = e.Placement(job_id=ev.job_id, slots=ev.slots)
        elif isinstance(ev, e.JobPreempted) and ev.cycle_id == recorded.cycle_id:
            preempted[ev.job_id] = e.Preemption(
                job_id=ev.job_id, reason=ev.reason, for_job=ev.for_job, note=ev.note
            )
    return Outcome(
        placements=tuple(placed[j] for j in recorded.placed if j in placed),
        preemptions=tuple(preempted[j] for j in recorded.preempted if j in preempted),
    )


def following_events(recorded: e.CycleDecided) -> int:
    """Pure: how many events after the record may belong to its append: a JobPlaced per
    placement, a JobPreempted (and a JobRequeued) per preemption, a NodeDrained per node."""
    return len(recorded.placed) + 2 * len(recorded.preempted) + 64


def compare(
    recorded: e.CycleDecided,
    outcome: Outcome,
    replayed: Decision,
    ranks: str | None = None,
    skipped: SkippedBound | None = None,
    configured: AnyPolicyConfig | None = None,
) -> list[Difference]:
    """Pure: every difference between a recorded decision (with its `outcome`) and its replay
    (empty: identical). `ranks`: the digest of the ranks the replay used; `skipped`: the most
    empty cycles the log lets the record claim before it (None: the log sets no bound);
    `configured`: the policy settings the service recorded running with at the record's
    position (`service.configured`; None: the log records none, as the simulator's).

    Placements and preemptions are compared per job and then in order; the waiting jobs by
    count, per code, the first ones listed and the digest of the whole order (ids, sort keys,
    reasons); then fragmentation, the wake-up time, the policy version and config, the rank
    inputs (a different rank digest says why the rest differs; ranks read anywhere but at the
    snapshot's position), the empty cycles it says came before it (`skipped_cycles`) and the
    policy and settings against the service's configured ones (a record claiming settings the
    service did not run with replays alike whenever the cycle's outcome does not depend on
    them: atk34-26 F2)."""
    out: list[Difference] = []
    # 0. what both claim to have placed and preempted
    if tuple(p.job_id for p in outcome.placements) != recorded.placed:
        out.append(
            Difference(
                what="record",
                recorded=f"placed {list(recorded.placed)}",
                replayed=f"placement events for {[p.job_id for p in outcome.placements]}",
            )
        )
    if tuple(p.job_id for p in outcome.preemptions) != recorded.preempted:
        out.append(
            Difference(
                what="record",
                recorded=f"preempted {list(recorded.preempted)}",
                replayed=f"preemption events for {[p.job_id for p in outcome.preemptions]}",
            )
        )
    # 1. placements (in order only when the record agrees with its events)
    out += _by_job(
        "placement",
        outcome.placements,
        replayed.placements,
        lambda p: slots_text(p.slots),
        in_order=not out,
    )
    # 2. preemptions
    out += _by_job("preemption", outcome.preemptions, replayed.preemptions, _preemption_text)
    # 3. the waiting jobs: counts, the first listed, the whole order by digest
    out += _compare_waiting(recorded.waiting, replayed_summary(recorded.waiting, replayed))
    # 4. the rest of the record
    out += _field("fragmentation_gpus", recorded.fragmentation_gpus, replayed.fragmentation_gpus)
    out += _field("wake_at", recorded.wake_at, replayed.wake_at, repr)
    out += _field("policy_version", recorded.policy_version, replayed.policy_version)
    out += _compare_ranks(recorded.ranks, ranks)
    out += _ranks_position(recorded)
    if skipped is not None:
        out += skipped.check(recorded.skipped_cycles)
    if configured is not None:
        out += configured_settings(recorded, configured)
    return out


def configured_settings(recorded: e.CycleDecided, configured: AnyPolicyConfig) -> list[Difference]:
    """Pure: how a service's record differs from the settings the service recorded running
    with (`service.configured`): its policy version, then each setting that differs by name."""
    if recorded.policy_version != configured.version:
        return [
            Difference(
                what="policy_version",
                recorded=recorded.policy_version,
                replayed=f"{configured.version} (the service's configured policy)",
            )
        ]
    if recorded.policy == configured:
        return []
    if recorded.policy is None or recorded.policy.version != configured.version:
        claimed = "none" if recorded.policy is None else recorded.policy.version
        return [
            Difference(
                what="policy settings",
                recorded=f"settings of {claimed}",
                replayed=f"the service's configured {configured.version} settings",
            )
        ]
    mine, theirs = msgspec.structs.asdict(recorded.policy), msgspec.structs.asdict(configured)
    return [
        Difference(
            what=f"policy setting {name}",
            recorded=repr(mine.get(name)),
            replayed=f"{theirs.get(name)!r} (the service's configured setting)",
        )
        for name in sorted(set(mine) | set(theirs))
        if mine.get(name) != theirs.get(name)
    ]


MIN_CYCLE_GAP_S = MIN_WAIT_S
"""A service's dispatcher starts a cycle at least this long after the previous one ended
(`ledger.cycle.loop.wait_time`'s floor; the worker's early cycle for a submission comes
`quiet_s` = 0.5 s after it)."""


class SkippedBound(msgspec.Struct, frozen=True, kw_only=True):
    """How many empty cycles a service's record can say came before it (`skipped_cycles`): they
    ran after the previous record (or the log's first event) and before this one, and a
    service's cycles are at least `MIN_CYCLE_GAP_S` apart. One more is allowed for the cycle a
    stopping server runs at once. The simulator cycles at the moments of its events (several at
    one moment while searches run out), so its records have no bound (None)."""

    since: float
    """When the previous record was decided (or the log began)."""
    until: float
    """When this record was decided."""

    @property
    def most(self) -> int:
        return max(0, math.floor((self.until - self.since) / MIN_CYCLE_GAP_S)) + 1

    def check(self, claimed: int) -> list[Difference]:
        most = self.most
        if claimed <= most:
            return []
        return [
            Difference(
                what="skipped_cycles",
                recorded=f"{claimed} empty cycles before it",
                replayed=(
                    f"at most {most} in the {self.until - self.since:g} s since the previous "
                    f"record (cycles are at least {MIN_CYCLE_GAP_S:g} s apart)"
                ),
            )
        ]


def _ranks_position(recorded: e.CycleDecided) -> list[Difference]:
    """Every dispatcher reads its ranks at its snapshot's position (the projection caught up
    to exactly it, or the usage fold of the log up to it): a record whose ranks say another
    position is not one a dispatcher wrote."""
    inputs = recorded.ranks
    if inputs is None or inputs.position == recorded.based_on:
        return []
    return [
        Difference(
            what="ranks position",
            recorded=f"ranks read at position {inputs.position}",
            replayed=f"ranks read at the snapshot's position {recorded.based_on}",
        )
    ]


_J = TypeVar("_J", e.Placement, e.Preemption)
_V = TypeVar("_V")


def _by_job(
    what: str,
    recorded: Sequence[_J],
    replayed: Sequence[_J],
    text: Callable[[_J], str],
    *,
    in_order: bool = True,
) -> list[Difference]:
    """The jobs whose placement (or preemption) differs; when none does and `in_order`, whether
    the order does."""
    rec = {p.job_id: p for p in recorded}
    rep = {p.job_id: p for p in replayed}
    out = [
        Difference(
            what=what,
            job_id=job,
            recorded=_absent(what) if a is None else text(a),
            replayed=_absent(what) if b is None else text(b),
        )
        for job in sorted(set(rec) | set(rep))
        if (a := rec.get(job)) != (b := rep.get(job))
    ]
    order_a, order_b = [p.job_id for p in recorded], [p.job_id for p in replayed]
    if in_order and not out and order_a != order_b:
        out.append(Difference(what=f"{what} order", recorded=str(order_a), replayed=str(order_b)))
    return out


def _field(
    what: str, recorded: _V, replayed: _V, text: Callable[[_V], str] = str
) -> list[Difference]:
    """A value of the record that the replay does not reproduce, as `text` writes it."""
    if recorded == replayed:
        return []
    return [Difference(what=what, recorded=text(recorded), replayed=text(replayed))]


def _compare_ranks(recorded: e.RankInputs | None, digest: str | None) -> list[Difference]:
    if recorded is None or not recorded.digest or digest is None:  # "": an upcast v1 record
        return []
    known = recorded.ranking_version in RANKING_VERSIONS
    out = [] if known else _field("ranking version", recorded.ranking_version, RANKING_VERSION)
    if recorded.digest != digest:
        out.append(
            Difference(
                what="ranks",
                recorded=f"digest {recorded.digest[:12]} at position {recorded.position}",
                replayed=f"digest {digest[:12]}",
            )
        )
    return out


def replayed_summary(recorded: e.Waiting, replayed: Decision) -> e.Waiting:
    """Pure: the waiting summary of a replayed decision in the form of the record's: over its
    runs (`cycle.decided.v4`), or one entry per job for a record upcast from v3 or older."""
    if recorded.digest_of == "jobs":
        return summary_of(replayed.considered())
    return replayed.summary()


def _compare_waiting(recorded: e.Waiting, replayed: e.Waiting) -> list[Difference]:
    out = _field("considered", recorded.considered, replayed.considered, lambda n: f"{n} jobs")
    out += _field("waiting", recorded.counts, replayed.counts, _counts_text)
    a = {w.job_id: w.code for w in recorded.first}
    b = {w.job_id: w.code for w in replayed.first}
    listed = 0
    for job in sorted(set(a) & set(b)):
        if a[job] != b[job]:
            out.append(Difference(what="reason", job_id=job, recorded=a[job], replayed=b[job]))
            listed += 1
    order_a = [w.job_id for w in recorded.first]
    order_b = [w.job_id for w in replayed.first]
    if order_a != order_b:
        i = next(
            (i for i, (x, y) in enumerate(zip(order_a, order_b, strict=False)) if x != y),
            min(len(order_a), len(order_b)),
        )
        out.append(
            Difference(
                what="waiting order",
                recorded=_place_text(order_a, i),
                replayed=_place_text(order_b, i),
            )
        )
        listed += 1
    if recorded.digest_of == "runs":
        out += _field("runs", recorded.runs, replayed.runs, lambda n: f"{n} runs of waiting jobs")
    if not out and recorded.order_digest != replayed.order_digest:
        out.append(
            Difference(
                what="order",
                recorded=f"digest {recorded.order_digest[:12]}",
                replayed=f"digest {replayed.order_digest[:12]} (sort keys or reasons differ)",
            )
        )
    return out


def _counts_text(counts: Sequence[e.WaitCount]) -> str:
    return ", ".join(f"{c.jobs} {c.code}" for c in counts) or "none"


def _place_text(order: Sequence[int], i: int) -> str:
    return f"job {order[i]} at place {i + 1}" if i < len(order) else f"nothing at place {i + 1}"


class CycleReplay(msgspec.Struct, frozen=True, kw_only=True):
    """The replay of one recorded decision."""

    position: int
    """Where the `CycleDecided` sits in the log."""
    cycle_id: str
    based_on: int
    policy_version: str
    decided_at: float
    placements: int
    preemptions: int
    considered: int
    differences: tuple[Difference, ...] = ()
    error: str | None = None
    """Why it could not be replayed (e.g. the policy version's code is gone)."""

    @property
    def identical(self) -> bool:
        return self.error is None and not self.differences

    def headline(self) -> str:
        what = (
            f"{self.cycle_id} (position {self.position}, based on {self.based_on}, "
            f"{self.policy_version})"
        )
        if self.error is not None:
            return f"{what}: cannot replay: {self.error}"
        if not self.differences:
            return (
                f"{what}: identical ({self.placements} placed, {self.preemptions} preempted, "
                f"{self.considered} considered)"
            )
        return f"{what}: {len(self.differences)} differences"


def decided_at(recorded: e.CycleDecided) -> float:
    """Pure: the `now` the decision was made for (`decided_at`; older records: the event time)."""
    return recorded.at if recorded.decided_at is None else recorded.decided_at


def cycle_replay(
    position: int,
    recorded: e.CycleDecided,
    differences: Sequence[Difference] = (),
    error: str | None = None,
) -> CycleReplay:
    return CycleReplay(
        position=position,
        cycle_id=recorded.cycle_id,
        based_on=recorded.based_on,
        policy_version=recorded.policy_version,
        decided_at=decided_at(recorded),
        placements=len(recorded.placed),
        preemptions=len(recorded.preempted),
        considered=recorded.waiting.considered,
        differences=tuple(differences),
        error=error,
    )
