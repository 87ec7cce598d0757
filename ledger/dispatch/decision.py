"""What one `decide()` gives: the decision (`Decision`: what to preempt and place, why the rest
waits, the command that records it) with what it leaves idle (`Idle`), and what it hands the next
call (`Carry`). Pure: values only; `ledger.dispatch.engine` makes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

import msgspec

from ledger.dispatch.ordering import KeptClasses, SortKey
from ledger.dispatch.placement import KeptIndex
from ledger.dispatch.reservation import Hold, KeptSlots
from ledger.dispatch.snapshot import KeptRanks, PendingJob
from ledger.dispatch.waits import WaitRun, Waits
from schemas.commands import ApplyDecision, DecisionBody
from schemas.decisions import Considered, Placement, Preemption, RankInputs, Waiting
from schemas.digest import summarise_runs
from schemas.policy import AnyPolicyConfig


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of one cycle: what to preempt, what to place, and why the rest waits."""

    based_on: int
    policy_version: str
    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    order: Sequence[tuple[SortKey, PendingJob]] = ()
    """Every pending job in the order considered, with its sort key (the policy's `order`)."""
    runs: tuple[WaitRun, ...] = ()
    """Why the jobs not placed wait: one run per stretch of the order with one reason."""
    fragmentation_gpus: int = 0
    """See `placement.fragmentation`."""
    wake_at: float | None = None
    """The earliest later time the decision could change without a new event: the next contract
    end on a draining node, or the time a `WAIT_CONTRACT` job gets room."""
    budget_spent: bool = False
    """Some job wanted a victim search (or its estimate) after the cycle's `search_budget` ran
    out: another cycle right away may place more."""
    idle: Idle = msgspec.field(default_factory=lambda: Idle())
    """What the cycle leaves free, and where (for measures; not recorded)."""
    hold: Hold | None = None
    """The cycle's reservation, if it made one (`Policy.holds_for`)."""

    @property
    def waiting(self) -> Waits:
        """Job id -> why it was not placed, read from `order` and `runs` (a new mapping per
        call, built on its first look-up by id: a reader holds one while it reads many)."""
        return Waits(self.order, self.runs)

    def considered(self) -> tuple[Considered, ...]:
        """The order one record per job (id, sort key and, if not placed, code and reason
        text), as decision records of `cycle.decided.v1` copied it and the order digest covers
        it (`schemas.digest.order_digest`). Built on demand: the cycle itself keeps runs."""
        out = [Considered(job_id=j.job_id, sort_key=k) for k, j in self.order]
        for r in self.runs:
            w = r.wait
            text = w.text()
            for i in range(r.start, r.stop):
                out[i] = Considered(job_id=out[i].job_id, sort_key=out[i].sort_key, reason=text,
                                    code=w.code)  # fmt: skip
        return tuple(out)

    def summary(self) -> Waiting:
        """The waiting summary its record keeps (`cycle.decided.v4`): built from the order's
        ids and sort keys and the runs, never a record per waiting job
        (`schemas.digest.summarise_runs`)."""
        order = self.order
        return summarise_runs(
            [j.job_id for _, j in order],
            list(map(itemgetter(0), order)),
            [(r.start, r.stop, r.wait.code, r.wait.text()) for r in self.runs],
        )

    def to_command(
        self,
        actor: str,
        cycle_id: str,
        *,
        decided_at: float | None = None,
        policy: AnyPolicyConfig | None = None,
        ranks: RankInputs | None = None,
        skipped_cycles: int = 0,
        stopping_held: bool = False,
        lost_held: bool = False,
        placed_held: bool = False,
        grace_held: bool = False,
    ) -> ApplyDecision:
        """The command that applies this decision, expecting the log still at `based_on`. The
        record it makes keeps the inputs (`policy`, its settings; `ranks`; `decided_at`; how its
        snapshot counted stopping GPUs, `stopping_held`, `lost_held`, `placed_held`; its MaxTime
        rule, `grace_held`) and, of the
        considered jobs, only the compact summary (`summary`)."""
        body = DecisionBody(
            cycle_id=cycle_id,
            based_on=self.based_on,
            policy_version=self.policy_version,
            policy=policy,
            decided_at=decided_at,
            ranks=ranks,
            placements=self.placements,
            preemptions=self.preemptions,
            waiting=self.summary(),
            fragmentation_gpus=self.fragmentation_gpus,
            wake_at=self.wake_at,
            skipped_cycles=skipped_cycles,
            stopping_held=stopping_held,
            lost_held=lost_held,
            placed_held=placed_held,
            grace_held=grace_held,
        )
        return ApplyDecision(actor=actor, expected_position=self.based_on, decision=body)


class Idle(msgspec.Struct, frozen=True, kw_only=True):
    """The GPUs a decision leaves free on active nodes, and where: on nodes kept for debug work
    (`Policy.reserved`), on nodes held for a reservation, and of the others those no waiting
    job can use (`placement.fragmentation` over them); and how many funded jobs wait."""

    free: int = 0
    reserve: int = 0
    held: int = 0
    fragmented: int = 0
    funded_waiting: int = 0


class Carry(msgspec.Struct, frozen=True):
    """What one `decide()` hands the next (`decide_carried`): the free-GPU index it made
    (`FreeIndex.of`) and the ranks it completed (`complete_ranks_kept`). A value its caller
    (the service's dispatcher, a replay, the simulator) owns and passes back in; every
    answer of `decide` is the same with or without it, only cheaper with it."""

    index: KeptIndex | None = None
    ranks: KeptRanks | None = None
    slots: KeptSlots | None = None
    """The running jobs' slots on active nodes the last reservation read (`Frees`)."""
    order: KeptClasses | None = None
    """The pending jobs in the classes of the last order, for a policy that keeps its order
    (an optional `order_kept(snapshot, kept) -> (order, kept)`: fair share's)."""
