"""The fold: `evolve(state, event) -> state`, one event at a time, and `fold` over many.

Pure: no I/O, no clock. `evolve` folds one event into the state *in place* and returns it:
copying a million-job state per event would make the fold O(n^2); callers that need the old state
keep a `State.copy()`. Events are facts: a valid history never makes it raise.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from ledger.core.state import (
    ENDS_KEPT_S,
    NODE_LOST,
    Account,
    Job,
    Node,
    NodeState,
    State,
    StoppedRun,
    Token,
    ancestors,
    held_bytes,
    is_system,
)
from schemas import events as e


def _release(state: State, job: Job) -> None:
    for sl in job.slots:
        for i in sl.gpu_indices:
            state.holders.pop((sl.node, i), None)
        state.node_jobs.get(sl.node, set()).discard(job.job_id)
        state._free.pop(sl.node, None)


def _node_becomes(
    state: State, name: str, to: NodeState, **reasons: str | tuple[tuple[int, int], ...]
) -> None:
    """A node event: the node's new state, with the reasons it sets or clears."""
    state.nodes[name] = msgspec.structs.replace(state.nodes[name], state=to, **reasons)


def _in_doubt(state: State, event: e.NodeLost) -> None:
    """The runs of a node lost with a fence may live until the fence (and each job's grace)
    passes: nothing ends them before."""
    for job_id in state.node_jobs.get(event.node, ()):
        job = state.jobs[job_id]
        until = event.at + event.fence_s + (job.spec.grace_s or 0)
        state.jobs[job_id] = msgspec.structs.replace(
            job,
            lost_at=job.lost_at if job.lost_at is not None else event.at,
            doubt_until=max(until, job.doubt_until or until),
        )


def _placed_lost(state: State, name: str) -> None:
    """A node lost with no fence: the runs placed there (their launch in doubt, none recorded
    started) may run there unheard (`Node.placed_lost`, atk51-23 F1)."""
    jobs = state.jobs
    placed = {(j, jobs[j].run) for j in state.node_jobs.get(name, ())
              if jobs[j].status == "placed"}  # fmt: skip
    if placed:
        node = state.nodes[name]
        state.nodes[name] = msgspec.structs.replace(
            node, placed_lost=tuple(sorted({*node.placed_lost, *placed}))
        )


def _placed_ended(state: State, event: e.JobRunEnded) -> None:
    """A run placed on a node when it was lost has ended (its agent, back, stopped it)."""
    key = (event.job_id, event.run)
    for name, node in state.nodes.items():
        if key in node.placed_lost:
            left = tuple(r for r in node.placed_lost if r != key)
            state.nodes[name] = msgspec.structs.replace(node, placed_lost=left)


def _out_of_doubt(state: State, node: str) -> None:
    """A returning node keeps its runs: no longer in doubt once none of their nodes is lost."""
    for job_id in state.node_jobs.get(node, ()):
        job = state.jobs[job_id]
        if job.doubt_until is None:
            continue
        if all(state.nodes[sl.node].state != "lost" for sl in job.slots):
            state.jobs[job_id] = msgspec.structs.replace(job, lost_at=None, doubt_until=None)


_NODE_EVENTS = (e.NodeRegistered, e.NodeRemoved)


def evolve(state: State, event: e.AnyEvent) -> State:
    """Fold one event into `state` (in place) and return it. Events are facts: never raises
    for a valid history."""
    state.events += 1
    if isinstance(event, _NODE_EVENTS):
        state._capacity.clear()
        state._free.clear()
    match event:
        case e.LedgerInitialised():
            state.initialised = True
            state.admins.add(event.admin)
            state.min_runtime_cap_s = event.min_runtime_cap_s
            state.cluster = event.cluster
        case e.AdminGranted():
            state.admins.add(event.user)
        case e.AdminRevoked():
            state.admins.discard(event.user)
        case e.AccountOpened():
            was = state.accounts.get(event.path)
            state.accounts[event.path] = Account(
                path=event.path, parent=event.parent, kind=event.kind
            )
            _below(state, event.path, 0 if was is not None and was.open else 1)
        case e.AccountClosed():
            acct = state.accounts[event.path]
            state.accounts[event.path] = msgspec.structs.replace(acct, open=False)
            _below(state, event.path, -1 if acct.open else 0)
        case e.SharesSet():
            acct = state.accounts[event.account]
            state.accounts[event.account] = msgspec.structs.replace(acct, shares=event.shares)
        case e.MemberAdded():
            state.members.setdefault(event.project, set()).add(event.user)
        case e.MemberRemoved():
            state.members.get(event.project, set()).discard(event.user)
        case e.ManagerGranted():
            state.managers.setdefault(event.user, set()).add(event.account)
        case e.ManagerRevoked():
            state.managers.get(event.user, set()).discard(event.account)
        case e.NodeRegistered():
            state.nodes[event.node] = Node(
                name=event.node, cluster=event.cluster, gpu_type=event.gpu_type, gpus=event.gpus
            )
            state.node_jobs[event.node] = set()
        case e.NodeDrainRequested():
            _node_becomes(state, event.node, "draining", drain_reason=event.reason)
        case e.NodeDrained():
            _node_becomes(state, event.node, "drained")
        case e.NodeReturned():
            _node_becomes(
                state, event.node, "active", drain_reason="", lost_reason="", placed_lost=()
            )
            _out_of_doubt(state, event.node)
        case e.NodeLost():
            _node_becomes(state, event.node, "lost", lost_reason=event.reason)
            if event.fence_s:
                _in_doubt(state, event)
            else:  # ended at once while their processes may live: stopping (s50, atk49-23 F3)
                for job_id in sorted(state.node_jobs.get(event.node, ())):
                    _stopped(state, state.jobs[job_id], event.at, NODE_LOST)
                _placed_lost(state, event.node)
        case e.NodeRemoved():
            _node_becomes(state, event.node, "removed", placed_lost=())
            _gone_with(state, event.node)
        case e.NodeAgentChanged():
            state.nodes[event.node] = msgspec.structs.replace(
                state.nodes[event.node], agent=event.agent
            )
        case e.JobSubmitted():
            state.jobs[event.job_id] = Job(spec=event)
            state.active.add(event.job_id)
            state.next_job_id = max(state.next_job_id, event.job_id + 1)
            _indexed(state, event, add=True)
        case e.JobPlaced():
            job = state.jobs[event.job_id]
            for sl in event.slots:
                for i in sl.gpu_indices:
                    state.holders[(sl.node, i)] = event.job_id
                state.node_jobs.setdefault(sl.node, set()).add(event.job_id)
                state._free.pop(sl.node, None)
            state.jobs[event.job_id] = msgspec.structs.replace(
                job,
                status="placed",
                slots=event.slots,
                placed_at=event.at,
                checkpoint_at=event.at,
                service_grace_s=state.grace_s,
                reaping_kill_at=None,
                leader_ended_at=None,
                reaping_left=0,
                leader_exit_code=None,
            )  # fmt: skip  (the grace its run gets: the service's now, atk49-23 F1)
        case e.JobStarted():
            job = state.jobs[event.job_id]
            state.jobs[event.job_id] = msgspec.structs.replace(
                job,
                status="running",
                started_at=event.at if event.started_at is None else event.started_at,
                logs=event.logs,
            )
        case e.JobPreempted():
            job = state.jobs[event.job_id]
            if event.reason != "node_failure":  # a lost node's runs: the node-lost rule's
                _stopped(state, job, event.at, "preempted")
            _release(state, job)
            state.jobs[event.job_id] = msgspec.structs.replace(
                job,
                slots=(),
                placed_at=None,
                started_at=None,
                preemptions=job.preemptions + 1,
                ran_s=job.ran_s + _held_s(job, event.at),
                takebacks=_takebacks(state, job, event),
                engine="",
                engine_job_id="",
                lost_at=None,
                doubt_until=None,
                reaping_kill_at=None,
                leader_ended_at=None,
                reaping_left=0,
                leader_exit_code=None,
            )
        case e.JobUnplaced():  # never started: nothing to stop, no preemption (pending again)
            job = state.jobs[event.job_id]
            _release(state, job)
            state.jobs[event.job_id] = msgspec.structs.replace(
                job, status="pending", slots=(), placed_at=None, started_at=None,
                unplaced=job.unplaced + 1, engine="", engine_job_id="", lost_at=None,
                doubt_until=None,
            )  # fmt: skip
        case e.JobHeld():
            state.jobs[event.job_id] = msgspec.structs.replace(state.jobs[event.job_id], held=True)
        case e.JobReleased():
            state.jobs[event.job_id] = msgspec.structs.replace(state.jobs[event.job_id], held=False)
        case e.JobRequeued():
            state.jobs[event.job_id] = msgspec.structs.replace(
                state.jobs[event.job_id], status="pending"
            )
        case e.JobFinished():
            job = state.jobs[event.job_id]
            if event.ended_at is None and (
                event.reason in ("cancelled", "preempted")
                or (event.reason in ("time_limit", "completed") and not is_system(event.actor))
            ):  # the ledger's stop, not the run's end (a cancel past its limit, or after its
                # command exited 0: `cancels`; engines, which record ends, are system actors)
                _stopped(state, job, event.at, "cancelled" if event.reason != "preempted"
                         else event.reason, at_once=event.reason == "completed")  # fmt: skip
            _release(state, job)
            state.finished += 1
            state.active.discard(event.job_id)
            _indexed(state, job.spec, add=False)
            _ended(state, event, job.spec.array_job_id)
            if state.live_only:
                del state.jobs[event.job_id]
            else:
                state.jobs[event.job_id] = msgspec.structs.replace(
                    job,
                    status="finished",
                    outcome=event.outcome,
                    exit_code=event.exit_code,
                    slots=(),
                )
        case e.CheckpointReported():
            held = state.jobs.get(event.job_id)
            if held is not None:  # a live state no longer holds a finished job
                state.jobs[event.job_id] = msgspec.structs.replace(held, checkpoint_at=event.at)
        case e.LeaderEnded():
            ending = state.jobs.get(event.job_id)
            if ending is not None and ending.status == "running" and ending.run == event.run:
                state.jobs[event.job_id] = msgspec.structs.replace(
                    ending, reaping_kill_at=event.kill_at, leader_ended_at=event.leader_ended_at,
                    reaping_left=event.left, leader_exit_code=event.exit_code,
                )  # fmt: skip
        case e.TokenIssued():
            state.tokens[event.token_id] = Token(
                token_id=event.token_id,
                user=event.user,
                name=event.name,
                secret_sha256=event.secret_sha256,
                issued_at=event.at,
                expires_at=event.expires_at,
                scope=event.scope,
                scope_node=event.scope_node,
                scope_job=event.scope_job,
            )
        case e.TokenRevoked():
            token = state.tokens[event.token_id]
            state.tokens[event.token_id] = msgspec.structs.replace(token, revoked=True)
        case e.ServiceConfigured():
            state.service = event
        case e.JobEngineLinked():
            linked = state.jobs.get(event.job_id)
            if linked is not None and linked.active:
                state.jobs[event.job_id] = msgspec.structs.replace(
                    linked, engine=event.engine, engine_job_id=event.engine_job_id
                )
        case e.JobRunEnded():
            state.stopped_runs.pop((event.job_id, event.run), None)
            _placed_ended(state, event)
            _run_ended(state, event)
        case e.JobKillOrdered():
            stopped = state.stopped_runs.get((event.job_id, event.run))
            if stopped is not None:  # its engine kills it at once (`StoppedRun.kill`)
                key = (event.job_id, event.run)
                state.stopped_runs[key] = msgspec.structs.replace(
                    stopped, kill=True, killed_at=event.at
                )
        case e.UtilisationSampled() | e.CycleDecided() | e.JobEngineEnded():
            pass
    return state


def _below(state: State, path: str, change: int) -> None:
    """Keep the count of open accounts below each account (when built) as one opens or closes."""
    index = state._open_below
    if index is not None and change:
        for above in ancestors(path):
            index[above] = index.get(above, 0) + change


def _indexed(state: State, spec: e.JobSubmitted, *, add: bool) -> None:
    """Keep the state's indexes of dependents, array tasks and jobs per user (when built) as
    jobs come and go."""
    deps, arrays, by_user = state._dependents, state._arrays, state._by_user
    held = state._bytes_by_user
    if held is not None:
        size = held.get(spec.user, 0) + (held_bytes(spec) if add else -held_bytes(spec))
        if size > 0:
            held[spec.user] = size
        else:
            held.pop(spec.user, None)
    if by_user is not None:
        count = by_user.get(spec.user, 0) + (1 if add else -1)
        if count > 0:
            by_user[spec.user] = count
        else:
            by_user.pop(spec.user, None)
    if deps is not None:
        for term in spec.dependency:
            for parent in term.job_ids:
                if add:
                    deps.setdefault(parent, set()).add(spec.job_id)
                elif parent in deps:
                    deps[parent].discard(spec.job_id)
                    if not deps[parent]:
                        del deps[parent]
    if arrays is not None and spec.array_job_id is not None:
        if add:
            arrays.setdefault(spec.array_job_id, set()).add(spec.job_id)
        elif spec.array_job_id in arrays:
            arrays[spec.array_job_id].discard(spec.job_id)
            if not arrays[spec.array_job_id]:
                del arrays[spec.array_job_id]


def _launched_unheard(state: State, job: Job) -> bool:
    """A `placed` job whose launch may run though no start is recorded: node agents launch
    what the ledger placed and report its start later (`up` killed -9 in between: atk51-23
    F3), stopped by a cancel, a preemption or a `node lost` (whose return says nothing of the
    processes: atk52-23 F1; `Node.placed_lost` keeps `node remove` from forgetting it).
    Decisions count it only under their rule (`CycleDecided.placed_held`), so a log written
    before replays as it was decided."""
    service = state.service
    return job.status == "placed" and service is not None and service.executor == "agents"


def _held_s(job: Job, at: float) -> float:
    """Seconds the run a preemption at `at` ends held its GPUs (`Job.ran_s`)."""
    return max(0.0, at - job.placed_at) if job.placed_at is not None else 0.0


def _takebacks(state: State, job: Job, event: e.JobPreempted) -> tuple[tuple[str, float], ...]:
    """An unfunded job's takebacks by funded non-debug work, this one added when it is one
    (`Job.takebacks`)."""
    by = state.jobs.get(event.for_job) if event.for_job is not None else None
    if job.funded or by is None or not by.funded or by.spec.debug:
        return job.takebacks
    return (*job.takebacks, (by.spec.account, event.at))


def _stopped(state: State, job: Job, at: float, why: str, at_once: bool = False) -> None:
    """The ledger stops the job's running run (or its placed run whose launch may run:
    `_launched_unheard`): its end is awaited (`State.stopped_runs`), and runs stopped more than
    `ENDS_KEPT_S` ago are forgotten. Killed at once when it is past its time limit, or
    `at_once` (a cancel of a job whose command had exited 0: what is left of it)."""
    running = job.status == "running" and job.engine
    if (running or _launched_unheard(state, job)) and job.slots:
        key = (job.job_id, job.run)
        s, began = job.spec, job.started_at
        past = began is not None and s.time_limit_s is not None and at >= began + s.time_limit_s
        state.stopped_runs[key] = StoppedRun(
            job_id=job.job_id,
            run=job.run,
            slots=job.slots,
            at=at,
            grace_s=s.grace_s,
            kill=past or at_once,
            why=why,
            user=s.user,
            job_name=s.job_name,
            account=s.account,
            gpus=s.gpus,
            funded=job.funded,
            debug=s.debug,
            submitted_at=s.at,
            started_at=began,
            service_grace_s=job.service_grace_s,
            reaping_kill_at=job.reaping_kill_at if running else None,
            placed=not running,
        )  # fmt: skip  (past its limit, in its grace: killed at once, as scancel)
    cut = at - ENDS_KEPT_S
    while state.stopped_runs:
        oldest = next(iter(state.stopped_runs))
        if state.stopped_runs[oldest].at >= cut:
            break
        del state.stopped_runs[oldest]


def _gone_with(state: State, node: str) -> None:
    """A removed node is gone for good: the runs a `node lost` of it left stopping (`NODE_LOST`)
    no longer wait for their end there."""
    for key, sr in list(state.stopped_runs.items()):
        if sr.why == NODE_LOST and any(sl.node == node for sl in sr.slots):
            del state.stopped_runs[key]


def _run_ended(state: State, event: e.JobRunEnded) -> None:
    """Keep that the run's end is recorded (`State.run_ends`: its engine's report again records
    nothing), and forget those recorded more than `ENDS_KEPT_S` ago. Folds the same whatever
    the log holds: a log written before holds duplicates, which fold as they always did."""
    state.run_ends.setdefault((event.job_id, event.run), event.at)
    cut = event.at - ENDS_KEPT_S
    while state.run_ends:
        oldest = next(iter(state.run_ends))
        if state.run_ends[oldest] >= cut:
            break
        del state.run_ends[oldest]


def _ended(state: State, event: e.JobFinished, array_job_id: int | None) -> None:
    """Keep the job's end for later dependencies, and forget ends older than `ENDS_KEPT_S`."""
    state.ends[event.job_id] = (event.reason, event.at, array_job_id)
    cut = event.at - ENDS_KEPT_S
    while state.ends:
        oldest = next(iter(state.ends))
        if state.ends[oldest][1] >= cut:
            break
        del state.ends[oldest]


def fold(events: Iterable[e.AnyEvent], state: State | None = None) -> State:
    s = state if state is not None else State()
    for ev in events:
        evolve(s, ev)
    return s
