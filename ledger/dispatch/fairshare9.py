"""`FairShare9` ("fairshare-9"): `fairshare-7` under which no job holds the cluster forever.

Pure: a policy is a config value (`schemas.policy.FairShare9Config` plus its version); its
methods are functions of their arguments. Everything not named here is `FairShare7`'s
(ledger/dispatch/fairshare7.py); `fairshare-8` and older keep their code exactly (replay).

Why (atk33-26 F3): a plan is taken only when its gain (the waiting job's GPUs x the gain
horizon) outweighs the funded work its victims lose. A non-resumable victim loses its whole run,
which grows without bound when it declared no time limit: one funded 64-GPU job held a 64-GPU
cluster for two days while 1,500 jobs of a team with no usage waited, and no record said why.

What changes, each a setting of its own:

- **Starvation ends the cost check** (`starve_after_s`, one day): a funded job that never ran
  and has waited that long since it was submitted takes a plan whatever its victims lose. The
  victims are still only those `fairshare-7` offers it: past their contracts, of a team it
  outranks by the margin that uses more than its share (a non-resumable one only when the
  waiting team's share is `spare_ratio` times the victim team's), unfunded jobs and squatters.
  So a job with no time limit runs at least its contract and then as long as no better-ranked
  team has waited a day behind it. Measured (docs/simulation.md, "fairshare-9"): one day
  decides as `fairshare-7` on the tuning workload and lowers every wait's p90 and the loss on
  Philly 400; 8 h quadrupled the funded loss on the tuning workload (4.3% against 1.1%), 12 h
  lengthened its waits.
- **The refusal is the reason, with its end**: a job refused a plan for its cost waits with
  `WAIT_RESOURCES: preempting jobs ... would lose ..., more than ... gained; it takes the plan
  anyway once it has waited ...` and, as `until`, the time it may (the cycle wakes then); the
  jobs of its team and shape that fail without searching after it wait with the same refusal
  (`as for job N (G GPUs), preempting ...`), not with the shortfall of free GPUs. `explain`,
  `queue` and the decision records say so.
- **Squat notes give the time as the CLI does** (`2026-01-01 00:00:00Z`), not `t=1.76722e+09`
  (six digits: up to 1.4 hours off).
"""

from __future__ import annotations

from collections.abc import Sequence

from ledger.dispatch.fairshare7 import FairShare7
from ledger.dispatch.preemption import Victim
from ledger.dispatch.snapshot import PendingJob, RunningJob, Snapshot
from schemas.units import when


class FairShare9(FairShare7, frozen=True, kw_only=True):
    """`fairshare-7` with the changes of the module docstring."""

    version: str = "fairshare-9"
    starve_after_s: float = 86_400.0

    def starves_at(self, job: PendingJob) -> float | None:
        """When a funded `job` has waited `starve_after_s` (None: never; a job that ran and
        was requeued would count its run as waiting, so it is not covered)."""
        if self.starve_after_s <= 0 or job.runs > 0 or job.min_runtime_s <= 0:
            return None
        return job.submitted_at + self.starve_after_s

    def weigh(
        self, job: PendingJob, victims: Sequence[Victim], snapshot: Snapshot, now: float
    ) -> str | None:
        refused = super().weigh(job, victims, snapshot, now)
        if refused is None:
            return None
        starves = self.starves_at(job)
        if starves is None:
            return refused
        if now >= starves:
            return None  # it has waited long enough: the loss no longer outweighs its wait
        return f"{refused}; it takes the plan anyway once it has waited {self.starve_after_s:g} s"

    def refused_until(self, job: PendingJob, now: float) -> float | None:
        """When a job refused a plan for its cost takes one anyway (`starves_at`)."""
        return self.starves_at(job)

    @property
    def shares_refusal(self) -> bool:
        return True

    def squat_note(self, job: RunningJob) -> str:
        return f"low utilisation since {when(job.low_util_since)}"
