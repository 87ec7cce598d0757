"""`FairShare7` ("fairshare-7"): `fairshare-6` measured by every wait and a fixed yardstick.

Pure: a policy is a config value (`schemas.policy.FairShare7Config` plus its version); its
methods are functions of their arguments. Everything not named here is `FairShare2`'s
(ledger/dispatch/fairshare2.py): teams by their share of the whole tree, the margin, the cost
model, squatters, least-loss plans. `fairshare-6` and older keep their code exactly (replay).

What changes, each a setting of its own so the frontier tables of docs/simulation.md can turn
it off:

- **Debug work never waits behind the free tier.** A debug-lane job may preempt an unfunded job
  of any size (unfunded work is preemptible by contract); funded resumable jobs past their
  contracts stay victims only up to `debug_victim_ratio` times its GPUs, as before.
- **No debug reserve by default** (`debug_reserve_per` 0): with every unfunded job a debug
  victim, the nodes a reserve keeps idle or lends to the free tier buy no debug wait that
  preempting the free tier does not (measured with and without, docs/simulation.md).
- **A preempted funded job ranks by its team's share like any other** (as since `fairshare-2`);
  `fairshare-5`'s step that puts unfunded jobs that ran and were preempted after those that never
  ran is kept (`requeued_last`): without it, on the workload `fairshare-7` was tuned on, every
  wait's p90 and the worst team were worse (docs/simulation.md).
- **Churn is priced**: a plan's loss counts, per funded fairness victim, `relaunch_cost_s`
  of restart overhead on its GPUs beside the work since its checkpoint.
- **Large gangs get a reservation** (`hold_share`, `hold_expect_s`): the first funded job in
  the order that asks at least this share of its pool's GPUs and cannot be placed holds the
  nodes it can have soonest, counting jobs it may preempt as gone at their contracts' ends
  (Slurm backfill's reservation under contracts). Only unfunded jobs (which it preempts when
  its time comes) and jobs whose declared time limit ends before then are placed there
  meanwhile. A job that declared no time limit and that it may not preempt never frees its
  node for the reservation unless `hold_expect_s` says when to expect it (Slurm's DefaultTime;
  0 by default).
- **Gain that grows with the wait** (`gain_aging`, 0 by default: measured, not taken): seconds
  added to the gain horizon per second the waiting job has waited.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

from ledger.dispatch.fairshare2 import FairShare2, _gpu_h
from ledger.dispatch.policy import declared_end, ends_before
from ledger.dispatch.preemption import Victim
from ledger.dispatch.snapshot import PendingJob, RunningJob, Snapshot


class FairShare7(FairShare2, frozen=True, kw_only=True):
    """`fairshare-6` with the changes of the module docstring."""

    version: str = "fairshare-7"
    debug_reserve_per: int = 0
    requeued_last: bool = True
    relaunch_cost_s: float = 300.0
    hold_share: float = 0.125
    hold_expect_s: float = 0.0
    gain_aging: float = 0.0

    def expected_end(self, job: RunningJob, now: float) -> float:
        end = declared_end(job, now)
        if end < math.inf or self.hold_expect_s <= 0:
            return end
        return max(now, job.placed_at + job.min_runtime_s + self.hold_expect_s)

    @property
    def fresh_first(self) -> bool:
        return self.requeued_last

    def _debug_victims(
        self, job: PendingJob, candidates: Iterable[RunningJob], now: float
    ) -> Iterator[Victim]:
        most = self.debug_victim_ratio * job.gpus
        for r in candidates:
            unfunded = r.min_runtime_s <= 0
            if not unfunded and (not r.resumable or r.gpus > most):
                continue
            cost = self.victim_key(r, now)
            kind = "unfunded" if unfunded else "resumable"
            note = f"debug lane: {kind}, {r.gpus} GPUs, loses {_gpu_h(cost[1])}"
            yield Victim(r, "debug", cost, note)

    def weigh(
        self, job: PendingJob, victims: Sequence[Victim], snapshot: Snapshot, now: float
    ) -> str | None:
        if self.lane(job):
            return None
        funded = [v for v in victims if v.reason == "fairness" and v.job.min_runtime_s > 0]
        work = sum(v.cost[1] for v in funded)
        restarts = sum(self.restart_cost(v.job) for v in funded)
        horizon = self.gain_horizon_s + self.gain_aging * max(0.0, now - job.submitted_at)
        gain = job.gpus * horizon
        if work + restarts <= gain:
            return None
        ids = ", ".join(str(v.job.job_id) for v in victims)
        return (
            f"preempting jobs {ids} would lose {_gpu_h(work)} of funded work and "
            f"{_gpu_h(restarts)} of restarts, more than the {_gpu_h(gain)} gained "
            f"({job.gpus} GPUs x {horizon:g} s)"
        )

    def restart_cost(self, job: RunningJob) -> float:
        """GPU-seconds of restart overhead `weigh` counts for the funded victim `job`."""
        return job.gpus * self.relaunch_cost_s

    def holds_for(self, job: PendingJob, snapshot: Snapshot) -> bool:
        if job.min_runtime_s <= 0 or self.hold_share <= 0:
            return False
        if job.gpus < self.hold_share * pool_gpus(snapshot, job):
            return False
        return not self.lane(job)

    def may_backfill(self, job: PendingJob, until: float, now: float) -> bool:
        return job.min_runtime_s <= 0 or ends_before(job, until, now)


def pool_gpus(snapshot: Snapshot, job: PendingJob) -> int:
    """Pure: the GPUs of the active nodes `job` may run on (its GPU type and cluster, when it
    names them)."""
    key = ("pool_gpus", job.gpu_type, job.cluster)
    memo = snapshot.memo  # a cycle asks once per waiting job
    found: int | None = memo.get(key)
    if found is not None:
        return found
    found = memo[key] = sum(
        n.gpus
        for n in snapshot.nodes
        if n.state == "active"
        and (job.gpu_type is None or n.gpu_type == job.gpu_type)
        and (job.cluster is None or n.cluster == job.cluster)
    )
    return found
