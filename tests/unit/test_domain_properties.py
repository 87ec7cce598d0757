"""Properties of the pure domain and the codec, checked with Hypothesis.

Random command sequences drawn from a small universe (users, accounts, nodes, job ids) run through
`decide` + `evolve` with a virtual clock. After every accepted command an independent
`check_invariants` re-derives what must hold from the state alone; every rejected command must
raise a `LedgerError` subclass (never anything else) and leave the state exactly as it was.
"""

from __future__ import annotations

import copy
import itertools
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.core.authz import authorisation_failure
from ledger.core.decide import decide
from ledger.core.evolve import evolve, fold
from ledger.core.state import State, is_system
from ledger.cycle import inputs
from ledger.cycle.inputs import snapshot_from_state, snapshot_kept
from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from schemas import codec
from schemas import commands as c
from schemas import events as e
from schemas.errors import EventDecodeError, LedgerError

T0 = 1_000.0

# --- the universe ---------------------------------------------------------------------------------

ADMIN = "root"
USERS = ("alice", "bob", "carol", "dave")
ACTORS = (ADMIN, "mgr", "pm", *USERS, "@dispatcher", "@executor")
PATHS = (
    "ai2", "ai2/olmo", "ai2/tulu", "ai2/olmo/sub", "ai2/olmo/alice", "ai2/olmo/dave", "lab",
    "lab/x", "lab/x/bob",
)  # fmt: skip
PROJECTS = ("ai2/olmo", "ai2/tulu", "ai2/olmo/sub", "lab/x")
NODES = ("n1", "n2", "a1")
GPU_TYPES = ("h100", "a100")
MEMBERS = (("alice", "ai2/olmo"), ("bob", "ai2/olmo"), ("carol", "ai2/tulu"))
KINDS = ("program", "project", "user")
REASONS: tuple[e.PreemptReason, ...] = ("fairness", "maintenance", "squatting", "admin", "debug")

SEED_ORG: list[c.AnyCommand] = [
    c.InitLedger(actor=ADMIN, admin=ADMIN, min_runtime_cap_s=7200),
    c.OpenAccount(actor=ADMIN, path="ai2", kind="program"),
    c.OpenAccount(actor=ADMIN, path="ai2/olmo", kind="project", shares=3),
    c.OpenAccount(actor=ADMIN, path="ai2/tulu", kind="project"),
    c.AddMember(actor=ADMIN, user="alice", project="ai2/olmo"),
    c.AddMember(actor=ADMIN, user="bob", project="ai2/olmo"),
    c.AddMember(actor=ADMIN, user="carol", project="ai2/tulu"),
    c.GrantManager(actor=ADMIN, user="mgr", account="ai2/olmo"),
    c.GrantManager(actor=ADMIN, user="pm", account="ai2"),
    c.RegisterNode(actor=ADMIN, node="n1", gpu_type="h100", gpus=4),
    c.RegisterNode(actor=ADMIN, node="n2", gpu_type="h100", gpus=4),
    c.RegisterNode(actor=ADMIN, node="a1", gpu_type="a100", gpus=2),
]

# --- steps: plain data, turned into commands against the state they meet -------------------------
#
# Actors are biased toward the one allowed to act and job references toward jobs in the status
# the command expects, so that most steps are accepted; the rest exercise the rejections.


def biased(preferred: tuple[Any, ...], universe: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """Mostly one of `preferred`, sometimes anything of `universe`."""
    return st.sampled_from(preferred * (2 * len(universe) // len(preferred)) + universe)


admins = biased((ADMIN,), ACTORS)
managers = biased((ADMIN, "mgr", "pm"), ACTORS)
systems = biased(("@dispatcher", "@executor"), ACTORS)
users = st.sampled_from(USERS)
paths = st.sampled_from(PATHS)
projects = biased(("ai2/olmo", "ai2/tulu"), PROJECTS)
members = biased(MEMBERS, tuple((u, p) for u in USERS for p in PROJECTS))
gpu_types = st.sampled_from(GPU_TYPES)
nodes = st.sampled_from(NODES)
shares = st.integers(-1, 4)
reasons = st.sampled_from(REASONS)
job_refs = st.tuples(st.integers(0, 5), st.sampled_from((True, True, True, False)))
"""(k, prefer): the k-th most recent job, among those in the expected status when `prefer`;
k == 5 names a job that does not exist."""
# "free": the first free GPUs from that node on; "held": GPUs some job holds; else explicit indices
picks = st.sampled_from(("free", "free", "free", "held"))
gpu_picks = st.one_of(picks, st.lists(st.integers(-1, 4), max_size=5))

Step = tuple[Any, ...]

step_strategies: list[tuple[int, st.SearchStrategy[Step]]] = [
    (4, st.tuples(st.just("tick"), st.sampled_from((0.0, 60.0, 1800.0, 3600.0, 7200.0, 30000.0)))),
    (1, st.tuples(st.just("open"), managers, paths, st.sampled_from(KINDS), shares)),
    (1, st.tuples(st.just("close"), managers, paths)),
    (1, st.tuples(st.just("shares"), managers, paths, shares)),
    (1, st.tuples(st.just("add"), managers, users, projects, shares)),
    (1, st.tuples(st.just("remove"), managers, users, projects)),
    (1, st.tuples(st.just("grant"), admins, users, paths)),
    (1, st.tuples(st.just("revoke"), admins, users, paths)),
    (1, st.tuples(st.just("register"), admins, nodes, gpu_types, st.integers(0, 4))),
    (1, st.tuples(st.just("drain"), admins, nodes, st.sampled_from(("maintenance", "fan", "")))),
    (1, st.tuples(st.just("return"), admins, nodes)),
    (1, st.tuples(st.just("rmnode"), admins, nodes)),
    (8, st.tuples(  # a member submits a job that fits
        st.just("submit"), st.sampled_from(MEMBERS),
        st.just(None), st.integers(1, 4), st.sampled_from((None, 0, 0, 600, 3600, 7200)),
        st.booleans(), st.sampled_from((None, None, "h100")),
        st.sampled_from((None, None, 600, 3600)),
    )),
    (3, st.tuples(  # anything goes
        st.just("submit"), members, biased((None,), ("mgr", "pm", "@sim", ADMIN)),
        st.sampled_from((1, 2, 4, 0, 6, 9, 11)),
        st.sampled_from((None, 0, 60, 3600, 7200, 7201, -1)), st.booleans(),
        st.sampled_from((None, "h100", "a100", "tpu")), st.sampled_from((None, 600, 3600, 0)),
    )),
    (1, st.tuples(st.just("cancel"), biased(("owner",), ACTORS), job_refs)),
    (8, st.tuples(  # what a dispatcher would propose
        st.just("decide"), st.just("@dispatcher"),
        st.lists(st.tuples(st.tuples(st.integers(0, 4), st.just(True)), nodes, picks), max_size=2),
        st.lists(st.tuples(st.tuples(st.integers(0, 4), st.just(True)), reasons), max_size=1),
    )),
    (3, st.tuples(  # anything goes
        st.just("decide"), systems, st.lists(st.tuples(job_refs, nodes, gpu_picks), max_size=3),
        st.lists(st.tuples(job_refs, reasons), max_size=2),
    )),
    (1, st.tuples(st.just("preempt"), admins, job_refs, st.sampled_from(("bad node", "x", " ")))),
    (4, st.tuples(st.just("start"), systems, job_refs)),
    (3, st.tuples(st.just("finish"), systems, job_refs, st.sampled_from((0, 0, 1)))),
    (1, st.tuples(st.just("sample"), systems, job_refs, st.floats(0, 120))),
    (1, st.tuples(st.just("checkpoint"), biased(("owner",), ACTORS), job_refs)),
]  # fmt: skip
_weighted = tuple(i for i, (weight, _) in enumerate(step_strategies) for _ in range(weight))
steps = st.lists(
    st.sampled_from(_weighted).flatmap(lambda i: step_strategies[i][1]), min_size=25, max_size=80
)

_WANTS: dict[str, tuple[str, ...]] = {
    "decide": ("pending",),
    "preempt": ("placed", "running"),
    "start": ("placed",),
    "finish": ("placed", "running"),
    "sample": ("running",),
    "checkpoint": ("running",),
    "cancel": ("pending", "placed", "running"),
}


def pick_job(state: State, ref: tuple[int, bool], wants: tuple[str, ...]) -> int:
    k, prefer = ref
    if k == 5 or not state.jobs:
        return state.next_job_id
    ids = sorted(state.jobs, reverse=True)
    fitting = [j for j in ids if state.jobs[j].status in wants]
    pool = fitting if prefer and fitting else ids
    return pool[k % len(pool)]


def _slots_for(
    state: State, job_id: int, node: str, pick: Any, taken: set[tuple[str, int]]
) -> tuple[e.GpuSlot, ...]:
    """Turn a placement pick into slots. "free" gives a valid placement whenever one exists."""
    job = state.jobs.get(job_id)
    need = job.spec.gpus if job is not None else 1
    if pick == "held":
        held = sorted(state.holders)[:need]
        return tuple(e.GpuSlot(node=n, gpu_indices=(i,)) for n, i in held)
    if pick != "free":
        return (e.GpuSlot(node=node, gpu_indices=tuple(pick)),)
    out: list[e.GpuSlot] = []
    for name in [node] + [n for n in sorted(state.nodes) if n != node]:
        n = state.nodes[name]
        if n.state != "active" or (job is not None and job.spec.gpu_type not in (None, n.gpu_type)):
            continue
        free = [
            i for i in range(n.gpus) if (name, i) not in state.holders and (name, i) not in taken
        ]
        got = free[: need - sum(len(s.gpu_indices) for s in out)]
        if got:
            taken.update((name, i) for i in got)
            out.append(e.GpuSlot(node=name, gpu_indices=tuple(got)))
    return tuple(out)


def to_command(state: State, step: Step) -> c.AnyCommand | float:
    """A step as a command against `state`, or the seconds to advance the clock."""
    kind, *a = step
    wants = _WANTS.get(kind, ())
    match kind:
        case "tick":
            return float(a[0])
        case "open":
            return c.OpenAccount(actor=a[0], path=a[1], kind=a[2], shares=a[3])
        case "close":
            return c.CloseAccount(actor=a[0], path=a[1])
        case "shares":
            return c.SetShares(actor=a[0], account=a[1], shares=a[2])
        case "add":
            return c.AddMember(actor=a[0], user=a[1], project=a[2], shares=a[3])
        case "remove":
            return c.RemoveMember(actor=a[0], user=a[1], project=a[2])
        case "grant":
            return c.GrantManager(actor=a[0], user=a[1], account=a[2])
        case "revoke":
            return c.RevokeManager(actor=a[0], user=a[1], account=a[2])
        case "register":
            return c.RegisterNode(actor=a[0], node=a[1], gpu_type=a[2], gpus=a[3])
        case "drain":
            return c.DrainNode(actor=a[0], node=a[1], reason=a[2])
        case "return":
            return c.ReturnNode(actor=a[0], node=a[1])
        case "rmnode":
            return c.RemoveNode(actor=a[0], node=a[1])
        case "submit":
            (user, project), on_behalf_of, gpus, min_rt, resumable, gpu_type, limit = a
            return c.SubmitJob(
                actor=on_behalf_of or user, user=user if on_behalf_of else None, account=project,
                gpus=gpus, min_runtime_s=min_rt, resumable=resumable, gpu_type=gpu_type,
                time_limit_s=limit,
            )  # fmt: skip
        case "cancel" | "checkpoint":
            job_id = pick_job(state, a[1], wants)
            actor = a[0]
            if actor == "owner":
                actor = state.jobs[job_id].spec.user if job_id in state.jobs else "alice"
            if kind == "cancel":
                return c.CancelJob(actor=actor, job_id=job_id)
            return c.ReportCheckpoint(actor=actor, job_id=job_id)
        case "decide":
            # a dispatcher proposes only what it can: preferred picks with no job in the wanted
            # status and "free" picks that do not fit are left out; other picks stay, to be rejected
            taken: set[tuple[str, int]] = set()
            placements = []
            pending = any(j.status in wants for j in state.jobs.values())
            for ref, node, pick in a[1]:
                if ref[1] and not pending:
                    continue
                job_id = pick_job(state, ref, wants)
                slots = _slots_for(state, job_id, node, pick, taken)
                job = state.jobs.get(job_id)
                if (
                    pick == "free"
                    and job
                    and sum(len(s.gpu_indices) for s in slots) < job.spec.gpus
                ):
                    continue
                placements.append(c.Placement(job_id=job_id, slots=slots))
            running = ("placed", "running")
            preemptions = tuple(
                c.Preemption(job_id=pick_job(state, ref, running), reason=r)
                for ref, r in a[2]
                if not ref[1] or any(j.status in running for j in state.jobs.values())
            )
            return c.ApplyDecision(actor=a[0], decision=c.DecisionBody(
                cycle_id="cycle", based_on=state.events, policy_version="prop",
                placements=tuple(placements), preemptions=preemptions,
            ))  # fmt: skip
        case "preempt":
            return c.PreemptJob(actor=a[0], job_id=pick_job(state, a[1], wants), note=a[2])
        case "start":
            return c.StartJob(actor=a[0], job_id=pick_job(state, a[1], wants))
        case "finish":
            return c.FinishJob(actor=a[0], job_id=pick_job(state, a[1], wants), exit_code=a[2])
        case "sample":
            job_id = pick_job(state, a[1], wants)
            n = state.jobs[job_id].spec.gpus if job_id in state.jobs else 1
            return c.SampleUtilisation(actor=a[0], job_id=job_id, gpu_utilisation=(a[2],) * n)
    raise AssertionError(kind)


# --- the independent invariant checker -----------------------------------------------------------

_ALLOWED_PARENTS = {("program", None), ("program", "program"), ("project", "program"),
                    ("project", "project"), ("user", "project")}  # fmt: skip


def manages(state: State, actor: str, path: str) -> bool:
    return actor in state.admins or any(
        path == root or path.startswith(root + "/") for root in state.managers.get(actor, ())
    )


def check_invariants(s: State) -> None:
    """What must hold in every state a valid history can reach, derived from scratch."""
    assert s.initialised and s.admins, "a ledger always has an admin"
    # 0. `active` names exactly the jobs not finished (the dispatcher's snapshot reads only these)
    assert s.active == {i for i, j in s.jobs.items() if j.status != "finished"}
    # 1. GPUs: held by at most one job; `holders` mirrors the slots of placed/running jobs
    held: dict[tuple[str, int], int] = {}
    for job in s.jobs.values():
        if job.status in ("placed", "running"):
            assert job.slots and job.placed_at is not None, job
            assert sum(len(sl.gpu_indices) for sl in job.slots) == job.spec.gpus, job
            for sl in job.slots:
                node = s.nodes[sl.node]
                assert node.state in ("active", "draining"), (job.job_id, node)
                assert job.spec.gpu_type in (None, node.gpu_type), (job.job_id, node)
                for i in sl.gpu_indices:
                    assert 0 <= i < node.gpus, (job.job_id, sl)
                    assert (sl.node, i) not in held, f"GPU {i} of {sl.node} held twice"
                    held[(sl.node, i)] = job.job_id
        else:
            assert job.slots == () and job.job_id not in held.values(), job
        assert job.job_id < s.next_job_id
    assert s.holders == held
    # 2. nodes: node_jobs mirrors the slots; drained/removed nodes are empty; draining ones are not
    for name, node in s.nodes.items():
        on = {jid for (n, _), jid in held.items() if n == name}
        assert s.node_jobs.get(name, set()) == on, name
        if node.state in ("drained", "removed"):
            assert not on, name
        if node.state == "draining":
            assert on, f"{name} is draining with no jobs: it should have reported drained"
    # 3. the account tree: paths name their parent, kinds nest, shares >= 0, open under open
    for path, acct in s.accounts.items():
        assert acct.path == path and acct.shares >= 0, acct
        parent = s.accounts.get(acct.parent) if acct.parent is not None else None
        assert acct.parent == (path.rsplit("/", 1)[0] if "/" in path else None), acct
        assert acct.parent is None or parent is not None, f"{path}: parent missing"
        assert (acct.kind, parent.kind if parent else None) in _ALLOWED_PARENTS, acct
        if acct.open and parent is not None:
            assert parent.open, f"open {path} under closed {parent.path}"
    # 4. jobs: in an open project by a member while unfinished; contract inside the cap
    for job in s.jobs.values():
        acct = s.accounts[job.spec.account]
        assert acct.kind == "project", job
        assert job.spec.gpus >= 1 and 0 <= job.spec.min_runtime_s <= s.min_runtime_cap_s, job
        if job.active:
            assert acct.open, job
            assert job.spec.user in s.members.get(job.spec.account, set()), job
    # (members keeping an open user leaf: see test_domain.test_every_member_keeps_an_open_user_leaf)


def check_accepted(before: State, cmd: c.AnyCommand, events: list[e.AnyEvent], now: float) -> None:
    """Authorisation and contracts, re-derived from the state the command met."""
    actor = cmd.actor
    admin = actor in before.admins
    match cmd:
        case c.RegisterNode() | c.RemoveNode():
            assert admin, cmd
        case c.DrainNode() | c.ReturnNode():  # an execution engine drains what it marks down
            assert admin or is_system(actor), cmd
        case (
            c.GrantManager() | c.RevokeManager() | c.GrantAdmin() | c.RevokeAdmin() | c.PreemptJob()
        ):
            assert admin, cmd
        case c.OpenAccount() | c.CloseAccount() | c.SetShares():
            path = cmd.account if isinstance(cmd, c.SetShares) else cmd.path
            parent = path.rsplit("/", 1)[0] if "/" in path else None
            assert admin if parent is None else manages(before, actor, parent), cmd
        case c.AddMember() | c.RemoveMember():
            assert manages(before, actor, cmd.project), cmd
        case c.SubmitJob():
            user = cmd.user or actor
            assert user in before.members.get(cmd.account, set()), cmd
            assert user == actor or is_system(actor) or manages(before, actor, cmd.account), cmd
        case c.CancelJob():
            job = before.jobs[cmd.job_id]
            assert (
                actor == job.spec.user
                or is_system(actor)
                or manages(before, actor, job.spec.account)
            )
        case c.ApplyDecision() | c.StartJob() | c.FinishJob() | c.SampleUtilisation():
            assert is_system(actor) or admin, cmd
    for ev in events:
        if isinstance(ev, e.JobPreempted):
            job = before.jobs[ev.job_id]
            assert job.placed_at is not None
            if isinstance(cmd, c.PreemptJob):
                assert cmd.note.strip() and ev.reason == cmd.reason and ev.cycle_id is None
            else:
                assert isinstance(cmd, c.ApplyDecision), cmd
                assert now >= job.placed_at + job.spec.min_runtime_s, (
                    "preempted inside its contract"
                )


# --- running steps through the pure domain -------------------------------------------------------


@dataclass
class Run:
    state: State
    events: list[e.AnyEvent]
    accepted: int = 0
    rejected: int = 0


def _ids() -> Callable[[], str]:
    n = itertools.count(1)
    return lambda: f"e{next(n)}"


def seed_org() -> tuple[State, list[e.AnyEvent]]:
    state, events, ids = State(), [], _ids()
    for cmd in SEED_ORG:
        for ev in decide(state, cmd, T0, ids):
            evolve(state, ev)
            events.append(ev)
    return state, events


def run_pure(script: list[Step]) -> Run:
    state, events = seed_org()
    run = Run(state, events)
    now, ids = T0, _ids()
    for step in script:
        cmd = to_command(state, step)
        if isinstance(cmd, float):
            now += cmd
            continue
        before = copy.deepcopy(state)
        try:
            new = decide(state, cmd, now, ids)
        except LedgerError:
            assert state == before, f"rejected {cmd} changed the state"
            run.rejected += 1
            continue
        assert state == before, f"decide({cmd}) changed the state"
        check_accepted(before, cmd, new, now)
        for ev in new:
            # the audit judges each event by the rules decide judged the command by
            assert authorisation_failure(state, ev) is None, (cmd, ev)
            evolve(state, ev)
        check_invariants(state)
        run.events += new
        run.accepted += 1
    return run


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_random_commands_never_break_an_invariant(script: list[Step]) -> None:
    run_pure(script)


@settings(max_examples=100, deadline=None)
@given(steps, st.data())
def test_folding_one_by_one_equals_folding_in_a_batch(
    script: list[Step], data: st.DataObject
) -> None:
    run = run_pure(script)
    assert fold(run.events) == run.state
    cut = data.draw(st.integers(0, len(run.events)), label="cut")
    assert fold(run.events[cut:], fold(run.events[:cut])) == run.state
    one_by_one = State()
    for ev in run.events:
        one_by_one = evolve(one_by_one, ev)
    assert one_by_one == run.state


@settings(max_examples=50, deadline=None)
@given(steps)
def test_the_snapshot_of_a_full_state_equals_that_of_the_live_state(script: list[Step]) -> None:
    """The dispatcher sees the same snapshot whether finished jobs stay in memory or leave it."""
    run = run_pure(script)
    live = fold(run.events, State(live_only=True))
    assert live.active == set(live.jobs) == run.state.active
    ranks = {"ai2/olmo": 0}
    assert snapshot_from_state(live, ranks, T0) == snapshot_from_state(run.state, ranks, T0)


@settings(max_examples=50, deadline=None)
@given(steps, st.booleans())
def test_a_snapshot_made_from_the_last_ones_views_equals_one_made_afresh(
    script: list[Step], hold_stopping: bool
) -> None:
    """`snapshot_kept` handed the last call's views (only the job records that came or went
    since are looked at) gives the snapshot `snapshot_from_state` gives, event after event."""
    run = run_pure(script)
    ranks = {"ai2/olmo": 0}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inputs, "KEEP_FROM", 0)  # kept from any number of live jobs
        _snapshots_kept(run.events, ranks, hold_stopping)


def _snapshots_kept(events: list[e.AnyEvent], ranks: dict[str, int], hold_stopping: bool) -> None:
    state, views = State(), None
    for n, ev in enumerate(events):
        evolve(state, ev)
        low = {j: T0 for j in sorted(state.active)[::3]} if n // 4 % 2 else None
        kept, views = snapshot_kept(state, ranks, T0 + n, views, low_util_since=low,
                                    hold_stopping=hold_stopping)  # fmt: skip
        assert kept == snapshot_from_state(
            state, ranks, T0 + n, low_util_since=low, hold_stopping=hold_stopping
        )


def test_the_generator_reaches_the_interesting_states() -> None:
    """Guard against a universe where almost everything is rejected: a fixed script places,
    runs, drains and preempts."""
    script: list[Step] = [
        ("submit", ("alice", "ai2/olmo"), None, 4, 0, True, None, None),
        ("submit", ("bob", "ai2/olmo"), "mgr", 2, 3600, False, "h100", None),
        ("decide", "@dispatcher", [((1, True), "n1", "free"), ((0, True), "n2", "free")], []),
        ("start", "@executor", (1, True)),
        ("drain", ADMIN, "n1", "maintenance"),
        ("decide", "@dispatcher", [], [((1, True), "fairness")]),
        ("tick", 3600.0),
        ("decide", "@dispatcher", [], [((0, True), "fairness")]),
    ]
    run = run_pure(script)
    assert run.rejected == 0
    kinds = [type(ev) for ev in run.events]
    for want in (e.JobPlaced, e.JobStarted, e.JobPreempted, e.JobRequeued, e.NodeDrained):
        assert want in kinds, want.__name__
    assert run.state.nodes["n1"].state == "drained"


# --- the same sequences through a real Ledger, then reloaded from disk ---------------------------


def _execute(led: Ledger, batch: list[c.AnyCommand]) -> None:
    """Append a batch; a rejected batch must leave the store and the state as they were."""
    before, position, head = copy.deepcopy(led.state), led.position, led.head()
    try:
        led.execute_all(batch)
    except LedgerError:
        assert (led.state, led.position, led.head()) == (before, position, head), batch
        return
    check_invariants(led.state)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps, st.lists(st.integers(1, 3), min_size=1, max_size=10))
def test_a_ledger_reloaded_from_its_store_equals_its_fold(
    script: list[Step], sizes: list[int]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home, clock = Path(tmp), SimClock(T0)
        led = Ledger(home, clock, seeded_ids(7))
        try:
            led.execute_all(SEED_ORG)
            batch: list[c.AnyCommand] = []
            for step, size in zip(script, itertools.cycle(sizes), strict=False):
                cmd = to_command(led.state, step)
                if isinstance(cmd, float) or len(batch) >= size:
                    _execute(led, batch) if batch else None
                    batch = []
                if isinstance(cmd, float):
                    clock.advance_to(clock.now() + cmd)
                else:
                    batch.append(cmd)
            if batch:
                _execute(led, batch)
            logged = [ev for _, ev in led.read(0, 1_000_000)]
            assert len(logged) == led.position == led.head()
            assert fold(logged) == led.state
            again = Ledger(home, clock)
            try:
                assert again.state == led.state
                assert again.position == led.position
            finally:
                again.close()
        finally:
            led.close()


# --- the codec ----------------------------------------------------------------------------------


def strategy_for(t: mi.Type) -> st.SearchStrategy[Any]:
    """Values of a msgspec type inside its bounds (`schemas.bounds`), the bounds included."""
    match t:
        case mi.IntType():  # within the type's bounds (msgspec.Meta ge/le), if any
            low = t.ge if t.ge is not None else (None if t.gt is None else t.gt + 1)
            high = t.le if t.le is not None else (None if t.lt is None else t.lt - 1)
            return st.integers(
                -(2**63) if low is None else low, 2**63 - 1 if high is None else high
            )
        case mi.FloatType():
            low = t.ge if t.ge is not None else t.gt
            high = t.le if t.le is not None else t.lt
            return st.floats(
                min_value=low,
                max_value=high,
                exclude_min=t.gt is not None,
                exclude_max=t.lt is not None,
                allow_nan=False,
                allow_infinity=False,
            )
        case mi.StrType():
            return st.text(min_size=t.min_length or 0, max_size=min(12, t.max_length or 12))
        case mi.BoolType():
            return st.booleans()
        case mi.NoneType():
            return st.none()
        case mi.LiteralType():
            return st.sampled_from(t.values)
        case mi.UnionType():
            return st.one_of([strategy_for(x) for x in t.types])
        case mi.VarTupleType():
            size = min(3, t.max_length if t.max_length is not None else 3)
            return st.lists(strategy_for(t.item_type), max_size=size).map(tuple)
        case mi.DictType():
            size = min(3, t.max_length if t.max_length is not None else 3)
            return st.dictionaries(
                strategy_for(t.key_type), strategy_for(t.value_type), max_size=size
            )
        case mi.StructType():
            return st.builds(t.cls, **{f.name: strategy_for(f.type) for f in t.fields})
    raise AssertionError(f"no strategy for {t}")


def instances(cls: type[e.Event]) -> st.SearchStrategy[e.AnyEvent]:
    return strategy_for(mi.type_info(cls))


any_event = st.one_of([instances(cls) for cls in e.EVENT_TYPES])


def test_every_event_type_is_in_the_union_and_tagged() -> None:
    stored = e.EVENT_TYPES + e.OLDER_TYPES
    assert len(e.TAGS) == len(stored) == len(set(stored))
    later = {e.CycleDecided: "v4", e.CycleDecidedV3: "v3", e.CycleDecidedV2: "v2"}
    later |= {e.JobSubmitted: "v2", e.JobFinished: "v2", e.JobRunEnded: "v2"}
    later |= {e.ServiceConfigured: "v2", e.JobEngineEnded: "v2"}
    assert all(e.tag_of(cls).endswith(".v1") for cls in stored if cls not in later)
    assert all(e.tag_of(cls).endswith("." + version) for cls, version in later.items())


@pytest.mark.parametrize("cls", e.EVENT_TYPES, ids=e.tag_of)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_event_type_round_trips(cls: type[e.Event], data: st.DataObject) -> None:
    event = data.draw(instances(cls), label="event")
    raw = codec.encode(event)
    back = codec.decode(raw)
    assert type(back) is cls
    assert back == event
    assert codec.encode(back) == raw, "encoding is canonical"
    assert codec.peek_tag(raw) == e.tag_of(cls)


@settings(max_examples=100, deadline=None)
@given(any_event, st.text(max_size=30).filter(lambda t: t not in e.TAGS))
def test_an_unknown_tag_is_reported_as_unknown(event: e.AnyEvent, tag: str) -> None:
    doc = msgspec.json.decode(codec.encode(event))
    doc["type"] = tag
    with pytest.raises(EventDecodeError) as info:
        codec.decode(msgspec.json.encode(doc))
    assert (info.value.tag, info.value.known) == (tag, False)
    assert info.value.fields == {"tag": tag, "known": False}


@settings(max_examples=100, deadline=None)
@given(any_event, st.sampled_from(("drop event_id", "drop at", "drop actor", "at is text")))
def test_a_known_tag_with_invalid_fields_is_reported_as_known(
    event: e.AnyEvent, damage: str
) -> None:
    doc = msgspec.json.decode(codec.encode(event))
    verb, name, *_ = damage.split()
    if verb == "drop":
        del doc[name]
    else:
        doc["at"] = "soon"
    with pytest.raises(EventDecodeError) as info:
        codec.decode(msgspec.json.encode(doc))
    assert (info.value.tag, info.value.known) == (e.tag_of(type(event)), True)
    assert "is invalid" in info.value.message


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_corrupt_bytes_raise_event_decode_error(data: bytes) -> None:
    with pytest.raises(EventDecodeError) as info:
        codec.decode(data)
    assert info.value.tag == codec.peek_tag(data)
    assert info.value.known is (info.value.tag in e.TAGS)


@settings(max_examples=100, deadline=None)
@given(any_event, st.data())
def test_truncated_events_raise_event_decode_error(event: e.AnyEvent, data: st.DataObject) -> None:
    raw = codec.encode(event)
    cut = data.draw(st.integers(0, len(raw) - 1), label="cut")
    with pytest.raises(EventDecodeError) as info:
        codec.decode(raw[:cut])
    assert (info.value.tag, info.value.known) == (None, False)
    assert "bytes are not an event" in info.value.message
