"""`gpuledger slurm ...`: Slurm as the execution engine (docs/slurm.md).

`import-shares` turns Slurm associations' shares into a budget file; `jobs` shows every job on
the partition, gpu-ledger's runs with their ledger job and the others as foreign.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import click

from ledger.cli._common import Ctx, pass_ctx
from ledger.cli.output import echo_json, json_option, print_table
from schemas.errors import EngineError


@click.group()
def slurm() -> None:
    """Slurm as the execution engine: migrate shares, inspect the partition."""


@slurm.command("import-shares")
@click.option(
    "--from",
    "source",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Saved output of `sacctmgr -nP show associations format=Account,ParentName,User,Share` "
    "(default: run sacctmgr now; needs Slurm accounting).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the budget file here (default: stdout).",
)
def import_shares(source: Path | None, output: Path | None) -> None:
    """Slurm association shares as a budget file for `gpuledger budget apply`."""
    from ledger.engines.slurm import SACCTMGR_ARGS, parse_sacctmgr_shares, shares_toml
    from ledger.engines.slurm.shares import accounts_written

    if source is not None:
        text = source.read_text()
    else:
        try:
            done = subprocess.run(
                SACCTMGR_ARGS, capture_output=True, text=True, timeout=60, check=False
            )
        except OSError as err:
            raise EngineError(
                f"sacctmgr cannot run: {err.strerror}",
                hint="run it on a Slurm host, or pass --from",
            ) from err
        if done.returncode != 0:
            raise EngineError(
                f"sacctmgr failed: {done.stderr.strip() or done.returncode}",
                hint="import-shares needs Slurm accounting (slurmdbd); or pass --from FILE",
            )
        text = done.stdout
    rows, parents, duplicates, inherit, orphans, left_out = parse_sacctmgr_shares(text)
    toml = shares_toml(rows, parents)
    if orphans:
        shown = ", ".join(f"{a} (parent {p})" for a, p in sorted(orphans.items()))
        click.echo(
            f"note: {len(orphans)} accounts have a parent that is in no line (a partial output, "
            f"or a parent on another cluster?): placed at the top: {shown}",
            err=True,
        )
    if left_out:
        click.echo(
            f"note: left out: {', '.join(left_out)} (Slurm's own root user association; the "
            "ledger's admins are named at `gpuledger init`)",
            err=True,
        )
    if any(a == "root" and u for a, u, _ in rows):
        users = sorted(u for a, u, _ in rows if a == "root" and u)
        click.echo(
            f"note: {len(users)} users are associated with Slurm's root account itself: "
            f"members of the project root/root: {', '.join(users)}",
            err=True,
        )
    if inherit:
        shown = ", ".join(inherit[:20]) + (" ..." if len(inherit) > 20 else "")
        click.echo(
            f"note: {len(inherit)} users have Share=parent (no share of their own in Slurm: "
            f"they compete as their account): members with the default share 1: {shown}",
            err=True,
        )
    if duplicates:
        shown = "; ".join(
            f"{name} ({', '.join('parent' if x < 0 else str(x) for x in shares)})"
            for name, shares in sorted(duplicates.items())
        )
        click.echo(
            f"note: {len(duplicates)} associations appear more than once (one per cluster or "
            f"partition?), the first share and parent kept: {shown}",
            err=True,
        )
    if output is None:
        click.echo(toml, nl=False)
    else:
        output.write_text(toml)
        click.echo(f"wrote {output}: {accounts_written(toml)} accounts", err=True)


@slurm.command("jobs")
@click.option("--partition", envvar="GPULEDGER_SLURM_PARTITION", required=True)
@json_option
@pass_ctx
def slurm_jobs(ctx: Ctx, partition: str, as_json: bool) -> None:
    """Every Slurm job on the partition: gpu-ledger's runs, and foreign jobs (never touched;
    their GPUs count as busy)."""
    from ledger.engines.slurm.executor import SlurmExecutor
    from ledger.engines.slurm.words import name_of
    from ledger.store.locate import open_source
    from schemas import codec

    # the store's first event names the ledger: read it beside a running server (read-only)
    ctx.require()
    with open_source(ctx.home) as source:
        first = source.read(0, 1)
    lid = name_of(codec.decode(first[0].data) if first else None)
    executor = SlurmExecutor(partition, lid, ctx.home / "jobs", env=os.environ)
    if not executor.refresh():
        raise EngineError("Slurm cannot be read", hint="is slurmctld up? see docs/slurm.md")
    rows: list[dict[str, Any]] = []
    for j in sorted(executor.view.values(), key=lambda j: j.slurm_id):
        if j.partition != partition:
            continue
        tag = j.tag(lid)
        rows.append(
            {
                "slurm_job_id": j.slurm_id,
                "job_id": None if tag is None else tag[0],
                "run": None if tag is None else tag[1],
                "foreign": tag is None,
                "state": j.state,
                "gpus": {n: list(i) for n, i in j.gpus.items() if i},
            }
        )
    if as_json:
        echo_json(rows)
        return
    table = []
    for r in rows:
        who = "foreign" if r["foreign"] else f"{r['job_id']} (run {r['run']})"
        gpus = " ".join(f"{n}:{','.join(map(str, i))}" for n, i in r["gpus"].items()) or "-"
        table.append((r["slurm_job_id"], who, r["state"], gpus))
    print_table(("slurm job", "ledger job", "state", "gpus"), table)


COMMANDS = [slurm]
