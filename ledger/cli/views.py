"""Read-side commands: shares, usage, report, projection, queue, explain, squatters, preempt."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
from rich.table import Table

from ledger.cli._common import Ctx, echo_json, json_option, parse_duration, parse_time, pass_ctx
from ledger.clock import SystemClock
from ledger.dispatch import registry
from ledger.dispatch.policy import Policy
from ledger.domain import State
from ledger.explain import explain_history, explain_pending, span, when
from ledger.service import StoreRanks, UtilTracker, preview
from projections import queries
from projections.errors import ProjectionBusy
from projections.fairshare import UsagePolicy
from projections.projector import Projector, rebuild
from projections.source import EmbeddedSource
from projections.store import Store
from schemas import codec
from schemas import commands as c
from schemas import events as e


def _console() -> Console:
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


@contextmanager
def projection(ctx: Ctx, *, quiet: bool = False) -> Iterator[Store]:
    """The projection caught up with the log. When a running service holds the file (DuckDB
    allows one writer), read a private in-memory copy built from the log instead."""
    ctx.ledger()  # a clear error when there is no ledger
    try:
        store = Store.open(ctx.home)
    except ProjectionBusy:
        if not quiet:
            click.echo("note: the service holds the projection; reading a private copy", err=True)
        store = Store(":memory:")
    with store, EmbeddedSource(ctx.home) as source:
        Projector(store, source).catch_up()
        status = store.status()
        if status.unknown_events and not quiet:
            tags = ", ".join(f"{t} ({n})" for t, n in sorted(status.unknown_tags.items()))
            click.echo(
                f"note: {status.unknown_events} events of types this version does not know were "
                f"kept and ignored: {tags}; upgrade gpu-ledger to use them",
                err=True,
            )
        yield store


def _usage_policy(window: str, half_life: str | None) -> UsagePolicy:
    return UsagePolicy(
        window_s=parse_duration(window),
        half_life_s=None if half_life is None else parse_duration(half_life),
    )


def _at(at: str | None) -> float:
    return SystemClock().now() if at is None else parse_time(at)


window_option = click.option("--window", default="7d", show_default=True, help="Usage window.")
half_life_option = click.option(
    "--half-life", default=None, help="Decay usage with this half-life instead of a window."
)
at_option = click.option("--at", default=None, help="Moment to ask about (ISO 8601; default now).")


def _num(x: float | None, fmt: str = ".3f") -> str:
    if x is None:
        return "-"
    return "inf" if math.isinf(x) else format(x, fmt)


@click.command()
@at_option
@window_option
@half_life_option
@json_option
@pass_ctx
def shares(ctx: Ctx, at: str | None, window: str, half_life: str | None, as_json: bool) -> None:
    """The fair-share tree, like `sshare -l`: shares, usage, level fair share, rank, factor."""
    t = _at(at)
    with projection(ctx) as store:
        rows = queries.shares_table(store, t, _usage_policy(window, half_life))
    if as_json:
        echo_json([r._asdict() for r in rows])
        return
    table = Table(
        "account",
        "raw shares",
        "norm shares",
        "usage GPU-h",
        "norm usage",
        "effective",
        "level FS",
        "rank",
        "factor",
        box=None,
    )
    for r in rows:
        table.add_row(
            "  " * r.depth + r.path.rsplit("/", 1)[-1], str(r.shares), _num(r.norm_shares),
            f"{r.usage / 3600:,.2f}", _num(r.norm_usage), _num(r.effective_usage),
            _num(r.level_fs), "-" if r.rank is None else str(r.rank), _num(r.factor),
        )  # fmt: skip
    _console().print(table)


@click.command()
@click.option("--by", type=click.Choice(["account", "user"]), default="account", show_default=True)
@at_option
@window_option
@half_life_option
@json_option
@pass_ctx
def usage(
    ctx: Ctx, by: str, at: str | None, window: str, half_life: str | None, as_json: bool
) -> None:
    """Funded GPU usage in the window ending at --at, per account (with ancestors) or user."""
    t = _at(at)
    with projection(ctx) as store:
        rows = queries.usage(store, t, by=by, policy=_usage_policy(window, half_life))  # type: ignore[arg-type]
    rows.sort(key=lambda r: r.name)
    if as_json:
        echo_json([{"name": r.name, "gpu_seconds": r.gpu_seconds} for r in rows])
        return
    table = Table(by, "GPU-hours", box=None)
    for r in rows:
        table.add_row(r.name, f"{r.gpu_hours:,.1f}")
    _console().print(table)


@click.group()
def report() -> None:
    """Reports over the projection."""


@report.command("delivered")
@click.option("--window", default="30d", show_default=True, help="How far back from --at.")
@at_option
@click.option(
    "--team-depth",
    type=int,
    default=2,
    show_default=True,
    help="Depth of a team (2 = projects under programs).",
)
@json_option
@pass_ctx
def report_delivered(ctx: Ctx, window: str, at: str | None, team_depth: int, as_json: bool) -> None:
    """Owed vs delivered GPU-hours per team (owed: allocation capped hour by hour at demand)."""
    end = _at(at)
    start = end - parse_duration(window)
    with projection(ctx) as store:
        rep = queries.delivered_report(store, start, end, team_depth=team_depth)
    if as_json:
        echo_json(rep)
        return
    table = Table("team", "owed GPU-h", "delivered GPU-h", "by period", "hour by hour", box=None)
    for t in rep.teams:
        table.add_row(
            t.team, f"{t.owed_gpu_h:,.1f}", f"{t.delivered_gpu_h:,.1f}",
            _pct(t.by_period), _pct(t.hour_by_hour),
        )  # fmt: skip
    _console().print(table)
    click.echo(
        "owed delivered, by period (sum delivered / sum owed, capped at 1): "
        f"{_pct(rep.by_period)}; "
        f"hour by hour (sum min(delivered, owed) / sum owed): {_pct(rep.hour_by_hour)}"
    )
    click.echo(
        f"teams at >= 95% (by period): {rep.teams_at_95} of {rep.teams_owed}; "
        f"worst: {rep.worst_team or '-'} {_pct(rep.worst)}"
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _progress_bar() -> tuple[Progress, Any]:
    bar = Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
        TimeRemainingColumn(), transient=True,
    )  # fmt: skip
    task = bar.add_task("events", total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, update


@click.group("projection")
def projection_group() -> None:
    """The DuckDB projection of the log."""


@projection_group.command("rebuild")
@pass_ctx
def projection_rebuild(ctx: Ctx) -> None:
    """Drop the projection and rebuild it from the log (with a progress bar)."""
    ctx.ledger()
    bar, update = _progress_bar()
    with bar:
        result = rebuild(ctx.home, progress=update)
    click.echo(f"rebuilt: {result.applied:,} events, position {result.position:,}")
    if result.unknown:
        click.echo(
            f"note: {result.unknown} events of types this version does not know were kept "
            "and ignored"
        )


@projection_group.command("status")
@json_option
@pass_ctx
def projection_status(ctx: Ctx, as_json: bool) -> None:
    """Where the projection stands in the log."""
    with projection(ctx, quiet=True) as store:
        status = store.status()
    if as_json:
        echo_json(status)
        return
    click.echo(
        f"position {status.position:,}, {status.events:,} events, {status.unknown_events} unknown"
    )


# `gpuledger project rebuild` reads naturally too
project_alias = click.Group(
    "project", commands=projection_group.commands, help="Alias of `projection`.", hidden=True
)


def _policy(name: str | None, state: State) -> Policy:
    """The policy named, else the one the service recorded running with, else the default."""
    if name is None and state.service is not None:
        return registry.policy_from_config(state.service.policy)
    return registry.policy_from_config(registry.default_config(name or registry.DEFAULT))


policy_option = click.option(
    "--policy",
    type=click.Choice(["fairshare", "fifo"]),
    default=None,
    help="Preview with this policy's defaults instead of the settings the service recorded.",
)


def _live(ctx: Ctx, policy: str | None, now: float) -> tuple[Any, Any]:
    ledger = ctx.ledger()
    with projection(ctx, quiet=True) as store:
        util = _utilisation(store, ledger.state)
        chosen = _policy(policy, ledger.state)
        return preview(ledger, StoreRanks(store), chosen, now, util.low_since)


def _utilisation(store: Store, state: State, threshold: float = 10.0) -> UtilTracker:
    running = [j.job_id for j in state.jobs.values() if j.status in ("placed", "running")]
    tracker = UtilTracker(threshold_pct=threshold)
    if not running:
        return tracker
    rows = store.con.execute(
        "SELECT raw FROM events WHERE tag IN ('job.utilisation_sampled.v1', 'job.placed.v1') "
        "AND job_id IN (SELECT unnest($ids)) ORDER BY position",
        {"ids": running},
    ).fetchall()
    for (raw,) in rows:
        tracker.observe(codec.decode(raw.encode() if isinstance(raw, str) else raw))
    return tracker


@click.command()
@policy_option
@click.option("--limit", type=int, default=50, show_default=True)
@json_option
@pass_ctx
def queue(ctx: Ctx, policy: str | None, limit: int, as_json: bool) -> None:
    """Pending work in dispatch order, with its sort key and why it waits."""
    now = SystemClock().now()
    snapshot, decision = _live(ctx, policy, now)
    pending = {p.job_id: p for p in snapshot.pending}
    rows = []
    for i, cons in enumerate(decision.considered[:limit]):
        p = pending[cons.job_id]
        wait = decision.waiting.get(cons.job_id)
        rows.append(
            {
                "order": i + 1, "job_id": p.job_id, "account": p.account, "user": p.user,
                "gpus": p.gpus, "funded": p.funded, "debug": p.debug,
                "sort_key": list(cons.sort_key),
                "code": wait.code if wait else "NEXT_CYCLE", "reason": wait.reason if wait else "",
                "waiting_s": now - p.submitted_at,
            }
        )  # fmt: skip
    if as_json:
        echo_json(rows)
        return
    table = Table(
        "#", "job", "account", "user", "gpus", "sort key", "waiting", "code", "reason", box=None
    )
    for r in rows:
        table.add_row(
            str(r["order"]), str(r["job_id"]), r["account"], r["user"], str(r["gpus"]),
            str(r["sort_key"]), span(r["waiting_s"]), r["code"], r["reason"],
        )  # fmt: skip
    _console().print(table)
    if len(decision.considered) > limit:
        click.echo(f"... and {len(decision.considered) - limit} more")


@click.command()
@click.argument("job_id", type=int)
@policy_option
@json_option
@pass_ctx
def explain(ctx: Ctx, job_id: int, policy: str | None, as_json: bool) -> None:
    """Why JOB_ID is pending, why it was placed where it was, or why it was preempted."""
    now = SystemClock().now()
    ledger = ctx.ledger()
    job = ledger.state.job(job_id)
    lines: list[str]
    if job.status == "pending":
        snapshot, decision = _live(ctx, policy, now)
        lines = explain_pending(job, decision, snapshot, now)
        history = _history(ctx, job_id)
        if any(isinstance(ev, e.JobPreempted) for ev in history):
            earlier = explain_history(job, history, _decisions(ctx, history), now)[1:]
            lines += ["Earlier:", *earlier]
    else:
        history = _history(ctx, job_id)
        lines = explain_history(job, history, _decisions(ctx, history), now)
    if as_json:
        echo_json({"job_id": job_id, "status": job.status, "explanation": lines})
        return
    for line in lines:
        click.echo(line)


def _history(ctx: Ctx, job_id: int) -> list[e.AnyEvent]:
    with projection(ctx, quiet=True) as store:
        rows = store.con.execute(
            "SELECT raw FROM events WHERE job_id = ? AND known ORDER BY position", [job_id]
        ).fetchall()
    return [codec.decode(r[0].encode() if isinstance(r[0], str) else r[0]) for r in rows]


def _decisions(ctx: Ctx, history: list[e.AnyEvent]) -> dict[str, e.CycleDecided]:
    cycles = sorted(
        {
            ev.cycle_id
            for ev in history
            if isinstance(ev, e.JobPlaced | e.JobPreempted) and ev.cycle_id
        }
    )
    if not cycles:
        return {}
    with projection(ctx, quiet=True) as store:
        rows = store.con.execute(
            "SELECT raw FROM events WHERE tag = 'cycle.decided.v1' AND position IN "
            "(SELECT position FROM decisions WHERE cycle_id IN (SELECT unnest($ids)))",
            {"ids": cycles},
        ).fetchall()
    out = {}
    for (raw,) in rows:
        ev = codec.decode(raw.encode() if isinstance(raw, str) else raw)
        if isinstance(ev, e.CycleDecided):
            out[ev.cycle_id] = ev
    return out


@click.command()
@click.option(
    "--threshold",
    type=float,
    default=10.0,
    show_default=True,
    help="Utilisation % below which a job counts as idle.",
)
@click.option("--after", default="1h", show_default=True, help="How long it must have been idle.")
@json_option
@pass_ctx
def squatters(ctx: Ctx, threshold: float, after: str, as_json: bool) -> None:
    """Running jobs whose GPUs sit idle, per manager: the first preemption candidates once past
    their contract."""
    now = SystemClock().now()
    ledger = ctx.ledger()
    state = ledger.state
    with projection(ctx, quiet=True) as store:
        util = _utilisation(store, state, threshold)
    idle_s = parse_duration(after)
    rows: list[dict[str, Any]] = []
    for job_id, since in sorted(util.low_since.items()):
        job = state.jobs[job_id]
        if job.status not in ("placed", "running") or now - since < idle_s:
            continue
        acct = job.spec.account
        managers = sorted(
            u
            for u, roots in state.managers.items()
            if any(acct == r or acct.startswith(r + "/") for r in roots)
        )
        ends = job.contract_ends_at()
        row: dict[str, Any] = {
            "job_id": job_id,
            "account": acct,
            "user": job.spec.user,
            "gpus": job.spec.gpus,
            "idle_since": since,
            "past_contract": ends is not None and now >= ends,
            "managers": managers,
        }
        rows.append(row)
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("no squatters")
        return
    by_manager: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        for m in r["managers"] or ["(no manager)"]:
            by_manager.setdefault(m, []).append(r)
    for m, jobs in sorted(by_manager.items()):
        click.echo(f"{m}:")
        for r in jobs:
            state_word = (
                "past its contract: preemptible" if r["past_contract"] else "inside its contract"
            )
            click.echo(
                f"  job {r['job_id']} {r['account']} {r['user']} {r['gpus']} GPUs idle since "
                f"{when(r['idle_since'])} ({state_word})"
            )


@click.command()
@click.argument("job_id", type=int)
@click.option("--reason", required=True, help="Why (recorded; required inside a contract).")
@pass_ctx
def preempt(ctx: Ctx, job_id: int, reason: str) -> None:
    """Admin preemption of JOB_ID, even inside its contract; resumable jobs are requeued."""
    appended = ctx.execute(c.PreemptJob(actor=ctx.actor, job_id=job_id, note=reason))
    requeued = any(isinstance(ev, e.JobRequeued) for ev in appended.events)
    click.echo(
        f"preempted job {job_id}{' (requeued)' if requeued else ''} (position {appended.position})"
    )


COMMANDS = [
    shares,
    usage,
    report,
    projection_group,
    project_alias,
    queue,
    explain,
    squatters,
    preempt,
]
