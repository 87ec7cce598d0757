"""The one read layer: every read the CLI and the HTTP API offer, returning `schemas.views`.

Each function takes the handles it reads (a `LiveState` for live state and previews, a caught-up
projection `Store` for history, a DuckDB connection for audit reads), typed filters and an
explicit `now`/`at`; it returns view Structs. No printing, no clock, no appends: transport-free
and side-effect free (a `preview` decides without appending). History reads (`jobs`, `log`) come
from the projection's read models, never from the folded write-side `State`; their SQL is
`projections.history`'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import msgspec

from ledger.core.utilisation import UtilTracker
from ledger.reads.explain import explain_history, explain_pending
from schemas import api
from schemas import events as e
from schemas import views as v
from schemas.bounds import TeamDepth, check
from schemas.errors import InvalidCommand, UnknownEntity
from schemas.units import when

if TYPE_CHECKING:  # a read loads what it uses: `jobs` and `shares` never load the dispatcher,
    # `jobs` neither the fair-share queries nor the event decoders
    import duckdb

    from ledger.core.state import Job, State
    from ledger.cycle.dispatcher import LiveState
    from ledger.dispatch.engine import Decision
    from ledger.dispatch.policy import Policy
    from ledger.dispatch.snapshot import PendingJob, Snapshot
    from ledger.store.application import Ledger
    from projections.fairshare import DeliveredReport, TeamHour, UsagePolicy
    from projections.store import Store

# --- identity ----------------------------------------------------------------------------------


def tokens(state: State, actor: str) -> list[api.TokenRow]:
    """Pure: the tokens `actor` may list (an admin: everyone's), oldest first; never secrets or
    their hashes."""
    admin = state.is_admin(actor)
    rows = [
        api.TokenRow(
            token_id=t.token_id,
            user=t.user,
            name=t.name,
            issued_at=t.issued_at,
            expires_at=t.expires_at,
            scope=t.scope,
            scope_node=t.scope_node,
            scope_job=t.scope_job,
            revoked=t.revoked,
        )
        for t in list(state.tokens.values())
        if admin or t.user == actor
    ]
    return sorted(rows, key=lambda r: (r.issued_at, r.token_id))


# --- budget tree and nodes ---------------------------------------------------------------------


def account_tree(state: State) -> list[v.AccountNode]:
    """Depth-first rows of the open budget tree with each account's normalised share."""
    kids: dict[str | None, list[str]] = {}
    for a in sorted(state.accounts.values(), key=lambda a: a.path):
        if a.open:
            kids.setdefault(a.parent, []).append(a.path)
    rows: list[v.AccountNode] = []

    def walk(parent: str | None, depth: int) -> None:
        siblings = kids.get(parent, [])
        total = sum(state.accounts[p].shares for p in siblings)
        for path in siblings:
            a = state.accounts[path]
            rows.append(
                v.AccountNode(
                    path=path,
                    kind=a.kind,
                    depth=depth,
                    shares=a.shares,
                    norm_shares=a.shares / total if total else 0.0,
                    members=sorted(state.members.get(path, ())) if a.kind == "project" else [],
                    managers=sorted(u for u, roots in state.managers.items() if path in roots),
                )
            )
            walk(path, depth + 1)

    walk(None, 0)
    return rows


def node_list(state: State) -> list[v.NodeRow]:
    """Nodes in service (not removed), by name, with free GPUs and the jobs they hold."""
    return [
        v.NodeRow(
            node=n.name,
            cluster=n.cluster,
            gpu_type=n.gpu_type,
            gpus=n.gpus,
            free_gpus=len(state.free_indices(n.name)),
            state=n.state,
            jobs=sorted(state.node_jobs.get(n.name, ())),
            drain_reason=n.drain_reason,
            lost_reason=n.lost_reason,
        )
        for n in sorted(state.nodes.values(), key=lambda n: n.name)
        if n.state != "removed"
    ]


# --- who sees what -------------------------------------------------------------------------------


def may_see_private(state: State, actor: str, user: str, account: str) -> bool:
    """Pure: whether `actor` may see the command, labels and logs of `user`'s job in
    `account`: its owner, a manager of the account or one above it, an admin. The one rule:
    the pages, `jobs` and `log` (both faces) all ask it."""
    return actor == user or state.is_admin(actor) or state.manages(actor, account)


class Viewer(NamedTuple):
    """Who reads, and the live state that says whom they manage."""

    actor: str
    state: State

    def sees(self, user: str, account: str) -> bool:
        return may_see_private(self.state, self.actor, user, account)


def redact(row: v.JobRow) -> v.JobRow:
    """Pure: the job without what only its owner, managers and admins see."""
    return msgspec.structs.replace(row, command=[], logs=[], redacted=True)


def redact_event(ev: e.AnyEvent) -> e.AnyEvent:
    """Pure: the event without a job's command, labels or logs (others are returned as they
    are)."""
    if isinstance(ev, e.JobSubmitted):
        return msgspec.structs.replace(ev, command=(), labels={})
    if isinstance(ev, e.JobStarted):
        return msgspec.structs.replace(ev, logs=())
    return ev


# --- jobs and the log (history: the projection) ----------------------------------------------


def jobs(store: Store, f: v.JobFilter, now: float, viewer: Viewer | None) -> list[v.JobRow]:
    """Jobs newest first, like sacct: start, end, elapsed, exit code. `since`/`until` select the
    jobs alive at some moment of [since, until] (not ended before `since`, submitted by
    `until`). A job whose command `viewer` may not see comes `redact`ed (None: nothing is)."""
    from projections.history import jobs_page

    return _seen(_job_rows(jobs_page(store.con, f), now), viewer)


def _seen(rows: list[v.JobRow], viewer: Viewer | None) -> list[v.JobRow]:
    if viewer is None:
        return rows
    return [r if viewer.sees(r.user, r.account) else redact(r) for r in rows]


def _job_rows(rows: list[tuple[Any, ...]], now: float) -> list[v.JobRow]:
    out = []
    for r in rows:
        (job_id, account_, user, gpus, gpu_type, cluster, status, outcome, exit_code, funded,
         min_runtime_s, resumable, priority, debug, time_limit_s, submitted_at, placed_at,
         started_at, finished_at, placements, preemptions, nodes, last_start,
         command, logs, finish_reason) = r  # fmt: skip
        began = started_at if started_at is not None else last_start
        if status in ("pending", "held"):
            began = None  # requeued: its last run is over
        end = finished_at if status == "finished" else (now if status == "running" else None)
        elapsed = None if began is None or end is None else max(0.0, end - began)
        out.append(
            v.JobRow(
                job_id=job_id, account=account_, user=user, gpus=gpus, gpu_type=gpu_type,
                cluster=cluster, status=status, outcome=outcome, exit_code=exit_code,
                funded=funded, min_runtime_s=min_runtime_s, resumable=resumable,
                priority=priority, debug=debug, time_limit_s=time_limit_s,
                submitted_at=submitted_at, placed_at=placed_at, started_at=began,
                finished_at=finished_at, elapsed_s=elapsed, nodes=list(nodes),
                placements=placements, preemptions=preemptions, command=list(command or []),
                logs=list(logs or []),
                finish_reason=(finish_reason or "exited") if status == "finished" else None,
            )
        )  # fmt: skip
    return out


def log(store: Store, f: v.LogFilter, viewer: Viewer | None) -> list[v.LogEntry]:
    """Events after `f.after` in log order (`f.limit` of them, or the last `f.tail`), from the
    projection's `events` table; events of unknown types keep their tag and a null body. The
    events of a job whose command `viewer` may not see come `redact_event`ed and marked, and so do
    token issues (their secret's hash withheld) for every viewer (None: nothing is)."""
    from projections import history

    rows = history.log_page(store.con, f.after, f.limit, tail=f.tail)
    out = [
        v.LogEntry(position=r.position, tag=r.tag, at=r.occurred_at, actor=r.actor, event=r.event)
        for r in rows
    ]
    if viewer is None:
        return out
    out = [  # a token's hash is the server's to check, never a reader's to see
        msgspec.structs.replace(
            x, event=msgspec.structs.replace(x.event, secret_sha256=""), redacted=True
        )
        if isinstance(x.event, e.TokenIssued)
        else x
        for x in out
    ]
    owners = {x.event.job_id: ("", "") for x in out if isinstance(x.event, e.JobStarted)}
    owners.update(
        {
            x.event.job_id: (x.event.user, x.event.account)
            for x in out
            if isinstance(x.event, e.JobSubmitted)
        }
    )
    unknown = sorted(job_id for job_id, who in owners.items() if who == ("", ""))
    if unknown:
        owners.update(history.owners(store.con, unknown))
    hidden = {job_id for job_id, (u, a) in owners.items() if not viewer.sees(u, a)}
    return [
        msgspec.structs.replace(x, event=redact_event(x.event), redacted=True)
        if isinstance(x.event, e.JobSubmitted | e.JobStarted) and x.event.job_id in hidden
        else x
        for x in out
    ]


# --- fair share, usage, delivered --------------------------------------------------------------


def _finite(x: float) -> float | None:
    return None if math.isinf(x) or math.isnan(x) else x


def shares(store: Store, at: float, policy: UsagePolicy) -> list[v.ShareRow]:
    """The fair-share tree as Slurm's `sshare -l` (Fair Tree) names and computes it."""
    from projections import queries

    return [
        v.ShareRow(
            account=r.path,
            parent=r.parent,
            kind=r.kind,
            depth=r.depth,
            raw_shares=r.shares,
            norm_shares=r.norm_shares,
            raw_usage_gpu_s=r.usage,
            # the projection's norm_usage is usage / the siblings' (Slurm's EffectvUsage) and
            # its effective_usage is usage / the whole tree's (Slurm's NormUsage)
            norm_usage=r.effective_usage,
            effectv_usage=r.norm_usage,
            level_fs=_finite(r.level_fs),
            level_fs_infinite=math.isinf(r.level_fs),
            rank=r.rank,
            fair_share=r.factor,
        )
        for r in queries.shares_table(store, at, policy)
    ]


def usage(
    store: Store, at: float, by: Literal["account", "user"], policy: UsagePolicy
) -> list[v.UsageRow]:
    """Funded GPU-hours in the window ending at `at`, per account (with ancestors) or user."""
    from projections import queries

    rows = queries.usage(store, at, by=by, policy=policy)
    return sorted(
        (v.UsageRow(name=r.name, usage_gpu_hours=r.gpu_hours) for r in rows),
        key=lambda r: r.name,
    )


def delivered(store: Store, start: float, end: float, team_depth: int) -> v.DeliveredView:
    """Owed against delivered GPU-hours per team over [start, end)."""
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise InvalidCommand("the report needs a positive, finite window", start=start, end=end)
    team_depth = check(team_depth, TeamDepth, "team depth")
    from projections import queries

    rep = queries.delivered_report(store, start, end, team_depth=team_depth)
    return _delivered_view(rep, team_depth)


def _delivered_view(rep: DeliveredReport, team_depth: int) -> v.DeliveredView:
    return v.DeliveredView(
        start_at=rep.start,
        end_at=rep.end,
        team_depth=team_depth,
        teams=[
            v.TeamDelivered(
                team=t.team,
                owed_gpu_hours=t.owed_gpu_h,
                delivered_gpu_hours=t.delivered_gpu_h,
                by_period=t.by_period,
                hour_by_hour=t.hour_by_hour,
            )
            for t in rep.teams
        ],
        by_period=rep.by_period,
        hour_by_hour=rep.hour_by_hour,
        teams_at_95=rep.teams_at_95,
        teams_owed=rep.teams_owed,
        worst_team=rep.worst_team,
        worst=rep.worst,
    )


def projection_status(store: Store) -> v.ProjectionStatusView:
    s = store.status()
    return v.ProjectionStatusView(
        position=s.position,
        events=s.events,
        unknown_events=s.unknown_events,
        unknown_tags=dict(s.unknown_tags),
    )


# --- queue, priority, explain (live: a preview decision on the current state) ----------------


def utilisation(store: Store, state: State, threshold: float = 10.0) -> UtilTracker:
    """Since when each placed or running job has stayed below `threshold` % (from its samples)."""
    running = [j.job_id for j in state.jobs.values() if j.status in ("placed", "running")]
    tracker = UtilTracker(threshold_pct=threshold)
    if not running:
        return tracker
    from projections import history

    for _position, ev in history.events_of(
        store.con, [e.UtilisationSampled, e.JobPlaced], job_ids=running
    ):
        tracker.observe(ev)
    return tracker


def live(ledger: LiveState, store: Store, policy: Policy, now: float) -> tuple[Snapshot, Decision]:
    """What the dispatcher would decide at `now` (nothing is appended)."""
    from ledger.cycle.dispatcher import StoreRanks, preview

    util = utilisation(store, ledger.state)
    return preview(ledger, StoreRanks(store), policy, now, util.low_since)


_RAW_TIME = re.compile(r"\bt=(\d+(?:\.\d+)?(?:e\+?\d+)?)")


def readable(text: str, until: float | None = None) -> str:
    """Pure: the dispatcher's reasons with their raw `t=1.76723e+09` times as UTC times (the
    exact `until` when the wait has one: the raw text keeps only six digits).

    Recorded decisions keep the dispatcher's text byte for byte (replay compares it); reads show
    times people can read."""
    return _RAW_TIME.sub(lambda m: when(until if until is not None else float(m.group(1))), text)


def _under(account: str, root: str | None) -> bool:
    return root is None or (account + "/").startswith(root.rstrip("/") + "/")


def estimated_starts(
    state: State, snapshot: Snapshot, decision: Decision, now: float, through: int | None = None
) -> dict[int, float | None]:
    """Pure: an estimated start for every pending job, or None when it cannot be known; with
    `through`, only for the jobs up to that one in dispatch order (a job's estimate depends on
    the jobs ahead of it alone, so those are the same as in the full answer).

    Jobs placed in the next cycle start `now`. For the others, in dispatch order: GPUs free up
    when running jobs reach their time limit (a job without one holds its GPUs for an unknown
    time), and each job ahead takes its GPUs from its estimated start until its own time limit;
    a job waiting for contracts to end (WAIT_CONTRACT) may start when they end. Cluster-wide GPU
    counts (a job's GPU type respected), node fit ignored: an estimate, not a promise.
    """
    placed = {p.job_id for p in decision.placements}
    free: dict[str, int] = {}
    for n in snapshot.nodes:
        if n.state == "active":
            free[n.gpu_type] = free.get(n.gpu_type, 0) + len(n.free)
    # (time, gpu_type, gpus freed); time None = unknown
    releases: list[tuple[float, str, int]] = []
    node_type = {n.name: n.gpu_type for n in snapshot.nodes}
    for r in snapshot.running:
        job = state.jobs.get(r.job_id)
        limit = job.spec.time_limit_s if job is not None else None
        if limit is None:
            continue
        begun = job.started_at if job is not None and job.started_at is not None else r.placed_at
        for sl in r.slots:
            releases.append(
                (max(now, begun + limit), node_type.get(sl.node, ""), len(sl.gpu_indices))
            )
    out: dict[int, float | None] = {}
    pending = {p.job_id: p for p in snapshot.pending}
    for cons in decision.considered:
        p = pending.get(cons.job_id)
        if p is None:
            continue
        if p.job_id in placed:
            out[p.job_id] = now
            if p.job_id == through:
                break
            continue
        types = [t for t in free if p.gpu_type is None or t == p.gpu_type]
        have = sum(free[t] for t in types)
        start: float | None = None
        if have >= p.gpus:
            start = now
        else:
            for at, t, g in sorted(releases):
                if t in types:
                    have += g
                    if have >= p.gpus:
                        start = at
                        break
        wait = decision.waiting.get(p.job_id)
        if wait is not None and wait.code == "WAIT_CONTRACT" and wait.until is not None:
            # the dispatcher may preempt the jobs in the way once their contracts end
            start = wait.until if start is None else min(start, max(now, wait.until))
        out[p.job_id] = start
        if start is None:
            if p.job_id == through:
                break
            continue
        # the job takes its GPUs from `start`: from the free pool, then from the releases
        need = p.gpus
        for t in types:
            take = min(free[t], need)
            free[t] -= take
            need -= take
        kept = []
        for at, t, g in sorted(releases):
            if need and t in types and at <= start:
                take = min(g, need)
                need -= take
                if g - take:
                    kept.append((at, t, g - take))
            else:
                kept.append((at, t, g))
        releases = kept
        if p.time_limit_s is not None:
            releases.append((start + p.time_limit_s, types[0] if types else "", p.gpus))
        if p.job_id == through:
            break
    return out


def queue(
    ledger: LiveState,
    store: Store,
    policy: Policy,
    now: float,
    f: v.QueueFilter,
    preview: tuple[Snapshot, Decision] | None = None,
) -> list[v.QueueRow]:
    """Pending (and held) work in dispatch order with its sort key, why it waits and an
    estimated start, filtered like squeue (-u, -A, --state), the first `f.limit` rows. `preview`:
    `live(...)` at `now` when the caller already holds it.

    Only the rows shown are built (their reason text, their estimated start, which needs the
    jobs ahead of them alone): at 10k pending a page of 50 costs what 50 rows cost. No preview
    is decided when no schedulable pending job passes the filter (`--state held`, an empty
    queue): its rows would be none."""
    state = ledger.state
    rows: list[v.QueueRow] = []
    if f.state in ("pending", "all") and (preview is not None or _any_pending(state, f)):
        snapshot, decision = preview or live(ledger, store, policy, now)
        pending = {p.job_id: p for p in snapshot.pending}
        shown: list[tuple[int, e.Considered, PendingJob]] = []
        for i, cons in enumerate(decision.considered):
            if len(shown) >= f.limit:
                break
            p = pending[cons.job_id]
            if (f.user and p.user != f.user) or not _under(p.account, f.account):
                continue
            shown.append((i, cons, p))
        through = shown[-1][2].job_id if shown else None
        starts = estimated_starts(state, snapshot, decision, now, through) if shown else {}
        for i, cons, p in shown:
            wait = decision.waiting.get(cons.job_id)
            rows.append(
                v.QueueRow(
                    order=i + 1, job_id=p.job_id, account=p.account, user=p.user, gpus=p.gpus,
                    funded=p.funded, debug=p.debug, state="pending", sort_key=list(cons.sort_key),
                    code=wait.code if wait else "NEXT_CYCLE",
                    reason=readable(wait.reason, wait.until) if wait else "",
                    submitted_at=p.submitted_at, waiting_s=max(0.0, now - p.submitted_at),
                    estimated_start_at=starts.get(p.job_id),
                )
            )  # fmt: skip
    if f.state in ("held", "all") and len(rows) < f.limit:
        for job in sorted(state.jobs.values(), key=lambda j: j.job_id):
            if len(rows) >= f.limit:
                break
            if not job.held or job.status != "pending":
                continue
            s = job.spec
            if (f.user and s.user != f.user) or not _under(s.account, f.account):
                continue
            rows.append(
                v.QueueRow(
                    order=None, job_id=s.job_id, account=s.account, user=s.user, gpus=s.gpus,
                    funded=job.funded, debug=s.debug, state="held", sort_key=[], code="HELD",
                    reason="held: `gpuledger release` lets it be scheduled",
                    submitted_at=s.at, waiting_s=max(0.0, now - s.at), estimated_start_at=None,
                )
            )  # fmt: skip
    return rows[: f.limit]


def _any_pending(state: State, f: v.QueueFilter) -> bool:
    """Pure: whether some pending job the dispatcher would consider (not held) passes `f`."""
    return any(
        job.status == "pending"
        and not job.held
        and not (f.user and job.spec.user != f.user)
        and _under(job.spec.account, f.account)
        for job in state.jobs.values()
    )


def queue_codes(state: State, snapshot: Snapshot, decision: Decision) -> list[tuple[str, str]]:
    """Pure: each queued job's account and code as `queue` gives them (pending in dispatch
    order, then held), without the rest of its row (the counts of /metrics)."""
    accounts = {p.job_id: p.account for p in snapshot.pending}
    out = []
    for cons in decision.considered:
        wait = decision.waiting.get(cons.job_id)
        out.append((accounts[cons.job_id], wait.code if wait else "NEXT_CYCLE"))
    held = sorted(
        (j.job_id, j.spec.account) for j in state.jobs.values() if j.held and j.status == "pending"
    )
    return out + [(account, "HELD") for _, account in held]


_DEBUG_LANE = ("debug_lane", "0: a funded debug-class job in the debug lane, 1: any other")
_KEY_PARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "fairshare-3": (
        _DEBUG_LANE,
        ("funded_class", "0 funded, 1 unfunded (funded work goes first)"),
        ("team_place", "the team's place by its share of the whole tree, 0 the best"),
        ("priority_neg", "declared priority, negated: orders jobs inside one team"),
        ("user_rank", "the user leaf's fair-share rank inside the team"),
        ("submitted_at", "submit time, earlier first"),
        ("job_id", "the tie-break"),
    ),
    "fairshare-2": (
        _DEBUG_LANE,
        ("funded_class", "0 funded, 1 unfunded (funded work goes first)"),
        ("team_rank", "the team's fair-share rank, 0 the best"),
        ("priority_neg", "declared priority, negated: orders jobs inside one team"),
        ("user_rank", "the user leaf's fair-share rank inside the team"),
        ("submitted_at", "submit time, earlier first"),
        ("job_id", "the tie-break"),
    ),
    "fairshare": (
        ("funded_class", "0 funded, 1 unfunded (funded work goes first)"),
        ("team_rank", "the team's fair-share rank, 0 the best"),
        ("priority_neg", "declared priority, negated: orders jobs inside one team"),
        ("user_rank", "the user leaf's fair-share rank inside the team"),
        ("submitted_at", "submit time, earlier first"),
        ("job_id", "the tie-break"),
    ),
    "fifo": (
        ("submitted_at", "submit time, earlier first"),
        ("job_id", "the tie-break"),
    ),
    "slurm": (
        ("funded_class", "0 funded, 1 unfunded"),
        ("multifactor_neg", "Slurm's multifactor priority, negated"),
        ("priority_neg", "declared priority, negated"),
        ("submitted_at", "submit time, earlier first"),
        ("job_id", "the tie-break"),
    ),
    "legacy": (
        ("funded_class", "0 funded, 1 unfunded"),
        ("priority_neg", "declared priority, negated"),
        ("submitted_at", "submit time, earlier first"),
        ("job_id", "the tie-break"),
    ),
}
_KEY_PARTS["fairshare-4"] = _KEY_PARTS["fairshare-3"]  # the same order, another gain
_KEY_PARTS["fairshare-5"] = (
    *_KEY_PARTS["fairshare-3"][:2],
    ("unfunded_ran", "1: an unfunded job that ran and was preempted (jobs that never ran first)"),
    *_KEY_PARTS["fairshare-3"][2:],
)
_KEY_PARTS["fairshare-6"] = _KEY_PARTS["fairshare-5"]  # the same order, a larger debug reserve


def key_parts(policy_version: str, key: Sequence[float | int | str]) -> list[v.KeyPart]:
    """Pure: the parts of a sort key with their names (unknown layouts get `part_N`)."""
    names = _KEY_PARTS.get(policy_version) or _KEY_PARTS.get(policy_version.split("-", 1)[0], ())
    if len(names) != len(key):
        names = tuple((f"part_{i + 1}", "") for i in range(len(key)))
    return [v.KeyPart(name=n, value=x, meaning=m) for (n, m), x in zip(names, key, strict=True)]


def priority(
    ledger: LiveState,
    store: Store,
    policy: Policy,
    now: float,
    f: v.QueueFilter,
    preview: tuple[Snapshot, Decision] | None = None,
) -> list[v.PriorityRow]:
    """Every pending job's sort key with each part named, in dispatch order (like sprio).
    `preview`: `live(...)` at `now` when the caller already holds it."""
    _, decision = preview or live(ledger, store, policy, now)
    state = ledger.state
    rows: list[v.PriorityRow] = []
    for i, cons in enumerate(decision.considered):
        spec = state.jobs[cons.job_id].spec
        if (f.user and spec.user != f.user) or not _under(spec.account, f.account):
            continue
        if len(rows) >= f.limit:
            break
        rows.append(
            v.PriorityRow(
                order=i + 1,
                job_id=cons.job_id,
                account=spec.account,
                user=spec.user,
                policy=decision.policy_version,
                parts=key_parts(decision.policy_version, cons.sort_key),
            )
        )
    return rows[: f.limit]


def _history(store: Store, job_id: int) -> list[e.AnyEvent]:
    from projections import history

    return [r.event for r in history.job_events(store.con, job_id)]


_JOB_EVENTS = (
    e.JobSubmitted, e.JobPlaced, e.JobStarted, e.JobPreempted, e.JobHeld, e.JobReleased,
    e.JobRequeued, e.JobFinished, e.CheckpointReported,
)  # fmt: skip


def job_from_history(job_id: int, history: Iterable[e.AnyEvent]) -> Job | None:
    """Pure: a job as the full fold holds it, from its own events alone (a live state keeps no
    finished jobs; their history is in the projection); None when it was never submitted."""
    from ledger.core.evolve import evolve
    from ledger.core.state import State

    scratch = State()
    for ev in history:
        if isinstance(ev, _JOB_EVENTS) and ev.job_id == job_id:
            if not isinstance(ev, e.JobSubmitted) and job_id not in scratch.jobs:
                continue
            evolve(scratch, ev)
    return scratch.jobs.get(job_id)


def _decisions(store: Store, history: Iterable[e.AnyEvent]) -> dict[str, e.CycleDecided]:
    cycles = sorted(
        {
            ev.cycle_id
            for ev in history
            if isinstance(ev, e.JobPlaced | e.JobPreempted) and ev.cycle_id
        }
    )
    if not cycles:
        return {}
    from projections.history import decisions_of_cycles

    return decisions_of_cycles(store.con, cycles)


def _tag(ev: e.AnyEvent) -> str:
    return e.tag_of(type(ev))


def explain(
    ledger: LiveState,
    store: Store,
    job_id: int,
    policy: Policy,
    now: float,
    preview: tuple[Snapshot, Decision] | None = None,
) -> v.ExplainView:
    """Why a job is pending, placed where it is, or was preempted: structured, and in words.
    `preview`: `live(...)` at `now` when the caller already holds it."""
    state = ledger.state
    history = _history(store, job_id)
    job = state.jobs.get(job_id) or job_from_history(job_id, history)
    if job is None:
        raise UnknownEntity(f"no job {job_id}", hint="see `gpuledger jobs`", job_id=job_id)
    decisions = _decisions(store, history)
    told = explain_history(job, history, decisions, now)
    events = [
        v.ExplainEvent(at=ev.at, tag=_tag(ev), text=t) for ev, t in _history_texts(history, told)
    ]
    held = job.held
    status: v.JobStatusWord = "held" if held and job.status == "pending" else job.status
    code = reason = sort_key = position = queue_length = start = None
    blocking: list[int] = []
    lines = told
    if job.status == "pending" and held:
        code, reason = "HELD", "held: `gpuledger release` lets it be scheduled"
        lines = [*told, "It is held: the dispatcher skips it until it is released."]
    elif job.status == "pending":
        snapshot, decision = preview or live(ledger, store, policy, now)
        lines = [readable(x) for x in explain_pending(job, decision, snapshot, now)]
        if any(isinstance(ev, e.JobPreempted) for ev in history):
            lines += ["Earlier:", *told[1:]]
        order = [c.job_id for c in decision.considered]
        if job_id in order:
            i = order.index(job_id)
            position, queue_length = i + 1, len(order)
            sort_key = list(decision.considered[i].sort_key)
            wait = decision.waiting.get(job_id)
            code = wait.code if wait else "NEXT_CYCLE"
            reason = (
                readable(wait.reason, wait.until)
                if wait
                else "it would be placed in the next cycle"
            )
            if wait is not None and wait.code == "WAIT_CONTRACT":
                blocking = sorted(
                    r.job_id for r in snapshot.running if r.placed_at + r.min_runtime_s > now
                )[:50]
            else:
                blocking = order[max(0, i - 50) : i] if wait is not None else []
            start = estimated_starts(state, snapshot, decision, now).get(job_id)
    return v.ExplainView(
        job_id=job_id,
        status=status,
        outcome=job.outcome,
        code=code,
        reason=reason,
        position=position,
        queue_length=queue_length,
        blocking_jobs=blocking,
        sort_key=sort_key,
        estimated_start_at=start,
        contract_ends_at=job.contract_ends_at(),
        history=events,
        lines=lines,
    )


def _history_texts(history: Sequence[e.AnyEvent], told: list[str]) -> list[tuple[e.AnyEvent, str]]:
    """Pair the events `explain_history` tells about with their sentences (it writes one per
    told event, in order, after its headline)."""
    tellable = (
        e.JobSubmitted, e.JobPlaced, e.JobStarted, e.CheckpointReported, e.JobPreempted,
        e.JobRequeued, e.JobHeld, e.JobReleased, e.JobFinished,
    )  # fmt: skip
    shown = [ev for ev in history if isinstance(ev, tellable)]
    return list(zip(shown, told[1 : 1 + len(shown)], strict=False))


def squatters(
    ledger: LiveState, store: Store, now: float, threshold: float, idle_s: float
) -> list[v.SquatterRow]:
    """Placed or running jobs whose GPUs sat below `threshold` % for at least `idle_s`."""
    state = ledger.state
    util = utilisation(store, state, threshold)
    rows = []
    for job_id, since in sorted(util.low_since.items()):
        job = state.jobs[job_id]
        if job.status not in ("placed", "running") or now - since < idle_s:
            continue
        acct = job.spec.account
        ends = job.contract_ends_at()
        rows.append(
            v.SquatterRow(
                job_id=job_id,
                account=acct,
                user=job.spec.user,
                gpus=job.spec.gpus,
                idle_since_at=since,
                past_contract=ends is not None and now >= ends,
                managers=sorted(
                    u
                    for u, roots in state.managers.items()
                    if any(acct == r or acct.startswith(r + "/") for r in roots)
                ),
            )
        )
    return rows


# --- audit reads (a read-only DuckDB connection over the projection) --------------------------


def audit_preemptions(
    con: duckdb.DuckDBPyConnection, account: str | None, since: float | None
) -> list[v.PreemptionRow]:
    """Every preemption: whose job, why, for which job, by whom, inside its contract or not."""
    from projections import history

    return [v.PreemptionRow(**r) for r in history.dicts(con, history.preemptions(account, since))]


def audit_budget_changes(
    con: duckdb.DuckDBPyConnection, since: float | None
) -> list[v.BudgetChangeRow]:
    """Who changed what in the budget tree, and why."""
    from projections import history

    return [v.BudgetChangeRow(**r) for r in history.dicts(con, history.budget_changes(since))]


# --- dashboard: series, GPU map, decisions, counts ---------------------------------------------


def job(store: Store, job_id: int, now: float, viewer: Viewer | None) -> v.JobRow:
    """One job as `jobs` shows it to `viewer` (UnknownEntity when the log has none with this
    id)."""
    from projections.history import jobs_page

    rows = jobs_page(store.con, v.JobFilter(limit=1), job_id=job_id)
    if not rows:
        raise UnknownEntity(f"no job {job_id}", job_id=job_id)
    return _seen(_job_rows(rows, now), viewer)[0]


class PastHours:
    """Team hours of whole hours already over, kept between reads (a server keeps one): an hour
    that has ended never changes (events are appended at their own time, and each hour's owed
    and delivered depend on that hour alone), so only the hours since the last read are read."""

    def __init__(self) -> None:
        self.key: tuple[float, int] | None = None
        self.until = 0.0
        self.hours: list[TeamHour] = []

    def advance(
        self, store: Store, start: float, end: float, team_depth: int, step_s: float
    ) -> bool:
        """Read at most `step_s` more of the ended hours of [start, end) ahead of `read`, so a
        long history is read in short steps (a server's idle moments after it starts); True
        while some remain."""
        if not self.behind(start, end, team_depth):
            return False
        cut = math.floor(end / 3600) * 3600
        if self.key != (start, team_depth) or self.until > cut:
            self.key, self.until, self.hours = (start, team_depth), start, []
        if self.until < cut:
            from projections import queries

            to = min(cut, self.until + max(3600.0, math.floor(step_s / 3600) * 3600))
            self.hours += queries.team_hours(store, self.until, to, team_depth=team_depth)
            self.until = to
        return self.until < cut

    def behind(self, start: float, end: float, team_depth: int) -> bool:
        """Whether some ended hour of [start, end) is not read yet (without reading)."""
        cut = math.floor(end / 3600) * 3600
        if start % 3600 or cut <= start:
            return False
        return self.key != (start, team_depth) or self.until != cut

    def read(self, store: Store, start: float, end: float, team_depth: int) -> list[TeamHour]:
        """The team hours of [start, end), as `queries.team_hours` gives them."""
        from projections import queries

        cut = math.floor(end / 3600) * 3600
        if start % 3600 or cut <= start:
            return queries.team_hours(store, start, end, team_depth=team_depth)
        if self.key != (start, team_depth) or self.until > cut:
            self.key, self.until, self.hours = (start, team_depth), start, []
        if self.until < cut:
            self.hours += queries.team_hours(store, self.until, cut, team_depth=team_depth)
            self.until = cut
        tail = queries.team_hours(store, cut, end, team_depth=team_depth) if end > cut else []
        return self.hours + tail


def delivered_series(
    store: Store,
    start: float,
    end: float,
    team_depth: int,
    bucket_s: float,
    past: PastHours | None = None,
) -> tuple[v.DeliveredView, v.DeliveredSeriesView]:
    """Owed against delivered over [start, end) as `delivered` gives it, and per team in
    buckets of `bucket_s` (a whole number of hours), from one reading of the team hours (whole
    past hours from `past` when given)."""
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise InvalidCommand("the series needs a positive, finite window", start=start, end=end)
    if bucket_s < 3600 or bucket_s % 3600:
        raise InvalidCommand("the bucket is a whole number of hours", bucket_s=bucket_s)
    from projections import queries
    from projections.fairshare import summarise

    team_depth = check(team_depth, TeamDepth, "team depth")
    if past is None:
        hours = queries.team_hours(store, start, end, team_depth=team_depth)
    else:
        hours = past.read(store, start, end, team_depth)
    sums: dict[str, dict[float, list[float]]] = {}
    for th in hours:
        at = start + ((th.hour - start) // bucket_s) * bucket_s
        cell = sums.setdefault(th.team, {}).setdefault(at, [0.0, 0.0])
        cell[0] += th.owed_gpu_h
        cell[1] += th.delivered_gpu_h
    series = v.DeliveredSeriesView(
        start_at=start,
        end_at=end,
        bucket_s=bucket_s,
        teams=[
            v.TeamSeries(
                team=team,
                points=[
                    v.TeamPoint(at=at, owed_gpu_hours=o, delivered_gpu_hours=d)
                    for at, (o, d) in sorted(cells.items())
                ],
            )
            for team, cells in sorted(sums.items())
        ],
    )
    return _delivered_view(summarise(hours, start, end), team_depth), series


def gpu_map(ledger: LiveState, store: Store) -> list[v.GpuRow]:
    """Every GPU of the nodes in service, by node and index, with the job holding it and that
    GPU's value in the job's last utilisation sample (one value per GPU in slot order; the
    job's mean when the sample does not have one per GPU)."""
    state = ledger.state
    holders: dict[tuple[str, int], int] = {}
    order: dict[int, list[tuple[str, int]]] = {}
    for j in state.jobs.values():
        for slot in j.slots:
            for g in slot.gpu_indices:
                holders[(slot.node, g)] = j.job_id
                order.setdefault(j.job_id, []).append((slot.node, g))
    util: dict[tuple[str, int], float] = {}
    if holders:
        from projections import history

        for job_id, sample in history.last_samples(store.con, sorted(order)).items():
            values = [float(x) for x in sample.gpu_utilisation]
            gpus = order[job_id]
            if not values:
                continue
            if len(values) != len(gpus):
                values = [sum(values) / len(values)] * len(gpus)
            util.update(zip(gpus, values, strict=True))
    out = []
    for n in sorted(state.nodes.values(), key=lambda n: n.name):
        if n.state == "removed":
            continue
        for g in range(n.gpus):
            jid = holders.get((n.name, g))
            spec = state.jobs[jid].spec if jid is not None else None
            out.append(
                v.GpuRow(
                    node=n.name,
                    gpu=g,
                    node_state=n.state,
                    job_id=jid,
                    user=None if spec is None else spec.user,
                    account=None if spec is None else spec.account,
                    utilisation_pct=util.get((n.name, g)),
                )
            )
    return out


def decisions(
    store: Store,
    since: float | None = None,
    until: float | None = None,
    limit: int = 500,
    *,
    job_id: int | None = None,
    position: int | None = None,
) -> list[v.DecisionRow]:
    """Recorded dispatcher cycles, newest first (at most `limit`), with their counts: in
    [since, until], that placed or preempted `job_id`, or the one at `position`."""
    from projections import history

    rows = history.decisions(store.con, since, until, limit, job_id=job_id, position=position)
    return [
        v.DecisionRow(
            position=p,
            cycle_id=c,
            decided_at=at,
            based_on=b,
            policy_version=pv,
            placed=list(pl),
            preempted=list(pr),
            considered=n,
            fragmentation_gpus=f,
        )
        for p, c, at, b, pv, pl, pr, n, f in rows
    ]


def decision_at(ledger: Ledger, position: int) -> e.CycleDecided:
    """The recorded decision at `position` of the log (its inputs by reference and outcome)."""
    got = ledger.read(position - 1, 1) if position >= 1 else []
    if not got or got[0][0] != position or not isinstance(got[0][1], e.CycleDecided):
        raise UnknownEntity(f"no recorded decision at position {position}", position=position)
    return got[0][1]


def preemption_counts(store: Store) -> list[v.CountRow]:
    """Preemptions over the whole log, per reason."""
    from projections import history

    return [v.CountRow(name=r, count=n) for r, n in history.preemption_counts(store.con)]


def placement_counts(store: Store) -> list[v.CountRow]:
    """Placements over the whole log, funded or not."""
    from projections import history

    return [v.CountRow(name=k, count=n) for k, n in history.placement_counts(store.con)]
