"""`FairShare13` ("fairshare-13"): `fairshare-12`'s reservation, paid for by the reserved job's
own team, with debug jobs let onto the held nodes.

Pure: a policy is a config value (`schemas.policy.FairShare13Config` plus its version); its
methods are functions of their arguments. Everything not named here is `FairShare12`'s
(ledger/dispatch/fairshare12.py): the oldest large funded job's reservation made at once,
binding every job, started by preempting what is past its contract on its nodes;
`fairshare-12` and older keep their code exactly (replay).

`fairshare-12` reached `slurm-lab`'s large-job wait on 8 of 10 workloads, and the price was
paid by the teams whose work was drained (docs/simulation.md, "`fairshare-12`": the worst team
at 26.4% on 30 teams at 4x demand, funded loss up to 2.7%, debug p90 3 and 65 min). What
changes, two of the ideas that page left to try:

- **The reserved job's own team drains** (`hold_drain` "own"): for the reserved job, only
  unfunded jobs (nobody's share) and the resumable jobs of *its own team* count as freeing
  their GPUs at their contracts' ends (and are preempted to start it); every other team's
  funded work frees them only at its declared limit (never, when it declared none), so it is
  never preempted for another team's reservation. "fair": the same, and other teams' jobs
  that fair share offers the reserved job as victims (`fairshare-7`'s rule: teams it outranks
  by the margin) count as freeing at their contracts' ends too. "over" is `fairshare-12`'s rule
  (resumable work of teams over their share, `hold_victim_fs`).
- **Debug jobs use the held nodes** (`hold_debug`): a debug-lane job (funded, <= 15 minutes)
  may be placed on the reservation's nodes, and may preempt there as its lane allows: it ends
  within 15 minutes, so it delays the reserved job's start by at most that much.

Not done: the nodes of least loss among those free now (the reservation still takes the nodes
that free soonest, then by name) and one reservation per pool (every workload measured has
one pool).
"""

from __future__ import annotations

from typing import Literal

from ledger.dispatch.fairshare2 import team_of
from ledger.dispatch.fairshare7 import pool_gpus
from ledger.dispatch.fairshare12 import FairShare12
from ledger.dispatch.snapshot import PendingJob, RunningJob, Snapshot

HoldDrain = Literal["over", "own", "fair"]


class FairShare13(FairShare12, frozen=True, kw_only=True):
    """`fairshare-12` with the changes of the module docstring."""

    version: str = "fairshare-13"
    hold_drain: HoldDrain = "own"
    hold_debug: bool = True

    def hold_takes(self, job: PendingJob, running: RunningJob, snapshot: Snapshot) -> bool | None:
        """Whether `job`'s reservation counts `running`'s GPUs as free at its contract's end
        (`engine._hold_for`), and so preempts it to start (`engine._start_held`): with
        `hold_drain` "own", for the reserved job, unfunded jobs and resumable jobs of its own
        team, never a large job submitted before it ("fair": other funded jobs by
        `fairshare-7`'s rule); None for any other job (`fairshare-7`'s rule)."""
        if self.hold_drain == "over":
            return super().hold_takes(job, running, snapshot)
        if job.job_id != self.reserved_job(snapshot):
            return None
        if running.min_runtime_s <= 0:
            return True
        # a large job submitted before it is never drained for it (else two large jobs could
        # take turns preempting each other as their contracts end)
        if running.job_id < job.job_id and running.gpus >= self.hold_share * pool_gpus(
            snapshot, job
        ):
            return False
        # other funded work: never drained for this job ("own"), or only when fair share
        # would offer it as a victim ("fair": `fairshare-7`'s rule)
        other = None if self.hold_drain == "fair" else False
        if not running.resumable:
            return other
        if team_of(running.account, self.team_depth) != team_of(job.account, self.team_depth):
            return other
        return True

    def may_backfill(self, job: PendingJob, until: float, now: float) -> bool:
        """`fairshare-7`'s rule (unfunded jobs, jobs whose declared limit ends before `until`)
        and, with `hold_debug`, every debug-lane job."""
        if self.hold_debug and self.lane(job):
            return True
        return super().may_backfill(job, until, now)
