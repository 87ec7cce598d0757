"""The DuckDB file that holds the read models, and its tracking position.

One file per projection under `<home>/projections/`; the main projection `ledger.duckdb` holds
every read model (see `schema.sql`). DuckDB lets one process open a file read-write: the
projector's. Readers in other processes open it read-only while no writer holds it.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The engine itself, not the `duckdb` package around it: the package adds ~80 ms of imports (its
# relation API, a version lookup in the installed metadata) that opening and querying a
# projection never use, and every CLI read pays them. The projector imports the package, which
# also lets the engine scan the Arrow tables it registers.
import _duckdb as duckdb

from projections.errors import ProjectionBusy, ProjectionError, ProjectionOutdated

DEFAULT_BATCH = 122_880
"""Events per transaction: exactly one DuckDB row group (122,880 rows), so a batch's events are
written straight to the database file as a whole row group, and per-statement costs vanish. A
batch that is not a multiple of the row group (131,072 was) leaves a partial row group that goes
through the write-ahead log and is written again by the next checkpoint: a quarter more DuckDB
CPU per event. Small enough to bound memory (about 1 KB per event in flight, two batches at a
time)."""

PROJECTION = "ledger"
log = logging.getLogger("gpuledger.projection")
SCHEMA_VERSION = "7"
PROJECTIONS_DIR = "projections"

MEMORY_LIMIT_ENV = "GPULEDGER_DUCKDB_MEMORY_LIMIT"
"""Overrides `MEMORY_LIMIT`: DuckDB's size text (`512MiB`, `4GB`)."""
MEMORY_LIMIT = "2GiB"
"""The most memory each projection's DuckDB database keeps (its buffers and its queries'),
past which it spills to `<file>.tmp` or refuses the query (DuckDB's own default, 80% of the
host's memory, let a server grow 0.7-1 GB per 16 MiB request and keep it: atk44z F10)."""
_SIZE = re.compile(r"\d+(\.\d+)?\s*(B|KB|KIB|MB|MIB|GB|GIB|TB|TIB)", re.IGNORECASE)


def memory_limit(environ: Any = None) -> str:
    """The DuckDB memory limit of the environment (`MEMORY_LIMIT_ENV`) or `MEMORY_LIMIT`;
    ProjectionError, one line, for a text that is no size."""
    text = ((os.environ if environ is None else environ).get(MEMORY_LIMIT_ENV) or "").strip()
    if not text:
        return MEMORY_LIMIT
    if not _SIZE.fullmatch(text):
        raise ProjectionError(
            f"{MEMORY_LIMIT_ENV}={text!r} is no size",
            hint="give a number and a unit, e.g. 2GiB or 512MB (docs/server.md)",
        )
    return text


CHAIN_TABLE = """
CREATE TABLE IF NOT EXISTS chain (
    projection VARCHAR PRIMARY KEY,
    position   BIGINT  NOT NULL,  -- the tracked position when it was written
    hash       VARCHAR NOT NULL   -- SHA-256 of the stored bytes of the event at `position`
)
"""
"""Where the projection stands in the hash chain, written with `tracking`: a reader of a copy of
the log (Kafka) checks that the next record links to it. Not a read model: the audit dumps leave
it out."""


def projection_path(home: Path | str, name: str = PROJECTION) -> Path:
    """`<home>/projections/<name>.duckdb`."""
    return Path(home) / PROJECTIONS_DIR / f"{name}.duckdb"


def sql_text(name: str) -> str:
    """The text of one of this package's .sql files."""
    return (Path(__file__).parent / name).read_text(encoding="utf-8")


_SECTION = re.compile(r"^-- name: (\w+)\n-- needs: (\w+)\n", re.MULTILINE)


def sql_sections(name: str) -> list[tuple[str, str, str]]:
    """The `-- name:` sections of a .sql file as (name, input table, statement), in file order."""
    text = sql_text(name)
    marks = list(_SECTION.finditer(text))
    out = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        out.append((m.group(1), m.group(2), text[m.end() : end].strip()))
    return out


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list[object] | None = None) -> Any:
    """The first column of the first row, or None (fetches the whole result: DuckDB wants every
    result finished before the connection does other work)."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0][0] if rows else None


@dataclass(frozen=True)
class Status:
    """Where a projection stands."""

    position: int
    events: int
    unknown_events: int
    unknown_tags: dict[str, int]
    """Tags this code does not know, with how many events of each the projection kept."""


READ_MODELS: dict[str, str] = {
    "events": "position",
    "account_history": "position, account",
    "node_history": "position, node",
    "jobs": "job_id",
    "job_intervals": "start_position",
    "preemptions": "position",
    "decisions": "position",
    "team_hours_kept": "team, from_at",
    "team_hours_span": "depth",
}
"""The read-model tables, each with the columns that order it (a key): what a projection holds
besides its tracking row, all derived from the log (`audit verify` compares them with a fresh
build)."""


class Store:
    """An open projection file. `read_only` stores serve queries; the projector writes."""

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        if read_only and not self.path.exists():
            raise ProjectionError(
                f"no projection at {self.path}",
                hint="run the projector first (it catches up from the event log)",
                path=str(self.path),
            )
        new = str(path) != ":memory:" and not self.path.exists()
        if not self.path.parent.exists():
            # the projection holds every job's command and event payload: its directory is
            # the service's alone, so DuckDB's WAL (made with the umask) is too (security.md,
            # row T13); a directory that exists keeps the mode its operator gave it
            self.path.parent.mkdir(parents=True, mode=0o700)
            self.path.parent.chmod(0o700)
        try:
            self.con = duckdb.connect(
                str(self.path), read_only=read_only, config={"memory_limit": memory_limit()}
            )
            if new:
                self.path.chmod(0o600)
        except duckdb.IOException as err:
            if "lock" in str(err).lower():
                raise ProjectionBusy(
                    f"the projection {self.path} is open in another process",
                    hint="DuckDB allows one writer per file: stop the other projector, or query "
                    "through the process that holds it",
                    path=str(self.path),
                ) from err
            raise ProjectionError(f"cannot open {self.path}: {err}", path=str(self.path)) from err
        try:
            if not read_only:
                self._ensure_schema()
            self._check_version()
        except BaseException:
            self.con.close()
            raise

    @classmethod
    def open(cls, home: Path | str, *, read_only: bool = False) -> Store:
        """The projection of the data directory `home`. Opened for writing, a file of another
        schema version (code before an upgrade) is made again, empty, and the writer's catch-up
        from its source rebuilds it: the projection is derived from the log, so nothing is
        lost, and a service comes back after an upgrade without a manual step."""
        path = projection_path(home)
        try:
            return cls(path, read_only=read_only)
        except ProjectionOutdated as err:
            if read_only:
                raise
            log.warning("%s: made again from the log", err.message)
            for stale in (path, path.with_name(path.name + ".wal")):
                stale.unlink(missing_ok=True)
            return cls(path)

    def _ensure_schema(self) -> None:
        exists = scalar(
            self.con, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'tracking'"
        )
        if exists:
            self.con.execute(CHAIN_TABLE)  # files made before it existed get it empty
            return
        self.con.execute("BEGIN")
        self.con.execute(sql_text("schema.sql"))
        self.con.execute(CHAIN_TABLE)
        self.con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [SCHEMA_VERSION])
        self.con.execute("INSERT INTO tracking VALUES (?, 0, 0, 0)", [PROJECTION])
        self.con.execute("COMMIT")

    def _check_version(self) -> None:
        try:
            version = scalar(self.con, "SELECT value FROM meta WHERE key = 'schema_version'")
        except duckdb.CatalogException:
            version = None
        if version != SCHEMA_VERSION:
            raise ProjectionOutdated(
                f"the projection {self.path} has schema version "
                f"{version or 'none'}, this code needs {SCHEMA_VERSION}",
                hint="rebuild it from the event log (`gpuledger projection rebuild`)",
                path=str(self.path),
            )

    def empty(self) -> None:
        """Drop every view, macro and table of the projection and make its schema again, empty:
        a catch-up from the log then builds it again in place, beside readers on other cursors
        of this database (snapshot isolation). For a projection built on events the log no
        longer holds (a failover to a standby that never got them: `ServiceLoop`)."""
        con = self.con
        kinds = [
            ("VIEW", "SELECT view_name FROM duckdb_views() WHERE NOT internal "
                     "AND schema_name = 'main' AND NOT temporary"),
            ("MACRO TABLE", "SELECT DISTINCT function_name FROM duckdb_functions() WHERE NOT "
                            "internal AND schema_name = 'main' AND function_type = 'table_macro'"),
            ("MACRO", "SELECT DISTINCT function_name FROM duckdb_functions() WHERE NOT internal "
                      "AND schema_name = 'main' AND function_type = 'macro'"),
            ("TABLE", "SELECT table_name FROM duckdb_tables() WHERE NOT internal "
                      "AND schema_name = 'main' AND NOT temporary"),
        ]  # fmt: skip
        con.execute("BEGIN")
        try:
            for kind, query in kinds:
                for (name,) in con.execute(query).fetchall():
                    con.execute(f'DROP {kind} IF EXISTS "{name}"')
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        self._ensure_schema()

    def position(self) -> int:
        return int(
            scalar(self.con, "SELECT position FROM tracking WHERE projection = ?", [PROJECTION])
            or 0
        )

    def chain(self) -> str | None:
        """The chain hash of the last record applied (what the next record must link to): ""
        at position 0; None when unknown (a file made before the chain table existed)."""
        position = self.position()
        if position == 0:
            return ""
        try:
            found = scalar(
                self.con,
                "SELECT hash FROM chain WHERE projection = ? AND position = ?",
                [PROJECTION, position],
            )
        except duckdb.CatalogException:
            return None
        return None if found is None else str(found)

    def status(self) -> Status:
        return status_of(self.con)

    def beside(self) -> Store:
        """The same projection on a connection of its own (a DuckDB cursor of this one's
        database): another thread may read or write through it while this one is in use
        (snapshot isolation between the two)."""
        other = object.__new__(Store)
        other.path, other.read_only, other.con = self.path, self.read_only, self.con.cursor()
        return other

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def status_of(con: duckdb.DuckDBPyConnection) -> Status:
    """Where the projection on `con` (a Store's connection, or a cursor of its database)
    stands: position, events applied, unknown events (with their tags)."""
    rows = con.execute(
        "SELECT position, events, unknown_events FROM tracking WHERE projection = ?",
        [PROJECTION],
    ).fetchall()
    row = rows[0]
    tags = []
    if row[2]:  # only a projection that kept unknown events scans for their tags
        tags = con.execute(
            "SELECT tag, count(*) FROM events WHERE NOT known GROUP BY tag ORDER BY tag"
        ).fetchall()
    return Status(
        position=int(row[0]),
        events=int(row[1]),
        unknown_events=int(row[2]),
        unknown_tags={str(t): int(n) for t, n in tags},
    )
