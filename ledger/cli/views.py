"""Read-side commands: shares, usage, report, projection, queue, explain, squatters, preempt."""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

import click

from ledger.cli._common import Ctx, bounded, pass_ctx, view_command
from ledger.cli.output import console, echo_json, fold_fields, json_option, print_table, progress
from schemas import commands as c
from schemas import events as e
from schemas.bounds import Percent, TeamDepth
from schemas.errors import InvalidCommand
from schemas.units import (
    key_text,
    parse_duration,
    parse_time,
    parse_window,
    span,
    times_in,
    when,
)

if TYPE_CHECKING:  # the projection is imported only where it is opened (client mode never)
    from collections.abc import Callable

    from schemas.views import PriorityRow, ProjectionStatusView, QueueRow

# Tables are rich's only when they do not fit a pipe as plain text (`print_table`): `--json`
# through a server imports neither rich nor the dispatcher (the client entry stays light).


def _window_args(at: str | None, window: str, half_life: str | None) -> dict[str, Any]:
    return {
        "at": None if at is None else parse_time(at),
        "window_s": parse_window(window),
        "half_life_s": None if half_life is None else parse_window(half_life, "--half-life"),
    }


def _at(at: str | None) -> float:
    from ledger.store.clock import SystemClock

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
    """The fair-share tree with Slurm's `sshare -l` columns (Fair Tree): RawShares, NormShares,
    RawUsage (GPU-hours here), NormUsage (of the whole tree), EffectvUsage (of the parent),
    LevelFS, Rank and FairShare."""
    rows = ctx.read("shares", quiet=False, **_window_args(at, window, half_life))
    if as_json:
        echo_json(rows)
        return
    header = (
        "Account", "RawShares", "NormShares", "RawUsage GPU-h", "NormUsage", "EffectvUsage",
        "LevelFS", "Rank", "FairShare",
    )  # fmt: skip
    table = []
    for r in rows:
        table.append((
            "  " * r.depth + r.account.rsplit("/", 1)[-1], str(r.raw_shares), _num(r.norm_shares),
            f"{r.raw_usage_gpu_s / 3600:,.2f}", _num(r.norm_usage), _num(r.effectv_usage),
            "inf" if r.level_fs_infinite else _num(r.level_fs),
            "-" if r.rank is None else str(r.rank), _num(r.fair_share),
        ))  # fmt: skip
    print_table(header, table)


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
    """Funded GPU-hours in the window ending at --at, per account (with ancestors) or user."""
    rows = ctx.read("usage", quiet=False, by=by, **_window_args(at, window, half_life))
    if as_json:
        echo_json(rows)
        return
    print_table((by, "GPU-hours"), [(r.name, f"{r.usage_gpu_hours:,.1f}") for r in rows])


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
    start = end - parse_window(window)
    depth = bounded(team_depth, TeamDepth, "--team-depth")
    rep = ctx.read("delivered", quiet=False, start=start, end=end, team_depth=depth)
    if as_json:
        echo_json(rep)
        return
    header = ("team", "owed GPU-h", "delivered GPU-h", "by period", "hour by hour")
    table = []
    for t in rep.teams:
        table.append((
            t.team, f"{t.owed_gpu_hours:,.1f}", f"{t.delivered_gpu_hours:,.1f}",
            _pct(t.by_period), _pct(t.hour_by_hour),
        ))  # fmt: skip
    print_table(header, table)
    click.echo(
        "owed delivered, by period (sum delivered / sum owed, capped at 1): "
        f"{_pct(rep.by_period)}; "
        f"hour by hour (sum min(delivered, owed) / sum owed): {_pct(rep.hour_by_hour)}"
    )
    click.echo(
        f"teams at >= 95% (by period): {rep.teams_at_95} of {rep.teams_owed}; "
        f"worst: {rep.worst_team or '-'} {_pct(rep.worst)}"
    )


@report.command("preemptions")
@click.option("-A", "--account", default=None, help="This account and everything below it.")
@click.option("--by", "by", is_flag=True, help="Only the preemptions its jobs caused.")
@click.option("--of", "of", is_flag=True, help="Only the preemptions its jobs suffered.")
@click.option("--window", default=None, help="How far back from --at  [default: 30d]")
@click.option("--since", default=None, help="From this moment instead (ISO 8601).")
@at_option
@json_option
@pass_ctx
def report_preemptions(
    ctx: Ctx,
    account: str | None,
    by: bool,
    of: bool,
    window: str | None,
    since: str | None,
    at: str | None,
    as_json: bool,
) -> None:
    """Preemptions a team suffered (its jobs were the victims) and caused (its waiting jobs were
    what they were preempted for): when, why, the victim rule, for whom, GPU-hours lost.

    One rule, as the Preemptions page and /metrics count them: a job belongs to its account and
    to its user's node below it (-A prog/proj/alice works); a preemption inside the subtree
    (victim and beneficiary in it) is suffered and caused both (side "both"). With no -A: every
    preemption; caused counts those that were for a waiting job."""
    if by and of:
        raise InvalidCommand(
            "--by and --of are one or the other", hint="give neither to see both sides"
        )
    if window is not None and since is not None:
        raise InvalidCommand(
            "--window and --since are one or the other",
            hint="--window counts back from --at; --since gives the start itself",
        )
    side = "by" if by else "of" if of else "both"
    end = _at(at)
    if since is not None:
        start = parse_time(since, "--since")
    else:
        start = end - parse_window(window or "30d")
        if start < 0:
            raise InvalidCommand(
                f"--window {window or '30d'} before --at {when(end)} starts before 1970",
                hint="give a later --at or a shorter --window",
            )
    if not start < end:
        raise InvalidCommand(
            f"--since {when(start)} is not before the end of the period, {when(end)}",
            hint="give an earlier --since (or a later --at)",
        )
    rep = ctx.read("preemptions", quiet=False, account=account, side=side, start=start, end=end)
    if as_json:
        echo_json(rep)
        return
    header = (
        "at", "side", "job", "account", "user", "gpus", "reason", "victim rule", "for job",
        "for account", "lost GPU-h",
    )  # fmt: skip
    print_table(
        header,
        [
            (
                when(r.preempted_at),
                r.side,
                str(r.job_id),
                r.account or "-",
                r.user_name or "-",
                "-" if r.gpus is None else str(r.gpus),
                r.reason,
                times_in(r.rule or "-"),
                "-" if r.for_job is None else str(r.for_job),
                r.for_account or "-",
                f"{r.lost_gpu_hours:,.1f}",
            )
            for r in rep.rows
        ],
        free=(6, 7),
    )  # fmt: skip (narrow: the reason and rule below each row, atk61-29b F5)
    parts = [
        f"{when(start)} to {when(end)}:", f"suffered {rep.suffered}, caused {rep.caused};",
        f"GPU-hours lost {rep.lost_gpu_hours:,.1f}",
        f"(by the jobs it preempted {rep.caused_lost_gpu_hours:,.1f})",
    ]  # fmt: skip
    click.echo(fold_fields(parts, console().width if sys.stdout.isatty() else 0))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


@click.group("projection")
def projection_group() -> None:
    """The DuckDB projection of the log."""


@projection_group.command("rebuild")
@pass_ctx
def projection_rebuild(ctx: Ctx) -> None:
    """Drop the projection and rebuild it from the log (with a progress bar)."""
    from ledger.store.embedded import rebuild

    head = ctx.ledger(live=True).position
    # its phase until the first batch is in: the bar sat at `0/304,777 -:--:--` for 2-7 s of a
    # 12 s rebuild (atk61-29c)
    with progress("opening the projection, reading the log's first events") as update:
        result = rebuild(
            ctx.home, progress=lambda done, total: update(done, max(total, head), what="events")
        )
    click.echo(f"rebuilt: {result.applied:,} events, position {result.position:,}")
    if result.unknown:
        click.echo(
            f"note: {result.unknown} events of types this version does not know were kept "
            "and ignored"
        )


@view_command(projection_group.command("status"), "projection")
def projection_status(status: ProjectionStatusView) -> None:
    """Where the projection stands in the log."""
    click.echo(
        f"position {status.position:,}, {status.events:,} events, {status.unknown_events} unknown"
    )


# `gpuledger project rebuild` reads naturally too
project_alias = click.Group(
    "project", commands=projection_group.commands, help="Alias of `projection`.", hidden=True
)


policy_option = click.option(
    "--policy",
    type=click.Choice(["fairshare", "fifo"]),
    default=None,
    help="Preview with this policy's defaults instead of the settings the service recorded.",
)


queue_filters = [
    click.option("--user", "-u", default=None, help="Only this user's jobs."),
    click.option(
        "--account", "-A", "account_path", default=None, help="Only this account (and below)."
    ),
    click.option(
        "--state",
        "-t",
        type=click.Choice(["pending", "held", "running", "queued", "all"]),
        default="queued",
        show_default=True,
        help="queued: pending and held; running: the jobs that hold GPUs (placed or running); "
        "all: every one of them.",
    ),
    click.option(
        "--limit",
        type=int,
        default=50,
        show_default=True,
        metavar="N",
        help="Show the first N jobs; when more match, a last line (on stderr with --json) "
        "says how many: '50 of 3,000 shown (--limit N)'.",
    ),
]


def _queue_filters(f: Any) -> Any:
    for option in reversed(queue_filters):
        f = option(f)
    return f


def _moment(at: str | None) -> float | None:
    """`--at` as a time, or None for now (the read layer takes the clock)."""
    return None if at is None else parse_time(at)


def _when(at: float | None) -> str:
    return "unknown" if at is None else when(at)


def _queue_fields(
    policy: str | None,
    user: str | None,
    account_path: str | None,
    state: str,
    limit: int,
    at: str | None,
) -> dict[str, Any]:
    """What `queue` and `priority` read with: the preview's policy, moment and filters."""
    return {
        "policy": policy, "user": user, "account": account_path, "state": state, "limit": limit,
        "at": _moment(at),
    }  # fmt: skip


def _shown_of(ctx: Ctx, rows: list[Any], asked: dict[str, Any]) -> str | None:
    """'50 of 3,000 shown (--limit N)' when the limit cut the list, else nothing."""
    if len(rows) < asked["limit"]:
        return None
    total = int(ctx.read("queue_total", **asked))
    if total <= len(rows):
        return None
    return f"{len(rows):,} of {total:,} shown (--limit N for more)"


def _queue_note(ctx: Ctx, rows: list[Any], asked: dict[str, Any]) -> str | None:
    """Under the queue: how many rows the limit left out, and the GPUs work outside the ledger
    holds (foreign Slurm jobs, running or pending with an allocation), which the queue's
    estimates and the dispatcher count busy."""
    lines = [line for line in (_shown_of(ctx, rows, asked), _foreign_line(ctx)) if line]
    return "\n".join(lines) or None


def _foreign_line(ctx: Ctx) -> str | None:
    held = [
        f"{n.node} GPUs {','.join(map(str, n.foreign_gpus))}"
        for n in ctx.read("nodes")
        if n.foreign_gpus
    ]
    if not held:
        return None
    return f"Held outside the ledger (counted busy): {'; '.join(held)}"


def _queue_view(view: str) -> Callable[[Callable[[Any], None]], click.Command]:
    """The command of a preview in dispatch order (`queue`, `priority`)."""
    return view_command(
        click.command(view), view, policy_option, _queue_filters, at_option, fields=_queue_fields,
        note=_queue_note if view == "queue" else None,
    )  # fmt: skip


@_queue_view("queue")
def queue(rows: list[QueueRow]) -> None:
    """Pending work in dispatch order: sort key, why it waits, estimated start (like squeue);
    then the jobs that may not run yet (a dependency, an array's limit) and held ones. With
    `--state running`, the jobs that hold GPUs, when they started and where."""
    if any(r.state in ("placed", "running", "stopping") for r in rows):
        # `started` only when a process started (a placed job may never start); a pending
        # row's estimate is its own column; a stopping one's SIGKILL at the latest
        head = ("job", "account", "user", "gpus", "state", "started", "est. start", "nodes")
        print_table(head, [
            (str(r.job_id), r.account, r.user, str(r.gpus),
             r.state if r.kill_at is None else f"{r.state} (SIGKILL by {_when(r.kill_at)})",
             "-" if r.started_at is None else _when(r.started_at),
             _when(r.estimated_start_at) if r.state == "pending" else "-",
             ",".join(r.nodes) or "-")
            for r in rows
        ])  # fmt: skip
        return
    header = (
        "#", "job", "account", "user", "gpus", "sort key", "waiting", "est. start", "code",
        "reason",
    )  # fmt: skip
    table = []
    for r in rows:
        table.append((
            "-" if r.order is None else str(r.order), str(r.job_id), r.account, r.user,
            str(r.gpus), key_text(r.sort_key) if r.sort_key else "-", span(r.waiting_s),
            _when(r.estimated_start_at), r.code, r.reason,
        ))  # fmt: skip
    print_table(header, table)


@_queue_view("priority")
def priority(rows: list[PriorityRow]) -> None:
    """Each pending job's sort key, part by part (like sprio), in dispatch order."""
    names = [p.name for p in rows[0].parts] if rows else []
    table = []
    for r in rows:
        cells = [
            when(p.value) if p.name == "submitted_at" and isinstance(p.value, float) else
            (f"{p.value:g}" if isinstance(p.value, float) else str(p.value))
            for p in r.parts
        ]  # fmt: skip
        table.append((str(r.order), str(r.job_id), r.account, r.user, *cells))
    print_table(("#", "job", "account", "user", *names), table)
    if rows:
        for p in rows[0].parts:
            click.echo(f"{p.name}: {p.meaning}")


@click.command()
@click.argument("job_id", type=int)
@policy_option
@at_option
@json_option
@pass_ctx
def explain(ctx: Ctx, job_id: int, policy: str | None, at: str | None, as_json: bool) -> None:
    """Why JOB_ID is pending, why it was placed where it was, or why it was preempted."""
    view = ctx.read("explain", job_id=job_id, policy=policy, at=_moment(at))
    if as_json:
        echo_json(view)
        return
    for line in view.lines:
        click.echo(line)
    if view.status in ("pending", "held"):
        click.echo(f"Estimated start: {_when(view.estimated_start_at)}.")


@click.command()
@click.option(
    "--threshold",
    type=float,
    default=None,
    help="Utilisation % below which a job counts as idle [the service's setting: 10 unless "
    "the recorded policy says otherwise].",
)
@click.option(
    "--after",
    default=None,
    help="How long it must have been idle [the service's setting: `serve --squat-after`, "
    "recorded in its policy; 1h unless set].",
)
@at_option
@json_option
@pass_ctx
def squatters(
    ctx: Ctx, threshold: float | None, after: str | None, at: str | None, as_json: bool
) -> None:
    """Running jobs whose GPUs sit idle, per manager: the first preemption candidates once past
    their contract. By default idle means the service's own squatting rule (its recorded
    policy's threshold and `--squat-after`), as the Nodes page shows it."""
    if threshold is not None:
        threshold = bounded(threshold, Percent, "--threshold")
    idle_s = None if after is None else parse_duration(after)
    rows = ctx.read("squatters", threshold=threshold, idle_s=idle_s, at=_moment(at))
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("no squatters")
        return
    from schemas.units import plural

    by_manager: dict[str, list[Any]] = {}
    for r in rows:
        for m in r.managers or ["(no manager)"]:
            by_manager.setdefault(m, []).append(r)
    for m, jobs in sorted(by_manager.items()):
        click.echo(f"{m}:")
        for r in jobs:
            state_word = (
                "past its contract: preemptible" if r.past_contract else "inside its contract"
            )
            click.echo(
                f"  job {r.job_id} {r.account} {r.user} {plural(r.gpus, 'GPU')} idle since "
                f"{when(r.idle_since_at)} ({state_word})"
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
    priority,
    explain,
    squatters,
    preempt,
]
