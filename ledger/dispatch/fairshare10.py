"""`FairShare10` ("fairshare-10"): `fairshare-9` whose order moves inside one cycle.

Pure: a policy is a config value (`schemas.policy.FairShare10Config` plus its version); its
methods are functions of their arguments. Everything not named here is `FairShare9`'s
(ledger/dispatch/fairshare9.py); `fairshare-9` and older keep their code exactly (replay).
`fairshare-9`'s starvation rule is off by default (`starve_after_s` 0, so the cost check is
`fairshare-7`'s): it is not the default policy's (docs/dispatch.md), and with it off
`fairshare-10` differs from the default, `fairshare-7`, by the charge alone.

Why (an outside attacker's finding): teams are ranked once per cycle from the usage the ranks
counted, and what the cycle itself places moves no team. When teams tie, at zero usage on a
fresh cluster or after a quiet week, the first team in the tie-break takes every idle GPU in the
first cycle (its 64-job array fills a 32-GPU cluster; the other teams' arrays wait for its
contracts). Kueue's fair sharing and Slurm's Fair Tree count an admission toward the share
before the next workload is ranked.

What changes: **each placement charges its team.** A funded job placed in the cycle adds its
GPUs x `charge_s` seconds (0, the default: its contract, `min_runtime_s`) to its team's usage,
and so to every ancestor's, before the next job is taken. Teams stand by their share of the
whole tree (`fairshare2.team_fs`: the team's allocated fraction over its fraction of all usage);
all usage grows by the same charge for every team, so comparing two teams needs only their own
usage over their allocated fraction, `(usage + charged) / allocated`, lower first, and a charge
moves only its own team. The order is a heap of teams per stretch of the order that shares the
parts before the team (debug lane, funded, unfunded that ran): the best team's next job is
taken, and only a placement re-ranks its team (`Charged`), so a cycle where nothing fits costs
no heap operation and one with P placements O(P log teams). Inside a team the order is
`fairshare-9`'s (priority, the user's rank, submit time, job id). Unfunded jobs charge nothing
(usage counts funded work only). Ties (equal standing, e.g. every team at zero usage and no
charge yet) fall back to `fairshare-9`'s team place.

Why the contract as the charge: it is the usage the placement certainly adds (the job is never
preempted inside it), it is known when the cycle decides, recorded in the job, and a job with a
longer contract commits more of the cluster than one with a shorter one. A fixed horizon
(`charge_s`) is a setting for the frontier.

What it reads beyond the ranks: `Snapshot.usage` and `Snapshot.shares` (the numbers the ranks
were computed from; `reads_usage`). A snapshot without them (a reader that has none) charges
nothing: the order is then `fairshare-9`'s. Preemption (victims, margins, the cost model) reads
the ranks as the cycle began, as `fairshare-9` does.

The sort key a decision records is `fairshare-9`'s with the team's place replaced by the job's
turn in the cycle's order (`key_parts`: `turn`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping, Sequence

from ledger.dispatch.fairshare2 import team_places
from ledger.dispatch.fairshare9 import FairShare9
from ledger.dispatch.ordering import Ordered, SortKey
from ledger.dispatch.snapshot import PendingJob, Snapshot

_Group = tuple[tuple[int, ...], Sequence[PendingJob]]


class FairShare10(FairShare9, frozen=True, kw_only=True):
    """`fairshare-9` with the change of the module docstring."""

    version: str = "fairshare-10"
    charge_s: float = 0.0
    starve_after_s: float = 0.0  # fairshare-9's rule off: the default policy has none

    @property
    def reads_usage(self) -> bool:
        """The cycle hands this policy `Snapshot.usage` and `Snapshot.shares`."""
        return True

    def charge(self, job: PendingJob) -> float:
        """Pure: the usage (GPU-seconds) placing `job` charges its team inside the cycle."""
        if job.min_runtime_s <= 0:
            return 0.0
        return job.gpus * (self.charge_s if self.charge_s > 0 else float(job.min_runtime_s))

    def order(self, snapshot: Snapshot) -> Charged:
        static = super().order(snapshot)
        assert isinstance(static, Ordered)
        part = 3 if self.fresh_first else 2  # where the team's place sits in a key's head
        places = team_places(snapshot, self.team_depth)
        if not snapshot.usage or not places:
            standing: dict[int, tuple[float, float]] = {}
        else:
            standing = {
                place: (snapshot.usage.get(team, 0.0), allocated(team, snapshot.shares))
                for team, place in places.items()
            }
        return Charged(static.groups, part, standing, self.charge)


def allocated(team: str, shares: Mapping[str, float]) -> float:
    """Pure: a team's allocated fraction of the whole tree: the product of the norm shares on
    its path (0 when one is unknown)."""
    out = 1.0
    cut = 0
    while cut >= 0:
        cut = team.find("/", cut + 1)
        out *= shares.get(team if cut < 0 else team[:cut], 0.0)
    return out


class Charged(Ordered):
    """Pending jobs in an order that placements move: `walk()` yields them one at a time, and
    `placed(job)` (the cycle calls it when it places the job it was just handed) charges the
    job's team before the next one is chosen. Read as a sequence it holds the order walked, each
    key with the team's place replaced by the job's turn; read before any walk, it walks once
    with nothing placed."""

    __slots__ = (
        "_charge",
        "_heads",
        "_part",
        "_place",
        "_placed",
        "_segments",
        "_standing",
        "_total",
    )

    def __init__(
        self,
        groups: Sequence[_Group],
        part: int,
        standing: Mapping[int, tuple[float, float]],
        charge: Callable[[PendingJob], float],
    ) -> None:
        super().__init__(())
        self._part = part
        self._standing = {p: list(v) for p, v in standing.items()}
        """Team place -> [usage + charged so far, allocated fraction]."""
        self._charge = charge
        self._heads: list[tuple[tuple[int, ...], int]] = []
        """(head, how many jobs) per stretch of `jobs` handed out from one group."""
        self._placed = False
        self._place = 0
        """The team place of the job last handed out."""
        self._total = 0
        segments: list[tuple[tuple[int, ...], dict[int, list[_Group]]]] = []
        for head, members in groups:  # sorted by head: segments, then team places, in order
            seg = head[:part]
            if not segments or segments[-1][0] != seg:
                segments.append((seg, {}))
            segments[-1][1].setdefault(head[part], []).append((head, members))
            self._total += len(members)
        self._segments = segments

    def _rank(self, place: int) -> float:
        """A team's standing: its usage (with what the cycle charged it) over its allocated
        fraction, lower first; 0 for a team without usage or not known."""
        found = self._standing.get(place)
        if found is None or found[0] <= 0.0:
            return 0.0
        return found[0] / found[1] if found[1] > 0.0 else math.inf

    def placed(self, job: PendingJob) -> None:
        """The job just handed out was placed: charge its team."""
        self._placed = True
        found = self._standing.get(self._place)
        if found is not None:
            found[0] += self._charge(job)

    def walk(self) -> Iterator[PendingJob]:
        """The jobs, best team's next job first; a placement re-ranks its team, and the walk
        moves to another team only when that one now ranks first. What was handed out is kept
        as stretches of one group (`jobs` and `_heads`), not job by job."""
        jobs, heads, rank = self.jobs, self._heads, self._rank
        for _, teams in self._segments:
            heap = [(rank(place), place) for place in teams]
            heapq.heapify(heap)
            cursor = dict.fromkeys(teams, (0, 0))
            done: set[int] = set()
            while heap:
                place = heap[0][1]
                if place in done:  # left the top while its last job was placed
                    heapq.heappop(heap)
                    continue
                self._place = place
                groups = teams[place]
                gi, mi = cursor[place]
                switch = False
                while gi < len(groups) and not switch:
                    head, members = groups[gi]
                    n, begun = len(members), mi
                    while mi < n:
                        job = members[mi]
                        mi += 1
                        yield job
                        if self._placed:  # only a placement sets it
                            self._placed = False
                            heapq.heapreplace(heap, (rank(place), place))
                            if heap[0][1] != place:
                                switch = True
                                break
                    jobs += members[begun:mi]
                    heads.append((head, mi - begun))
                    if mi >= n:
                        gi, mi = gi + 1, 0
                if gi >= len(groups):
                    if heap[0][1] == place:
                        heapq.heappop(heap)
                    else:
                        done.add(place)
                else:
                    cursor[place] = (gi, mi)

    def pairs(self) -> list[tuple[SortKey, PendingJob]]:
        found = self._pairs
        if found is None:
            if len(self.jobs) < self._total:
                for _ in self.walk():  # read before (or without) a cycle: nothing placed
                    pass
            part, jobs = self._part, self.jobs
            found = []
            turn = 0
            for head, n in self._heads:
                before, after = head[:part], head[part + 1 :]
                for j in jobs[turn : turn + n]:
                    found.append(((*before, turn, *after, j.submitted_at, j.job_id), j))
                    turn += 1
            self._pairs = found
        return found

    def __len__(self) -> int:
        return self._total
