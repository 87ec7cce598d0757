"""`gpuledger budget apply FILE.toml [--dry-run]`: budgets as code. Beside a running server the
plan is made by the server (`POST /v1/budget/plan`) and applied through `/v1/batch`: the same
lines, the same errors."""

from __future__ import annotations

from pathlib import Path

import click

from ledger.cli._common import Ctx, pass_ctx
from schemas import api
from schemas.commands import AnyCommand
from schemas.errors import InvalidCommand
from schemas.units import plural


@click.group("budget")
def budget_group() -> None:
    """Budgets as code."""


@budget_group.command("apply")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Print the plan and check it; append nothing.")
@click.option("--prune", is_flag=True, help="Close accounts that the file does not list.")
@pass_ctx
def budget_apply(ctx: Ctx, file: Path, dry_run: bool, prune: bool) -> None:
    """Diff FILE against the ledger, print the plan, then apply it atomically.

    FILE is TOML: one table per account, named by its path; an
    account's shares are of its parent. For example:

    \b
        [accounts."ai2"]
        kind = "program"               # program | project | user
        shares = 1                     # default 1
        managers = ["carol"]           # optional: exactly these manage the subtree
        reason = "FY27 plan"           # optional: recorded with the change

    \b
        [accounts."ai2/olmo"]
        kind = "project"
        shares = 3
        members = ["alice", "bob"]     # optional: exactly these are members
        member_shares = { alice = 2 }  # optional: a member's share of the project (default 1)

    Accounts the file does not list are left alone unless --prune closes them. Examples:
    examples/demo-budgets.toml, examples/ai2-synthetic.budgets.toml.
    """
    try:
        data = file.read_bytes()
    except OSError as e:
        raise InvalidCommand(f"cannot read {file}: {e.strerror}") from e
    changes = _plan(ctx, data, str(file), prune)
    if not changes:
        click.echo("no changes: the ledger matches the budget file")
        return
    for ch in changes:
        click.echo(f"  {ch.symbol} {ch.text}")
    commands = [ch.command for ch in changes]
    if dry_run:
        _check(ctx, data, str(file), prune, commands)
        click.echo(f"plan: {plural(len(changes), 'change')} (dry run: nothing appended)")
        return
    appended = ctx.execute_all(commands)
    click.echo(
        f"applied {plural(len(changes), 'change')} as {plural(len(appended.events), 'event')} "
        f"(position {appended.position})"
    )


def _request(ctx: Ctx, data: bytes, name: str, prune: bool, check: bool) -> api.BudgetPlan:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        from ledger.core import budget as b

        b.parse(data, name)  # the same malformed-TOML line as embedded mode
        raise
    body = api.BudgetPlanRequest(name=name, toml=text, prune=prune, check=check, actor=ctx.actor)
    plan: api.BudgetPlan = ctx.remote.post("budget/plan", body, type=api.BudgetPlan, read=True)
    return plan


def _plan(ctx: Ctx, data: bytes, name: str, prune: bool) -> list[api.BudgetChange]:
    if ctx.remote is not None:
        return _request(ctx, data, name, prune, check=False).changes
    from ledger.core import budget as b

    ledger = ctx.ledger()
    changes = b.plan(ledger.state, b.parse(data, name), ctx.actor, prune=prune)
    return [api.BudgetChange(symbol=ch.symbol, text=ch.text, command=ch.command) for ch in changes]


def _check(ctx: Ctx, data: bytes, name: str, prune: bool, commands: list[AnyCommand]) -> None:
    """Every change checked as it would be applied (the dry run): raises the first rejection."""
    if ctx.remote is not None:
        _request(ctx, data, name, prune, check=True)
        return
    from ledger.core import budget as b

    ledger = ctx.ledger()
    b.require_may_change(ledger.state, ctx.actor)
    b.check(ledger.state, commands, ledger.clock.now(), ledger.ids, ledger.admit)


COMMANDS = [budget_group]
