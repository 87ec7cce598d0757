"""Reports of simulation runs: JSON, a Markdown table (one row per policy), PNG plots.

`summary`, `rows` and `markdown` are pure (values in, text out); `write_plots` and `write_report`
are the edge that writes files (matplotlib with the Agg backend: no display needed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ledger.sim.fold import LOSS_KINDS
from ledger.sim.metrics import Metrics, Quantiles
from ledger.sim.runner import RunResult
from schemas.units import approx

COLUMNS = (
    ("policy", "policy"),
    ("owed_period", "owed by period"),
    ("fixed_period", "fixed by period"),
    ("fixed_hourly", "fixed hour by hour"),
    ("teams_95", "teams >= 95%"),
    ("worst", "worst team"),
    ("worst_fixed", "worst team fixed hourly / daily"),
    ("queued_p90", "queued per job p90"),
    ("wait", "every wait p50/p90/p99"),
    ("debug_p90", "debug p90"),
    ("jct_p90", "funded JCT p90"),
    ("nondebug_p90", "funded non-debug queued / JCT p90"),
    ("large_p90", "large queued p90"),
    ("lost", "GPU-h lost"),
    ("idle", "idle while funded waited"),
)
"""The printed table's columns (the headline measures; report.md has every one). The wait
target ("all waits p90 <= slurm-lab's") is judged by *queued per job* (each original job's
waits summed, first and after every requeue): every wait as its own sample lets a policy that
preempts and requeues often show a shorter p90 than the time its jobs spend waiting. The funded
figures count debug jobs as funded work; *funded non-debug* leaves them out (many short debug jobs
otherwise set the funded p90 the same for every policy)."""


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def summary(r: RunResult) -> dict[str, Any]:
    """Pure: everything about one run as JSON-ready data."""
    m = r.metrics
    cfg = r.config
    horizon_h = cfg.days * 24.0
    return {
        "policy": cfg.policy,
        "config": {
            "cluster": {
                "nodes": cfg.cluster.nodes,
                "gpus_per_node": cfg.cluster.gpus_per_node,
                "gpu_type": cfg.cluster.gpu_type,
                "gpus": cfg.cluster.gpus,
            },
            "days": cfg.days,
            "seed": cfg.seed,
            "tick_s": cfg.tick_s,
            "checkpoint_every_s": cfg.checkpoint_every_s,
            "resubmit": cfg.resubmit,
            "policy_settings": dict(cfg.knobs),
            "sigterm_checkpoint_p": cfg.sigterm_checkpoint_p,
            "grace_s": cfg.grace_s,
            "relaunch_s": cfg.relaunch_s,
            "min_runtime_cap_s": cfg.min_runtime_cap_s,
            "ranks": cfg.ranks,
            "drains": [msgspec.to_builtins(d.__dict__) for d in cfg.drains],
            "start_at": cfg.start_at,
        },
        "home": str(r.home),
        "workload": {
            "name": r.workload.name,
            "jobs": r.submitted,
            "offered_gpu_h": r.offered_gpu_h,
            "offered_load": r.offered_gpu_h / (cfg.cluster.gpus * horizon_h) if horizon_h else 0.0,
            "dropped": r.dropped,
            "notes": list(r.workload.notes),
        },
        "speed": {
            "wall_s": m.wall_s,
            "cpu_s": m.cpu_s,
            "sim_days_per_s": m.days / m.wall_s if m.wall_s else None,
            "events": m.events,
            "events_per_s": m.events / m.wall_s if m.wall_s else None,
            "cycles": m.cycles,
        },
        "metrics": msgspec.to_builtins(m),
    }


def _p(q: Quantiles | None, which: str = "p90_s") -> str:
    return "-" if q is None else approx(getattr(q, which))


def _idle_text(m: Metrics) -> str:
    i = m.idle
    if i is None:
        return "-"
    return f"{i.gpu_h:,.0f} ({_pct(i.share)})"


def _nondebug(m: Metrics) -> str:
    """Funded non-debug jobs' queued per job p90 / JCT p90."""
    return f"{_p(m.queued_funded_nondebug)} / {_p(m.jct_funded_nondebug)}"


def _worst_fixed(m: Metrics) -> str:
    """The lowest team's fixed owed met hour by hour / day by day (a lock-out shows here)."""
    return f"{_pct(m.fixed_worst_hourly)} / {_pct(m.fixed_worst_daily)}"


class _Measured(Protocol):
    @property
    def metrics(self) -> Metrics: ...


@dataclass(frozen=True)
class Done:
    """A finished run as a sweep keeps it (a line of its `runs.jsonl`): its `summary` and its
    metrics, what the sweep's table needs, also of a run an earlier, interrupted sweep did."""

    summary: dict[str, Any]
    metrics: Metrics

    @classmethod
    def of(cls, r: RunResult) -> Done:
        return cls(summary(r), r.metrics)

    @classmethod
    def read(cls, data: dict[str, Any]) -> Done:
        """Pure: a run from its summary (`summary`, through JSON)."""
        return cls(data, msgspec.convert(data["metrics"], Metrics))


def row(r: _Measured) -> dict[str, str]:
    """Pure: one printed row of a run (the `COLUMNS`)."""
    m = r.metrics
    lost = f"{m.lost_gpu_h:,.0f} ({_pct(m.lost_share)}; funded {_pct(m.lost_funded_share)})"
    large = f"{_p(m.queued_large)} ({m.large_jobs})"
    return {
        "policy": m.policy,
        "owed_period": _pct(m.owed_by_period),
        "owed_hourly": _pct(m.owed_hour_by_hour),
        "fixed_period": _pct(m.fixed_by_period),
        "fixed_hourly": _pct(m.fixed_hour_by_hour),
        "teams_95": f"{m.teams_at_95}/{m.teams}; {m.fixed_teams_at_95}/{m.teams}",
        "worst": f"{_pct(m.worst_by_period)}; {_pct(m.fixed_worst_by_period)}",
        "worst_fixed": _worst_fixed(m),
        "queued_p90": _p(m.queued),
        "wait": "/".join(approx(x) for x in (m.wait.p50_s, m.wait.p90_s, m.wait.p99_s)),
        "debug_p90": approx(m.wait_debug.p90_s),
        "jct_p90": _p(m.jct_funded),
        "nondebug_p90": _nondebug(m),
        "large_p90": large,
        "lost": lost,
        "idle": _idle_text(m),
    }


def markdown(results: Sequence[RunResult], title: str = "Simulation") -> str:
    """Pure: the comparison tables (one row per policy each), the run facts, and per-team
    tables."""
    if not results:
        return f"# {title}\n\nNo runs.\n"
    first = results[0]
    s = summary(first)
    lines = [f"# {title}", ""]
    cl = s["config"]["cluster"]
    lines.append(
        f"Workload `{s['workload']['name']}`: {s['workload']['jobs']} jobs, "
        f"{s['workload']['offered_gpu_h']:,.0f} GPU-hours offered "
        f"(load {s['workload']['offered_load']:.2f} of capacity) on {cl['nodes']} nodes x "
        f"{cl['gpus_per_node']} {cl['gpu_type']} = {cl['gpus']} GPUs over "
        f"{s['config']['days']:g} days; seed {s['config']['seed']}; restart overhead "
        f"{approx(s['config']['relaunch_s'])} per relaunch."
    )
    lines.append("")
    for note in s["workload"]["notes"]:
        lines.append(f"- {note}")
    for d in s["workload"]["dropped"]:
        lines.append(f"- dropped: {d}")
    lines += ["", *table(OWED, results), "", OWED_NOTE, ""]
    lines += [*table(WAITS, results), "", WAITS_NOTE, ""]
    lines += [*table(CHURN, results), "", CHURN_NOTE]
    for r in results:
        m = r.metrics
        lines += [
            "",
            f"## {m.policy}: owed and delivered per team",
            "",
            "| team | allocation | delivered GPU-h | owed GPU-h (Ai2) | by period | hour by hour "
            "| owed GPU-h (fixed) | by period | hour by hour |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for t in m.team_rows:
            lines.append(
                f"| {t.team} | {_pct(t.allocation)} | {t.delivered_gpu_h:,.0f} | "
                f"{t.owed_gpu_h:,.0f} | {_pct(t.by_period)} | {_pct(t.hour_by_hour)} | "
                f"{t.fixed_owed_gpu_h:,.0f} | {_pct(t.fixed_by_period)} | "
                f"{_pct(t.fixed_hour_by_hour)} |"
            )
    return "\n".join(lines) + "\n"


Cell = tuple[str, Callable[[Metrics], str]]


def table(cells: Sequence[Cell], results: Sequence[RunResult]) -> list[str]:
    """Pure: a Markdown table, one row per run, of `cells` (header, value of the metrics)."""
    out = ["| " + " | ".join(h for h, _ in cells) + " |"]
    out.append("|" + "|".join("---" for _ in cells) + "|")
    for r in results:
        out.append("| " + " | ".join(f(r.metrics) for _, f in cells) + " |")
    return out


def _kinds(m: Metrics) -> str:
    return " / ".join(f"{m.lost_by_kind.get(k, 0.0):,.0f}" for k in LOSS_KINDS)


def _where(m: Metrics) -> str:
    i = m.idle
    if i is None:
        return "-"
    parts = (i.reserve_gpu_h, i.held_gpu_h, i.fragmented_gpu_h, i.other_gpu_h)
    return " / ".join(f"{x:,.0f}" for x in parts)


def _q3(q: Quantiles | None) -> str:
    if q is None:
        return "-"
    return "/".join(approx(x) for x in (q.p50_s, q.p90_s, q.p99_s))


OWED: tuple[Cell, ...] = (
    ("policy", lambda m: m.policy),
    ("owed by period (Ai2)", lambda m: _pct(m.owed_by_period)),
    ("hour by hour (Ai2)", lambda m: _pct(m.owed_hour_by_hour)),
    ("owed by period (fixed)", lambda m: _pct(m.fixed_by_period)),
    ("hour by hour (fixed)", lambda m: _pct(m.fixed_hour_by_hour)),
    ("teams >= 95% (Ai2; fixed)", lambda m: f"{m.teams_at_95}/{m.teams}; "
                                            f"{m.fixed_teams_at_95}/{m.teams}"),
    ("worst team (Ai2)", lambda m: f"{_pct(m.worst_by_period)} {m.worst_team or ''}".strip()),
    ("worst team (fixed)", lambda m: f"{_pct(m.fixed_worst_by_period)} "
                                     f"{m.fixed_worst_team or ''}".strip()),
    ("worst team (fixed) hour by hour", lambda m: f"{_pct(m.fixed_worst_hourly)} "
                                                 f"{m.fixed_worst_hourly_team or ''}".strip()),
    ("worst team (fixed) day by day", lambda m: f"{_pct(m.fixed_worst_daily)} "
                                                f"{m.fixed_worst_daily_team or ''}".strip()),
    ("Jain", lambda m: "-" if m.jain is None else f"{m.jain:.3f}"),
    ("occupancy", lambda m: _pct(m.occupancy)),
    ("unfunded share", lambda m: _pct(m.unfunded_share)),
    ("mean demand / supply", lambda m: f"{m.demand_ratio:.2f}"),
)  # fmt: skip
OWED_NOTE = (
    "Owed, two yardsticks. *Ai2*: the team's allocated fraction of capacity capped hour by hour "
    "at its demand under the policy that ran (funded GPUs pending or running). *Fixed*: what a "
    "partition of the team's allocated size would have run of the funded jobs it submitted "
    "(the same for every policy). *By period*: sum delivered / sum owed, capped at 1 per team. "
    "*Hour by hour*: sum of min(delivered, owed) per hour / sum owed; *day by day* the same "
    "per day. The worst team by period can read 100% over a lock-out paid back later; the "
    "worst team hour by hour and day by day cannot."
)
WAITS: tuple[Cell, ...] = (
    ("policy", lambda m: m.policy),
    ("queued per job p50/p90/p99", lambda m: _q3(m.queued)),
    ("every wait p50/p90/p99", lambda m: _q3(m.wait)),
    ("waits", lambda m: f"{m.wait.count:,}"),
    ("first wait p90", lambda m: _p(m.wait_first)),
    ("funded queued p90", lambda m: _p(m.queued_funded)),
    ("unfunded wait p90", lambda m: _p(m.wait_unfunded)),
    ("debug p90 (jobs)", lambda m: f"{approx(m.wait_debug.p90_s)} ({m.wait_debug.count})"),
    ("large queued p90 (jobs)", lambda m: f"{_p(m.queued_large)} ({m.large_jobs})"),
    ("longest under share", lambda m: approx(m.longest_under_share_s)),
    ("funded JCT p50/p90", lambda m: f"{_p(m.jct_funded, 'p50_s')}/{_p(m.jct_funded)}"),
    ("funded non-debug queued / JCT p90", _nondebug),
    ("funded slowdown p90", lambda m: "-" if m.slowdown_funded is None
        or m.slowdown_funded.p90_s is None else f"{m.slowdown_funded.p90_s:.1f}"),
    ("never started; not done (at limit)", lambda m: f"{m.wait.never_started}; {m.censored} "
                                                     f"({m.ended_at_limit})"),
)  # fmt: skip
WAITS_NOTE = (
    "*Queued per job*: the sum of an original job's waits (first and after each requeue or "
    "resubmission, open ones up to the end): the wait target's measure. Waits: every wait, "
    "from submission and from each requeue (or resubmission after a "
    "preemption) to the next placement, one sample each (a job requeued often is many short "
    "samples); *first wait*: submission to first placement. Open waits count with "
    "their length so far. *Large*: jobs asking >= 1/8 of their pool. *Longest under share*: "
    "the longest wait of a funded job whose team had been delivered less than its share over "
    "the trailing 7 days when the wait began. *JCT*: submission to completion of the last run "
    "(jobs not done count with their time so far); *slowdown*: JCT / max(work, 10 s). *Funded*: "
    "funded jobs, debug jobs included; *funded non-debug*: funded jobs that are not debug jobs."
)
CHURN: tuple[Cell, ...] = (
    ("policy", lambda m: m.policy),
    ("preemptions/job", lambda m: f"{m.preemptions_per_job:.2f}"),
    ("preemptions (by reason)", lambda m: f"{m.preemptions} ("
        + (", ".join(f"{k} {v}" for k, v in m.preemptions_by_reason.items()) or "-") + ")"),
    ("GPU-h lost", lambda m: f"{m.lost_gpu_h:,.0f} ({_pct(m.lost_share)})"),
    ("funded lost", lambda m: f"{m.lost_funded_gpu_h:,.0f} ({_pct(m.lost_funded_share)})"),
    ("lost by kind", _kinds),
    ("idle while funded waited", _idle_text),
    ("reserve / held / fragmented / other", _where),
    ("fragmented", lambda m: _pct(m.fragmentation_share)),
    ("events", lambda m: f"{m.events:,}"),
    ("cycles", lambda m: f"{m.cycles:,}"),
    ("wall; CPU", lambda m: f"{m.wall_s:.1f}s; {m.cpu_s:.1f}s"),
)  # fmt: skip
CHURN_NOTE = (
    "GPU-h lost: per preemption, the work since the last checkpoint (resumable jobs) or since "
    "placement (others), and per relaunch the restart overhead; as a share of all GPU-hours "
    "delivered (funded: funded jobs' loss alone, the loss target's measure). By kind: "
    + " / ".join(LOSS_KINDS)
    + ". Idle while funded waited: GPU-hours free on delivering nodes while a funded job was "
    "pending, and where: nodes kept for debug work / nodes held for a reservation / free GPUs no "
    "waiting job could use / the rest."
)


def sweep_markdown(cells: Sequence[tuple[str, Sequence[_Measured]]], title: str) -> str:
    """Pure: one table for a sweep: a row per (workload, policy) with the `COLUMNS` and where
    the idle GPU-hours were, workloads in the order given."""
    header = ["workload", *(h for _, h in COLUMNS), "idle: reserve / held / fragmented / other"]
    lines = [f"# {title}", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---" for _ in header) + "|")
    for label, results in cells:
        for r in results:
            values = row(r)
            lines.append(
                "| " + " | ".join([label, *(values[k] for k, _ in COLUMNS), _where(r.metrics)])
                + " |"
            )  # fmt: skip
    lines += ["", OWED_NOTE, "", WAITS_NOTE, "", CHURN_NOTE]
    return "\n".join(lines) + "\n"


def write_sweep(
    cells: Sequence[tuple[str, Sequence[Done]]], out: Path, title: str
) -> dict[str, Path]:
    """Write `<out>/sweep.json` (every run's summary, by workload) and `<out>/sweep.md`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "sweep.json", "markdown": out / "sweep.md"}
    data = [{"workload": label, "runs": [r.summary for r in rs]} for label, rs in cells]
    paths["json"].write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    paths["markdown"].write_text(sweep_markdown(cells, title))
    return paths


# --- files --------------------------------------------------------------------------------------


PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
"""A qualitative palette (matplotlib's tab10): neighbours differ in hue."""
LINE_STYLES = ("-", "--", ":", "-.")


def team_styles(teams: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Pure: a (colour, line style) per team, all different for up to 40 teams (the palette's
    10 colours, then again dashed, dotted, dash-dotted); past 40 they repeat."""
    ordered = sorted(teams)
    n = len(PALETTE)
    return {
        t: (PALETTE[i % n], LINE_STYLES[(i // n) % len(LINE_STYLES)]) for i, t in enumerate(ordered)
    }


def y_top(values: Sequence[float], floor: float = 1.05) -> float:
    """Pure: an axis top that shows every value (5% headroom), at least `floor`: nothing
    clipped, however far a team bursts past what it was owed."""
    return max([floor, *(1.05 * v for v in values if math.isfinite(v))])


def write_plots(results: Sequence[RunResult], out: Path) -> list[Path]:
    """PNG plots, policies side by side: per-team delivered/owed over time, final per-team
    delivered/owed, convergence, and waits."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    n = len(results)
    # 1. per team: delivered / owed so far, by day (the by-period measure as it accrues)
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 4), sharey=True, squeeze=False)
    every = sorted({t for r in results for t in r.metrics.team_series})
    styles = team_styles(every)
    tops: list[float] = []
    for ax, r in zip(axes[0], results, strict=True):
        for team, pts in sorted(r.metrics.team_series.items()):
            xs = [d for d, o, _ in pts if o > 0]
            ys = [g / o for _, o, g in pts if o > 0]
            tops += ys
            colour, style = styles[team]
            ax.plot(xs, ys, linewidth=1.2, color=colour, linestyle=style,
                    label=team.rsplit("/", 1)[-1])  # fmt: skip
        ax.axhline(0.95, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"{r.metrics.policy}: delivered / owed so far")
        ax.set_xlabel("day")
    axes[0][0].set_ylim(0.0, y_top(tops))  # shared: every panel shows every value
    axes[0][0].set_ylabel("delivered / owed (by period, per team)")
    axes[0][-1].legend(fontsize=6, ncol=max(1, len(every) // 12), loc="center left",
                       bbox_to_anchor=(1.01, 0.5))  # fmt: skip
    paths.append(_save(fig, out / "owed_delivered_over_time.png", plt))
    # 2. final per-team by-period measure, grouped by team
    fig, ax = plt.subplots(figsize=(max(8, len(results[0].metrics.team_rows) * 0.6), 4))
    teams = [t.team for t in results[0].metrics.team_rows]
    width = 0.8 / n
    for k, r in enumerate(results):
        by = {t.team: (t.by_period or 0.0) for t in r.metrics.team_rows}
        ax.bar(
            [i + k * width for i in range(len(teams))],
            [by.get(t, 0.0) for t in teams],
            width,
            label=r.metrics.policy,
        )
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(teams))])
    ax.set_xticklabels([t.rsplit("/", 1)[-1] for t in teams], rotation=60, fontsize=7)
    ax.axhline(0.95, color="grey", linestyle=":", linewidth=1)
    ax.set_ylabel("delivered / owed (by period)")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "owed_delivered_by_team.png", plt))
    # 3. convergence of delivered shares towards owed shares
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        conv = r.metrics.convergence
        ax.plot([d for d, _ in conv], [v for _, v in conv], label=r.metrics.policy)
    ax.set_xlabel("day")
    ax.set_ylabel("distance: delivered vs owed shares")
    ax.legend()
    paths.append(_save(fig, out / "convergence.png", plt))
    # 4. waits
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [r.metrics.policy for r in results]
    series: list[tuple[str, list[float | None]]] = [
        ("queued per job p90", [_q(r.metrics.queued) for r in results]),
        ("p50", [r.metrics.wait.p50_s for r in results]),
        ("p90", [r.metrics.wait.p90_s for r in results]),
        ("p99", [r.metrics.wait.p99_s for r in results]),
        ("debug p90", [r.metrics.wait_debug.p90_s for r in results]),
    ]
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series):
        ax.bar(
            [i + k * width for i in range(n)],
            [max(1.0, v or 0.0) / 3600.0 for v in values],
            width,
            label=name,
        )
    ax.set_yscale("log")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(n)])
    ax.set_xticklabels(labels)
    ax.set_ylabel("wait (hours, log; 1 s floor; p50-p99: every wait)")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "waits.png", plt))
    return paths


def _q(q: Quantiles | None) -> float | None:
    return None if q is None else q.p90_s


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # a legend beside the axes fits too
    plt.close(fig)
    return path


def write_report(
    results: Sequence[RunResult], out: Path, title: str = "Simulation", plots: bool = True
) -> dict[str, Path]:
    """Write `<out>/report.json`, `<out>/report.md` and the PNG plots; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    data = [summary(r) for r in results]
    paths = {"json": out / "report.json", "markdown": out / "report.md"}
    paths["json"].write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    paths["markdown"].write_text(markdown(results, title))
    if plots and _have_matplotlib():
        for p in write_plots(results, out):
            paths[p.stem] = p
    return paths


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
