"""`gpuledger token create|list|revoke`: bearer tokens for the API."""

from __future__ import annotations

import os

import click

from ledger.cli._common import Ctx, pass_ctx
from ledger.cli.output import echo_json, json_option, print_table
from ledger.core import tokens
from ledger.store.clock import SystemClock, new_token_secret
from ledger.wire.client import token_file
from schemas import commands as c
from schemas.api import TokenRow
from schemas.events import TokenScope
from schemas.units import format_time, parse_duration


@click.group()
def token() -> None:
    """Bearer tokens: only their hash is kept; the secret is printed once."""


@token.command("create")
@click.option("--user", default=None, help="Whose token (admins only for someone else).")
@click.option("--expires", default="90d", show_default=True, help="Lifetime, e.g. 90d; 0 = never.")
@click.option("--name", default="", help="What it is for (shown by `token list`).")
@click.option("--node", default=None, help="A node token: reports for this node only (admins).")
@click.option("--job", "job_id", type=int, default=None, help="A job token: its checkpoints only.")
@click.option("--save", is_flag=True, help="Also write it to your 0600 token file.")
@pass_ctx
def token_create(
    ctx: Ctx,
    user: str | None,
    expires: str,
    name: str,
    node: str | None,
    job_id: int | None,
    save: bool,
) -> None:
    """Create a token and print its secret (once: it is not kept anywhere)."""
    actor = ctx.actor
    if user is None:
        user = actor or _whoami(ctx)
    lifetime = parse_duration(expires)
    expires_at = SystemClock().now() + lifetime if lifetime else None
    scope: TokenScope = "node" if node is not None else "job" if job_id is not None else "user"
    secret = new_token_secret()
    cmd = tokens.issue(
        actor,
        user,
        secret,
        name=name,
        expires_at=expires_at,
        scope=scope,
        scope_node=node,
        scope_job=job_id,
    )
    appended = ctx.execute(cmd)
    if save:
        path = token_file()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")
        os.chmod(path, 0o600)
        click.echo(f"saved to {path}", err=True)
    click.echo(
        f"token {cmd.token_id} for {f'node {node}' if scope == 'node' else user} "
        f"(expires {format_time(expires_at)}; "
        f"position {appended.position}); the secret, shown only now:",
        err=True,
    )
    click.echo(secret)


def _whoami(ctx: Ctx) -> str:
    remote = ctx.remote
    if remote is None:
        return ctx.actor
    actor: str = remote.get("whoami")["actor"]
    return actor


@token.command("list")
@json_option
@pass_ctx
def token_list(ctx: Ctx, as_json: bool) -> None:
    """Your tokens (an admin's: everyone's), never their secrets."""
    if ctx.remote is not None:
        rows = ctx.remote.get("tokens", type=list[TokenRow])
    else:
        from ledger.reads import layer as reads

        rows = reads.tokens(ctx.ledger().state, ctx.actor)
    if as_json:
        echo_json(rows)
        return
    table = []
    for r in rows:
        scope = r.scope + (f":{r.scope_node}" if r.scope_node else "")
        scope += f":{r.scope_job}" if r.scope_job is not None else ""
        alive = "revoked" if r.revoked else f"expires {format_time(r.expires_at)}"
        table.append((r.token_id, r.user, scope, alive, r.name))
    print_table(("token", "user", "scope", "state", "name"), table)


@token.command("revoke")
@click.argument("token_id")
@pass_ctx
def token_revoke(ctx: Ctx, token_id: str) -> None:
    """Revoke a token: it gets 401 from now on."""
    appended = ctx.execute(c.RevokeToken(actor=ctx.actor, token_id=token_id))
    click.echo(f"revoked token {token_id} (position {appended.position})")


COMMANDS = [token]
