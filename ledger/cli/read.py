"""Commands that only read: account tree, node list, jobs, log, schemas export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import msgspec

from ledger.cli._common import Ctx, build, pass_ctx, view_command
from ledger.cli.output import console, echo_json, json_option, print_table
from ledger.cli.write import account, node
from schemas.bounds import MAX_ARRAY_TASKS, MAX_READ_ROWS
from schemas.errors import InvalidCommand
from schemas.units import format_duration, format_time, parse_time, span
from schemas.views import AccountNode, JobFilter, LogEntry, LogFilter, NodeRow


@view_command(account.command("tree"), "accounts")
def account_tree(rows: list[AccountNode]) -> None:
    """Show the budget tree with shares and normalised shares."""
    from rich.tree import Tree

    root = Tree("budget tree")
    at: dict[int, Tree] = {-1: root}
    for r in rows:
        name = r.path.rsplit("/", 1)[-1]
        extra = f"  managers: {', '.join(r.managers)}" if r.managers else ""
        label = f"{name} [{r.kind}] shares {r.shares} ({r.norm_shares:.0%} of parent){extra}"
        at[r.depth] = at[r.depth - 1].add(label)
    console().print(root)


@view_command(node.command("list"), "nodes")
def node_list(rows: list[NodeRow]) -> None:
    """List nodes with their state and free GPUs."""
    table = []
    for r in rows:
        why = r.lost_reason if r.state == "lost" else r.drain_reason
        state = r.state + (f" ({why})" if why else "")
        jobs = ",".join(map(str, r.jobs)) or "-"
        if r.foreign_gpus:
            jobs += f" (GPUs {','.join(map(str, r.foreign_gpus))} held outside the ledger)"
        if r.stopping_jobs:  # past their limit, or stopped by the ledger: in their grace
            jobs += f" (stopping: {','.join(map(str, r.stopping_jobs))})"
        if r.stopping_gpus:
            jobs += f" (GPUs {','.join(map(str, r.stopping_gpus))} stopping)"
        table.append((r.node, r.cluster, r.gpu_type, str(r.gpus), str(r.free_gpus), state, jobs))
    print_table(("node", "cluster", "type", "gpus", "free", "state", "jobs"), table)


STATES = ("pending", "held", "placed", "running", "finished", "active")
"""The `jobs --status` words that are a job's state (one at a time)."""
REASONS = (
    "completed", "failed", "cancelled", "time_limit", "preempted", "node_lost",
    "dependency_never_satisfied", "launch_failed",
)  # fmt: skip
"""The `jobs --status` words that are how a finished job ended (`finish_reason`; several)."""
SLURM_STATES: dict[str, tuple[str, ...]] = {
    "PD": ("pending",), "PENDING": ("pending",), "R": ("running",), "RUNNING": ("running",),
    "CF": ("placed",), "CONFIGURING": ("placed",),
    "CD": ("completed",), "COMPLETED": ("completed",),
    "F": ("failed", "launch_failed"), "FAILED": ("failed", "launch_failed"),
    "CA": ("cancelled", "dependency_never_satisfied"),
    "CANCELLED": ("cancelled", "dependency_never_satisfied"),
    "TO": ("time_limit",), "TIMEOUT": ("time_limit",),
    "PR": ("preempted",), "PREEMPTED": ("preempted",),
    "NF": ("node_lost",), "NODE_FAIL": ("node_lost",),
}  # fmt: skip
"""sacct's `-s` state names and abbreviations as the ledger's words (docs/slurm-users.md):
Slurm's FAILED is also a job whose launch failed, and its CANCELLED a job whose dependency can
never be satisfied (slurmctld cancels it)."""


def status_words(text: str) -> tuple[str | None, tuple[str, ...] | None]:
    """Pure: `jobs --status TEXT` as (state, finish reasons): one state word, or one or more
    ways a job ended (`finish_reason` words, sacct's names and abbreviations: `TO,F,NF`)."""
    words: list[str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        mapped = SLURM_STATES.get(part.upper()) or (
            (part.lower(),) if part.lower() in STATES + REASONS else None
        )
        if mapped is None:
            raise InvalidCommand(
                f"invalid --status {part!r}",
                hint=f"use one of {', '.join(STATES)}; or how jobs ended, several with commas: "
                f"{', '.join(REASONS)} (sacct's CD, F, CA, TO, PR, NF too)",
            )
        words += [w for w in mapped if w not in words]
    states = [w for w in words if w in STATES]
    if not words or (states and len(words) > 1):
        raise InvalidCommand(
            f"invalid --status {text!r}: one state at a time, or ways jobs ended",
            hint="e.g. --status running, or --status time_limit,failed (sacct -s TO,F)",
        )
    return (states[0], None) if states else (None, tuple(words))


def _rows_asked(limit: int, tasks: bool) -> int:
    """Rows `jobs` asks for: one more than shown (below the server's most), to say whether there
    are more; all of an array's tasks to pick some; a limit the read refuses (0, negative) as
    given, for the read's own one-line error."""
    if limit < 1:
        return limit
    return max(limit, MAX_ARRAY_TASKS) if tasks else min(limit + 1, max(limit, MAX_READ_ROWS))


NAME_SHOWN = 24
"""The most of a job's name `jobs` prints (the dashboard's Queue cuts it to a line too)."""


def cut_name(name: str) -> str:
    """Pure: a job's name as `jobs` lists it: "-" for none, cut to `NAME_SHOWN` characters with
    "…" (`gpuledger jobs` had no name column; squeue shows NAME by default, atk61-29c)."""
    name = " ".join(name.split())
    if not name:
        return "-"
    return name if len(name) <= NAME_SHOWN else name[: NAME_SHOWN - 1] + "…"


@click.command()
@click.option(
    "--status",
    default=None,
    help="One state: pending, held, placed, running, finished, active; or how finished jobs "
    "ended, several with commas: completed, failed, cancelled, time_limit, preempted, node_lost, "
    "dependency_never_satisfied, launch_failed (sacct -s: CD, F, CA, TO, PR, NF, R, PD, CF).",
)
@click.option("--user", "-u", default=None)
@click.option(
    "--account", "-A", "account_path", default=None, help="This account and everything below it."
)
@click.option("--since", "-S", default=None, help="Jobs alive at or after this time (ISO 8601).")
@click.option("--until", "-E", default=None, help="Jobs submitted at or before this time.")
@click.option("--limit", type=int, default=200, show_default=True)
@click.option(
    "--jobs",
    "-j",
    "job_ids",
    default=None,
    help="Only these jobs: ID[,ID...]; an array's id: all its tasks, ARRAY_TASK (17_2): that "
    "task (like sacct -j).",
)
@click.option(
    "--at", default=None, help="The jobs as they were at this moment (default now; ISO 8601)."
)
@click.option(
    "--before-id",
    type=click.IntRange(1, 2**53),
    default=None,
    help="Only jobs with a smaller id: the page after one that ended at this job.",
)
@json_option
@pass_ctx
def jobs(
    ctx: Ctx,
    status: str | None,
    user: str | None,
    account_path: str | None,
    since: str | None,
    until: str | None,
    limit: int,
    job_ids: str | None,
    at: str | None,
    before_id: int | None,
    as_json: bool,
) -> None:
    """List jobs newest first, like sacct: start, end, elapsed, exit code, why it ended."""
    wanted, reasons = (None, None) if status is None else status_words(status)
    refs = None if job_ids is None else _ids(job_ids)
    tasks = {(i, t) for i, t in refs or () if t is not None}
    selected = _jobs_read(
        ctx,
        status=wanted,
        reasons=reasons,
        user=user,
        account=account_path,
        since=None if since is None else parse_time(since),
        until=None if until is None else parse_time(until),
        limit=_rows_asked(limit, bool(tasks)),
        at=None if at is None else parse_time(at),
        job_ids=None if refs is None else tuple(sorted({i for i, _ in refs})),
        before_id=before_id,
    )
    if tasks:  # ARRAY_TASK: that task only
        whole = {i for i, t in refs or () if t is None}
        selected = [
            r for r in selected
            if r.job_id in whole or r.array_job_id in whole
            or (r.array_job_id, r.array_task_id) in tasks
        ][:limit]  # fmt: skip
    more = len(selected) > limit or (limit >= MAX_READ_ROWS and len(selected) == limit)
    selected = selected[:limit]
    if as_json:
        echo_json(selected)
        return
    header = (
        "job", "name", "account", "user", "gpus", "state", "contract", "submitted", "start",
        "end", "elapsed", "exit", "nodes", "log",
    )  # fmt: skip
    rows: list[tuple[str, ...]] = []
    for r in selected:
        contract = "unfunded" if not r.funded else format_duration(r.min_runtime_s)
        contract += " resumable" if r.resumable else ""
        contract += " debug" if r.debug else ""
        state: str = (
            r.finish_reason or r.outcome or r.status if r.status == "finished" else r.status
        )
        # a stopping job (past its limit, in its grace) ends by its SIGKILL at the latest
        end = format_time(r.finished_at) if r.kill_at is None else f"by {format_time(r.kill_at)}"
        rows.append((
            str(r.job_id), cut_name(r.job_name), r.account, r.user, str(r.gpus), state, contract,
            format_time(r.submitted_at), format_time(r.started_at), end,
            "-" if r.elapsed_s is None else span(r.elapsed_s),
            "-" if r.exit_code is None else str(r.exit_code), ",".join(r.nodes) or "-",
            r.logs[0] if r.logs else "-",
        ))  # fmt: skip
    # narrow: contract, start, end, nodes and log below each row, whole (atk61-29b F5)
    print_table(header, rows, free=(6, 8, 9, 12, 13))
    if more:  # (atk47-29 F5: it stopped at 200 rows without a word)
        click.echo(f"the newest {limit} shown; more match: --limit N, or --before-id "
                   f"{selected[-1].job_id} for the next page", err=True)  # fmt: skip


def _jobs_read(ctx: Ctx, **fields: Any) -> list[Any]:
    """`jobs`' rows: one read; through a server, whose pages hold at most `MAX_READ_ROWS` rows,
    page after page (`before_id` the previous page's last, smallest, id) up to the rows asked,
    so that `--limit 15000` answers as it does embedded (it was refused: atk50-29 F8)."""
    rows = fields["limit"]
    if ctx.remote is None or rows <= MAX_READ_ROWS:
        one: list[Any] = ctx.read("jobs", quiet=False, **fields)
        return one
    build(JobFilter, limit=rows)  # the embedded read's own refusal of a limit past its most
    got: list[Any] = []
    while len(got) < rows:  # (a page cut at its bytes holds fewer: the next goes on after it)
        page = ctx.read(
            "jobs", quiet=False, **{**fields, "limit": min(MAX_READ_ROWS, rows - len(got))}
        )
        if not page:
            break
        got += page
        fields["before_id"] = page[-1].job_id
    return got


def _log_read(ctx: Ctx, f: LogFilter) -> list[LogEntry]:
    """`log`'s events: one read; through a server, whose pages hold at most `MAX_READ_ROWS`
    events, page after page (`after` the previous page's last position), so that `--limit` and
    `--tail` past it answer as they do embedded (atk50-29 F8). `--tail N`: where the log ends
    now (its last event), then the N positions up to it (positions follow one another)."""
    asked = f.limit if f.tail is None else f.tail
    if ctx.remote is None or asked <= MAX_READ_ROWS:
        return list(ctx.read("log", after=f.after, limit=f.limit, tail=f.tail))
    after, end = f.after, None
    if f.tail is not None:
        last = ctx.read("log", after=f.after, tail=1)
        if not last:
            return []
        end = last[0].position
        after = max(f.after, end - f.tail)
    got: list[LogEntry] = []
    while len(got) < asked and (end is None or after < end):  # (a page cut at its bytes: on)
        ask = min(MAX_READ_ROWS, asked - len(got), asked if end is None else end - after)
        page = ctx.read("log", after=after, limit=ask)
        if not page:
            break
        got += page
        after = page[-1].position
    return got


def _ids(text: str) -> list[tuple[int, int | None]]:
    """`-j 5,6,7` (or `-j 17_2`, one task of array 17) as job references; one clear error for
    anything else."""
    from ledger.cli.submit import job_ref

    parts = [x.strip() for x in text.split(",") if x.strip()]
    refs = [job_ref(x) for x in parts]
    if not parts or any(r is None for r in refs):
        raise InvalidCommand(
            f"invalid --jobs {text!r}", hint="use job ids: -j 5, -j 5,6,7 or -j 17_2 (a task)"
        )
    return [r for r in refs if r is not None]


def _summary(ev: Any) -> str:
    data = msgspec.to_builtins(ev)
    for key in ("type", "event_id", "at", "actor", "prev_hash", "considered"):
        data.pop(key, None)
    return " ".join(
        f"{k}={json.dumps(v, separators=(',', ':'))}"
        for k, v in data.items()
        if v not in (None, "", [], {})
    )


def _log_line(r: LogEntry) -> str:
    body = (
        _summary(r.event) if r.event is not None else "(an event type this version does not know)"
    )
    return f"{r.position:>8}  {format_time(r.at)}  {r.actor or '-':<12} {r.tag:<28} {body}"


@click.command()
@click.option("--after", type=int, default=0, show_default=True, help="Start after this position.")
@click.option("--limit", type=int, default=100, show_default=True)
@click.option("--tail", "-n", type=int, default=None, help="Only the last N events.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events as they are appended.")
@click.option(
    "--interval",
    type=float,
    default=1.0,
    show_default=True,
    help="--follow: seconds between polls.",
)
@json_option
@pass_ctx
def log(
    ctx: Ctx, after: int, limit: int, tail: int | None, follow: bool, interval: float, as_json: bool
) -> None:
    """Print the event log from a position (from the projection's copy of it). With --json and
    --follow, one JSON object per line."""
    import time

    f = build(LogFilter, after=after, limit=limit, tail=tail)
    if not 0.01 <= interval <= 3600:
        raise InvalidCommand(f"--interval must be 0.01..3600 seconds, got {interval}")
    records = _log_read(ctx, f)
    if as_json and not follow:
        echo_json(records)
        return
    for r in records:
        click.echo(msgspec.json.encode(r).decode() if as_json else _log_line(r))
    if not follow:
        return
    last = records[-1].position if records else after
    if f.tail is not None and not records:
        last = after
    while True:
        time.sleep(interval)
        records = ctx.read("log", after=last, limit=10_000)
        for r in records:
            click.echo(msgspec.json.encode(r).decode() if as_json else _log_line(r))
        if records:
            last = records[-1].position


@click.group()
def schemas() -> None:
    """Event schemas."""


@schemas.command("export")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def schemas_export(directory: Path) -> None:
    """Write one JSON Schema per event type into DIRECTORY."""
    from schemas.export import export

    written = export(directory)
    click.echo(f"wrote {len(written)} schemas to {directory}")


@schemas.command("openapi")
@click.argument(
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path(__file__).resolve().parents[2] / "schemas" / "openapi.json",
)
def schemas_openapi(path: Path) -> None:
    """Write the HTTP API's OpenAPI document to PATH (committed as schemas/openapi.json)."""
    from ledger.server.app import offline_document

    path.write_bytes(offline_document())
    click.echo(f"wrote {path}")


COMMANDS = [jobs, log, schemas]
