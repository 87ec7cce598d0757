"""`FairShare16` ("fairshare-16"): `fairshare-7` with the free tier's takebacks priced and
bounded.

Pure: a policy is a config value (`schemas.policy.FairShare16Config` plus its version); its
methods are functions of their arguments. Everything not named here is `FairShare7`'s
(ledger/dispatch/fairshare7.py); `fairshare-7` and older keep their code exactly (replay).
(`fairshare-15` was an unmerged branch's: the number is skipped.)

Why: judged by the time queued per job (every wait of a job, first and after each requeue,
summed), `fairshare-7` queues its unfunded jobs as long as `slurm-lab` does but more of them:
funded work takes the free tier's GPUs back again and again (one Philly job 98 times), each
takeback puts a job back in the queue, and `requeued_last` puts it behind every unfunded job
that never ran, so the all-jobs p90 is set by the free tier's many requeue waits
(docs/simulation.md, "fairshare-16").

What changes, each a setting of its own so the frontier tables can turn it off (on by default:
the two prices; the rest measured worse on Philly 400 and left off, docs/simulation.md). With
both prices 0 and the rest off it decides as `fairshare-7`.

- **Churn is priced in the victim choice** (`takeback_price_s`, 3,600 s): an unfunded victim costs,
  beside the GPU-seconds of work it loses, its GPUs x `takeback_price_s` for every time it was
  taken back before, so among the free tier's jobs the plans of least cost take those taken back
  fewest times first. (Unfunded victims cost nothing when a plan is weighed against its gain, as
  before: the price only orders them.) `takeback_spread` off turns it round: the jobs taken back
  most (up to `CONCENTRATE_RUNS`) go first, so the takebacks stay with few jobs.
- **Takebacks are bounded** (`takeback_limit`): an unfunded job already taken back this many
  times is no victim of funded non-debug work (0: no bound); debug-lane jobs may still preempt it
  (they run at most 15 minutes).
- **Funded churn is priced too** (`funded_takeback_price_s`, 1,800 s): when a plan is weighed
  against its gain, a funded fairness victim costs, beside its lost work and restart overhead,
  its GPUs x this for every time it was taken back before (0: as `fairshare-7`), so a long job is
  not taken back again and again as its team's share drifts round the margin.
- **A moment's grace** (`takeback_grace_s`): an unfunded job placed less than this long ago is
  no victim of funded non-debug work (0: none), so a relaunch is not undone before it made
  progress (work since the last checkpoint is lost, and the restart overhead is paid again).
- **Requeued free-tier jobs first** (`requeued_first`, off): `fairshare-5`'s step turned round:
  unfunded jobs that ran and were preempted go before those that never ran (off:
  `fairshare-7`'s order, `requeued_last`), so a job taken back waits for the next free GPUs,
  not for every later arrival of the free tier.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ledger.dispatch.fairshare7 import FairShare7
from ledger.dispatch.preemption import CLASS_UNFUNDED, Victim
from ledger.dispatch.snapshot import PendingJob, RunningJob, Snapshot

CONCENTRATE_RUNS = 16
"""With `takeback_spread` off, an unfunded victim costs its GPUs x `takeback_price_s` for every
takeback it is short of this many: the jobs taken back most are taken first."""


class FairShare16(FairShare7, frozen=True, kw_only=True):
    """`fairshare-7` with the changes of the module docstring."""

    version: str = "fairshare-16"
    takeback_price_s: float = 3600.0
    takeback_limit: int = 0
    takeback_grace_s: float = 0.0
    funded_takeback_price_s: float = 1800.0
    requeued_first: bool = False
    takeback_spread: bool = True

    @property
    def fresh_first(self) -> bool:
        return self.requeued_last or self.requeued_first

    @property
    def ran_first(self) -> bool:
        return self.requeued_first

    def victim_key(self, job: RunningJob, now: float) -> tuple[float, ...]:
        """(class, GPU-seconds lost, plus the price of the takebacks before for the free tier)."""
        klass = self._class(job, now)
        lost = job.gpus * job.work_lost_s(now)
        if klass == CLASS_UNFUNDED:
            if self.takeback_spread:
                lost += job.gpus * self.takeback_price_s * job.runs
            else:  # the jobs taken back most first, up to `CONCENTRATE_RUNS` takebacks
                lost += job.gpus * self.takeback_price_s * max(0, CONCENTRATE_RUNS - job.runs)
        return (klass, lost)

    def restart_cost(self, job: RunningJob) -> float:
        """The restart overhead, and the price of the funded victim's takebacks before."""
        return job.gpus * (self.relaunch_cost_s + self.funded_takeback_price_s * job.runs)

    def victims(
        self, job: PendingJob, candidates: Iterable[RunningJob], snapshot: Snapshot, now: float
    ) -> Iterator[Victim]:
        limit, grace = self.takeback_limit, self.takeback_grace_s
        found = super().victims(job, candidates, snapshot, now)
        if (limit <= 0 and grace <= 0) or self.lane(job):
            yield from found
            return
        for v in found:
            r = v.job
            if r.min_runtime_s <= 0:
                if 0 < limit <= r.runs:
                    continue  # taken back often enough: it keeps its GPUs against funded work
                if now - r.placed_at < grace:
                    continue  # placed a moment ago: let it get somewhere first
            yield v
