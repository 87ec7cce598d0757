"""`FairShare12` ("fairshare-12"): a reservation for a large job of a team under its share, made
at once, drained toward as contracts end, and started by preempting what is past its contract.

Pure: a policy is a config value (`schemas.policy.FairShare12Config` plus its version); its
methods are functions of their arguments. Everything not named here is `FairShare11`'s
(ledger/dispatch/fairshare11.py) and so `fairshare-7`'s order, victims and cost model;
`fairshare-11` and older keep their code exactly (replay).

Why `slurm-lab` starts large jobs sooner (docs/simulation.md, "Large jobs"): it reserves for its
top pending job *at once*, every later job respects the reservation (only jobs whose limit ends
first backfill), and the reserved nodes free when their jobs end. `fairshare-7` reserves only
when the cycle reaches the job (jobs ahead of it take the freed GPUs), counts a node as freeing
only at the end of contracts of jobs it may preempt *for fairness*, and even then starts the job
only when a fairness plan passes the cost model, which a gang of 8 nodes rarely does.
`fairshare-11` bound every job but only after a day and inside a 1-hour window, and for the
oldest large job whatever its team (the 30-team corners paid on their worst team).

What changes:

- **Whose reservation** (`hold_team_fs`, `hold_by`): of the funded jobs asking at least
  `hold_share` of their pool, only those of a team whose share of the whole tree is at least
  `hold_team_fs` (1: a team using no more than its share; the teams fair share owes); of
  them the oldest (`hold_by` "oldest", the same job every cycle while its team stays owed) or
  the one of the most owed team ("share"). None: `fairshare-7`'s reservation (the first large
  job in the order, made when the cycle reaches it).
- **At once**: `hold_early_after_s` 0 and no window (`hold_window_s` 0): the reservation binds
  every job from the first cycle (only unfunded jobs and jobs whose declared limit ends before
  it starts use its nodes meanwhile).
- **Nodes that free soonest by contracts** (`hold_takes`): for the reserved job, every running
  unfunded or resumable job frees its GPUs at its contract's end, whatever its team (fair share
  would offer it as a fairness victim only from a team the waiting one outranks by the margin);
  a funded job that is not resumable, or a large job submitted before it, frees them at its
  declared limit only (never, when it declared none): preempting the first loses its whole run,
  and two large jobs could take turns preempting each other as their contracts end.
- **Started by preemption** (`hold_start`, `hold_starts`): when every job on the reserved nodes
  is past its contract (the reservation's time has come) and the job still does not fit, the
  engine preempts them (reason `fairness`, a note naming the reservation) and places it there,
  without the cost model's refusal: a drain that waited for natural ends could wait for days
  (most funded work declares no limit).
"""

from __future__ import annotations

from typing import Literal

from ledger.dispatch.fairshare2 import team_fs, team_of
from ledger.dispatch.fairshare7 import FairShare7, pool_gpus
from ledger.dispatch.fairshare11 import FairShare11
from ledger.dispatch.snapshot import PendingJob, RunningJob, Snapshot

HoldBy = Literal["oldest", "share"]


class FairShare12(FairShare11, frozen=True, kw_only=True):
    """`fairshare-11` with the changes of the module docstring."""

    version: str = "fairshare-12"
    hold_window_s: float = 0.0
    hold_early_after_s: float = 0.0
    hold_team_fs: float = 0.0
    hold_by: HoldBy = "oldest"
    hold_start: bool = True
    hold_binds: bool = True
    hold_victim_fs: float = 1.0

    def reserved_for(self, snapshot: Snapshot) -> PendingJob | None:
        """The large funded job of an owed team the cycle reserves for (see the module
        docstring), or None."""
        if self.hold_share <= 0:
            return None
        pending = snapshot.pending
        settings = (self.hold_share, self.debug_lane, self.hold_team_fs, self.hold_by)
        kept = ("reserved_for12", *settings, self.team_depth)
        memo = snapshot.memo  # a cycle asks once per waiting job
        if kept in memo:
            last: PendingJob | None = memo[kept]
            return last
        best: PendingJob | None = None
        best_key: tuple[float, float, int] | None = None
        shares: dict[str, float] = {}
        share = self.hold_share
        for j in pending:
            if j.min_runtime_s <= 0 or self.lane(j):
                continue
            pool = pool_gpus(snapshot, j)
            if j.gpus < share * pool or j.gpus > pool:
                continue  # not large, or larger than its pool: it would hold nothing, forever
            team = team_of(j.account, self.team_depth)
            fs = shares.get(team)
            if fs is None:
                fs = shares[team] = team_fs(team, snapshot.level_fs) or 0.0
            if fs < self.hold_team_fs:
                continue
            key = (-fs if self.hold_by == "share" else 0.0, j.submitted_at, j.job_id)
            if best_key is None or key < best_key:
                best, best_key = j, key
        memo[kept] = best
        return best

    def holds_for(self, job: PendingJob, snapshot: Snapshot) -> bool:
        picked = self.reserved_job(snapshot)
        if picked is None:  # no owed team's large job: fairshare-7's reservation
            return FairShare7.holds_for(self, job, snapshot)
        return job.job_id == picked

    def hold_takes(self, job: PendingJob, running: RunningJob, snapshot: Snapshot) -> bool | None:
        """Whether `job`'s reservation counts `running`'s GPUs as free at its contract's end
        (`engine._hold_for`): for the reserved job, unfunded and resumable jobs of any team and
        no other (a funded job that is not resumable, or a large job submitted before it,
        frees them at its declared limit, never without one); None for any other job
        (`fairshare-7`'s rule)."""
        if job.job_id != self.reserved_job(snapshot):
            return None
        if running.min_runtime_s <= 0:
            return True
        # a large job submitted before this one (a lower id: ids are given in submission
        # order) is never drained for it, else two large jobs could take turns preempting
        # each other as their contracts end
        if running.job_id < job.job_id and running.gpus >= self.hold_share * pool_gpus(
            snapshot, job
        ):
            return False
        if self.hold_victim_fs > 0:
            team = team_of(running.account, self.team_depth)
            if (team_fs(team, snapshot.level_fs) or 0.0) >= self.hold_victim_fs:
                return False  # a team using no more than its share keeps its work
        return running.resumable

    def hold_starts(self, job: PendingJob, snapshot: Snapshot) -> bool:
        """Whether the engine may start `job` on its reservation's nodes by preempting the jobs
        there once all are past their contracts (`engine._start_held`)."""
        return self.hold_start and job.job_id == self.reserved_job(snapshot)
