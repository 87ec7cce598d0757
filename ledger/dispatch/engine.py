"""One dispatcher cycle's decision: `decide(snapshot, policy, now) -> Decision`.

Pure: no I/O, no clock, no ids; the same snapshot, policy and `now` give the same decision, byte
for byte. The cycle edge takes the snapshot at log position P, calls `decide`, and appends
`Decision.to_command(...)` with expected position P, so the ledger rejects a decision that the
log has overtaken.

Steps:

1. Index the free GPUs of the active nodes (`placement.FreeIndex`).
2. Maintenance: preempt every job on a draining node whose contract has ended (reason
   `maintenance`); note when the next contract on a draining node ends (`wake_at`).
3. Take the pending jobs in the policy's order. Each job is placed if it fits. If not, and the
   policy lets it preempt, search for victims among the running jobs *past their contract*; when
   the freed GPUs plus the free ones fit it by the placement rules, preempt them and place it on
   the GPUs they free, in this same cycle. Otherwise record why it waits (`Unplaceable`).
4. Record the fragmentation left for the jobs still waiting, and when to wake next.

Backfill: there is no reservation. A job that cannot be placed reserves nothing, so a later job
that fits in the remaining free GPUs is placed now. This never idles a GPU while work waits; the
price is that a large job can be overtaken by smaller later ones. It does not starve for long under
fair share: once the jobs that overtook it pass their contracts it may preempt them (when it
outranks them by the margin), and until then the cycle reports `WAIT_CONTRACT` with the time room
appears, which feeds `wake_at`.

Victim searches cost O(running jobs) each, so a cycle runs at most `Policy.search_budget` of
them (a search and, when it fails, the estimate behind `WAIT_CONTRACT` count one each; with no
budget left for the estimate the job reads `WAIT_RESOURCES`). One
policy answer serves every job of a victim group (`Policy.victim_group`) in the cycle, and a failed
search makes later jobs of the same group and shape asking as many GPUs fail without searching,
until a preemption frees GPUs.

Why a job waits (`Unplaceable.code`):

- `WAIT_PRIORITY`: it would have fitted in the GPUs free at the start of the cycle, but jobs
  ahead of it in the order took them; or the cycle's victim searches (`Policy.search_budget`)
  went to jobs ahead of it.
- `WAIT_CONTRACT`: there is room for it once contracts of jobs it may preempt end (`until`).
- `WAIT_RESOURCES`: not enough GPUs of its shape are free, and nothing it may preempt frees them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence

import msgspec

from ledger.dispatch import reservation
from ledger.dispatch.decision import Carry, Decision, Idle
from ledger.dispatch.ordering import KeptClasses, Ordered, SortKey
from ledger.dispatch.placement import (
    FreeIndex,
    Pool,
    PoolKey,
    Shape,
    fragmentation_split,
)
from ledger.dispatch.policy import Policy, victim_key_of
from ledger.dispatch.preemption import (
    Ask,
    Plan,
    Replay,
    dearest_nodes,
    plan_gang,
    plan_gang_least,
    plan_single,
    plan_single_least,
    ready_key,
)
from ledger.dispatch.reservation import Frees, Hold, KeptSlots, soonest, start_plan
from ledger.dispatch.snapshot import (
    PendingJob,
    RunningJob,
    Snapshot,
    complete_ranks_kept,
)

# `Unplaceable`, `WaitCode`, `WaitRun` are re-exported: their readers import them from here
from ledger.dispatch.waits import Unplaceable as Unplaceable
from ledger.dispatch.waits import WaitCode as WaitCode
from ledger.dispatch.waits import WaitRun as WaitRun
from schemas.codec import gc_paused
from schemas.events import (
    GpuSlot,
    Placement,
    Preemption,
    PreemptReason,
)

_MemoKey = tuple[Hashable, str | None, str | None, bool]
_GroupKey = tuple[Hashable, str | None, str | None, bool]

_BUDGET_SPENT = Unplaceable(
    code="WAIT_PRIORITY", reason="the cycle's victim searches went to jobs ahead of it in the order"
)
_TAKEN = Unplaceable(
    code="WAIT_PRIORITY",
    reason="jobs ahead of it in the order took the GPUs free at the start of the cycle",
)


_Facts = tuple[bool, Hashable, tuple[str, int], bool]
"""What a policy says of a pending job by its traits alone (`job_traits`): may it preempt, its
victim group, its search budget, does it get a reservation when left waiting."""


def _facts(policy: Policy, job: PendingJob, snapshot: Snapshot) -> _Facts:
    may = policy.may_preempt(job)
    group = policy.victim_group(job, snapshot) if may else None
    return (may, group, policy.budget_of(job), policy.holds_for(job, snapshot))


class _Cycle:
    """The scratch state of one `decide()` call."""

    def __init__(
        self,
        snapshot: Snapshot,
        policy: Policy,
        now: float,
        index: FreeIndex,
        kept_slots: KeptSlots | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.policy = policy
        self.now = now
        self.index = index
        self.spent: dict[str, int] = {}
        """Victim searches spent per budget (`Policy.budget_of`)."""
        self.rounds = int(getattr(policy, "search_rounds", 1))
        self.renewed: dict[str, tuple[int, int]] = {}
        """Per budget: budgets drawn on, placements and preemptions when last renewed."""
        self.reserved = sorted(n for n in policy.reserved(snapshot) if n in self.index.free)
        """Active nodes kept for debug jobs (`Policy.reserved`)."""
        self.hidden: list[GpuSlot] | None = None
        """The reserved nodes' free GPUs, taken out of the index while funded non-debug jobs
        are considered."""
        self.hold: Hold | None = None
        """The cycle's reservation (at most one)."""
        self.held: list[GpuSlot] | None = None
        """The held nodes' free GPUs, taken out of the index while jobs that may not backfill
        are considered."""
        self.drain_at: str | None = None  # the node the free tier's head drains (`_drain_for`)
        self.drained: list[GpuSlot] | None = None  # its free GPUs out of the index (`_draining`)
        self.live: dict[int, RunningJob] = {}
        self.preempted = False
        """Whether a job left `live` this cycle (until then every victim read is live)."""
        self.in_pool: dict[tuple[PoolKey, bool], list[RunningJob]] = {}
        """Running jobs by the pools of the active nodes they hold GPUs on, and whether they
        are past their contract (victim candidates)."""
        free, pool_of = self.index.free, self.index.pool_of
        in_pool = self.in_pool
        for r in snapshot.running:  # order does not matter: candidates are sorted by key
            self.live[r.job_id] = r
            past = now >= r.placed_at + r.min_runtime_s
            slots = r.slots
            if len(slots) == 1:  # most jobs: one node, one pool
                node = slots[0].node
                if node in free:
                    in_pool.setdefault((pool_of[node], past), []).append(r)
                continue
            keys = {pool_of[sl.node] for sl in slots if sl.node in free}
            for key in keys if len(keys) < 2 else sorted(keys):
                in_pool.setdefault((key, past), []).append(r)
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.order: Sequence[tuple[SortKey, PendingJob]] = ()
        self.runs: list[list] = []  # type: ignore[type-arg]
        """[start, stop, why] per stretch of the order waiting for one reason (`WaitRun`)."""
        self.smallest: dict[Shape, int] = {}
        """The fewest GPUs a waiting job of each shape asks for (for `fragmentation`)."""
        self.wake: list[float] = []
        self.budget_spent = False
        self.funded_waiting = 0
        """Funded jobs left waiting."""
        self.failed: dict[_MemoKey, tuple[int, int, Unplaceable, bool]] = {}
        """A failed victim search: (GPUs asked, job id, why, whether the policy refused the
        plan it found) per group and shape. While no preemption frees GPUs, a job of the group
        and shape asking as many fails as well."""
        self.refused_until: Callable[[PendingJob, float], float | None] | None = getattr(
            policy, "refused_until", None
        )
        """When a job refused a plan for its cost may take it anyway (`Policy.weigh`), if the
        policy says; its jobs then wait with that time (and the cycle wakes then)."""
        self.plans_tried = (
            int(getattr(policy, "plans_tried", 1)) if getattr(policy, "least_loss", False) else 1
        )
        """How many least-loss plans a victim search weighs before the job waits: after a
        refused one the next, on none of the nodes of its dearest victim (`_next_plans`;
        older policies: 1)."""
        self.shares_refusal = bool(getattr(policy, "shares_refusal", False))
        """Jobs that fail without searching after a refused plan wait with the refusal too
        (else with the shortfall of free GPUs)."""
        self.victims: dict[_GroupKey, Replay] = {}
        """The policy's victims per victim group, constraints and contract mode: one answer
        serves every job of the group this cycle (preempted jobs are skipped as they go)."""
        self.ordered: dict[tuple[tuple[PoolKey, ...], bool], list[RunningJob]] = {}
        self.shared: dict[tuple[str, str, float | None], Unplaceable] = {}
        self.frees = Frees(now, self.index, policy.expected_end, kept_slots)
        """When the running jobs free their GPUs, for the cycle's reservations (`_hold_for`),
        from the last cycle's slots on active nodes of the jobs that did not change."""
        self.pool_gpus: dict[tuple[PoolKey, ...], int] = {}
        """GPUs of a pool set's active nodes but the reserved ones (`_whole_ever`)."""
        self.epoch = 0
        """Counts every change of the cycle's state other than the index's GPUs (those count in
        `FreeIndex.moves`): a search spent, the reserve or the held nodes hidden or shown, a
        reservation made. With `moves`, it says that nothing a waiting job's answer depends on
        (beyond its shape and traits) changed."""

    # --- 2. maintenance -------------------------------------------------------------------------

    def drain(self) -> None:
        draining = {n.name for n in self.snapshot.nodes if n.state == "draining"}
        if not draining:
            return
        on_draining = [r for r in self.live.values() if any(s.node in draining for s in r.slots)]
        for r in sorted(on_draining, key=lambda r: r.job_id):
            if r.in_contract(self.now):
                self.wake.append(r.contract_ends_at)
            else:
                on = ", ".join(sorted({sl.node for sl in r.slots} & draining))
                self._preempt(r, "maintenance", None, f"node {on} is draining")

    # --- 3. order, place, preempt ---------------------------------------------------------------

    def consider(self, ordered: Sequence[tuple[SortKey, PendingJob]]) -> None:
        """Place, preempt for, or explain each job in order (the hot loop of a cycle). A job
        left waiting joins the run of the job before it when both wait for the same reason."""
        index, policy, snapshot = self.index, self.policy, self.snapshot
        self.order = ordered
        runs, smallest = self.runs, self.smallest
        run: list | None = None  # type: ignore[type-arg]
        shapes: dict[tuple[str | None, str | None, int], tuple[bool, bool]] = {}
        reserved = self.reserved
        spent, budget_of = self.spent, policy.budget_of
        may_preempt, victim_group = policy.may_preempt, policy.victim_group
        holds_for, may_backfill = policy.holds_for, policy.may_backfill
        # what the policy says of a job by its traits alone, asked once per traits this cycle
        traits_of: Callable[[PendingJob, Snapshot], Hashable] | None = getattr(
            policy, "job_traits", None
        )
        shaped = bool(getattr(policy, "traits_shaped", False))  # traits hold the shape too
        facts: dict[Hashable, _Facts] = {}
        seen: dict[Hashable, tuple[int, int, Unplaceable]] = {}
        """The cycle's stamp (`epoch`, the index's `moves`) when the last job of a shape and
        traits waited, and why: while neither moves, the next such job waits as it did."""
        starts: Callable[[PendingJob, Snapshot], bool] | None = getattr(policy, "hold_starts", None)
        """Whether the reserved job may preempt the jobs left on its nodes once all are past
        their contracts (`_start_held`); older policies: never."""
        window_for: Callable[[PendingJob], float] | None = getattr(policy, "hold_window_for", None)
        early = getattr(policy, "hold_before", None)
        first = early(snapshot) if early is not None else None
        if first is not None:  # a reservation every job but its own respects (`hold_before`)
            # made only when it starts within the policy's window (`hold_window_s`; 0: any time)
            window = float(getattr(policy, "hold_window_s", 0.0)) or math.inf
            self._hold_for(first, index.is_gang(first), window)
        # an early reservation that binds no job (`hold_binds` false): it only says which nodes
        # the job starts on once all their jobs are past their contracts (`_start_held`)
        loose = (
            first.job_id if first is not None and not getattr(policy, "hold_binds", True) else None
        )
        drains: Callable[[PendingJob, Snapshot], bool] | None = getattr(policy, "drains_for", None)
        wake = self.wake
        waited: set[tuple[str | None, str | None, int]] = set()  # shapes seen waiting
        # an order that placements move (`fairshare10.Charged`): handed out one job at a time,
        # told of each placement before the next is chosen
        walk: Callable[[], Iterator[PendingJob]] | None = getattr(ordered, "walk", None)
        charge: Callable[[PendingJob], None] | None = getattr(ordered, "placed", None)
        jobs: Iterable[PendingJob]
        if walk is not None:
            jobs = walk()
        else:
            jobs = ordered.jobs if isinstance(ordered, Ordered) else [j for _, j in ordered]
        for at, job in enumerate(jobs):
            if reserved and (job.min_runtime_s > 0 and not job.debug) != (self.hidden is not None):
                self._reserve(self.hidden is None)
            if self.drain_at and (job.min_runtime_s > 0) == (self.drained is not None):
                self._draining(self.drained is None)
            hold = self.hold
            if (
                hold is not None
                and hold.job_id != loose
                and (job.job_id == hold.job_id or may_backfill(job, hold.until, self.now))
                == (self.held is not None)
            ):
                self._holding(self.held is None)
            shape = (job.gpu_type, job.cluster, job.gpus)
            known = shapes.get(shape)
            if known is None:
                gang = index.is_gang(job)
                known = shapes[shape] = (gang, index.fitted_at_start(job, gang))
            gang, fitted = known
            if traits_of is not None:
                traits = traits_of(job, snapshot)
                seen_key = traits if shaped else (shape, traits)
                same = seen.get(seen_key)
            else:
                traits = seen_key = same = None
            epoch, moves = self.epoch, index.moves
            if same is not None and same[0] == epoch and same[1] == moves:
                # nothing moved since a job of the same shape and traits waited: so does this one
                wait = same[2]
                if wait.until is not None:
                    wake.append(wait.until)
            else:
                slots = index.place(job, gang)
                memo: _MemoKey | None = None
                searches = False
                fact: _Facts | None = None
                if slots is None and traits is not None:
                    fact = facts.get(traits)
                    if fact is None:
                        fact = facts[traits] = _facts(policy, job, snapshot)
                if slots is None and (fact[0] if fact is not None else may_preempt(job)):
                    if fact is not None:
                        group, (name, budget) = fact[1], fact[2]
                    else:
                        group, (name, budget) = victim_group(job, snapshot), budget_of(job)
                    searches = group is not None
                    if searches and (spent.get(name, 0) < budget or self._renew(name)):
                        memo = (group, job.gpu_type, job.cluster, gang)
                        slots = self._by_preemption(job, gang, memo)
                if (
                    slots is None
                    and hold is not None
                    and job.job_id == hold.job_id
                    and hold.until <= self.now
                    and starts is not None
                    and starts(job, snapshot)
                ):  # its reservation's time has come: preempt what is left on its nodes
                    slots = self._start_held(job, gang, hold)
                if slots is not None:
                    if hold is not None and job.job_id == hold.job_id:  # its reservation is spent
                        self._holding(False)
                        self.hold = None
                        self.epoch += 1
                    self.placements.append(Placement(job_id=job.job_id, slots=slots))
                    if charge is not None:
                        charge(job)
                    continue
                wait = self._why(job, gang, fitted, memo, searches)
                if wait.until is not None:
                    wake.append(wait.until)
                if self.hold is None and (
                    fact[3] if fact is not None else holds_for(job, snapshot)
                ):  # within the policy's window for this job (`hold_window_for`; older: any time)
                    self._hold_for(job, gang, math.inf if window_for is None else window_for(job))
                # it changed nothing on its way (a reservation tried and not made included: the
                # next job of its traits would find none either, `_hold_for` reading of a job
                # only its traits; asked again by each of a long queue's large jobs, it was
                # most of a what-if's time at 9,000 pending, atk53-29 F2)
                if seen_key is not None and epoch == self.epoch and moves == index.moves:
                    seen[seen_key] = (epoch, moves, wait)
            if drains is not None and self.drain_at is None and not gang and drains(job, snapshot):
                slots = self._drain_for(job)
                if slots is not None:  # it took back newer runs of its tier (`free_drain_takes`)
                    self.placements.append(Placement(job_id=job.job_id, slots=slots))
                    continue
            if run is not None and run[1] == at and (run[2] is wait or run[2] == wait):
                run[1] = at + 1
            else:
                run = [at, at + 1, wait]
                runs.append(run)
            if job.min_runtime_s > 0:
                self.funded_waiting += 1
            if shape not in waited:  # later jobs of a shape ask as many GPUs: no smaller
                waited.add(shape)
                kind = (job.gpu_type, job.cluster, gang)
                if job.gpus < smallest.get(kind, job.gpus + 1):
                    smallest[kind] = job.gpus

    def _by_preemption(
        self, job: PendingJob, gang: bool, memo: _MemoKey
    ) -> tuple[GpuSlot, ...] | None:
        failed = self.failed.get(memo)
        if failed is not None and job.gpus >= failed[0]:
            return None
        self._spend(job)
        plan = self._plan(job, gang, ready=False)
        if plan is None:
            self.failed[memo] = (job.gpus, job.job_id, self._estimate(job, gang), False)
            return None
        refused = self.policy.weigh(job, plan.victims, self.snapshot, self.now)
        if refused is not None and self.plans_tried > 1:
            later = self._next_plans(job, gang, plan)
            if later is not None:  # a later plan `weigh` takes
                plan, refused = later, None
        if refused is not None:
            until = self.refused_until(job, self.now) if self.refused_until is not None else None
            wait = self._wait("WAIT_RESOURCES", refused, until)
            self.failed[memo] = (job.gpus, job.job_id, wait, True)
            return None
        for v in plan.victims:
            self._preempt(v.job, v.reason, job.job_id, v.note)
        if gang:
            return self.index.take_whole(plan.nodes, job.gpus)
        return (self.index.take(plan.nodes[0], job.gpus),)

    def _next_plans(self, job: PendingJob, gang: bool, refused: Plan) -> Plan | None:
        """After `weigh` refused `refused`, the next plans of least loss, each on none of the
        nodes the dearest victim of a refused one holds, up to `Policy.plans_tried` plans in
        all (each a search of `job`'s budget): the first `weigh` takes, else None."""
        skip: frozenset[str] = frozenset()
        plan = refused
        for _ in range(self.plans_tried - 1):
            if not self._left(job):
                return None
            skip |= dearest_nodes(plan)
            self._spend(job)
            found = self._plan(job, gang, ready=False, skip=skip)
            if found is None:
                return None
            plan = found
            if self.policy.weigh(job, plan.victims, self.snapshot, self.now) is None:
                return plan
        return None

    def _plan(
        self, job: PendingJob, gang: bool, ready: bool, skip: frozenset[str] = frozenset()
    ) -> Plan | None:
        """Victims that make `job` fit; `ready=True` also offers jobs inside their contracts and
        plans by when the contracts end (an estimate, never applied); `skip`: nodes a least-loss
        plan may not clear (`_next_plans`)."""
        index, now = self.index, self.now
        pools = index.pools_for(job.gpu_type, job.cluster)
        group = (self.policy.victim_group(job, self.snapshot), job.gpu_type, job.cluster, ready)
        found = self.victims.get(group)
        if found is None:
            candidates = self._candidates(pools, ready)
            found = self.victims[group] = Replay(
                self.policy.victims(job, candidates, self.snapshot, now)
            )
        # no job left `live` yet this cycle: every victim read is still there
        victims = found.live(self.live if self.preempted else None)
        if self.held is not None:  # the job may not backfill: leave the held nodes alone
            held = self.hold.nodes if self.hold is not None else frozenset()
            victims = (v for v in victims if not any(sl.node in held for sl in v.job.slots))
        least = self.policy.least_loss and not ready
        ask = Ask(job.gpus, pools, index, now)
        if gang:
            if least and self.policy.least_loss_gangs:
                return plan_gang_least(ask, victims, skip)
            return plan_gang(ask, victims)
        return plan_single_least(ask, victims, skip) if least else plan_single(ask, victims)

    def _candidates(self, pools: list[Pool], ready: bool) -> Iterator[RunningJob]:
        """Running jobs on the pools' active nodes, in the policy's victim order (`ready`: by
        when their contracts end, then that order, including jobs inside their contracts),
        skipping those already preempted. Sorted once per cycle per pool set."""
        key = (tuple(p.key for p in pools), ready)
        ordered = self.ordered.get(key)
        if ordered is None:
            now, victim_key = self.now, victim_key_of(self.policy, self.snapshot)
            seen: dict[int, RunningJob] = {}
            for p in pools:
                for r in self.in_pool.get((p.key, True), ()):
                    seen[r.job_id] = r
                if ready:
                    for r in self.in_pool.get((p.key, False), ()):
                        seen[r.job_id] = r
            # the job id last: the order is total whatever the policy's key
            if ready:
                ordered = sorted(
                    seen.values(),
                    key=lambda r: (ready_key(r, now), *victim_key(r, now), r.job_id),
                )
            else:
                ordered = sorted(seen.values(), key=lambda r: (*victim_key(r, now), r.job_id))
            self.ordered[key] = ordered
        live = self.live
        return (r for r in ordered if r.job_id in live)

    def _preempt(
        self, r: RunningJob, reason: PreemptReason, for_job: int | None, note: str
    ) -> None:
        assert not r.in_contract(self.now), f"job {r.job_id} is inside its contract"
        del self.live[r.job_id]
        self.preempted = True
        self.index.release(r.slots)
        self.failed.clear()  # freed GPUs beyond the preemptor's need may now fit others
        self.preemptions.append(
            Preemption(job_id=r.job_id, reason=reason, for_job=for_job, note=note)
        )

    # --- why a job waits ------------------------------------------------------------------------

    def _wait(self, code: WaitCode, reason: str, until: float | None = None) -> Unplaceable:
        """One shared value per distinct reason."""
        key = (code, reason, until)
        found = self.shared.get(key)
        if found is None:
            found = self.shared[key] = Unplaceable(code=code, reason=reason, until=until)
        return found

    def _estimate(self, job: PendingJob, gang: bool) -> Unplaceable:
        """Why a job that may preempt found no victims: contracts in the way, or no room."""
        if self.index.fitted_at_start(job, gang):
            return _TAKEN
        plan = None
        if self._left(job):
            self._spend(job)
            plan = self._plan(job, gang, ready=True)
        else:
            self.budget_spent = True
        if plan is not None and plan.until > self.now:
            ids = ", ".join(str(v.job.job_id) for v in plan.victims)
            until = plan.until
            return self._wait(
                "WAIT_CONTRACT", f"room at t={until:g} when the contracts of jobs {ids} end", until
            )
        return self._wait("WAIT_RESOURCES", self.index.shortfall(job, gang))

    def _why(
        self, job: PendingJob, gang: bool, fitted: bool, memo: _MemoKey | None, searches: bool
    ) -> Unplaceable:
        """`fitted`: the job would have fitted in the GPUs free at the start of the cycle;
        `searches`: it may search for victims (its policy gives it a victim group)."""
        index = self.index
        if memo is not None:
            size, first, wait, refused = self.failed[memo]
            if first == job.job_id:
                return wait
            if fitted:
                return _TAKEN
            if wait.code == "WAIT_CONTRACT":
                reason = f"no room before t={wait.until:g} (as for job {first}, {size} GPUs)"
                return self._wait("WAIT_CONTRACT", reason, wait.until)
            if refused and self.shares_refusal:
                reason = f"as for job {first} ({size} GPUs), {wait.reason}"
                return self._wait("WAIT_RESOURCES", reason, wait.until)
            return self._wait("WAIT_RESOURCES", index.shortfall(job, gang))
        if fitted:
            return _TAKEN
        if searches:
            self.budget_spent = True
            return _BUDGET_SPENT
        return self._wait("WAIT_RESOURCES", index.shortfall(job, gang))

    # --- budgets and the debug reserve -----------------------------------------------------------

    def _left(self, job: PendingJob) -> bool:
        """Whether the budget `job` draws on has a search left this cycle."""
        name, budget = self.policy.budget_of(job)
        return self.spent.get(name, 0) < budget or self._renew(name)

    def _renew(self, name: str) -> bool:
        """With `search_rounds` > 1, a spent budget starts again when the cycle placed or
        preempted since it last did, `search_rounds` budgets at most (`fairshare14`)."""
        if self.rounds < 2:
            return False
        used, mark = self.renewed.get(name, (1, 0))
        done = len(self.placements) + len(self.preemptions)
        if used >= self.rounds or done == mark:
            return False
        self.renewed[name] = (used + 1, done)
        self.spent[name] = 0
        self.epoch += 1
        return True

    def _spend(self, job: PendingJob) -> None:
        self.epoch += 1
        name = self.policy.budget_of(job)[0]
        self.spent[name] = self.spent.get(name, 0) + 1

    def _reserve(self, hide: bool) -> None:
        """Take the reserved nodes' free GPUs out of the index (`hide`) or give them back."""
        if hide == (self.hidden is not None):
            return
        self.epoch += 1
        if hide:
            free = self.index.free
            self.hidden = [self.index.take(n, len(free[n])) for n in self.reserved if free[n]]
        else:
            assert self.hidden is not None
            self.index.release(self.hidden)
            self.hidden = None
            self.failed.clear()

    # --- reservations --------------------------------------------------------------------------

    def _holding(self, hide: bool) -> None:
        """Take the held nodes' free GPUs out of the index (`hide`) or give them back."""
        if hide == (self.held is not None):
            return
        self.epoch += 1
        if hide:
            assert self.hold is not None
            free = self.index.free
            self.held = [self.index.take(n, len(free[n])) for n in sorted(self.hold.nodes)
                         if free.get(n)]  # fmt: skip
        else:
            assert self.held is not None
            self.index.release(self.held)
            self.held = None
            self.failed.clear()

    def _drain_for(self, job: PendingJob) -> tuple[GpuSlot, ...] | None:
        """The free tier's waiting head (`Policy.drains_for`) holds the node closest to free
        (`freest_node`), or takes a node's newer free-tier runs back (`newer_runs_node`)."""
        pools, skip = self.index.pools_for(job.gpu_type, job.cluster), set(self.reserved)
        if getattr(self.policy, "free_drain_takes", False):
            found = reservation.newer_runs_node(self.index, pools, job, self.live, skip, self.now)
            self.drain_at = ""  # tried: once a cycle, and nothing hidden
            if found is None:
                return None
            for r in found[1]:
                self._preempt(r, "fairness", job.job_id, "the free tier's older job takes back")
            return (self.index.take(found[0], job.gpus),)
        self.drain_at = reservation.freest_node(self.index, pools, job.gpus, skip)
        self._draining(True)  # nothing when there is no such node
        return None

    def _draining(self, hide: bool) -> None:
        """Take the drained node's free GPUs out of the index (`hide`) or give them back."""
        if hide == (self.drained is not None):
            return
        self.epoch += 1
        if hide and self.drain_at is not None:
            have = len(self.index.free[self.drain_at])
            self.drained = [self.index.take(self.drain_at, have)] if have else []
        elif self.drained is not None:
            self.index.release(self.drained)
            self.drained = None
            self.failed.clear()

    def _hold_for(self, job: PendingJob, gang: bool, window: float = math.inf) -> None:
        """Reserve for `job` the nodes of its pools whose GPUs it can have soonest: a running
        job gives its GPUs back at its contract's end when `job` may preempt it then, else when
        the policy expects it to end (`Policy.expected_end`; inf: never, for a reservation).
        Nodes kept for debug work are left out. No reservation when no set of nodes frees in
        finite time, nor when the soonest one frees later than `window` from now (Slurm's
        `bf_window`: no reservation is planned beyond it)."""
        now, index = self.now, self.index
        pools = index.pools_for(job.gpu_type, job.cluster)
        keys = {p.key for p in pools}
        group = self.policy.victim_group(job, self.snapshot)
        preempts = self.policy.may_preempt(job) and group is not None
        # the policy may say itself which jobs free their GPUs for this reservation at their
        # contracts' ends (None: those it may preempt, as below; older policies: never asked)
        takes: Callable[[PendingJob, RunningJob, Snapshot], bool | None] | None = getattr(
            self.policy, "hold_takes", None
        )
        skip = set(self.reserved)
        memo = (group, job.gpu_type, job.cluster, True)
        found = self.victims.get(memo) if preempts else None
        eligible: set[int] | None = None
        if found is not None:  # the group's victims, as its searches read them this cycle
            eligible = {v.job.job_id for v in found.live(self.live if self.preempted else None)}
        # `soonest` finds none when the nodes it could ever have whole hold too few GPUs: known
        # without timing every node, and without asking of every job whether `job` may preempt
        # it when the group has no answer yet (most of a long queue's reservations, measured)
        if (
            gang
            and takes is None
            and window == math.inf
            and self._whole_ever(job, pools, keys, preempts, skip, eligible) < job.gpus
        ):
            return
        if eligible is None:
            eligible = set()
            if preempts:
                # the group's victims, as its searches read them (`_plan`, ready): one answer
                # per group and constraint set in a cycle (`Policy.victim_group`)
                candidates = self._candidates(pools, ready=True)
                found = self.victims[memo] = Replay(
                    self.policy.victims(job, candidates, self.snapshot, now)
                )
                eligible = {v.job.job_id for v in found.live(self.live if self.preempted else None)}
        said = None if takes is None else (lambda r: takes(job, r, self.snapshot))
        on = self.frees.on(self.live.values(), eligible, said, keys, gang)
        hold = soonest(job, gang, index, pools, on, skip, now, window)
        if hold is None:
            return
        self.epoch += 1
        self.hold = hold
        if hold.until > now:
            self.wake.append(hold.until)

    def _whole_ever(
        self, job: PendingJob, pools: list[Pool], keys: set[PoolKey], preempts: bool,
        skip: set[str], eligible: set[int] | None,
    ) -> int:  # fmt: skip
        """The GPUs of the nodes of `pools` (but `skip`) that a gang reservation for `job`
        could ever have whole: those no running job holds for ever (`Frees.never`: timed at its
        contract's end when `job` may preempt it (`preempts`: it may preempt some), else when
        expected). `soonest` takes exactly these nodes, soonest first, so a gang job asking
        more gets no reservation. `eligible`: the jobs `job` may preempt, when its group's
        victims are known this cycle; else only the jobs whose time may be infinite are asked
        about (`Policy.victims` is a filter of its candidates one by one)."""
        size = self.index.size
        pool_keys = tuple(p.key for p in pools)
        total = self.pool_gpus.get(pool_keys)
        if total is None:  # the reserved nodes (`skip`) are the same all cycle
            total = self.pool_gpus[pool_keys] = sum(
                size[n] for p in pools for n in p.nodes if n not in skip
            )
        live = self.live
        ready, expected = self.frees.infinite(live)
        if eligible is None:
            eligible = set()
            if preempts and (ready or expected):
                asked = [live[i] for i in sorted(ready | expected) if i in live]
                eligible = {v.job.job_id for v in self.policy.victims(job, asked, self.snapshot,
                                                                      self.now)}  # fmt: skip
        never = self.frees.never(live, eligible, keys)
        return total - sum(size[n] for n in never if n not in skip)

    def _start_held(self, job: PendingJob, gang: bool, hold: Hold) -> tuple[GpuSlot, ...] | None:
        """Start `job` on its reservation's nodes by preempting every job left there, when all
        are past their contracts and the nodes then fit it (`Policy.hold_starts`); else None
        and nothing changes."""
        now, index = self.now, self.index
        plan = start_plan(job, gang, index, self.live.values(), hold, now)
        if plan is None:
            return None
        nodes, victims = plan
        for r, note in victims:
            self._preempt(r, "fairness", job.job_id, note)
        self.epoch += 1
        if gang:
            return index.take_whole(nodes, job.gpus)
        return (index.take(nodes[0], job.gpus),)

    # --- 4. record ------------------------------------------------------------------------------

    def idle(self) -> tuple[Idle, int]:
        """What the cycle leaves free, and where (`Idle`); and `Decision.fragmentation_gpus`."""
        free = self.index.free
        reserve = set(self.reserved)
        held = set(self.hold.nodes) if self.hold is not None else set()
        if self.drain_at:
            held.add(self.drain_at)
        every, kept = fragmentation_split(self.index, self.smallest, skip=reserve | held)
        return Idle(
            free=sum(map(len, free.values())),
            reserve=sum(len(free[n]) for n in reserve),
            held=sum(len(free[n]) for n in held),
            fragmented=kept,
            funded_waiting=self.funded_waiting,
        ), every

    def decision(self) -> Decision:
        self._draining(False)
        self._reserve(False)
        self._holding(False)
        later = [t for t in self.wake if t > self.now]
        runs = tuple(WaitRun(a, b, w) for a, b, w in self.runs)
        idle, fragmented = self.idle()
        return Decision(
            based_on=self.snapshot.position,
            policy_version=self.policy.version,
            placements=tuple(self.placements),
            preemptions=tuple(self.preemptions),
            order=self.order,
            runs=runs,
            fragmentation_gpus=fragmented,
            wake_at=min(later) if later else None,
            budget_spent=self.budget_spent,
            idle=idle,
            hold=self.hold,
        )


def decide(snapshot: Snapshot, policy: Policy, now: float) -> Decision:
    """Pure: the decision of one cycle over `snapshot` (see the module docstring for the steps).

    Interior accounts missing from `snapshot.ranks` are ranked as their best leaf first
    (`complete_ranks`), so a reader may hand over the leaf ranks alone.
    """
    return decide_carried(snapshot, policy, now, None)[0]


def decide_carried(
    snapshot: Snapshot, policy: Policy, now: float, carry: Carry | None
) -> tuple[Decision, Carry]:
    """Pure: `decide(snapshot, policy, now)`, made from what the last call handed on (`carry`,
    None: nothing), and what to hand the next one."""
    last = carry or Carry()
    with gc_paused():
        ranks, kept_ranks = complete_ranks_kept(snapshot.ranks, last.ranks)
        if ranks != snapshot.ranks:  # else the same snapshot (its `delta` with it)
            snapshot = msgspec.structs.replace(snapshot, ranks=ranks)
        # 1. index the free GPUs
        index, kept_index = FreeIndex.of(snapshot.nodes, last.index)
        cycle = _Cycle(snapshot, policy, now, index, last.slots)
        # 2. maintenance drains
        cycle.drain()
        # 3. pending jobs in the policy's order: place, preempt for, or explain
        order_kept = getattr(policy, "order_kept", None)
        kept_order: KeptClasses | None = None
        if order_kept is None:
            ordered = policy.order(snapshot)
        else:
            ordered, kept_order = order_kept(snapshot, last.order)
        cycle.consider(ordered if isinstance(ordered, Ordered) else tuple(ordered))
        # 4. fragmentation and the next wake-up
        slots = cycle.frees.kept(last.slots)
        carry = Carry(index=kept_index, ranks=kept_ranks, slots=slots, order=kept_order)
        return cycle.decision(), carry
