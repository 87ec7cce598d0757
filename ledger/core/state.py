"""The write side's state: what `decide` needs to enforce the invariants, built only by folding
events (`ledger.core.evolve`).

Pure: values and queries; no I/O, no clock. `State` is mutable so that the fold is O(events)
(`evolve` changes it in place); its parts (`Account`, `Node`, `Job`, `Token`) are frozen Structs.
Actors: people by name; system actors (the dispatcher, executors, the simulator) start with "@";
node and job tokens act as the narrow system actors `@node:NAME` and `@job:ID`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from schemas import events as e
from schemas.bounds import DEFAULT_GRACE_S, MAX_DEPENDENCY_IDS, job_grace
from schemas.errors import InvalidTransition, UnknownEntity
from schemas.policy import AnyPolicyConfig

JobStatus = Literal["pending", "placed", "running", "finished"]
ENDS_KEPT_S = 86_400.0
"""How long a job's end is kept for the dependencies of later submissions (`State.ends`)."""
NodeState = Literal["active", "draining", "drained", "removed", "lost"]
"""`lost`: it stopped answering (`NodeLost`); no work is placed on it until it is returned."""
NODE_LOST = "node_lost"
"""`StoppedRun.why` of a run a `node lost` (fence 0: an admin's word) ended while its processes
may live on: it is stopping, as a cancel's run, until its end is recorded or its node is
removed; a decision holds it only under its rule (`CycleDecided.lost_held`, s50)."""
FORGOTTEN_PREFIX = "its end was never reported: forgotten by"
"""How the note of a stopped run's end no engine reported begins (`node remove --force`)."""


class Account(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    parent: str | None
    kind: e.AccountKind
    shares: int = 0
    open: bool = True


class Node(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    cluster: str
    gpu_type: str
    gpus: int
    state: NodeState = "active"
    drain_reason: str = ""
    lost_reason: str = ""
    agent: str = ""
    """The node agent that holds it (`NodeAgentChanged`: a digest of its id), "" while none is
    recorded."""
    placed_lost: tuple[tuple[int, int], ...] = ()
    """The runs (job, run) a `node lost` (no fence) ended while they were placed here: their
    agent may have launched them, unheard, so their processes may live (atk51-23 F1). `node
    remove` is refused while any is listed, as for its stopping runs, until the run's end is
    recorded (`JobRunEnded`: its agent, back, stopped it), the node returns or is removed. No
    decision reads it."""


class Job(msgspec.Struct, frozen=True, kw_only=True):
    spec: e.JobSubmitted
    status: JobStatus = "pending"
    slots: tuple[e.GpuSlot, ...] = ()
    placed_at: float | None = None
    started_at: float | None = None
    checkpoint_at: float | None = None
    outcome: e.FinishOutcome | None = None
    exit_code: int | None = None
    preemptions: int = 0
    """Its runs ended by a preemption (or a requeue, or with their node) so far."""
    ran_s: float = 0.0
    """Seconds its runs ended by a preemption held their GPUs (placement to preemption), summed:
    its time queued so far is the time since submission less this (`fairshare-17`'s
    `free_order` "waited", s63-policy); 0 in a snapshot made before it was kept."""
    unplaced: int = 0
    """Its runs its engine took back unstarted (`JobUnplaced`): runs, not preemptions."""
    takebacks: tuple[tuple[str, float], ...] = ()
    """An unfunded job's preemptions for a funded non-debug job: (that job's account, when), in
    order (`fairshare-17` counts those of another team's work); () for a funded job, and in a
    snapshot made before it was kept (s54)."""
    logs: tuple[str, ...] = ()
    held: bool = False
    """A held pending job is not scheduled until released."""
    engine: str = ""
    engine_job_id: str = ""
    """The engine's run of the current placement (`JobEngineLinked`), "" while none is known."""
    lost_at: float | None = None
    doubt_until: float | None = None
    """Its node was lost at `lost_at` with a fence (`NodeLost`): its run may still be alive
    until then; None when it is not in doubt."""
    service_grace_s: float | None = None
    """The service's grace (`State.grace_s`) as recorded when its run was last placed: what a
    stop of that run gets without a grace of the job's own, whatever a later start of the
    service records (the agent keeps the grace it launched with: atk49-23 F1); None before a
    placement, or in a snapshot made before it was kept (then the service's current one)."""
    reaping_kill_at: float | None = None
    """Its current run's command has exited leaving processes its engine reaps (`LeaderEnded`):
    their SIGKILL at the latest; every read shows it `stopping` (atk49-23 F4). None otherwise."""
    leader_ended_at: float | None = None
    reaping_left: int = 0
    leader_exit_code: int | None = None
    """Its current run's command's exit code as its `LeaderEnded` said (None: not said): 0
    makes a cancel record its completion (`cancels.cancel`, atk52-23 F2)."""

    @property
    def job_id(self) -> int:
        return self.spec.job_id

    @property
    def funded(self) -> bool:
        return self.spec.min_runtime_s > 0

    @property
    def run(self) -> int:
        """Its current (or next) run, 0 for the first, as engines number runs: every run
        preempted or taken back unstarted before it."""
        return self.preemptions + self.unplaced

    @property
    def active(self) -> bool:
        return self.status != "finished"

    def service_grace(self, current_s: float) -> float:
        """Pure: the service's grace for its run: as recorded when it was placed, else
        `current_s` (the service's now)."""
        return current_s if self.service_grace_s is None else self.service_grace_s

    def grace(self, current_s: float) -> float:
        """Pure: the grace a stop of its run gets (`StoppedRun.grace`'s rule): its own, else the
        service's when the run was placed (`service_grace`), at most `MAX_GRACE_S`."""
        return job_grace(self.spec.grace_s, self.service_grace(current_s))

    def contract_ends_at(self) -> float | None:
        """When the job becomes preemptible (its contract runs from the engine's real start once
        known, else from its placement); None when it holds no GPUs."""
        if self.placed_at is None:
            return None
        return max(self.placed_at, self.started_at or 0.0) + self.spec.min_runtime_s


class StoppedRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run the ledger stopped (a cancel, a preemption, a requeue) while it ran, whose real end
    its engine has not reported yet (`JobRunEnded`): its processes may still hold its GPUs
    (their grace), which an engine that restarts must go on holding until they are gone."""

    job_id: int
    run: int
    slots: tuple[e.GpuSlot, ...]
    at: float
    """When the ledger stopped it."""
    grace_s: int | None = None
    """The job's own grace (None: the engine's default)."""
    kill: bool = False
    """A second cancel cut its grace: SIGKILL at once (`JobKillOrdered`, atk46-23 F7)."""
    killed_at: float | None = None
    """When that second cancel came (its `JobKillOrdered`): its SIGKILL's time, which the reads
    show as `kill_at` (atk47-23 F6: they showed the first cancel's, already past)."""
    why: str = ""
    """What stopped it: `cancelled`, `preempted` (a requeue is a preemption) or `node_lost`
    (`NODE_LOST`: an admin's `node lost` of a node whose processes may live); "" in a
    snapshot made before. With `user`, `account` and `gpus`: what `queue` shows of it once
    its job is gone from the live state (`ledger.reads.stopping`)."""
    user: str = ""
    job_name: str | None = None
    """Its job's name (`submit -J`), which it holds for a `singleton` while it lives out its
    grace (`jobs.blocked`); None in a snapshot made before it was kept."""
    account: str = ""
    gpus: int = 0
    funded: bool = True
    debug: bool = False
    submitted_at: float = 0.0
    started_at: float | None = None
    service_grace_s: float | None = None
    """Its job's `Job.service_grace_s` when it was stopped: the service's grace when the run
    was placed (None: unknown, then the service's current one)."""
    reaping_kill_at: float | None = None
    """Its command had exited leaving processes its engine was reaping when the ledger stopped
    it (`Job.reaping_kill_at`): their SIGKILL at the latest, which the stop does not move later
    (atk53-23 F6: the reads showed a whole new grace from a cancel, though they died at this
    one); None otherwise, and in a snapshot made before it was kept."""
    placed: bool = False
    """Stopped while its job was `placed` (no start recorded) on node agents, whose launch may
    have run unheard (`up` killed -9 right after it): its processes may live, as a running
    run's, until its agent reports it gone, or reports a list without it (it never launched)
    (s52, atk51-23 F3: no stopped run was kept, its GPU read free at once and a restarted
    agent gave its processes a new grace). Decisions hold it only under their rule
    (`CycleDecided.placed_held`); kept only in logs written since."""

    def grace(self, current_s: float) -> float:
        """Pure: the one rule of every engine and read: the job's own grace, else the service's
        when this run was placed (`current_s`, the service's now, when that is unknown), at
        most `MAX_GRACE_S` (atk49-23 F1: a stop spanning a restart with another `--grace`
        was read with the new one while the agent applied the launch's)."""
        service = current_s if self.service_grace_s is None else self.service_grace_s
        return job_grace(self.grace_s, service)

    def kill_at(self, default_grace_s: float) -> float:
        """Pure: when its processes get SIGKILL at the latest: its stop plus its grace (the
        job's own, else `default_grace_s`), counted from the stop the log recorded, so a
        restart of the service or of an agent between the stop and its SIGTERM gives no new
        grace (atk47-23 F3), and never after the SIGKILL of a reaping the stop found
        (`reaping_kill_at`); when a second cancel cut the grace (`kill`), that cancel's time
        (`killed_at`; the stop itself in a state made before it was kept), never after the
        grace's end."""
        end = self.at + self.grace(default_grace_s)
        if self.reaping_kill_at is not None:  # what its command left dies at its reaping's
            end = min(end, max(self.at, self.reaping_kill_at))
        if not self.kill:
            return end
        return self.at if self.killed_at is None else min(end, self.killed_at)

    def kill_due(self, now: float, default_grace_s: float) -> bool:
        """Pure: whether its engine must SIGKILL it now (`kill_at` has come)."""
        return now >= self.kill_at(default_grace_s)


class Token(msgspec.Struct, frozen=True, kw_only=True):
    """A bearer token as the ledger knows it: never the secret, only its SHA-256."""

    token_id: str
    user: str
    name: str
    secret_sha256: str
    issued_at: float
    expires_at: float | None = None
    scope: e.TokenScope = "user"
    scope_node: str | None = None
    scope_job: int | None = None
    revoked: bool = False

    @property
    def acts_as(self) -> str:
        """The actor its calls act as: the user, or a narrow system actor for node/job scope."""
        if self.scope == "node":
            return f"{NODE_ACTOR}{self.scope_node}"
        if self.scope == "job":
            return f"{JOB_ACTOR}{self.scope_job}"
        return self.user


@dataclass
class State:
    """Everything `decide` needs to enforce the invariants. Built only by folding events."""

    initialised: bool = False
    cluster: str = "default"
    min_runtime_cap_s: int = 8 * 3600
    admins: set[str] = field(default_factory=set)
    accounts: dict[str, Account] = field(default_factory=dict)
    members: dict[str, set[str]] = field(default_factory=dict)
    managers: dict[str, set[str]] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    holders: dict[tuple[str, int], int] = field(default_factory=dict)
    node_jobs: dict[str, set[int]] = field(default_factory=dict)
    jobs: dict[int, Job] = field(default_factory=dict)
    tokens: dict[str, Token] = field(default_factory=dict)
    service: e.ServiceConfigured | None = None
    """The settings the service last recorded (policy, interval, executor, grace)."""
    next_job_id: int = 1
    events: int = 0
    live_only: bool = False
    """A live state: a finished job leaves `jobs` (decisions never need it again; history reads
    come from the projection), so memory follows live work, not history. `next_job_id` says
    which ids existed: a command on a job that left is refused as finished."""
    finished: int = 0
    """How many jobs have finished (counted in both modes)."""
    active: set[int] = field(default_factory=set)
    """The ids of the jobs not finished (pending, placed, running): what the dispatcher's
    snapshot reads, so its cost follows live work even when `jobs` keeps finished ones."""
    ends: dict[int, tuple[str, float, int | None]] = field(default_factory=dict)
    """How jobs ended (their `FinishReason`, when, their array) for `ENDS_KEPT_S`, oldest first:
    a later submission may depend on them (`ledger.core.jobs`), whether or not the state keeps
    finished jobs."""
    stopped_runs: dict[tuple[int, int], StoppedRun] = field(default_factory=dict)
    """(job, run) -> the runs the ledger stopped while they ran whose end is not recorded yet,
    oldest first (`StoppedRun`; kept at most `ENDS_KEPT_S` after the stop: an engine that never
    reports such ends leaves nothing behind for ever)."""
    stopped_runs_kept: bool = field(default=True, compare=False, repr=False)
    """False for a state unfolded from a snapshot older than `stopped_runs` (they are unknown)."""
    run_ends: dict[tuple[int, int], float] = field(default_factory=dict)
    """(job, run) -> when the end of that run was recorded (`JobRunEnded`), oldest first, for
    `ENDS_KEPT_S`: an engine that reports it again (a resent agent report) records nothing
    (`runs.confirm_run_ended`)."""
    run_ends_kept: bool = field(default=True, compare=False, repr=False)
    """False for a state unfolded from a snapshot older than `run_ends` (they are unknown)."""
    _capacity: dict[tuple[str | None, str | None], tuple[int, int]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _dependents: dict[int, set[int]] | None = field(default=None, compare=False, repr=False)
    _arrays: dict[int, set[int]] | None = field(default=None, compare=False, repr=False)
    _by_user: dict[str, int] | None = field(default=None, compare=False, repr=False)
    _free: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)
    """Node -> its free GPU indices (`free_gpus`), kept between reads: `evolve` forgets a
    node's entry whenever one of its GPUs is taken or given back, and every entry on a node
    event."""
    _bytes_by_user: dict[str, int] | None = field(default=None, compare=False, repr=False)
    _open_below: dict[str, int] | None = field(default=None, compare=False, repr=False)

    @property
    def policy(self) -> AnyPolicyConfig | None:
        """The policy settings the service last recorded running with (None: it never ran)."""
        return None if self.service is None else self.service.policy

    @property
    def grace_s(self) -> float:
        """The grace the service gives a job stopped without one of its own, as it last
        recorded it (`serve`/`up --grace`); `DEFAULT_GRACE_S` when it recorded none (it never
        ran, or ran before `service.configured.v2`). Every read counts a SIGKILL with it."""
        grace = None if self.service is None else self.service.grace_s
        return DEFAULT_GRACE_S if grace is None else float(grace)

    @property
    def max_time_s(self) -> int | None:
        """The longest time limit the service's engine starts (Slurm's partition MaxTime), as
        it last recorded observing it (`ServiceConfigured.max_time_s`); None: no limit, or none
        recorded. A job submitted without a time limit takes its limit from it."""
        return None if self.service is None else self.service.max_time_s

    def run_grace(self, job: Job) -> float:
        """The grace a stop of `job`'s run gets (`Job.grace`, with the service's current grace
        when its placement's is unknown)."""
        return job.grace(self.grace_s)

    def copy(self) -> State:
        return State(
            initialised=self.initialised,
            cluster=self.cluster,
            min_runtime_cap_s=self.min_runtime_cap_s,
            admins=set(self.admins),
            accounts=dict(self.accounts),
            members={k: set(v) for k, v in self.members.items()},
            managers={k: set(v) for k, v in self.managers.items()},
            nodes=dict(self.nodes),
            holders=dict(self.holders),
            node_jobs={k: set(v) for k, v in self.node_jobs.items()},
            jobs=dict(self.jobs),
            tokens=dict(self.tokens),
            service=self.service,
            next_job_id=self.next_job_id,
            events=self.events,
            live_only=self.live_only,
            finished=self.finished,
            active=set(self.active),
            ends=dict(self.ends),
            stopped_runs=dict(self.stopped_runs),
            stopped_runs_kept=self.stopped_runs_kept,
            run_ends=dict(self.run_ends),
            run_ends_kept=self.run_ends_kept,
            _bytes_by_user=None if self._bytes_by_user is None else dict(self._bytes_by_user),
        )

    # --- queries -------------------------------------------------------------------------------

    def is_admin(self, actor: str) -> bool:
        return actor in self.admins

    def manages(self, actor: str, path: str) -> bool:
        """Admins manage everything; a manager manages their account and everything below it."""
        if self.is_admin(actor):
            return True
        return any(
            path == root or path.startswith(root + "/") for root in self.managers.get(actor, ())
        )

    def open_account(self, path: str) -> Account:
        acct = self.accounts.get(path)
        if acct is None or not acct.open:
            raise UnknownEntity(
                f"unknown account {path!r}",
                hint="see `gpuledger account tree` for the open accounts",
                account=path,
            )
        return acct

    def stopped_of(self, job_id: int) -> list[StoppedRun]:
        """The job's runs the ledger stopped whose end is not recorded yet (their grace), only
        for a job whose record ended (finished, or gone from the live state): what a second
        cancel kills at once (`cancels.cancel`)."""
        job = self.jobs.get(job_id)
        if job is not None and job.status != "finished":
            return []
        return [sr for sr in self.stopped_runs.values() if sr.job_id == job_id]

    def stopping_arrays(self, lost: bool = True, placed: bool = True) -> dict[int, int | None]:
        """Job -> its array's id (None: no array) of the jobs whose record ended while a run the
        ledger stopped lives out its grace (`stopped_of`; a task's end keeps its array, `ends`):
        what a second cancel of an array kills and what a stopping job holds back
        (`jobs.blocked`). `lost` False: not the runs a `node lost` ended (`NODE_LOST`), as the
        decisions recorded before s50 counted (`CycleDecided.lost_held`); `placed` False: not
        the runs stopped while placed (`StoppedRun.placed`, `CycleDecided.placed_held`)."""
        out: dict[int, int | None] = {}
        for sr in self.stopped_runs.values():
            if (not lost and sr.why == NODE_LOST) or (not placed and sr.placed):
                continue
            job = self.jobs.get(sr.job_id)
            if job is not None and job.status != "finished":
                continue  # a requeued job is pending: live, as its own record says
            end = self.ends.get(sr.job_id)
            out[sr.job_id] = end[2] if end is not None else job.spec.array_job_id if job else None
        return out

    def array_stopped(self, array_job_id: int) -> list[StoppedRun]:
        """The runs the ledger stopped whose end is not recorded yet (`stopped_of`) of every
        task of the job array `array_job_id` whose record ended: what a second cancel of the
        array's id kills at once, as a second `scancel ARRAY_ID` signals every task (atk47-23
        F13). Empty for a job that is no array."""
        tasks = {j for j, a in self.stopping_arrays().items() if a == array_job_id}
        return [sr for sr in self.stopped_runs.values() if sr.job_id in tasks]

    def job(self, job_id: int) -> Job:
        job = self.jobs.get(job_id)
        if job is None and self.live_only and 0 < job_id < self.next_job_id:
            raise InvalidTransition(
                f"job {job_id} is finished", hint="see `gpuledger jobs`", job_id=job_id
            )
        if job is None:
            raise UnknownEntity(f"unknown job {job_id}", hint="see `gpuledger jobs`", job_id=job_id)
        return job

    def node(self, name: str) -> Node:
        node = self.nodes.get(name)
        if node is None or node.state == "removed":
            raise UnknownEntity(
                f"unknown node {name!r}", hint="see `gpuledger node list`", node=name
            )
        return node

    def capacity(self, gpu_type: str | None, cluster: str | None) -> tuple[int, int]:
        """(total GPUs, largest node) over registered nodes matching the constraints. Cached;
        `evolve` drops the cache on every node event."""
        key = (gpu_type, cluster)
        hit = self._capacity.get(key)
        if hit is None:
            hit = self._capacity[key] = self._scan_capacity(gpu_type, cluster)
        return hit

    def _scan_capacity(self, gpu_type: str | None, cluster: str | None) -> tuple[int, int]:
        total = largest = 0
        for n in self.nodes.values():
            if n.state == "removed":
                continue
            if gpu_type is not None and n.gpu_type != gpu_type:
                continue
            if cluster is not None and n.cluster != cluster:
                continue
            total += n.gpus
            largest = max(largest, n.gpus)
        return total, largest

    def dependents(self) -> dict[int, set[int]]:
        """Job id -> the unfinished jobs whose dependency names it (an array's first task id
        stands for the array). Built from the live jobs on first use, then kept by `evolve`."""
        if self._dependents is None:
            index: dict[int, set[int]] = {}
            for job_id in self.active:
                for term in self.jobs[job_id].spec.dependency:
                    for parent in term.job_ids:
                        index.setdefault(parent, set()).add(job_id)
            self._dependents = index
        return self._dependents

    def active_of(self, user: str) -> int:
        """How many unfinished jobs (pending, placed, running) `user` owns. Built from the live
        jobs on first use, then kept by `evolve`."""
        if self._by_user is None:
            index: dict[str, int] = {}
            for job_id in self.active:
                owner = self.jobs[job_id].spec.user
                index[owner] = index.get(owner, 0) + 1
            self._by_user = index
        return self._by_user.get(user, 0)

    def held_of(self, user: str) -> int:
        """About the bytes the specs of `user`'s unfinished jobs hold (`held_bytes`). Built from
        the live jobs on first use, then kept by `evolve` (and carried by `copy`)."""
        if self._bytes_by_user is None:
            index: dict[str, int] = {}
            for job_id in self.active:
                spec = self.jobs[job_id].spec
                index[spec.user] = index.get(spec.user, 0) + held_bytes(spec)
            self._bytes_by_user = index
        return self._bytes_by_user.get(user, 0)

    def open_below(self, path: str) -> int:
        """How many open accounts sit below the account `path` (at any depth). Built from the
        accounts on first use, then kept by `evolve`."""
        if self._open_below is None:
            index: dict[str, int] = {}
            for acct in self.accounts.values():
                if acct.open:
                    for above in ancestors(acct.path):
                        index[above] = index.get(above, 0) + 1
            self._open_below = index
        return self._open_below.get(path, 0)

    def array_tasks(self, array_job_id: int) -> set[int]:
        """The unfinished tasks of the job array `array_job_id` (empty for a job that is no
        array). Built from the live jobs on first use, then kept by `evolve`."""
        if self._arrays is None:
            index: dict[int, set[int]] = {}
            for job_id in self.active:
                array = self.jobs[job_id].spec.array_job_id
                if array is not None:
                    index.setdefault(array, set()).add(job_id)
            self._arrays = index
        return self._arrays.get(array_job_id, set())

    def free_indices(self, node: str) -> list[int]:
        holders = self.holders
        return [i for i in range(self.nodes[node].gpus) if (node, i) not in holders]

    def free_gpus(self, node: str) -> tuple[int, ...]:
        """`free_indices` as a tuple, kept until a GPU of the node is taken or given back (the
        dispatcher's snapshot reads every node each cycle; few change between two)."""
        hit = self._free.get(node)
        if hit is None:
            hit = self._free[node] = tuple(self.free_indices(node))
        return hit


JOB_HELD_OVERHEAD = 1024
"""The bytes a job holds besides its strings (its records, ids, slots), for `held_bytes`."""


DEPENDENCY_ID_BYTES = 48
"""What one job id a job's dependency names holds in memory (an int, its place in a tuple, a
share of its term), for `held_bytes`."""


def held_bytes(spec: Any) -> int:
    """Pure: about the bytes a job's spec (a `JobSubmitted`, or the `SubmitJob` that makes one
    task of it) holds in memory: its command line, environment, labels and paths, the job ids
    its dependency names (`DEPENDENCY_ID_BYTES` each: a dependency of 160 terms of 1,024 ids
    took ~19 MB and was not counted, atk45-25 F5), and `JOB_HELD_OVERHEAD`."""
    return (
        JOB_HELD_OVERHEAD
        + DEPENDENCY_ID_BYTES * _dependency_ids(spec)
        + sum(map(len, spec.command))
        + sum(len(k) + len(v) for k, v in spec.env.items())
        + sum(len(k) + len(v) for k, v in spec.labels.items())
        + len(spec.workdir) + len(spec.stdout) + len(spec.stderr) + len(spec.job_name)
    )  # fmt: skip


def _dependency_ids(spec: Any) -> int:
    """The job ids `spec`'s dependency names: what it lists, or, past `MAX_DEPENDENCY_IDS`
    (a command not yet decided, which names some again), those it names once per kind (what
    `ledger.core.jobs` records), at most one past the bound (refused beyond)."""
    listed = sum(len(term.job_ids) for term in spec.dependency)
    if listed <= MAX_DEPENDENCY_IDS:
        return listed
    seen: set[tuple[str, int]] = set()
    for term in spec.dependency:
        seen.update((term.kind, job_id) for job_id in term.job_ids)
        if len(seen) > MAX_DEPENDENCY_IDS:
            break
    return len(seen)


DRAINED_NOTE = "its node's agent drained"
"""The note of the maintenance preemption `agent --drain` makes (host maintenance, which a
contract allows: `audit check` lists it as allowed, `explain` says so)."""


def is_system(actor: str) -> bool:
    """System actors (the dispatcher, executors, the simulator) start with '@'."""
    return actor.startswith("@")


NODE_ACTOR = "@node:"
"""A node token acts as `@node:NAME`: it reports starts, exits and samples of jobs on NAME only."""
JOB_ACTOR = "@job:"
"""A job token acts as `@job:ID`: it reports checkpoints of job ID only."""


def ancestors(path: str) -> list[str]:
    """Pure: the accounts above the account `path`, nearest last (`a/b/c`: `a`, `a/b`)."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]
