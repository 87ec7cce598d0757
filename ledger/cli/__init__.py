"""`gpuledger`: the command line.

An edge: it parses, builds commands and prints; the ledger decides.
"""

from __future__ import annotations

from pathlib import Path

import click

from ledger.cli._common import Ctx, LedgerGroup, default_home


@click.group(cls=LedgerGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    default=default_home,
    show_default="$GPULEDGER_HOME or ./.gpuledger",
    help="Data directory (event store and projections).",
)
@click.option(
    "--as",
    "actor",
    envvar="GPULEDGER_USER",
    help="Who is acting (or $GPULEDGER_USER).",
)
@click.version_option(package_name="gpu-ledger")
@click.pass_context
def cli(ctx: click.Context, home: Path, actor: str | None) -> None:
    """gpu-ledger: budgets, fair share and scheduling contracts for shared GPU clusters."""
    ctx.obj = Ctx(home, actor)


def _register() -> None:
    from ledger.cli import budget, read, serve, views, write

    for module in (write, read, budget, views, serve):
        for command in module.COMMANDS:
            cli.add_command(command)


_register()


def main() -> None:
    cli(prog_name="gpuledger")
