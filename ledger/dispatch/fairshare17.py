"""`FairShare17` ("fairshare-17"): the free tier's hours shared oldest first, and a debug job
that waits keeps the next node it can have.

Pure: a policy is a config value (`schemas.policy.FairShare17Config` plus its version); its
methods are functions of their arguments. Everything not named here is `FairShare16`'s
(ledger/dispatch/fairshare16.py), whose prices are off by default here (both 0: `fairshare-7`'s
victim costs); `fairshare-16` and older keep their code exactly (replay).

Why: judged by the time queued per job, `fairshare-7` misses the wait target on held-out Philly
assignments because of the free tier (unfunded jobs queue ~19 d at p90 on seed 2): its jobs go
by team and with `requeued_last` a job taken back waits behind every later arrival, and funded
work takes back the cheapest unfunded run, which is the one placed last, so the oldest free-tier
jobs are restarted again and again while new ones overtake them (docs/simulation.md,
"fairshare-17").

What changes, each a setting of its own so the tables can turn it off:

- **The free tier goes oldest first** (`free_order` "oldest"; "team": `fairshare-7`'s order;
  "smallest": by GPUs asked, fewest first, then oldest): after every funded job, unfunded jobs
  go by submit time and id alone (a requeue keeps the submit time, so a job taken back goes
  before the free tier's later arrivals).
- **Takebacks come from the free tier's newest arrivals** (`free_age_price`, 1.0): an unfunded
  victim costs, beside the GPU-seconds of work it loses, its GPUs x `free_age_price` x the
  seconds since it was submitted, so the plans of least cost take back the jobs submitted last
  (the tail of the free tier's order), and the oldest run on. (Unfunded victims cost nothing when
  a plan is weighed against its gain, as before: the price only orders them.)
- **A bound on a free-tier job's takebacks** (`takeback_limit`, `fairshare-16`'s rule, 3 here;
  0: none): an unfunded job taken back this many times keeps its GPUs against funded non-debug
  work until it ends. With the order above the free tier's oldest jobs finish instead of being
  restarted again and again; without it the order alone lengthened the waits (measured,
  docs/simulation.md).
- **A waiting debug job keeps a node** (`debug_hold`, on): a debug-lane job that cannot be placed
  (nor by preempting what its lane may) gets the cycle's reservation: the node whose jobs'
  contracts end soonest (every running job counted as freeing there at its contract's end, so
  funded non-resumable jobs it may not preempt too; ties by node name). It preempts nothing
  there that its lane may not: while the reservation lasts no funded non-debug job is placed
  on that node's free GPUs (only unfunded jobs, which it may preempt, and jobs whose declared
  limit ends before the contracts do), so the GPUs a funded job frees there are kept for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ledger.dispatch.fairshare2 import FREE_HEAD
from ledger.dispatch.fairshare16 import FairShare16
from ledger.dispatch.ordering import KeptClasses, Ordered, SortKey
from ledger.dispatch.preemption import CLASS_UNFUNDED
from ledger.dispatch.snapshot import PendingJob, RunningJob, Snapshot

FreeOrder = Literal["oldest", "smallest", "team"]


class FairShare17(FairShare16, frozen=True, kw_only=True):
    """`fairshare-16` (prices off) with the changes of the module docstring."""

    version: str = "fairshare-17"
    takeback_price_s: float = 0.0
    funded_takeback_price_s: float = 0.0
    takeback_limit: int = 3
    free_order: FreeOrder = "oldest"
    free_age_price: float = 1.0
    debug_hold: bool = True

    @property
    def free_oldest(self) -> bool:
        return self.free_order != "team"

    def order(self, snapshot: Snapshot) -> Sequence[tuple[SortKey, PendingJob]]:
        return self.order_kept(snapshot, None)[0]

    def order_kept(
        self, snapshot: Snapshot, kept: KeptClasses | None
    ) -> tuple[Sequence[tuple[SortKey, PendingJob]], KeptClasses | None]:
        """`fairshare-7`'s order (kept between cycles as it is) with the free tier as
        `free_order` says: "smallest" splits its one group by GPUs asked (fewest first), made
        afresh each cycle."""
        if self.free_order != "smallest":
            return self._ordered(snapshot, kept)
        ordered = self._ordered(snapshot, None)[0]
        groups: list[tuple[tuple[int, ...], Sequence[PendingJob]]] = []
        for head, members in ordered.groups:
            if head != FREE_HEAD:
                groups.append((head, members))
                continue
            by: dict[int, list[PendingJob]] = {}
            for j in members:  # in (submit time, job id) order: kept inside each size
                by.setdefault(j.gpus, []).append(j)
            groups += [((*FREE_HEAD, g), by[g]) for g in sorted(by)]
        return Ordered(groups), None

    def victim_key(self, job: RunningJob, now: float) -> tuple[float, ...]:
        """(class, GPU-seconds lost, plus for the free tier its GPUs x `free_age_price` x its
        age since submission: the newest arrivals are the cheapest victims)."""
        klass, lost = super().victim_key(job, now)
        if klass == CLASS_UNFUNDED and self.free_age_price > 0:
            lost += job.gpus * self.free_age_price * max(0.0, now - job.submitted_at)
        return (klass, lost)

    def holds_for(self, job: PendingJob, snapshot: Snapshot) -> bool:
        if self.debug_hold and self.lane(job):
            return True
        return super().holds_for(job, snapshot)

    def hold_takes(self, job: PendingJob, running: RunningJob, snapshot: Snapshot) -> bool | None:
        """For a debug-lane job's reservation (`engine._hold_for`): every running job counts as
        freeing its GPUs at its contract's end (a job it may not preempt is not preempted: this
        reservation has no `hold_starts`, it only keeps the node); None for any other job's
        (`fairshare-7`'s rule)."""
        if self.debug_hold and self.lane(job):
            return True
        return None
