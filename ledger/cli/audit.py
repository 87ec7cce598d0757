"""Replay, what-if and audit commands: `replay`, `whatif`, `audit sql|job|preemptions|
budget-changes|verify|check`. An edge: parses, reads the log and the projection, prints."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import msgspec

from ledger.cli._common import Ctx, pass_ctx, projection
from ledger.cli.output import echo_json, json_option, print_table, progress
from ledger.dispatch import registry
from ledger.history import audit as au
from ledger.history import tamper as tm
from projections.kafka_wire import TOPIC, TOPIC_ENV
from schemas import api
from schemas import views as v
from schemas.errors import InvalidCommand
from schemas.units import format_time, parse_duration, parse_time, span

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from ledger.history.compare import CycleReplay
    from ledger.history.copy_check import CopyReport
    from ledger.sim.whatif import WhatIfReport

# DuckDB, Arrow, the Kafka client and the simulator are imported by the commands that use them:
# a client beside a server (most audit commands) needs at most Arrow, and the rest were ~0.35 s
# of CPU at every `gpuledger audit ...` (stop 56's suite ran ~110 such processes in one test)

T = TypeVar("T")


def _time(text: str | None) -> float | None:
    return None if text is None else parse_time(text)


# --- replay ---------------------------------------------------------------------------------------


@click.command()
@click.option("--cycle", "cycle_id", help="The cycle id (e.g. cycle-812) of one decision.")
@click.option(
    "--job", "job_id", type=int, help="Every decision that considered, placed or preempted JOB."
)
@click.option("--all", "all_", is_flag=True, help="Every recorded decision.")
@click.option("--from", "start", help="Only decisions made at or after this time (ISO 8601).")
@click.option("--to", "end", help="Only decisions made at or before this time.")
@click.option(
    "--exact",
    is_flag=True,
    help="Catch the rebuilt projection up to exactly each decision's position (slower; the "
    "default for many decisions reads it as of that position: the same rows).",
)
@click.option(
    "--show", type=int, default=20, show_default=True, help="Differences shown per decision."
)
@json_option
@pass_ctx
def replay(
    ctx: Ctx,
    cycle_id: str | None,
    job_id: int | None,
    all_: bool,
    start: str | None,
    end: str | None,
    exact: bool,
    show: int,
    as_json: bool,
) -> None:
    """Rebuild what recorded decisions saw from the log alone, decide again, compare.

    Prints `identical` per decision, or every difference (placements, preemptions, sort keys,
    reasons, ...). Exits 1 when a decision differs or cannot be replayed."""
    if not (cycle_id or job_id is not None or all_ or start or end):
        raise InvalidCommand("which decisions?", hint="pass --cycle ID, --job JOB or --all")
    from ledger.history import replay as rp

    ctx.local_only()
    selection = rp.Selection(cycle=cycle_id, job=job_id, start=_time(start), end=_time(end))
    decisions = rp.find_decisions(ctx.home, selection)
    if not decisions and all_ and not (cycle_id or job_id is not None or start or end):
        click.echo("no decisions recorded yet: nothing to replay")  # an empty history is intact
        return
    if not decisions:
        raise InvalidCommand(
            "no recorded decision matches", hint="see `gpuledger audit sql` on the decisions view"
        )
    verbose = not all_ or len(decisions) == 1
    started = time.perf_counter()
    results: list[CycleReplay] = []
    with progress("decisions replayed", len(decisions)) as update:
        for result in rp.replay_found(ctx.home, decisions, exact=exact):
            results.append(result)
            update(len(results))
            if not as_json and (verbose or not result.identical):
                _print_replay(result, show)
    elapsed = time.perf_counter() - started
    same = sum(r.identical for r in results)
    failed = sum(r.error is not None for r in results)
    differ = len(results) - same - failed
    if as_json:
        echo_json(
            {
                "decisions": results,
                "identical": same,
                "differ": differ,
                "cannot_replay": failed,
                "seconds": elapsed,
            }
        )
    else:
        click.echo(replay_summary(len(results), elapsed, same, differ, failed))
    if same != len(results):
        sys.exit(1)


def replay_summary(n: int, elapsed: float, same: int, differ: int, failed: int) -> str:
    """Pure: `replay`'s last line, its counts written as its bar's (`1,778`; it said `1778`
    under a bar of `1,778/1,778`, atk61-29b)."""
    rate = n / elapsed if elapsed > 0 else float("inf")
    return (
        f"{n:,} decisions replayed in {elapsed:.2f} s ({rate:.1f}/s): {same:,} identical, "
        f"{differ:,} differ, {failed:,} cannot be replayed"
    )


def _print_replay(result: CycleReplay, show: int) -> None:
    click.echo(f"{result.headline()} at {format_time(result.decided_at)}")
    for d in result.differences[:show]:
        click.echo(f"  {d.text()}")
    if len(result.differences) > show:
        click.echo(f"  ... and {len(result.differences) - show} more")


# --- what-if --------------------------------------------------------------------------------------


@click.command()
@click.option(
    "--budgets",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A budgets TOML applied on top of the organisation at --from.",
)
@click.option("--policy", type=click.Choice(registry.NAMES), help="Another policy (its defaults).")
@click.option("--window", help="Another usage window for fair share (e.g. 3d).")
@click.option("--from", "start", required=True, help="Start of the period (ISO 8601).")
@click.option("--to", "end", required=True, help="End of the period.")
@click.option(
    "--keep",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the what-if ledger in this (new) directory, to replay or audit it.",
)
@click.option(
    "--tick",
    default="10m",
    show_default=True,
    help="Cycle at least this often (with --step the decisions are at its moments only; the "
    "tick then times the simulated checkpoints alone).",
)
@click.option(
    "--step",
    help="Decide only every STEP of the period (e.g. 1m, what the Budget review page runs), "
    "not at every submission and exit: faster on a deep queue, waits rounded up to it; "
    "shorter than the period.",
)
@json_option
@pass_ctx
def whatif(
    ctx: Ctx,
    budgets: Path | None,
    policy: str | None,
    window: str | None,
    start: str,
    end: str,
    keep: Path | None,
    tick: str,
    step: str | None,
    as_json: bool,
) -> None:
    """Re-simulate the submissions recorded between --from and --to with other budgets,
    window or policy, through a real ledger, and compare per team with the same simulation
    with no change (run too: twice the time), what happened beside them; with no change
    given, the simulation against what happened."""
    from ledger.core import budget as b
    from ledger.sim import whatif as wi

    t0, t1 = parse_time(start), parse_time(end)
    ctx.local_only()
    budget = None if budgets is None else b.parse(budgets.read_bytes(), str(budgets))
    window_s = None if window is None else float(parse_duration(window))
    step_s = None if step is None else float(parse_duration(step))
    if step_s is not None and not step_s > 0:
        raise InvalidCommand(f"invalid --step {step!r}", hint="give a positive duration, e.g. 1m")
    if step_s is not None and step_s >= t1 - t0:  # no decision at all after the first moment
        raise InvalidCommand(
            f"--step {step} is not shorter than the period ({span(t1 - t0)})",
            hint="give a step shorter than --from .. --to, e.g. 1m",
        )
    if keep is not None and keep.exists() and any(keep.iterdir()):
        raise InvalidCommand(f"{keep} is not empty", hint="--keep needs a new directory")
    # the work is an estimate (decisions weighed by the queue, and the submissions, of both
    # runs): a percent of it, not a count in a unit the report then contradicts (atk61-29b F1)
    with (
        projection(ctx, quiet=True) as store,
        progress("what-if", unit="of the estimated work", percent=True) as update,
    ):
        report = wi.run_whatif(
            ctx.home,
            store,
            t0,
            t1,
            budgets=budget,
            policy=policy,
            window_s=window_s,
            keep=keep,
            tick_s=parse_duration(tick),
            step_s=step_s,
            progress=lambda done, total: update(done, total),
        )
    if as_json:
        echo_json(report)
        return
    _print_whatif(report)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _wait(x: float | None) -> str:
    return "-" if x is None else span(x)


def _pair(a: str, b_: str) -> str:
    return a if a == b_ else f"{a} -> {b_}"


def _print_whatif(r: WhatIfReport) -> None:
    click.echo(
        f"what-if {format_time(r.start)} .. {format_time(r.end)}: {r.submissions} submissions "
        f"(+{r.carried} active at the start), policy {r.policy_version} "
        f"({', '.join(f'{k}={v}' for k, v in sorted(r.config.items()))}), {r.cycles} cycles"
    )
    header: tuple[str, ...] = (
        "team",
        "owed GPU-h",
        "delivered GPU-h",
        "by period",
        "mean wait",
        "p90 wait",
        "never placed",
        "preemptions",
    )
    based = any(t.baseline is not None for t in r.teams)
    if based:  # what happened beside: the simulation's own gap from it, not the change's
        header = (*header, "delivered: happened")
    rows = []
    for t in r.teams:
        w = t.whatif
        a = t.baseline if t.baseline is not None else t.actual
        row = (
            t.team,
            _pair(f"{a.owed_gpu_h:,.1f}", f"{w.owed_gpu_h:,.1f}"),
            _pair(f"{a.delivered_gpu_h:,.1f}", f"{w.delivered_gpu_h:,.1f}"),
            _pair(_pct(a.by_period), _pct(w.by_period)),
            _pair(_wait(a.mean_wait_s), _wait(w.mean_wait_s)),
            _pair(_wait(a.p90_wait_s), _wait(w.p90_wait_s)),
            _pair(str(a.never_placed), str(w.never_placed)),
            _pair(str(a.preemptions), str(w.preemptions)),
        )  # fmt: skip
        rows.append((*row, f"{t.actual.delivered_gpu_h:,.1f}") if based else row)
    click.echo(f"compared: {r.compared}")
    title = "no change -> what-if" if based else "what happened -> simulated with no change"
    print_table(header, rows, title=title, whole=(0,))
    for note in r.notes:
        click.echo(f"note: {note}")
    if r.home:
        click.echo(f"the what-if ledger is in {r.home}")


# --- audit: read-only SQL and reports ---------------------------------------------------------


@click.group("audit")
def audit_group() -> None:
    """Read-only SQL, reports, tamper evidence and invariant checks over the ledger."""


format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json", "parquet"]),
    default="table",
    show_default=True,
)
as_json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (the same as --format json)."
)
output_option = click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the result to this file (required for parquet).",
)


@contextmanager
def readonly(ctx: Ctx) -> Iterator[duckdb.DuckDBPyConnection]:
    """The projection caught up with the log, then opened read-only (or, when a running service
    holds the file, the private in-memory copy), locked down."""
    import duckdb

    from ledger.history import tables
    from projections.store import memory_limit, projection_path

    path = projection_path(ctx.home)
    with projection(ctx, quiet=True) as store:
        if store.path != path:  # the service holds the file: our copy is private
            tables.lock_down(store.con, configuration=True)
            yield store.con
            return
    try:
        con = duckdb.connect(str(path), read_only=True, config={"memory_limit": memory_limit()})
    except duckdb.IOException:  # taken meanwhile: a private copy
        with projection(ctx, quiet=True) as store:
            tables.lock_down(store.con, configuration=True)
            yield store.con
            return
    try:
        tables.lock_down(con, configuration=True)
        yield con
    finally:
        con.close()


def _plain(value: Any) -> Any:
    """JSON-safe: non-finite floats as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _flat(table: pa.Table) -> pa.Table:
    """Nested columns (lists, structs, maps) as JSON text, for CSV."""
    import pyarrow as pa

    cols = []
    for col in table.columns:
        t = col.type
        if pa.types.is_nested(t):
            values = [json.dumps(_plain(v), default=str) for v in col.to_pylist()]
            cols.append(pa.array(values, pa.string()))
        else:
            cols.append(col)
    return pa.Table.from_arrays(cols, names=table.column_names)


def _cell(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and (name.endswith("_at") or name == "at"):
        return format_time(value)
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:g}"
    if isinstance(value, list | dict):
        return json.dumps(_plain(value), default=str)
    return str(value)


def export(table: pa.Table, fmt: str, output: Path | None) -> None:
    """Print or write a result as a table, CSV, JSON (an array of objects) or Parquet."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if fmt == "parquet":
        if output is None:
            raise InvalidCommand("parquet needs --output FILE")
        pq.write_table(table, output)
        click.echo(f"{table.num_rows} rows written to {output}")
        return
    if fmt == "csv":
        sink = pa.BufferOutputStream()
        pacsv.write_csv(_flat(table), sink)
        data = sink.getvalue().to_pybytes()
    elif fmt == "json":
        rows = [_plain(r) for r in table.to_pylist()]
        data = (json.dumps(rows, indent=2, default=str) + "\n").encode()
    else:
        names = table.column_names
        cells = [[_cell(n, row[n]) for n in names] for row in table.to_pylist()]
        if output is None:
            print_table(names, cells)
            click.echo(f"({table.num_rows} rows)")
            return
        with open(output, "w", encoding="utf-8") as f:
            print_table(names, cells, file=f)
        click.echo(f"{table.num_rows} rows written to {output}")
        return
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        output.write_bytes(data)
        click.echo(f"{table.num_rows} rows written to {output}")


@audit_group.command("sql")
@click.argument("query")
@format_option
@as_json_option
@output_option
@pass_ctx
def audit_sql(ctx: Ctx, query: str, fmt: str, as_json: bool, output: Path | None) -> None:
    """Run one read-only SELECT over the views: events, jobs, job_intervals, account_history,
    account_shares, accounts_at(t), node_history, nodes, preemptions, decisions. Admins only:
    the projection holds every job's command, logs and event payloads. Through a server it
    stops at a time, row and byte limit."""
    from ledger.history import tables

    fmt = "json" if as_json else fmt
    sql = tables.check_select(query)
    if ctx.remote is None:  # the server checks its callers; here, the same rule
        from ledger.reads import layer as reads

        state = ctx.reader().state
        reads.require_query_all(state, ctx.viewer(state))
    export(_table(ctx, api.AuditQuery(kind="sql", sql=sql)), fmt, output)


def _table(ctx: Ctx, query: api.AuditQuery) -> pa.Table:
    """The audit table: from the server beside a running one (`POST /v1/audit/table`, the exact
    Arrow table), else from the projection opened read-only."""
    if ctx.remote is not None:
        import pyarrow as pa

        got: api.AuditTable = ctx.remote.post("audit/table", query, type=api.AuditTable, read=True)
        return pa.ipc.open_stream(got.arrow).read_all()
    from ledger.history import tables

    with readonly(ctx) as con:
        return tables.audit_table(con, query)


@audit_group.command("job")
@click.argument("job_id", type=int)
@format_option
@as_json_option
@output_option
@pass_ctx
def audit_job(ctx: Ctx, job_id: int, fmt: str, as_json: bool, output: Path | None) -> None:
    """JOB_ID's whole history with reasons: submission, every cycle it waited in (why), its
    placements, preemptions (why, for whom), requeues and finish."""
    table = _table(ctx, api.AuditQuery(kind="job", job_id=job_id))
    rows = table.to_pylist()
    if as_json or fmt == "json":
        _view_json([v.AuditJobRow(**r) for r in rows], output)
        return
    export(table, fmt, output)


def _view_json(rows: Any, output: Path | None) -> None:
    """JSON of views: on stdout like every `--json`, or into `output`."""
    if output is None:
        echo_json(rows)
        return
    text = msgspec.json.format(msgspec.json.encode(rows, order="sorted"), indent=2)
    output.write_bytes(text + b"\n")
    click.echo(f"{len(rows)} rows written to {output}")


@audit_group.command("preemptions")
@click.option("--account", help="Only jobs in this account (or below it).")
@click.option("--since", help="Only preemptions at or after this time (ISO 8601).")
@format_option
@as_json_option
@output_option
@pass_ctx
def audit_preemptions(
    ctx: Ctx,
    account: str | None,
    since: str | None,
    fmt: str,
    as_json: bool,
    output: Path | None,
) -> None:
    """Every preemption: whose job, why, for which job, by whom, and whether it was inside the
    job's contract (only admin preemptions with a reason may be)."""
    if as_json or fmt == "json":
        _view_json(ctx.read("audit_preemptions", account=account, since=_time(since)), output)
        return
    table = _table(ctx, api.AuditQuery(kind="preemptions", account=account, since=_time(since)))
    export(table, fmt, output)


@audit_group.command("budget-changes")
@click.option("--since", help="Only changes at or after this time (ISO 8601).")
@format_option
@as_json_option
@output_option
@pass_ctx
def audit_budget_changes(
    ctx: Ctx, since: str | None, fmt: str, as_json: bool, output: Path | None
) -> None:
    """Who changed what in the budget tree, and why: accounts opened and closed, shares (before
    and after), members, managers and admins."""
    if as_json or fmt == "json":
        _view_json(ctx.read("audit_budget_changes", since=_time(since)), output)
        return
    table = _table(ctx, api.AuditQuery(kind="budget-changes", since=_time(since)))
    export(table, fmt, output)


# --- audit: tamper evidence and invariants ----------------------------------------------------


@audit_group.command("verify")
@click.option("--kafka", "bootstrap", help="Also check the Kafka copy at HOST:PORT.")
@click.option("--topic", envvar=TOPIC_ENV, default=TOPIC, show_default=True)
@json_option
@pass_ctx
def audit_verify(ctx: Ctx, bootstrap: str | None, topic: str, as_json: bool) -> None:
    """Recompute the hash chain over the store (and the Kafka topic): report the first broken
    link and what broke it (an edited, deleted or moved event). Exits 1 on any problem."""
    if ctx.remote is not None and not bootstrap:  # the server reads its own store
        report: tm.ChainReport = _asked_with_progress(ctx.remote, "verify", tm.ChainReport)
    else:
        ctx.local_only()
        with progress(STAGES["chain"], tm.store_head(ctx.home)) as update:
            report = tm.verify_store(ctx.home, tm.file_anchor(ctx.home), progress=_staged(update))
    copy, held = None, ""
    if bootstrap:
        from ledger.history import copy_check

        kafka = copy_check.KafkaCopy(bootstrap, topic)
        copy = copy_check.verify_copy(
            tm.store_records(ctx.home), kafka, first_offset=kafka.first_offset, topic=topic
        )
        held = _held(bootstrap, topic)  # asked after the walk: one opened since is found too
        if not held:  # else it hides the rest of the topic from the walk: said below
            copy = copy_check.below_progress(copy, copy_check.kept_progress(ctx.home, topic))
    if as_json:
        echo_json({"store": report, "kafka": copy})
    else:
        _print_chain("store", report)
        if copy is not None:
            _print_copy(topic, copy)
            if held:
                click.echo(f"note: {held}; the walk above stops there")
    if not report.ok or (copy is not None and not copy.ok):
        sys.exit(1)


def _held(bootstrap: str, topic: str) -> str:
    """A transaction another producer holds open on the topic hides every committed record
    after it from the walk: "N events behind the store" read as a relay catching up, with the
    relay's events on the topic behind it (atk49-25 F2). What to say of it ("": none)."""
    from ledger.store.relay import RelayError, held_at, held_text

    try:
        held = held_at(bootstrap, topic)
    except RelayError:
        return ""
    return "" if held is None else held_text(topic, held)


STAGES = {
    "waiting": "waiting for the audit under way",
    "chain": "verify 1/3: chain, events",
    "snapshots": "verify 2/3: snapshots, events folded",
    "projection": "verify 3/3: projection, events rebuilt",
    "check": "events checked",
}
"""What the bar says in each stage of a whole-log audit (`tamper.STAGES`; a check has one):
the chain's walk was 41% of a verify at a million events and its bar stood full, still, for
the rest (atk47-29 F3)."""


def _staged(update: Any) -> tm.Steps:
    """A bar's `update` told each stage's progress (`tamper.Steps`)."""
    return lambda stage, done, total: update(done, total or None, what=STAGES.get(stage, stage))


def _asked_with_progress(remote: Any, kind: str, returns: type[T]) -> T:
    """`GET /v1/audit/{kind}` of the server, streamed (`Client.streamed`: a line at least every
    second, so a walk of any length is waited for; with a fixed timeout the client gave up at
    60 s on a million events and said the server was not running, atk47-29 F2), its steps
    drawn as embedded mode's bar on a terminal. A Ctrl-C closes the connection: the server
    stops the walk at once."""
    with progress(STAGES["waiting"]) as update:
        answer: T = remote.streamed(f"audit/{kind}", returns, on_step=_stepped(update))
    return answer


def _stepped(update: Any) -> Callable[[api.AuditStep], None]:
    staged = _staged(update)
    return lambda step: staged(step.stage or "chain", step.done, step.total)


def _print_chain(what: str, report: tm.ChainReport) -> None:
    if report.ok:
        click.echo(
            f"{what}: chain intact over {report.events:,} events; head position {report.head:,}, "
            f"head link {report.head_hash} (keep it elsewhere: it anchors the last event)"
        )
        return
    first = report.problems[0]
    click.echo(
        f"{what}: chain BROKEN over {report.events:,} events: first at position "
        f"{first.position} ({first.kind})"
    )
    for p in report.problems:
        click.echo(f"  {p.text()}")


def _print_copy(topic: str, copy: CopyReport) -> None:
    where = f"kafka topic {topic}"
    copies = (
        f"; {copy.copies:,} exact copies of records before them, which readers pass over"
        if copy.copies
        else ""
    )
    if copy.early:  # atk51-25 F5: the relay's own, not another producer's
        copies += (
            f"; {copy.early:,} copies of records the relay signed, found before their turn (a "
            "topic made again under the relay, or someone replaying saved records), which "
            "readers pass over"
        )
    if copy.ok:
        behind = f", {copy.behind:,} events behind the store" if copy.behind else ""
        click.echo(
            f"{where}: {copy.records:,} records, positions 1 to {copy.last_position:,} in "
            f"order, byte-equal to the store, chain intact{behind}{copies}"
        )
        return
    click.echo(f"{where}: DIFFERS from the store{copies}")
    for p in [*copy.problems, *copy.chain.problems]:
        click.echo(f"  {p.text()}")
    if copy.more:
        click.echo(f"  ... and {copy.more:,} more problems (the first {len(copy.problems)} shown)")


@audit_group.command("check")
@click.option(
    "--agent-state",
    "agent_states",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Also count the live job processes of a node agent with this state directory "
    "(repeatable; on its node).",
)
@json_option
@pass_ctx
def audit_check(ctx: Ctx, agent_states: tuple[Path, ...], as_json: bool) -> None:
    """Scan the whole history for violated invariants: a GPU held by two jobs, a preemption
    inside a contract (admin ones with a reason are listed as such), a placement on a draining
    node, usage charged to an unfunded job, a budget change by someone not authorised then;
    and now, a GPU held by two jobs counting the job processes really alive on this host.
    One line per violation; exits 1 on any."""
    if ctx.remote is not None and not agent_states:  # the server checks its own host
        view: v.CheckView = _asked_with_progress(ctx.remote, "check", v.CheckView)
    else:
        from ledger.engines.supervised import live_processes
        from ledger.history import tables

        ctx.local_only()  # --agent-state names directories of this host, not the server's
        # the whole log, as through the server ("events checked"): no bar had it (atk61-29b F3)
        with progress(STAGES["check"], tm.store_head(ctx.home)) as update:
            report = tables.scan_history(ctx.home, progress=update)
        live = tables.live_violations(
            ctx.home, lambda: ctx.ledger(live=True), live_processes, agent_states
        )
        with projection(ctx, quiet=True) as store:
            view = tables.check_view(report, store, live)
    if as_json:
        echo_json(view)
    else:
        for x in view.violations:
            click.echo(_violation(x).line())
        for n in view.noted:
            click.echo(f"allowed: {_violation(n).line()}")
        click.echo(
            f"{view.events:,} events checked: {len(view.violations)} violations, "
            f"{len(view.noted)} allowed exceptions"
        )
    if view.violations:
        sys.exit(1)


def _violation(item: v.CheckItem) -> au.Violation:
    return msgspec.convert(item, au.Violation, from_attributes=True)


COMMANDS = [replay, whatif, audit_group]
