"""`gpuledger budget apply FILE.toml [--dry-run]`: budgets as code."""

from __future__ import annotations

from pathlib import Path

import click

from ledger import budget as b
from ledger.cli._common import Ctx, pass_ctx
from ledger.domain import decide, evolve
from schemas.errors import InvalidCommand


@click.group("budget")
def budget_group() -> None:
    """Budgets as code."""


@budget_group.command("apply")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Print the plan and check it; append nothing.")
@click.option("--prune", is_flag=True, help="Close accounts that the file does not list.")
@pass_ctx
def budget_apply(ctx: Ctx, file: Path, dry_run: bool, prune: bool) -> None:
    """Diff FILE against the ledger, print the plan, then apply it atomically."""
    try:
        data = file.read_bytes()
    except OSError as e:
        raise InvalidCommand(f"cannot read {file}: {e.strerror}") from e
    ledger = ctx.ledger()
    changes = b.plan(ledger.state, b.parse(data, str(file)), ctx.actor, prune=prune)
    if not changes:
        click.echo("no changes: the ledger matches the budget file")
        return
    for ch in changes:
        click.echo(f"  {ch.symbol} {ch.text}")
    if dry_run:
        scratch = ledger.state.copy()  # check every change as it would be applied
        for ch in changes:
            for ev in decide(scratch, ch.command, ledger.clock.now(), ledger.ids):
                evolve(scratch, ev)
        click.echo(f"plan: {len(changes)} changes (dry run: nothing appended)")
        return
    appended = ledger.execute_all([ch.command for ch in changes])
    click.echo(
        f"applied {len(changes)} changes as {len(appended.events)} events "
        f"(position {appended.position})"
    )


COMMANDS = [budget_group]
