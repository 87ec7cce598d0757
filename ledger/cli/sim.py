"""`gpuledger simulate`: replay a workload through the real ledger, projections and dispatcher.

    T=examples/traces/philly-4plusgpu-sample.csv.gz   # shipped with the repository
    gpuledger --home sim simulate run --trace $T --nodes 50 --policy fairshare
    gpuledger --home cmp simulate compare --trace $T --nodes 50
    gpuledger simulate dump --synthetic out.csv.gz

A run writes a normal ledger into `--home` (compare: `--home/<policy>` per policy), so every other
command works on it afterwards. See docs/simulation.md.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ledger.cli._common import Ctx, pass_ctx
from ledger.cli.output import print_table, progress
from ledger.cli.sim_pool import run_parallel, run_sweep, submissions_made
from ledger.core import budget as b
from ledger.dispatch import registry
from ledger.sim import report
from ledger.sim.family import family, from_spec, parse_spec
from ledger.sim.runner import POLICIES, Cluster, Drain, RunResult, SimConfig
from ledger.sim.runner import simulate as run_simulation
from ledger.sim.workload import (
    DEFAULT_MIN_RUNTIME,
    Assumptions,
    Synthetic,
    Workload,
    budget_toml,
    dump_trace,
    parse_distribution,
    parse_trace,
    resolve,
    synthetic,
)
from schemas.errors import InvalidCommand
from schemas.units import parse_duration

F = Callable[..., Any]


def _workload_options(f: F) -> F:
    opts = [
        click.option(
            "--trace",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Job trace CSV (gzip or not) in the normalised trace format.",
        ),
        click.option(
            "--synthetic", "synth", is_flag=True, help="Generate the seeded Ai2-shaped workload."
        ),
        click.option(
            "--family",
            "family_spec",
            is_flag=False,
            flag_value="",
            default=None,
            metavar="'KEY=VALUE ...'",
            help="Generate a member of the workload family (ledger/sim/family.py) on --nodes x "
            "--gpus-per-node GPUs over --days with --seed; settings: demand, teams, programs, "
            "researchers, skew, mix (small:W,medium:W,large:W), debug, unfunded, resumable, load.",
        ),
        click.option(
            "--budgets",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Budgets TOML (`budget apply` format): the budget tree and shares.",
        ),
        click.option("--seed", type=int, default=1, show_default=True, help="Seeds everything."),
        click.option("--days", type=float, default=28.0, show_default=True),
        click.option("--programs", type=int, default=3, show_default=True),
        click.option("--teams", type=int, default=15, show_default=True),
        click.option("--users", type=int, default=150, show_default=True),
        click.option(
            "--team-skew",
            type=float,
            default=0.8,
            show_default=True,
            help="Trace without groups: sigma of the lognormal factor on team demand weights.",
        ),
        click.option(
            "--min-runtime",
            "min_runtime",
            default=DEFAULT_MIN_RUNTIME,
            show_default=True,
            help="Trace without min_runtime_s: VALUE:WEIGHT distribution of non-debug jobs "
            "(0 = unfunded).",
        ),
        click.option(
            "--resumable",
            "resumable_p",
            type=float,
            default=0.7,
            show_default=True,
            help="Trace without resumable: probability a job is resumable.",
        ),
        click.option(
            "--debug-limit/--no-debug-limit",
            default=True,
            show_default=True,
            help="Trace without time_limit_s: jobs that ran <= 15 min declare 900 s (debug).",
        ),
        click.option(
            "--load",
            type=float,
            default=1.0,
            show_default=True,
            help="Synthetic: offered GPU-hours of mid-size and multi-node jobs / capacity.",
        ),
        click.option(
            "--unfunded",
            "unfunded_p",
            type=float,
            default=0.3,
            show_default=True,
            help="Synthetic: probability a mid-size job is unfunded.",
        ),
        click.option("--nodes", type=int, default=50, show_default=True),
        click.option("--gpus-per-node", type=int, default=8, show_default=True),
        click.option("--gpu-type", default="h100", show_default=True),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _sim_options(f: F) -> F:
    opts = [
        click.option(
            "--tick", default="10m", show_default=True, help="Periodic cycle (ranks drift)."
        ),
        click.option(
            "--checkpoint-every",
            default="1h",
            show_default=True,
            help="Running resumable jobs checkpoint this often.",
        ),
        click.option(
            "--resubmit/--no-resubmit",
            default=True,
            show_default=True,
            help="Resubmit non-resumable jobs that were preempted (a new job).",
        ),
        click.option(
            "--set",
            "knobs",
            multiple=True,
            metavar="KEY=VALUE",
            help="A policy setting (e.g. margin=0.2, search_budget=64, debug_lane=false, "
            "spare_ratio=3), for every policy of the run that has it. Repeatable.",
        ),
        click.option(
            "--sigterm-checkpoint",
            "sigterm_p",
            type=click.FloatRange(0.0, 1.0),
            default=0.0,
            show_default=True,
            help="Share of resumable jobs that checkpoint on SIGTERM (lose only the grace).",
        ),
        click.option(
            "--grace",
            default="30s",
            show_default=True,
            help="SIGTERM-to-SIGKILL grace: what a job that checkpoints on SIGTERM loses.",
        ),
        click.option(
            "--relaunch-cost",
            "relaunch",
            default="5m",
            show_default=True,
            help="Restart overhead of every relaunch after a preemption: the run takes that "
            "much longer, and it counts as lost.",
        ),
        click.option(
            "--ranks",
            type=click.Choice(["incremental", "projection"]),
            default="incremental",
            show_default=True,
            help="Where fair-share ranks come from (see docs/simulation.md).",
        ),
        click.option(
            "--drain",
            "drains",
            multiple=True,
            help="NODE@WHEN[+FOR]: drain NODE at WHEN after the start, return it FOR later "
            "(e.g. n001@2d+6h). Repeatable.",
        ),
        click.option(
            "--dump",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Also write the workload as a trace CSV (.gz: gzip'd) with every column.",
        ),
        click.option(
            "--report",
            "report_dir",
            type=click.Path(file_okay=False, path_type=Path),
            help="Where to write report.json, report.md and plots (default: HOME/report).",
        ),
        click.option("--no-plots", is_flag=True, help="Skip the PNG plots."),
        click.option("--json", "as_json", is_flag=True, help="Print the report JSON."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise InvalidCommand(f"cannot read {path}: {e.strerror}") from e


def build_workload(kw: dict[str, Any], **grid: object) -> Workload:
    """The workload the options describe (a trace, the synthetic generator, or a member of the
    family with the `grid` settings over its spec's)."""
    trace, synth, spec = kw["trace"], kw["synth"], kw.get("family_spec")
    if (trace is not None) + bool(synth) + (spec is not None) != 1:
        raise InvalidCommand("give exactly one of --trace FILE, --synthetic and --family")
    budget = None
    if kw["budgets"] is not None:
        budget = b.parse(_read(kw["budgets"]), str(kw["budgets"]))
    if spec is not None:
        member = from_spec(
            spec, gpus=kw["nodes"] * kw["gpus_per_node"], gpus_per_node=kw["gpus_per_node"],
            days=kw["days"], seed=kw["seed"], **grid,
        )  # fmt: skip
        return family(member, budget)
    # the seed and the budget tree's shape are both workloads' options
    tree = {k: kw[k] for k in ("seed", "programs", "teams", "users")}
    if synth:
        g = Synthetic(
            **tree,
            days=kw["days"],
            capacity_gpus=kw["nodes"] * kw["gpus_per_node"],
            gpus_per_node=kw["gpus_per_node"],
            load=kw["load"],
            unfunded_p=kw["unfunded_p"],
        )
        return synthetic(g, budget)
    how = Assumptions(
        **tree,
        team_skew=kw["team_skew"],
        min_runtime=parse_distribution(kw["min_runtime"]),
        resumable_p=kw["resumable_p"],
        debug_time_limit=kw["debug_limit"],
    )
    return resolve(parse_trace(_read(trace), str(trace)), how, budget, name=trace.name)


def parse_drain(text: str) -> Drain:
    """'n001@2d+6h' -> Drain(node='n001', at_s=172800, back_after_s=21600)."""
    node, sep, when = text.partition("@")
    if not sep or not node:
        raise InvalidCommand(
            f"invalid --drain {text!r}", hint="write NODE@WHEN[+FOR], e.g. n001@2d+6h"
        )
    at, plus, back = when.partition("+")
    return Drain(
        node=node, at_s=parse_duration(at), back_after_s=parse_duration(back) if plus else None
    )


def parse_knobs(texts: tuple[str, ...], policies: list[str]) -> dict[str, dict[str, str]]:
    """`KEY=VALUE` settings -> policy -> the settings it has. A setting no policy of the run
    has, or a bad value, is refused naming it."""
    knobs: dict[str, str] = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise InvalidCommand(f"invalid --set {text!r}", hint="write KEY=VALUE, e.g. margin=0.2")
        knobs[key.strip()] = value.strip()
    out: dict[str, dict[str, str]] = {}
    used: set[str] = set()
    for name in policies:
        config = registry.default_config(name)
        fields = type(config).__struct_fields__
        mine = {k: v for k, v in knobs.items() if k in fields}
        registry.with_knobs(config, mine)  # bad values fail here, before any run
        used |= set(mine)
        out[name] = mine
    unused = sorted(set(knobs) - used)
    if unused:
        raise InvalidCommand(
            f"no policy of this run has the setting {', '.join(unused)}",
            hint="see schemas/policy.py for each policy's settings",
        )
    return out


def _config(policy: str, kw: dict[str, Any], knobs: dict[str, str] | None = None) -> SimConfig:
    return SimConfig(
        policy=policy,
        knobs=tuple(sorted((knobs or {}).items())),
        sigterm_checkpoint_p=kw["sigterm_p"],
        grace_s=parse_duration(kw["grace"]),
        relaunch_s=parse_duration(kw["relaunch"]),
        cluster=Cluster(
            nodes=kw["nodes"], gpus_per_node=kw["gpus_per_node"], gpu_type=kw["gpu_type"]
        ),
        days=kw["days"],
        seed=kw["seed"],
        tick_s=parse_duration(kw["tick"]),
        checkpoint_every_s=parse_duration(kw["checkpoint_every"]),
        resubmit=kw["resubmit"],
        ranks=kw["ranks"],
        drains=tuple(parse_drain(d) for d in kw["drains"]),
    )


def _dump(workload: Workload, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(dump_trace(workload.jobs, gzipped=path.name.endswith(".gz")))
    toml = path.with_name(path.name.split(".")[0] + ".budgets.toml")
    toml.write_text(budget_toml(workload.budget))
    click.echo(f"wrote {len(workload.jobs)} jobs to {path} and the budget tree to {toml}", err=True)


def _run_all(
    policies: list[str], kw: dict[str, Any], home: Path, compare: bool, parallel: int = 1
) -> list[RunResult]:
    knobs = parse_knobs(kw["knobs"], policies)
    workload = build_workload(kw)
    if kw["dump"] is not None:
        _dump(workload, kw["dump"])
    made = submissions_made(workload, float(kw["days"]))
    # a compare cut short (Ctrl-C) removes the policies' ledgers it made: a rerun of the same
    # command was refused by the one it finished ("already holds a ledger", atk61-29b F4)
    made_here = [home / p for p in policies if compare and not (home / p).exists()]
    try:
        if parallel > 1 and len(policies) > 1:
            runs = [(p, _config(p, kw, knobs[p]), home / p) for p in policies]
            return run_parallel(runs, workload, float(kw["days"]), parallel)
        results = []
        for policy in policies:
            with progress(policy, made(float("inf")), unit="jobs submitted") as update:

                def told(done: float, total: float, events: int, update: Any = update) -> None:
                    update(made(done))

                target = home / policy if compare else home
                config = _config(policy, kw, knobs[policy])
                results.append(run_simulation(workload, config, target, told))
        return results
    except BaseException:
        for path in made_here:
            shutil.rmtree(path, ignore_errors=True)
        raise


def _print(results: list[RunResult], out: dict[str, Path], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([report.summary(r) for r in results], indent=2, sort_keys=True))
        return
    header = [h for _, h in report.COLUMNS]
    rows = [[report.row(r)[k] for k, _ in report.COLUMNS] for r in results]
    print_table(header, rows, records=True)  # 13 figures a run: a record on a narrow terminal
    for r in results:
        m = r.metrics
        click.echo(
            f"{m.policy}: {m.days:g} simulated days in {m.wall_s:.1f} s = "
            f"{m.days / m.wall_s:.2f} simulated days/s, {m.events:,} events = "
            f"{m.events / m.wall_s:,.0f} events/s ({m.cycles:,} cycles); ledger in {r.home}"
        )
    plots = "waits" in out
    click.echo(f"report: {out['markdown']} (json{', plots' if plots else ''} beside it)")


def _plots_note(out: dict[str, Path], no_plots: bool) -> None:
    if not no_plots and "waits" not in out:
        click.echo("plots skipped: matplotlib is not installed (pip install matplotlib)", err=True)


@click.group("simulate")
def simulate_group() -> None:
    """Replay a workload on a simulated cluster through the real ledger and dispatcher."""


@simulate_group.command("run")
@click.option(
    "--policy",
    type=click.Choice([*POLICIES, *sorted(registry.VERSIONS)]),
    default=registry.DEFAULT,
    show_default=True,
    help="A policy name (its current version) or a version, e.g. fairshare-1.",
)
@_workload_options
@_sim_options
@pass_ctx
def run_cmd(ctx: Ctx, /, policy: str, **kw: Any) -> None:
    """Simulate one policy; the ledger goes into --home."""
    results = _run_all([policy], kw, ctx.home, compare=False)
    out = report.write_report(
        results, kw["report_dir"] or ctx.home / "report", f"Simulation: {policy}",
        plots=not kw["no_plots"],
    )  # fmt: skip
    _print(results, out, kw["as_json"])
    _plots_note(out, kw["no_plots"])


@simulate_group.command("compare")
@click.option(
    "--policies",
    default=",".join(POLICIES),
    show_default=True,
    help="Comma-separated policies (names or versions), each run on the same workload into "
    "--home/POLICY.",
)
@click.option(
    "--parallel",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Run up to this many policies at once, each in its own process.",
)
@_workload_options
@_sim_options
@pass_ctx
def compare_cmd(ctx: Ctx, /, policies: str, parallel: int, **kw: Any) -> None:
    """Simulate several policies on the same workload; print one row per policy."""
    names = [p.strip() for p in policies.split(",") if p.strip()]
    known = {*POLICIES, *registry.VERSIONS}
    bad = [p for p in names if p not in known]
    if bad or not names:
        raise InvalidCommand(
            f"unknown policies {', '.join(bad) or '(none)'}",
            hint=f"use {', '.join([*POLICIES, *sorted(registry.VERSIONS)])}",
        )
    results = _run_all(names, kw, ctx.home, compare=True, parallel=parallel)
    out = report.write_report(
        results, kw["report_dir"] or ctx.home / "report", "Policy comparison",
        plots=not kw["no_plots"],
    )  # fmt: skip
    _print(results, out, kw["as_json"])
    _plots_note(out, kw["no_plots"])


def parse_grid(texts: tuple[str, ...]) -> list[dict[str, object]]:
    """`KEY=V1/V2/...` settings of the family -> every combination, in order (the last KEY
    varies fastest). KEY is a family setting (see `--family`) or `gpus`."""
    axes: list[tuple[str, list[object]]] = []
    for text in texts:
        key, sep, values = text.partition("=")
        if not sep or not values:
            raise InvalidCommand(
                f"invalid --grid {text!r}", hint="write KEY=V1/V2, e.g. demand=2/4"
            )
        if key in (k for k, _ in axes):
            raise InvalidCommand(f"--grid names {key!r} twice")
        if key == "gpus":
            try:
                axes.append((key, [int(v) for v in values.split("/")]))
            except ValueError:
                raise InvalidCommand(f"invalid --grid {text!r}: GPUs are integers") from None
            continue
        axes.append((key, [parse_spec(f"{key}={v}")[key] for v in values.split("/")]))
    cells: list[dict[str, object]] = [{}]
    for key, taken in axes:
        cells = [{**c, key: v} for c in cells for v in taken]
    return cells


def _sweep_label(cell: dict[str, object], seed: int) -> str:
    def text(v: object) -> str:
        if isinstance(v, tuple):
            return "/".join(f"{w:g}" for _, w in v)
        return f"{v:g}" if isinstance(v, float) else str(v)

    return " ".join([*(f"{k}={text(v)}" for k, v in cell.items()), f"seed={seed}"])


def _sweep_one(
    kw: dict[str, Any], cell: dict[str, object], policy: str, knobs: dict[str, str], home: Path
) -> RunResult:
    """One run of a sweep (a process of its pool): the cell's workload, one policy."""
    kw, workload = _cell_workload(kw, cell)
    return run_simulation(workload, _config(policy, kw, knobs), home)


def _cell_workload(kw: dict[str, Any], cell: dict[str, object]) -> tuple[dict[str, Any], Workload]:
    """The options and the workload of a sweep's cell (`gpus` sets the cluster's nodes)."""
    kw = dict(kw)
    grid = dict(cell)
    gpus = grid.pop("gpus", None)
    if isinstance(gpus, int):
        if gpus <= 0 or gpus % kw["gpus_per_node"]:
            raise InvalidCommand(f"--grid gpus={gpus}: not a positive multiple of --gpus-per-node")
        kw["nodes"] = gpus // kw["gpus_per_node"]
    return kw, build_workload(kw, **grid)


@simulate_group.command("sweep")
@click.option(
    "--policies",
    default=",".join(POLICIES),
    show_default=True,
    help="Comma-separated policies (names or versions), each run on every workload.",
)
@click.option(
    "--grid",
    "grid",
    multiple=True,
    metavar="KEY=V1/V2/...",
    help="A family setting (or gpus) and the values the sweep takes; repeatable (every "
    "combination is run).",
)
@click.option(
    "--seeds", default="1", show_default=True, help="Comma-separated seeds, each a workload."
)
@click.option("--parallel", type=click.IntRange(min=1), default=1, show_default=True)
@_workload_options
@_sim_options
@pass_ctx
def sweep_cmd(
    ctx: Ctx, /, policies: str, grid: tuple[str, ...], seeds: str, parallel: int, **kw: Any
) -> None:
    """Run every policy on every workload of a grid of the family (--family SPEC, with --grid
    over its settings and --seeds); one table (HOME/report/sweep.md and sweep.json), a row per
    workload and policy. Each run leaves its ledger in HOME/NNN/POLICY, and its report as a line
    of HOME/report/runs.jsonl as soon as it ends."""
    if kw["family_spec"] is None:
        kw["family_spec"] = ""
    names = [p.strip() for p in policies.split(",") if p.strip()]
    bad = [p for p in names if p not in {*POLICIES, *registry.VERSIONS}]
    if bad or not names:
        raise InvalidCommand(f"unknown policies {', '.join(bad) or '(none)'}")
    try:
        seed_list = [int(x) for x in seeds.split(",") if x.strip()]
    except ValueError:
        raise InvalidCommand(f"invalid --seeds {seeds!r}", hint="write 1,2,3") from None
    knobs = parse_knobs(kw["knobs"], names)
    cells = [(c, s) for c in parse_grid(grid) for s in seed_list]
    if not cells:
        raise InvalidCommand("the sweep has no workload", hint="give --seeds")
    for cell, seed in cells:  # every workload's settings are checked before any run
        _cell_workload({**kw, "seed": seed, "days": min(kw["days"], 0.01)}, cell)
    labels = [_sweep_label(c, s) for c, s in cells]
    tasks = [
        (
            ctx.home / f"{i + 1:03d}" / p,
            labels[i],
            p,
            _sweep_one,
            ({**kw, "seed": s}, cell, p, knobs[p]),
        )
        for i, (cell, s) in enumerate(cells)
        for p in names
    ]
    report_dir = kw["report_dir"] or ctx.home / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    done = run_sweep(tasks, ctx.home, report_dir, parallel)
    table = [(labels[i], [done[ctx.home / f"{i + 1:03d}" / p] for p in names])
             for i in range(len(cells))]  # fmt: skip
    title = f"Sweep of the workload family ({kw['family_spec'] or 'defaults'})"
    out = report.write_sweep(table, report_dir, title)
    if kw["as_json"]:
        click.echo(out["json"].read_text())
        return
    header = ["workload", *(h for _, h in report.COLUMNS)]
    print_table(
        header,
        [
            [label, *(report.row(r)[k] for k, _ in report.COLUMNS)]
            for label, rs in table
            for r in rs
        ],
        records=True,
    )
    click.echo(f"report: {out['markdown']} (json beside it)")


@simulate_group.command("dump")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@_workload_options
def dump_cmd(out: Path, **kw: Any) -> None:
    """Write the workload as a trace CSV with every optional column (no simulation), and its
    budget tree beside it as OUT-stem.budgets.toml."""
    _dump(build_workload(kw), out)


simulate = simulate_group
COMMANDS = [simulate]
