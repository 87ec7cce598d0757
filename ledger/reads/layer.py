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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

import msgspec

from ledger.core.utilisation import UtilTracker
from ledger.reads.viewers import Viewer as Viewer
from ledger.reads.viewers import may_query_all as may_query_all
from ledger.reads.viewers import may_see_private as may_see_private
from ledger.reads.viewers import redact as redact
from ledger.reads.viewers import redact_event as redact_event
from ledger.reads.viewers import require_query_all as require_query_all
from schemas import api
from schemas import events as e
from schemas import views as v
from schemas.bounds import DEFAULT_GRACE_S, TeamDepth, check
from schemas.errors import InvalidCommand, UnknownEntity
from schemas.units import times_in

if TYPE_CHECKING:  # a read loads what it uses: `jobs` and `shares` never load the dispatcher,
    # `jobs` neither the fair-share queries nor the event decoders
    import duckdb

    from ledger.core.state import State
    from ledger.cycle.dispatcher import LiveState
    from projections.fairshare import DeliveredReport, UsagePolicy
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


def node_list(
    state: State,
    foreign: Mapping[str, frozenset[int]] | None = None,
    stopping: Mapping[str, frozenset[int]] | None = None,
    now: float = 0.0,
    heard_from: Mapping[str, float] | None = None,
) -> list[v.NodeRow]:
    """Nodes in service (not removed), by name, with free GPUs and the jobs they hold; GPUs
    that `foreign` work holds, and those of stopped runs still in their grace (`stopping`), as
    the service last observed its engine, are not free, nor those of the runs the log says were
    stopped and whose end is not recorded yet (`stopping_gpus`, which the dispatcher holds: a
    read with the service down, embedded, showed them free, atk47-23 F4). `stopping_jobs`: the
    jobs stopping on each at `now` (`stopping_on`); `heard_from`: when the service last heard
    from each (its engine's `heard_from`)."""
    from ledger.cycle.inputs import stopping_gpus

    held = foreign or {}
    ending = dict(stopping or {})
    for node, gpus in stopping_gpus(state).items():
        ending[node] = ending.get(node, frozenset()) | gpus
    stopping_jobs = stopping_on(state, now)

    def busy(node: str) -> frozenset[int]:
        return held.get(node, frozenset()) | ending.get(node, frozenset())

    return [
        v.NodeRow(
            node=n.name,
            cluster=n.cluster,
            gpu_type=n.gpu_type,
            gpus=n.gpus,
            free_gpus=len(set(state.free_indices(n.name)) - busy(n.name)),
            foreign_gpus=sorted(held.get(n.name, ())),
            stopping_gpus=sorted(ending.get(n.name, ())),
            state=n.state,
            jobs=sorted(state.node_jobs.get(n.name, ())),
            drain_reason=n.drain_reason,
            lost_reason=n.lost_reason,
            stopping_jobs=stopping_jobs.get(n.name, []),
            heard_from=(heard_from or {}).get(n.name),
        )
        for n in sorted(state.nodes.values(), key=lambda n: n.name)
        if n.state != "removed"
    ]


def stopping_on(state: State, now: float) -> dict[str, list[int]]:
    """Pure: node -> the jobs stopping on it at `now` (`ledger.reads.stopping`, as `queue`
    shows them): those it holds past their time limit, and those with a run the ledger stopped
    there not reported gone (their record ended, or requeued: atk50b-23 F5, a requeued job's
    run went unnamed beside GPUs said stopping), in job order."""
    from ledger.reads.stopping import past_limit

    out: dict[str, set[int]] = {}
    for node, held in state.node_jobs.items():
        for j in held:
            job = state.jobs.get(j)
            limit = None if job is None else job.spec.time_limit_s
            if job is not None and (
                past_limit(job.status, job.started_at, limit, now)
                or (job.status == "running" and job.reaping_kill_at is not None)  # F4
            ):
                out.setdefault(node, set()).add(j)
    for sr in state.stopped_runs.values():
        for sl in sr.slots:
            out.setdefault(sl.node, set()).add(sr.job_id)
    return {node: sorted(jobs) for node, jobs in out.items()}


# --- jobs and the log (history: the projection) ----------------------------------------------


def jobs(
    store: Store, f: v.JobFilter, now: float, viewer: Viewer | None, *, below: int | None = None
) -> list[v.JobRow]:
    """Jobs newest first, like sacct: start, end, elapsed, exit code. `since`/`until` select the
    jobs alive at some moment of [since, until] (not ended before `since`, submitted by
    `until`). A job whose command `viewer` may not see comes `redact`ed (None: nothing is).
    `below` (else `f.before_id`): only jobs with smaller ids (the page after one that ended at
    `below`).

    With `f.at` before the log's last event, the jobs as they were then (`jobs_as_of`): those
    submitted later do not exist, the others are as their events up to then made them."""
    from ledger.reads.stopping import reaping_kills
    from projections.history import jobs_page, known_account, position_at

    known_account(store.con, f.account)
    below = f.before_id if below is None else below
    if f.at is not None:
        position = position_at(store.con, f.at)
        if position is not None:
            rows = jobs_as_of(store, f, position, below)
            return _seen(_job_rows(rows, f.at, store), viewer)
    rows = jobs_page(store.con, f, below=below)
    reaping = {} if viewer is None else reaping_kills(viewer.state)
    return _seen(_job_rows(rows, now, store, _stopping(viewer), reaping), viewer)


def _stopping(viewer: Viewer | None) -> dict[int, float]:
    """The jobs the live state (the viewer's) shows stopping after their record ended, with
    their SIGKILL (`stopping.stopping_kills`; none without a viewer)."""
    from ledger.reads.stopping import stopping_kills

    return {} if viewer is None else stopping_kills(viewer.state)


def finished_jobs(
    store: Store, f: v.JobFilter, viewer: Viewer | None, *, reason: str | None, offset: int
) -> tuple[int, list[v.JobRow]]:
    """The finished jobs `f` selects (its user, account and below, `since`/`until`), ended for
    `reason` when given: their true total and the page of at most `f.limit` after the first
    `offset`, newest first, like `sacct -s CD,F,CA,TO,PR`; redacted for `viewer` as `jobs`."""
    from projections.history import jobs_count, jobs_page, known_account

    known_account(store.con, f.account)
    done = msgspec.structs.replace(f, status="finished", at=None)
    total = jobs_count(store.con, done, reason)
    rows = jobs_page(store.con, done, reason=reason, offset=offset) if offset < total else []
    return total, _seen(_job_rows(rows, 0.0), viewer)


def jobs_as_of(
    store: Store, f: v.JobFilter, position: int, below: int | None = None
) -> list[tuple[Any, ...]]:
    """The rows `f` selects as the projection held them at log `position`: page by page of the
    jobs submitted by then (newest first; ids below `below` when given), the rows an event
    after `position` changed rebuilt from their own events up to it (a projection of those jobs
    alone), and the filters that depend on a job's state (`status`, `since`) applied to the
    rows as they were."""
    from projections.history import changed_after, job_records, jobs_page

    fixed = msgspec.structs.replace(
        f, status=None, reasons=None, since=None, at=None, limit=max(f.limit, 500)
    )
    out: list[tuple[Any, ...]] = []
    while len(out) < f.limit:
        page = jobs_page(store.con, fixed, before=position, below=below)
        if not page:
            break
        below = page[-1][0]
        changed = set(changed_after(store.con, [r[0] for r in page], position))
        then = {r[0]: r for r in _rebuilt(job_records(store.con, sorted(changed), position))}
        for row in page:
            row = then.get(row[0], row)
            if _kept(row, f):
                out.append(row)
    return out[: f.limit]


def _rebuilt(records: list[tuple[int, str, bytes]]) -> list[tuple[Any, ...]]:
    """The job rows a projection of `records` alone holds (every event of those jobs up to a
    position: a job's row depends on its own events only)."""
    if not records:
        return []
    from projections.history import jobs_page
    from projections.projector import Projector
    from projections.source import ListSource, LogRecord
    from projections.store import Store

    with Store(":memory:") as scratch:
        Projector(scratch, ListSource([LogRecord(*r) for r in records])).catch_up()
        ids = sorted({r[0] for r in scratch.con.execute("SELECT job_id FROM jobs").fetchall()})
        return jobs_page(scratch.con, v.JobFilter(job_ids=tuple(ids), limit=max(1, len(ids))))


def _kept(row: tuple[Any, ...], f: v.JobFilter) -> bool:
    """Whether a job row passes the filters that depend on its state (`status`, `reasons`,
    `since`)."""
    status, finished_at = row[6], row[18]
    if f.since is not None and finished_at is not None and finished_at < f.since:
        return False
    if f.reasons is not None and row[24] not in f.reasons:
        return False
    if f.status is None:
        return True
    if f.status == "active":
        return bool(status != "finished")
    if f.status == "pending":
        return bool(status == "pending")
    return bool(status == f.status)


def _seen(rows: list[v.JobRow], viewer: Viewer | None) -> list[v.JobRow]:
    if viewer is None:
        return rows
    return [r if viewer.sees(r.user, r.account) else redact(r) for r in rows]


def _job_rows(
    rows: list[tuple[Any, ...]],
    now: float,
    store: Store | None = None,
    stopped: Mapping[int, float] | None = None,
    reaping: Mapping[int, float] | None = None,
) -> list[v.JobRow]:
    """The rows as `jobs` shows them at `now`: a running job past its limit `stopping`, with
    its SIGKILL at the latest (`ledger.reads.stopping`, its own grace, else the service's,
    read from `store`); a finished job in `stopped` (its record ended while its stopped run
    lives out its grace: job -> its SIGKILL, `stopping.stopping_kills`) `stopping` with that
    SIGKILL, its end not known yet (None), its elapsed time to `now`, as squeue's `CG`, where
    it showed `finished` at the cancel; its end is its run's real end once recorded. A running
    job in `reaping` (its command exited leaving processes: `stopping.reaping_kills`) is
    `stopping` with that SIGKILL. A finished job that never started names no node (`slots`
    keep its placement)."""
    from ledger.reads.stopping import past_limit, shown

    ending = [r[0] for r in rows if past_limit(r[6], r[17], r[14], now)]
    service: dict[int, float] = {}  # the service's grace when each was placed (atk49-23 F1)
    if ending and store is not None:
        from projections.history import graces, placement_graces

        grace = graces(store.con, ending)
        service = placement_graces(store.con, ending)
    else:
        grace = {}
    out = []
    for r in rows:
        (job_id, account_, user, gpus, gpu_type, cluster, status, outcome, exit_code, funded,
         min_runtime_s, resumable, priority, debug, time_limit_s, submitted_at, placed_at,
         started_at, finished_at, placements, preemptions, slots, command, logs,
         finish_reason, finish_note, engine_job_id, job_name, workdir, array_job_id,
         array_task_id) = r  # fmt: skip
        end = finished_at if status == "finished" else (now if status == "running" else None)
        reason = finish_reason if status == "finished" else None
        note = finish_note if status == "finished" else ""
        ended: float | None = finished_at
        kill_at: float | None
        if stopped and status == "finished" and job_id in stopped:
            status, kill_at, ended, end = "stopping", stopped[job_id], None, now
        elif reaping and status == "running" and job_id in reaping:  # atk49-23 F4
            status, kill_at = "stopping", reaping[job_id]
        else:
            status, kill_at = shown(status, started_at, time_limit_s, grace.get(job_id), now,
                                    service.get(job_id, DEFAULT_GRACE_S))  # fmt: skip
        elapsed = None if started_at is None or end is None else max(0.0, end - started_at)
        # where it ran: none for a finished job no run of which started (its placement stays
        # in `slots`; atk55-23 F2: a launch cancelled before it started named its node)
        ran = status != "finished" or started_at is not None
        gpu_slots = [
            e.GpuSlot(node=sl["node"], gpu_indices=tuple(sl["gpu_indices"])) for sl in slots
        ]
        out.append(
            v.JobRow(
                job_id=job_id, account=account_, user=user, gpus=gpus, gpu_type=gpu_type,
                cluster=cluster, status=status, outcome=outcome, exit_code=exit_code,
                funded=funded, min_runtime_s=min_runtime_s, resumable=resumable,
                priority=priority, debug=debug, time_limit_s=time_limit_s,
                submitted_at=submitted_at, placed_at=placed_at, started_at=started_at,
                finished_at=ended, elapsed_s=elapsed,
                nodes=sorted({sl.node for sl in gpu_slots if ran}), placements=placements,
                preemptions=preemptions, command=list(command or []), logs=list(logs or []),
                finish_reason=reason, finish_note=note, slots=gpu_slots,
                engine_job_id=engine_job_id, job_name=job_name, workdir=workdir,
                array_job_id=array_job_id, array_task_id=array_task_id, kill_at=kill_at,
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
        v.LogEntry(
            position=r.position,
            tag=r.tag if r.event is None else e.tag_of(type(r.event)),
            at=r.occurred_at,
            actor=r.actor,
            event=r.event,
        )
        for r in rows
    ]
    if viewer is None:
        return out
    before = history.log_page(store.con, out[0].position - 2, 1) if out else []
    out = [  # a token's hash is the server's to check, never a reader's to see
        msgspec.structs.replace(
            x, event=msgspec.structs.replace(x.event, secret_sha256=""), redacted=True
        )
        if isinstance(x.event, e.TokenIssued)
        else x
        for x in out
    ]
    earlier = [  # the event before the page: its link shows in the page's first
        v.LogEntry(position=r.position, tag=r.tag, at=r.occurred_at, actor=r.actor, event=r.event)
        for r in before
        if out and r.position == out[0].position - 1
    ]
    owners = {x.event.job_id: ("", "") for x in [*earlier, *out] if _private(x.event)}
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
    withheld = {  # events shown without their private fields: the next one's link hides too
        x.position for x in [*earlier, *out] if _private(x.event) and x.event.job_id in hidden
    }
    return [
        _unlinked(
            msgspec.structs.replace(x, event=redact_event(x.event), redacted=True)
            if x.position in withheld and x.event is not None
            else x,
            x.position - 1 in withheld,
        )
        for x in out
    ]


def _unlinked(x: v.LogEntry, hide: bool) -> v.LogEntry:
    """`x` with its event's `prev_hash` empty when `hide`: the link hashes the previous event's
    whole stored bytes, so shown beside that event redacted it would confirm a guess of its
    private fields offline (docs/security.md, row T1)."""
    if not hide or x.event is None:
        return x
    return msgspec.structs.replace(x, event=msgspec.structs.replace(x.event, prev_hash=""))


def _private(ev: e.AnyEvent | None) -> TypeGuard[e.JobSubmitted | e.JobStarted | e.JobFinished]:
    """A job's event `redact_event` takes something out of."""
    return isinstance(ev, e.JobSubmitted | e.JobStarted) or (
        isinstance(ev, e.JobFinished) and ev.reason == "launch_failed"
    )


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


DELIVERED_MAX_S = 3660 * 86400.0
"""The longest window of the delivered report (ten years): its cost is one row per team and
clock hour, so a window from 1970 to the year 3000 would be nine million hours per team."""


def delivered(store: Store, start: float, end: float, team_depth: int) -> v.DeliveredView:
    """Owed against delivered GPU-hours per team over [start, end) (at most `DELIVERED_MAX_S`)."""
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise InvalidCommand("the report needs a positive, finite window", start=start, end=end)
    if end - start > DELIVERED_MAX_S:
        raise InvalidCommand(
            f"the report covers at most {DELIVERED_MAX_S / 86400:,.0f} days, "
            f"asked for {(end - start) / 86400:,.0f}",
            hint="ask for a shorter window (--window, or start and end)",
        )
    team_depth = check(team_depth, TeamDepth, "team depth")
    from projections import queries

    rep = queries.delivered_report(store, start, end, team_depth=team_depth)
    return delivered_view(rep, team_depth)


def delivered_view(rep: DeliveredReport, team_depth: int) -> v.DeliveredView:
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
    """Where the projection stands (of `store.con`: a read pool's cursor too)."""
    from projections.store import status_of

    s = status_of(store.con)
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


def preemption_report(
    con: duckdb.DuckDBPyConnection,
    account: str | None,
    side: Literal["of", "by", "both"],
    start: float | None,
    end: float | None,
) -> v.PreemptionReportView:
    """The preemptions `account`'s subtree suffered and caused in [start, end): why, the victim
    rule, for whom and the GPU-hours lost (`report preemptions`, the Preemptions page)."""
    from projections import history

    history.known_account(con, account)
    q = history.preemption_report(account, side, start, end)
    # the victim rule's raw `t=` times (the policy's note, kept byte for byte) as times, the
    # CLI's text on every face (atk48-29 F1: the page showed "since t=1.79646e+09")
    rows = [
        v.PreemptionReportRow(**{**r, "rule": times_in(r["rule"]) if r.get("rule") else r["rule"]})
        for r in history.dicts(con, q)
    ]
    caused = [
        r
        for r in rows
        if r.side in ("caused", "both") or (r.side == "all" and r.for_job is not None)
    ]
    return v.PreemptionReportView(
        account=account,
        side=side,
        start=start,
        end=end,
        suffered=sum(r.side in ("suffered", "both", "all") for r in rows),
        # caused: for a job of the subtree (a preemption inside it counts on both sides);
        # with no account, every preemption that was for a waiting job
        caused=len(caused),
        lost_gpu_hours=sum(
            (r.lost_gpu_hours for r in rows if r.side in ("suffered", "both", "all")), 0.0
        ),  # floats even when empty: both faces print the same bytes
        caused_lost_gpu_hours=sum((r.lost_gpu_hours for r in caused), 0.0),
        rows=rows,
    )


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
    return _seen(_job_rows(rows, now, store, _stopping(viewer)), viewer)[0]


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
    before: int | None = None,
) -> list[v.DecisionRow]:
    """Recorded dispatcher cycles, newest first (at most `limit`), with their counts: in
    [since, until], that placed or preempted `job_id`, or the one at `position`; `before`: those
    before this position."""
    from projections import history

    rows = history.decisions(
        store.con, since, until, limit, job_id=job_id, position=position, before=before
    )
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


def decision_at(store: Store, position: int) -> e.CycleDecided:
    """The recorded decision at `position` of the log (its inputs by reference and outcome),
    from the projection's copy of the log (`events`: the event as stored, its `prev_hash`
    too): UnknownEntity when the projection holds no decision there."""
    from projections import history

    got = history.events_of(store.con, [e.CycleDecided], first=position, last=position)
    if not got or not isinstance(got[0][1], e.CycleDecided):
        raise UnknownEntity(f"no recorded decision at position {position}", position=position)
    return got[0][1]


def preemption_counts(store: Store, after: int = 0) -> list[v.CountRow]:
    """Preemptions over the whole log (`after`: those after this position), per reason."""
    from projections import history

    return [v.CountRow(name=r, count=n) for r, n in history.preemption_counts(store.con, after)]


def team_counts(store: Store, depth: int, after: int = 0) -> list[tuple[str, str, str, int]]:
    """Placements, preemptions suffered and preemptions caused per team over the whole log
    (`after`: those after this position; `history.team_counts`; the Kueue-style metrics)."""
    from projections import history

    return history.team_counts(store.con, depth, after)


def placement_counts(store: Store, after: int = 0) -> list[v.CountRow]:
    """Placements over the whole log (`after`: those after this position), funded or not."""
    from projections import history

    return [v.CountRow(name=k, count=n) for k, n in history.placement_counts(store.con, after)]
