"""Commands that append: init, accounts, shares, members, managers, nodes, hold, release,
requeue, checkpoints (a job's `submit` and `cancel` are `ledger.cli.submit`'s)."""

from __future__ import annotations

import contextlib
import os

import click

from ledger.cli._common import Ctx, pass_ctx
from schemas import commands as c
from schemas.errors import InvalidCommand, InvalidTransition
from schemas.units import parse_duration


def _done(ctx: Ctx, what: str, cmd: c.AnyCommand) -> None:
    appended = ctx.execute(cmd)
    click.echo(f"{what} (position {appended.position})")


@click.command()
@click.option("--admin", required=True, help="The first admin's user name.")
@click.option(
    "--min-runtime-cap", default="8h", show_default=True, help="Longest contract a job may sign."
)
@click.option(
    "--cluster", default="default", show_default=True, help="Name of the default cluster."
)
@click.option(
    "--store",
    default=None,
    metavar="DSN",
    help="Keep the log in this PostgreSQL database (postgresql://...; docs/ha.md) instead of the "
    "SQLite file in the data directory.",
)
@pass_ctx
def init(ctx: Ctx, admin: str, min_runtime_cap: str, cluster: str, store: str | None) -> None:
    """Create the data directory and name the first admin."""
    from ledger.store import STORE_FILE, locate

    made = [p for p in (ctx.home, ctx.home / STORE_FILE) if not p.exists()]
    try:
        if store is not None:
            locate.remember(ctx.home, locate.store_of(ctx.home, store))
        ledger = ctx.ledger(must_exist=False)
        cmd = c.InitLedger(
            actor=admin,
            admin=admin,
            min_runtime_cap_s=parse_duration(min_runtime_cap),
            cluster=cluster,
        )
        appended = ledger.execute(cmd)
        from ledger.store import relay_progress

        with relay_progress.opened(ctx.home) as recorder:
            relay_progress.begin(recorder)  # a new store: no relay published anywhere yet
    except BaseException:
        if store is not None:  # a refused init leaves no store file (nor a home) behind
            for p in reversed(made):
                with contextlib.suppress(OSError):
                    p.rmdir() if p.is_dir() else p.unlink()
        raise
    click.echo(f"initialised {ctx.home} with admin {admin!r} (position {appended.position})")


@click.group()
def account() -> None:
    """Open, close and show accounts of the budget tree."""


@account.command("open")
@click.argument("path")
@click.option("--kind", type=click.Choice(["program", "project", "user"]), required=True)
@click.option("--shares", type=int, default=1, show_default=True)
@click.option("--reason", default="")
@pass_ctx
def account_open(ctx: Ctx, path: str, kind: str, shares: int, reason: str) -> None:
    """Open account PATH (e.g. ai2/olmo) under its parent."""
    cmd = c.OpenAccount(actor=ctx.actor, path=path, kind=kind, shares=shares, reason=reason)  # type: ignore[arg-type]
    _done(ctx, f"opened {kind} {path} with {shares} shares", cmd)


@account.command("close")
@click.argument("path")
@click.option("--reason", default="")
@pass_ctx
def account_close(ctx: Ctx, path: str, reason: str) -> None:
    """Close account PATH (it must have no open children and no unfinished jobs)."""
    _done(ctx, f"closed {path}", c.CloseAccount(actor=ctx.actor, path=path, reason=reason))


@click.group()
def share() -> None:
    """Set shares of the budget tree."""


@share.command("set")
@click.argument("account_path", metavar="ACCOUNT")
@click.argument("shares", type=int)
@click.option("--reason", default="")
@pass_ctx
def share_set(ctx: Ctx, account_path: str, shares: int, reason: str) -> None:
    """Set ACCOUNT's shares of its parent's budget."""
    cmd = c.SetShares(actor=ctx.actor, account=account_path, shares=shares, reason=reason)
    _done(ctx, f"{account_path} now has {shares} shares", cmd)


@click.group()
def member() -> None:
    """Add and remove members of projects."""


@member.command("add")
@click.argument("user")
@click.argument("project")
@click.option(
    "--shares", type=int, default=1, show_default=True, help="The member's share of the project."
)
@pass_ctx
def member_add(ctx: Ctx, user: str, project: str, shares: int) -> None:
    """Make USER a member of PROJECT."""
    _done(
        ctx,
        f"{user} joined {project}",
        c.AddMember(actor=ctx.actor, user=user, project=project, shares=shares),
    )


@member.command("remove")
@click.argument("user")
@click.argument("project")
@pass_ctx
def member_remove(ctx: Ctx, user: str, project: str) -> None:
    """Remove USER from PROJECT."""
    _done(
        ctx, f"{user} left {project}", c.RemoveMember(actor=ctx.actor, user=user, project=project)
    )


@click.group()
def manager() -> None:
    """Grant and revoke managers of subtrees (admins only)."""


@manager.command("grant")
@click.argument("user")
@click.argument("account_path", metavar="ACCOUNT")
@pass_ctx
def manager_grant(ctx: Ctx, user: str, account_path: str) -> None:
    """Let USER manage ACCOUNT and everything below it."""
    _done(
        ctx,
        f"{user} manages {account_path}",
        c.GrantManager(actor=ctx.actor, user=user, account=account_path),
    )


@manager.command("revoke")
@click.argument("user")
@click.argument("account_path", metavar="ACCOUNT")
@pass_ctx
def manager_revoke(ctx: Ctx, user: str, account_path: str) -> None:
    """Stop USER managing ACCOUNT."""
    cmd = c.RevokeManager(actor=ctx.actor, user=user, account=account_path)
    _done(ctx, f"{user} no longer manages {account_path}", cmd)


@click.group()
def node() -> None:
    """Register, drain, return, mark lost, remove and list nodes."""


@node.command("add")
@click.argument("name")
@click.option("--gpus", type=int, required=True)
@click.option("--gpu-type", required=True)
@click.option("--cluster", default=None)
@pass_ctx
def node_add(ctx: Ctx, name: str, gpus: int, gpu_type: str, cluster: str | None) -> None:
    """Register node NAME with its GPUs."""
    cmd = c.RegisterNode(actor=ctx.actor, node=name, gpus=gpus, gpu_type=gpu_type, cluster=cluster)
    _done(ctx, f"registered {name}: {gpus} x {gpu_type}", cmd)


@node.command("drain")
@click.argument("name")
@click.option("--reason", required=True, help="Why (maintenance ticket, ...).")
@pass_ctx
def node_drain(ctx: Ctx, name: str, reason: str) -> None:
    """Stop placements on NAME; its jobs leave as their contracts expire."""
    appended = ctx.execute(c.DrainNode(actor=ctx.actor, node=name, reason=reason))
    drained = any(type(ev).__name__ == "NodeDrained" for ev in appended.events)
    state = "drained (it was empty)" if drained else "draining"
    click.echo(f"{name} is {state} (position {appended.position})")


@node.command("return")
@click.argument("name")
@pass_ctx
def node_return(ctx: Ctx, name: str) -> None:
    """Return a draining, drained or lost node to service."""
    _done(ctx, f"{name} is back in service", c.ReturnNode(actor=ctx.actor, node=name))


@node.command("lost")
@click.argument("name")
@click.option("--reason", required=True, help="What happened (power, network, ...).")
@pass_ctx
def node_lost(ctx: Ctx, name: str, reason: str) -> None:
    """Record that NAME is gone: its jobs end now (resumable ones are requeued)."""
    appended = ctx.execute(c.MarkNodeLost(actor=ctx.actor, node=name, reason=reason))
    requeued = sum(type(ev).__name__ == "JobRequeued" for ev in appended.events)
    ended = [ev for ev in appended.events if type(ev).__name__ == "JobFinished"]
    failed = sum(getattr(ev, "reason", "") == "node_lost" for ev in ended)
    # a dependent elsewhere whose dependency can no longer be met ends with it (atk51-23)
    others = f", {len(ended) - failed} dependent jobs ended" if len(ended) > failed else ""
    click.echo(
        f"{name} is lost: {requeued} jobs requeued, {failed} failed{others} "
        f"(position {appended.position})"
    )


@node.command("remove")
@click.argument("name")
@click.option("--reason", default="")
@click.option(
    "--force",
    is_flag=True,
    help="remove it although runs stopped (or placed) there are not reported gone: the machine "
    "is gone for good; each stopped run there is forgotten, its end recorded now (nothing then "
    "kills what may still run there)",
)
@pass_ctx
def node_remove(ctx: Ctx, name: str, reason: str, force: bool) -> None:
    """Remove an empty node from the cluster (refused while runs stopped or placed there may
    live)."""
    cmd = c.RemoveNode(actor=ctx.actor, node=name, reason=reason, force=force)
    _done(ctx, f"removed {name}", cmd)


@click.command()
@click.argument("job_id", type=int, envvar="GPULEDGER_JOB_ID")
@pass_ctx
def checkpoint(ctx: Ctx, job_id: int) -> None:
    """Report that JOB_ID (default: $GPULEDGER_JOB_ID, set inside a job) saved its progress:
    a preemption then loses only the work after now. Touching $GPULEDGER_CHECKPOINT_FILE does
    the same from inside the job, and inside a job with no token of its own (the Slurm
    executor's) this command does just that."""
    # inside a job run by a node agent, the job's token is the caller: the server names it
    as_job = bool(os.environ.get("GPULEDGER_JOB_TOKEN")) and ctx.remote is not None
    mark = os.environ.get("GPULEDGER_CHECKPOINT_FILE", "")
    if not as_job and mark and os.environ.get("GPULEDGER_JOB_ID") == str(job_id):
        _touch_checkpoint(job_id, mark)  # inside a Slurm job: no token, the file is the way
        return
    actor = "" if as_job else ctx.actor
    try:
        _done(ctx, f"checkpoint of job {job_id}", c.ReportCheckpoint(actor=actor, job_id=job_id))
    except InvalidTransition:
        # inside the job, whose start the server has not recorded yet (it is `placed` until
        # its node's next report): the file says it, recorded once the job is running
        if not (as_job and mark and os.environ.get("GPULEDGER_JOB_ID") == str(job_id)):
            raise
        _touch_checkpoint(job_id, mark)


def _touch_checkpoint(job_id: int, path: str) -> None:
    """A checkpoint said from inside job `job_id` through its checkpoint file (the Slurm
    executor's jobs carry no token): the executor records it at its next read of the job, once
    the job is recorded running."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.utime(fd)
        finally:
            os.close(fd)
    except OSError as err:
        raise InvalidCommand(
            f"cannot touch the checkpoint file {path}: {err.strerror}",
            hint="GPULEDGER_CHECKPOINT_FILE is set by the executor; run this inside the job",
        ) from err
    click.echo(
        f"checkpoint of job {job_id} reported through $GPULEDGER_CHECKPOINT_FILE (recorded at "
        "the executor's next read)"
    )


@click.command()
@click.argument("job_id", type=int)
@click.option("--reason", default="", help="Why (recorded).")
@pass_ctx
def hold(ctx: Ctx, job_id: int, reason: str) -> None:
    """Hold pending JOB_ID: it is not scheduled until released (like `scontrol hold`)."""
    _done(ctx, f"held job {job_id}", c.HoldJob(actor=ctx.actor, job_id=job_id, reason=reason))


@click.command()
@click.argument("job_id", type=int)
@pass_ctx
def release(ctx: Ctx, job_id: int) -> None:
    """Release held JOB_ID: it is scheduled again (like `scontrol release`)."""
    _done(ctx, f"released job {job_id}", c.ReleaseJob(actor=ctx.actor, job_id=job_id))


@click.command()
@click.argument("job_id", type=int)
@click.option("--reason", default="", help="Why (recorded).")
@pass_ctx
def requeue(ctx: Ctx, job_id: int, reason: str) -> None:
    """Stop placed or running JOB_ID and queue it again, same job id (like `scontrol requeue`)."""
    cmd = c.RequeueJob(actor=ctx.actor, job_id=job_id, reason=reason)
    _done(ctx, f"requeued job {job_id}", cmd)


@click.group()
def admin() -> None:
    """Grant and revoke admins."""


@admin.command("grant")
@click.argument("user")
@pass_ctx
def admin_grant(ctx: Ctx, user: str) -> None:
    """Make USER an admin."""
    _done(ctx, f"{user} is an admin", c.GrantAdmin(actor=ctx.actor, user=user))


@admin.command("revoke")
@click.argument("user")
@pass_ctx
def admin_revoke(ctx: Ctx, user: str) -> None:
    """Revoke USER's admin rights (never the last admin's)."""
    _done(ctx, f"{user} is no longer an admin", c.RevokeAdmin(actor=ctx.actor, user=user))


COMMANDS = [
    init, account, share, member, manager, node, checkpoint, hold, release, requeue, admin,
]  # fmt: skip
