"""The audit's tables and checks, for the CLI (`gpuledger audit ...`) and the server
(`/v1/audit/table`, `/v1/audit/check`) alike.

- `audit_table(con, query)`: one audit table as Arrow (a read-only SELECT the caller wrote, a
  job's whole history, the preemptions, the budget changes), over a projection whose connection
  is locked down (`lock_down`): no file or network access, so a SELECT reads the views only;
  `check_select` lets one SELECT statement through and nothing else.
- `job_rows(con, job)`: a job's history with reasons: its events, the recorded cycles it waited
  in (runs of the same reason in one row) and its utilisation samples (runs of one level in one
  row). The queries are `projections.history`'s, over the projection's tables; the events come
  decoded by the codec, as their latest version.
- `scan_history(home)`, `live_violations(...)`, `check_view(...)`: `audit check`'s answer.

An edge: reads the projection and the store.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from ledger.history import audit as au
from ledger.history.compare import slots_text
from ledger.store.locate import LogSource, open_source
from projections import history
from projections.source import follow
from projections.store import Store
from schemas import api, codec
from schemas import events as e
from schemas import views as v
from schemas.errors import InvalidCommand

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa


# --- running a table ---------------------------------------------------------------------------


def lock_down(con: duckdb.DuckDBPyConnection, *, configuration: bool = False) -> None:
    """No file or network access for `con`: an audit SELECT reads the projection's views only
    (the projection itself needs no external access). `configuration`: also lock the settings,
    so that a query cannot turn the access back on (a connection of its own; the server's
    connection keeps changing its settings)."""
    con.execute("SET enable_external_access = false")
    if configuration:
        con.execute("SET lock_configuration = true")


def check_select(sql: str) -> str:
    """Pure-ish: `sql` if it is exactly one SELECT (or WITH ... SELECT) statement, else a clear
    InvalidCommand. The projection is also opened read-only: this is the first line."""
    import duckdb

    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as err:
        raise InvalidCommand(f"the SQL does not parse: {err}".split("\n")[0]) from err
    if len(statements) != 1:
        raise InvalidCommand(
            f"audit sql runs one statement, got {len(statements)}",
            hint="send one SELECT (or WITH ... SELECT) at a time",
        )
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise InvalidCommand(
            f"audit sql is read-only: {kind.name} statements are refused",
            hint="use SELECT or WITH ... SELECT; the projection is rebuilt from the log and is "
            "never edited by hand",
        )
    return sql


@dataclass(frozen=True)
class Limits:
    """What one audit query may take: its time (enforced by whoever runs it: the server's read
    pool interrupts it), its result's rows and bytes (enforced by `run_query`)."""

    timeout_s: float = 10.0
    max_rows: int = 1_000_000
    max_bytes: int = 256 * 2**20


NO_LIMITS = Limits(timeout_s=math.inf, max_rows=2**62, max_bytes=2**62)
"""Embedded mode: the caller's own process and files."""

_BATCH = 8_192


def run_query(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    params: dict[str, Any] | None = None,
    limits: Limits = NO_LIMITS,
) -> pa.Table:
    """The result of one statement as an Arrow table, read in record batches: past
    `limits.max_rows` or `limits.max_bytes` the query stops (nothing larger is held). A failure,
    an interruption (the time limit) or a limit becomes one InvalidCommand line."""
    import duckdb
    import pyarrow as pa

    try:
        reader = con.sql(sql, params=params or None).to_arrow_reader(_BATCH)
        batches, rows, size = [], 0, 0
        for batch in reader:
            rows += batch.num_rows
            size += batch.nbytes
            if rows > limits.max_rows or size > limits.max_bytes:
                reader.close()
                what = (
                    f"{limits.max_rows:,} rows"
                    if rows > limits.max_rows
                    else f"{limits.max_bytes // 2**20:,} MiB"
                )
                raise InvalidCommand(
                    f"the query's result is larger than {what}: it was stopped",
                    hint="aggregate, filter or add a LIMIT",
                )
            batches.append(batch)
        return pa.Table.from_batches(batches, schema=reader.schema)
    except duckdb.InterruptException as err:
        raise _past_time_limit(limits) from err
    except OSError as err:  # the Arrow reader's words for DuckDB's error while it streamed
        first = str(err).split("\n")[0]
        if first.startswith("INTERRUPT"):  # interrupted between batches (at load: a 500 before)
            raise _past_time_limit(limits) from err
        raise InvalidCommand(
            f"the query failed: {first}", hint="see docs/replay-and-audit.md for the views"
        ) from err
    except duckdb.Error as err:
        first = str(err).split("\n")[0]
        if "read-only" in first or "read only" in first:
            raise InvalidCommand(f"audit sql is read-only: {first}") from err
        raise InvalidCommand(
            f"the query failed: {first}", hint="see docs/replay-and-audit.md for the views"
        ) from err


def _past_time_limit(limits: Limits) -> InvalidCommand:
    return InvalidCommand(
        f"the query ran past its time limit of {limits.timeout_s:g} s and was stopped",
        hint="aggregate, filter or add a LIMIT; a join of the log with itself is costly",
    )


def audit_table(
    con: duckdb.DuckDBPyConnection, q: api.AuditQuery, limits: Limits = NO_LIMITS
) -> pa.Table:
    """The table `q` asks for, from the projection `con` (locked down by the caller; a `sql`
    table only for a caller `may_query_all` allows: the caller checks)."""
    import duckdb
    import pyarrow as pa

    if q.kind == "sql":
        return run_query(con, check_select(q.sql), None, limits)
    if q.kind == "job":
        if q.job_id is None:
            raise InvalidCommand("an audit job table needs job_id")
        try:
            return pa.Table.from_pylist(job_rows(con, q.job_id))
        except duckdb.InterruptException as err:
            raise InvalidCommand(
                f"the job's history took longer than its time limit of {limits.timeout_s:g} s"
            ) from err
    if q.kind == "preemptions":
        return run_query(con, *history.preemptions(q.account, q.since), limits)
    return run_query(con, *history.budget_changes(q.since), limits)


# --- a job's history ---------------------------------------------------------------------------


def job_rows(con: duckdb.DuckDBPyConnection, job: int) -> list[dict[str, Any]]:
    """The whole history of a job: its events with reasons (placements with their place in the
    cycle that made them), the recorded cycles it waited in (runs of cycles with the same reason
    in one row), and its utilisation samples (runs of the same level in one row)."""
    events = history.job_events(con, job)
    if not events:
        raise InvalidCommand(f"no events of job {job}", hint="see `gpuledger jobs`")
    waits = history.waits(con, job, events[0].position, events[-1].position)
    places = {
        cycle: f"#{k} of {n} placed, {considered} considered"
        for cycle, (k, n, considered) in history.placed_by(con, job).items()
    }
    out: list[dict[str, Any]] = []
    run: dict[str, Any] | None = None
    for position, at, tag, actor, ev in events:
        detail = _detail(ev)
        if isinstance(ev, e.JobPlaced) and ev.cycle_id in places:
            detail += f"; {places[ev.cycle_id]}"
        if isinstance(ev, e.UtilisationSampled):
            if run is not None and run["detail"].startswith(detail):
                run["samples"] += 1
                run["until_at"] = at
                run["detail"] = f"{detail} ({run['samples']} samples)"
                continue
            run = {"samples": 1}
        else:
            run = None
        row = {
            "position": position,
            "occurred_at": at,
            "event": tag.rsplit(".", 1)[0],
            "actor": actor,
            "detail": detail,
            "until_at": None,
        }
        if run is not None:
            run.update(row)
            row = run
        out.append(row)
    out += _waiting_rows(waits)
    out.sort(key=lambda r: r["position"])
    for r in out:
        r.pop("samples", None)
    return out


def _waiting_rows(waits: Iterable[tuple[int, float, str, str | None]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    run: dict[str, Any] | None = None
    for position, at, cycle_id, code in waits:
        if code is None:  # not among the cycle's waiting jobs: a run ends
            run = None
            continue
        if run is not None and run["text"] == code:
            run["cycles"] += 1
            run["until_at"] = at
            run["detail"] = f"waited in {run['cycles']} recorded cycles: {code}"
            continue
        run = {
            "position": position,
            "occurred_at": at,
            "event": "cycle.waiting",
            "actor": "@dispatcher",
            "detail": f"waited in {cycle_id}: {code}",
            "until_at": None,
            "cycles": 1,
            "text": code,
        }
        out.append(run)
    for r in out:
        r.pop("cycles", None)
        r.pop("text", None)
    return out


def _detail(ev: e.AnyEvent) -> str:
    match ev:
        case e.JobSubmitted():
            contract = f"min runtime {ev.min_runtime_s}s" if ev.min_runtime_s else "unfunded"
            return (
                f"{ev.gpus} GPUs in {ev.account} for {ev.user}; {contract}"
                f"{', resumable' if ev.resumable else ''}{', debug' if ev.debug else ''}"
                f"{f', priority {ev.priority}' if ev.priority else ''}"
            )
        case e.JobPlaced():
            return f"placed by {ev.cycle_id} (based on {ev.based_on}) on {slots_text(ev.slots)}"
        case e.JobPreempted():
            why = f"{ev.reason} for job {ev.for_job}" if ev.for_job is not None else ev.reason
            note = f": {ev.note}" if ev.note else ""
            return f"preempted ({why}{note}){f' by {ev.cycle_id}' if ev.cycle_id else ''}"
        case e.JobFinished():
            code = "" if ev.exit_code is None else f", exit code {ev.exit_code}"
            return f"finished: {ev.outcome}{code}"
        case e.JobRequeued():
            return "requeued (resumable): pending again"
        case e.JobUnplaced():
            why = f": {ev.reason}" if ev.reason else ""
            return f"run {ev.run} taken back before it started{why}; pending again"
        case e.UtilisationSampled():
            mean = sum(ev.gpu_utilisation) / max(1, len(ev.gpu_utilisation))
            return f"utilisation {mean:.0f}%"
        case _:
            return ""


# --- audit check -------------------------------------------------------------------------------


class _Holders(Protocol):
    """What `live_violations` asks of a ledger: catch up, then who holds which GPU."""

    def catch_up(self) -> int: ...

    @property
    def state(self) -> Any: ...


class _LiveProcess(Protocol):
    @property
    def job_id(self) -> int: ...

    @property
    def node(self) -> str: ...

    @property
    def gpu_indices(self) -> Sequence[int]: ...


def scan_history(home: Path, progress: Callable[[int], None] | None = None) -> au.CheckReport:
    """The invariants over the whole log, read from the store (its own connection);
    `progress` is told how many records were read, every 10,000 and at the end."""
    with open_source(home) as source:
        return au.check(_positioned(source, progress=progress))


def _positioned(
    source: LogSource, page: int = 50_000, progress: Callable[[int], None] | None = None
) -> Iterator[tuple[int, Any]]:
    read = 0
    for records in follow(source, page=page):
        for rec in records:
            yield rec.position, codec.decode(rec.data)
            read += 1
            if progress is not None and read % 10_000 == 0:
                progress(read)
    if progress is not None:
        progress(read)


def check_view(report: au.CheckReport, store: Store, live: list[au.Violation]) -> v.CheckView:
    """`audit check`'s answer: the history's violations, usage charged to unfunded jobs (from
    the projection `store`) and GPUs held twice by live processes, in log order."""
    charges = au.check_charges(store)
    violations = sorted([*report.violations, *charges, *live], key=lambda x: x.position)
    return v.CheckView(
        events=report.events,
        violations=[msgspec.convert(x, v.CheckItem, from_attributes=True) for x in violations],
        noted=[msgspec.convert(x, v.CheckItem, from_attributes=True) for x in report.noted],
    )


def live_violations(
    home: Path,
    ledger: Callable[[], _Holders],
    live_processes: Callable[[Path], Sequence[_LiveProcess]],
    agent_states: Sequence[Path] = (),
) -> list[au.Violation]:
    """The ledger's holders now against the live processes (`live_processes` of a state
    directory: the executors' own, `ledger.engines.supervised.live_processes`) of the local
    executor on this host (`home/agent`), of `up`'s local node agents (`home/agents/NODE`) and of
    the node agents whose state directories are named; the ledger is opened only when some are
    alive."""
    from ledger.store.clock import SystemClock

    local = sorted(d for d in (home / "agents").glob("*") if d.is_dir())
    procs = [p for d in (home / "agent", *local, *agent_states) for p in live_processes(d)]
    if not procs:
        return []
    led = ledger()
    position = led.catch_up()
    live = [(p.job_id, p.node, i) for p in procs for i in p.gpu_indices]
    return au.check_live(led.state.holders, live, position, SystemClock().now())
