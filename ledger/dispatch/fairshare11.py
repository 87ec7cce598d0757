"""`FairShare11` ("fairshare-11"): a reservation for the oldest large job that every job respects
once it is near.

Pure: a policy is a config value (`schemas.policy.FairShare11Config` plus its version); its
methods are functions of their arguments. Everything not named here is `FairShare8`'s
(ledger/dispatch/fairshare8.py) and so `fairshare-7`'s; `fairshare-10` and older keep their code
exactly (replay).

Why: large gang jobs waited longer than under `slurm-lab` on the tuning workload and on held-out
ones (docs/simulation.md, "Large jobs: the target missed"). `fairshare-7` reserves for the first
large job in the team order, which changes as shares change, and only jobs after it in the order
respect the reservation; `fairshare-8` showed that a reservation for the *oldest* large job that
binds every job (`hold_early`, Slurm backfill's order: the top job's reservation binds everyone)
reaches `slurm-lab`'s figure, and pays for it on the worst team, since its nodes are held (kept
for jobs that end before it starts) for as long as it takes them to drain, days at a time.

What changes (Slurm's `sched/backfill` with its `bf_window`):

- **The oldest large funded job's reservation binds every job, inside a window**
  (`hold_window_s`): each cycle, before any job is considered, the nodes the oldest large job
  can have soonest are computed as `fairshare-7` computes them (free GPUs; jobs it may preempt
  at their contracts' ends; jobs with a declared time limit at that limit; other jobs never).
  When they are all free by `now + hold_window_s`, every other job respects them (only unfunded
  jobs and jobs whose declared limit ends before then are placed there); when later, no
  reservation binds the jobs ahead of it, and it holds nodes when the cycle reaches it, as in
  `fairshare-8` without the lift. Slurm plans no reservation beyond `bf_window` either.
- **Only once it has waited** (`hold_early_after_s`, 0): the binding reservation is made only
  for a job that has waited that long since it was submitted (Slurm's age factor).
- Defaults of `fairshare-8` changed: `hold_lift` off (lifting the job ahead of every team cost
  the worst team on the tuning workload and on held-out ones), `hold_early` on.
- **Squat notes give the time as the CLI does** (`fairshare-9`'s fix).

The order is `fairshare-7`'s when `hold_lift` is off (its sort keys too: no part for the
reservation), `fairshare-8`'s when on.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from ledger.dispatch.fairshare7 import FairShare7
from ledger.dispatch.fairshare8 import FairShare8
from ledger.dispatch.ordering import SortKey
from ledger.dispatch.snapshot import PendingJob, RunningJob, Snapshot
from schemas.units import when


class FairShare11(FairShare8, frozen=True, kw_only=True):
    """`fairshare-8` with the changes of the module docstring."""

    version: str = "fairshare-11"
    hold_lift: bool = False
    hold_early: bool = True
    hold_window_s: float = 3_600.0
    hold_early_after_s: float = 86_400.0

    def hold_before(self, snapshot: Snapshot) -> PendingJob | None:
        """The oldest large funded job, whose reservation `decide()` makes before it considers
        any job when it starts within `hold_window_s` (`engine._hold_for`), once it has waited
        `hold_early_after_s`."""
        found = super().hold_before(snapshot)
        if found is None or snapshot.taken_at - found.submitted_at < self.hold_early_after_s:
            return None
        return found

    # fairshare-8 returns a list; fairshare-7's order is an `Ordered` (a sequence, lazily keyed)
    def order(self, snapshot: Snapshot) -> Sequence[tuple[SortKey, PendingJob]]:  # type: ignore[override]
        if self.hold_lift:
            return super().order(snapshot)
        return FairShare7.order(self, snapshot)

    def job_traits(self, job: PendingJob, snapshot: Snapshot) -> Hashable:
        """`fairshare-8`'s traits (with whether the job is the reserved one), the reserved job
        looked up once per snapshot: a cycle asks for every waiting job."""
        picked = self.reserved_job(snapshot)  # kept with the snapshot (`reserved_for`)
        return (FairShare7.job_traits(self, job, snapshot), job.job_id == picked)

    def squat_note(self, job: RunningJob) -> str:
        return f"low utilisation since {when(job.low_util_since)}"
