"""Commands that only read: account tree, node list, jobs, log, schemas export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import msgspec
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from ledger.cli._common import Ctx, echo_json, fmt_duration, fmt_time, json_option, pass_ctx
from ledger.cli.write import account, node
from ledger.domain import Job, State
from schemas.events import tag_of


def _console() -> Console:
    import sys

    # a pipe gets full-width lines, not a table squeezed to 80 columns
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _children(state: State) -> dict[str | None, list[str]]:
    kids: dict[str | None, list[str]] = {}
    for a in sorted(state.accounts.values(), key=lambda a: a.path):
        if a.open:
            kids.setdefault(a.parent, []).append(a.path)
    return kids


def tree_rows(state: State) -> list[dict[str, Any]]:
    """Depth-first rows of the open budget tree with each account's normalised share."""
    kids = _children(state)
    rows: list[dict[str, Any]] = []

    def walk(parent: str | None, depth: int) -> None:
        siblings = kids.get(parent, [])
        total = sum(state.accounts[p].shares for p in siblings)
        for path in siblings:
            a = state.accounts[path]
            members = sorted(state.members.get(path, ())) if a.kind == "project" else []
            managers = sorted(u for u, roots in state.managers.items() if path in roots)
            rows.append(
                {
                    "path": path,
                    "kind": a.kind,
                    "depth": depth,
                    "shares": a.shares,
                    "norm_shares": a.shares / total if total else 0.0,
                    "members": members,
                    "managers": managers,
                }
            )
            walk(path, depth + 1)

    walk(None, 0)
    return rows


@account.command("tree")
@json_option
@pass_ctx
def account_tree(ctx: Ctx, as_json: bool) -> None:
    """Show the budget tree with shares and normalised shares."""
    rows = tree_rows(ctx.ledger().state)
    if as_json:
        echo_json(rows)
        return
    root = Tree("budget tree")
    at: dict[int, Tree] = {-1: root}
    for r in rows:
        name = r["path"].rsplit("/", 1)[-1]
        extra = f"  managers: {', '.join(r['managers'])}" if r["managers"] else ""
        label = (
            f"{name} [{r['kind']}] shares {r['shares']} ({r['norm_shares']:.0%} of parent){extra}"
        )
        at[r["depth"]] = at[r["depth"] - 1].add(label)
    _console().print(root)


def node_rows(state: State) -> list[dict[str, Any]]:
    rows = []
    for n in sorted(state.nodes.values(), key=lambda n: n.name):
        if n.state == "removed":
            continue
        free = len(state.free_indices(n.name))
        rows.append(
            {
                "node": n.name,
                "cluster": n.cluster,
                "gpu_type": n.gpu_type,
                "gpus": n.gpus,
                "free_gpus": free,
                "state": n.state,
                "jobs": sorted(state.node_jobs.get(n.name, ())),
                "drain_reason": n.drain_reason,
            }
        )
    return rows


@node.command("list")
@json_option
@pass_ctx
def node_list(ctx: Ctx, as_json: bool) -> None:
    """List nodes with their state and free GPUs."""
    rows = node_rows(ctx.ledger().state)
    if as_json:
        echo_json(rows)
        return
    t = Table("node", "cluster", "type", "gpus", "free", "state", "jobs", box=None)
    for r in rows:
        state = r["state"] + (f" ({r['drain_reason']})" if r["drain_reason"] else "")
        jobs = ",".join(map(str, r["jobs"])) or "-"
        t.add_row(
            r["node"], r["cluster"], r["gpu_type"], str(r["gpus"]), str(r["free_gpus"]), state, jobs
        )
    _console().print(t)


def job_row(job: Job) -> dict[str, Any]:
    s = job.spec
    return {
        "job_id": s.job_id,
        "account": s.account,
        "user": s.user,
        "gpus": s.gpus,
        "gpu_type": s.gpu_type,
        "status": job.status,
        "outcome": job.outcome,
        "funded": job.funded,
        "min_runtime_s": s.min_runtime_s,
        "resumable": s.resumable,
        "priority": s.priority,
        "debug": s.debug,
        "submitted_at": s.at,
        "placed_at": job.placed_at,
        "nodes": [sl.node for sl in job.slots],
        "preemptions": job.preemptions,
        "command": list(s.command),
        "logs": list(job.logs),
        "finish_reason": job.finish_reason if job.status == "finished" else None,
    }


@click.command()
@click.option(
    "--status",
    type=click.Choice(["pending", "placed", "running", "finished", "active"]),
    default=None,
)
@click.option("--user", default=None)
@click.option(
    "--account", "account_path", default=None, help="This account and everything below it."
)
@click.option("--limit", type=int, default=200, show_default=True)
@json_option
@pass_ctx
def jobs(
    ctx: Ctx,
    status: str | None,
    user: str | None,
    account_path: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs, newest first."""
    selected = []
    for job in sorted(ctx.ledger().state.jobs.values(), key=lambda j: -j.job_id):
        if (status == "active" and not job.active) or (
            status not in (None, "active") and job.status != status
        ):
            continue
        if user and job.spec.user != user:
            continue
        if account_path and not (job.spec.account + "/").startswith(account_path.rstrip("/") + "/"):
            continue
        selected.append(job_row(job))
        if len(selected) >= limit:
            break
    if as_json:
        echo_json(selected)
        return
    t = Table(
        "job", "account", "user", "gpus", "status", "contract", "submitted", "nodes", "log",
        box=None,
    )  # fmt: skip
    for r in selected:
        contract = "unfunded" if not r["funded"] else fmt_duration(r["min_runtime_s"])
        contract += " resumable" if r["resumable"] else ""
        contract += " debug" if r["debug"] else ""
        status_text = r["outcome"] if r["status"] == "finished" else r["status"]
        if r["finish_reason"] == "time_limit":
            status_text += " (time limit)"
        t.add_row(
            str(r["job_id"]),
            r["account"],
            r["user"],
            str(r["gpus"]),
            status_text,
            contract,
            fmt_time(r["submitted_at"]),
            ",".join(r["nodes"]) or "-",
            r["logs"][0] if r["logs"] else "-",
        )
    _console().print(t)


def _summary(ev: Any) -> str:
    data = msgspec.to_builtins(ev)
    for key in ("type", "event_id", "at", "actor", "prev_hash", "considered"):
        data.pop(key, None)
    return " ".join(
        f"{k}={json.dumps(v, separators=(',', ':'))}"
        for k, v in data.items()
        if v not in (None, "", [], {})
    )


@click.command()
@click.option("--after", type=int, default=0, show_default=True, help="Start after this position.")
@click.option("--limit", type=int, default=100, show_default=True)
@json_option
@pass_ctx
def log(ctx: Ctx, after: int, limit: int, as_json: bool) -> None:
    """Print the event log from a position."""
    records = ctx.ledger().read(after, limit)
    if as_json:
        echo_json([{"position": pos, "event": ev} for pos, ev in records])
        return
    for pos, ev in records:
        click.echo(
            f"{pos:>8}  {fmt_time(ev.at)}  {ev.actor:<12} {tag_of(type(ev)):<28} {_summary(ev)}"
        )


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


COMMANDS = [jobs, log, schemas]
