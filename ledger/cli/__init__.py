"""`gpuledger`: the command line.

An edge: it parses, builds commands and prints; the ledger decides.
"""

from __future__ import annotations

from pathlib import Path

import click

from ledger.cli._common import Ctx, default_home
from ledger.cli.output import LedgerGroup
from ledger.store import EVENTS_DB

# Which modules define (or extend) each top-level command. Commands load lazily, so
# `gpuledger submit` does not import DuckDB, Arrow or Kafka; `--help` loads them all.
_MODULES: dict[str, tuple[str, ...]] = {
    "init": ("write",),
    "account": ("write", "read"),
    "share": ("write",),
    "member": ("write",),
    "manager": ("write",),
    "node": ("write", "read"),
    "submit": ("submit",),
    "cancel": ("submit",),
    "checkpoint": ("write",),
    "hold": ("write",),
    "release": ("write",),
    "requeue": ("write",),
    "admin": ("write",),
    "jobs": ("read",),
    "log": ("read",),
    "schemas": ("read",),
    "budget": ("budget",),
    "shares": ("views",),
    "usage": ("views",),
    "report": ("views",),
    "projection": ("views", "kafka"),
    "project": ("views", "kafka"),
    "queue": ("views",),
    "explain": ("views",),
    "priority": ("views",),
    "squatters": ("views",),
    "preempt": ("views",),
    "up": ("serve",),
    "serve": ("serve",),
    "agent": ("agent",),
    "status": ("serve",),
    "token": ("token",),
    "slurm": ("slurm",),
    "relay": ("kafka",),
    "simulate": ("sim",),
    "replay": ("audit",),
    "whatif": ("audit",),
    "audit": ("audit",),
    "store": ("store",),
}


def _load(*modules: str) -> None:
    import importlib

    for name in modules:
        module = importlib.import_module(f"ledger.cli.{name}")
        for command in module.COMMANDS:
            if command.name not in cli.commands:
                cli.add_command(command)


class _Lazy(LedgerGroup):
    def store_path(self, ctx: click.Context) -> Path | None:
        return ctx.obj.home / EVENTS_DB if isinstance(ctx.obj, Ctx) else None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_MODULES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _MODULES:
            _load(*_MODULES[cmd_name])
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Lazy, context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option(
    "--url",
    envvar="GPULEDGER_URL",
    default=None,
    help="Server to use: http(s)://HOST:PORT or unix:/PATH (or $GPULEDGER_URL). Default: the "
    "server running on --home if any, else the data directory itself.",
)
@click.version_option(package_name="gpu-ledger")
@click.pass_context
def cli(ctx: click.Context, home: Path, actor: str | None, url: str | None) -> None:
    """gpu-ledger: budgets, fair share and scheduling contracts for shared GPU clusters."""
    ctx.obj = Ctx(home, actor, url)
    ctx.call_on_close(ctx.obj.close)


def main() -> None:
    cli(prog_name="gpuledger")
