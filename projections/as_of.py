"""The projection as of a log position: what replay ranks a decision from without catching a
projection up to exactly that position. An edge: DuckDB connections and SQL.

Every table fair share reads is append-only by position, so the rows a projection that has run
ahead of P holds with position <= P (intervals closed after P reopened) are the rows it held at P
(`AS_OF_SQL`). `AsOf` reads replay's own in-memory projection that way; `DiskAsOf` reads the data
directory's projection, read-only, for a position only where it is anchored to the log.
"""

from __future__ import annotations

from pathlib import Path

from projections.store import Store

AS_OF_SCHEMA = "replay_at"


def _views(view: str, source: str, refused: tuple[str, ...]) -> str:
    """The as-of views (`CREATE OR REPLACE {view}<table>`) over the tables of `source` (a
    schema, `main` or `<db>.main`); the tables in `refused` change in place: reading them is
    an error."""
    at = "getvariable('replay_position')"
    kept = "".join(
        f"CREATE OR REPLACE {view}{t} AS\nSELECT * FROM {source}.{t} WHERE position <= {at};\n"
        for t in ("account_history", "node_history", "events")
    )
    refuse = "".join(
        f"CREATE OR REPLACE {view}{t} AS\nSELECT x.* FROM {source}.{t} x, "
        f"(SELECT error('{t} cannot be read as of a position')) e;\n"
        for t in refused
    )
    return f"""
-- an interval as the projection at P has it: opened at or before P, open if it closed after P
CREATE OR REPLACE {view}job_intervals AS
SELECT * REPLACE (
    CASE WHEN end_position <= {at} THEN end_position END AS end_position,
    CASE WHEN end_position <= {at} THEN end_at END AS end_at,
    CASE WHEN end_position <= {at} THEN end_reason END AS end_reason,
    CASE WHEN run_start_position <= {at} THEN run_start_position END AS run_start_position,
    CASE WHEN run_start_position <= {at} THEN run_start_at END AS run_start_at,
    CASE WHEN run_end_position <= {at} THEN run_end_position END AS run_end_position,
    CASE WHEN run_end_position <= {at} THEN run_end_at END AS run_end_at)
FROM {source}.job_intervals WHERE start_position <= {at};
{kept}{refuse}"""


AS_OF_SQL = f"CREATE SCHEMA IF NOT EXISTS {AS_OF_SCHEMA};" + _views(
    f"VIEW {AS_OF_SCHEMA}.", "main", ("jobs", "tracking")
)
"""The projection *as of position P*, read from a projection that has run ahead of P.

Every table fair share reads is append-only by position: `account_history` rows are written at
their event's position and never change; a `job_intervals` row is written at its JobPlaced
position and changes three times at most, when its run starts (at `run_start_position`), when
the releasing event (at `end_position`) closes it and when a stopped run's end is reported (at
`run_end_position`). So the rows
with position <= P, with intervals closed after P reopened, are exactly the rows the projector
has after catching up to P. `jobs` and `tracking` change in place and are refused."""


class AsOf(Store):
    """A connection (cursor) on the in-memory projection that resolves the read models to the
    as-of views (`search_path`), positioned with `at(position)`. Read only by convention; one
    per thread (DuckDB variables and settings belong to a connection)."""

    def __init__(self, store: Store) -> None:  # no super().__init__: it opens a database
        self.path = store.path
        self.read_only = True
        self.con = store.con.cursor()
        self.con.execute(f"SET search_path = '{AS_OF_SCHEMA},main'")

    def at(self, position: int) -> None:
        self.con.execute(f"SET VARIABLE replay_position = {int(position)}")


class DiskAsOf(Store):
    """The data directory's projection, opened read-only and read *as of* a position through
    temporary views that shadow its tables (`_temp_views_sql`), anchored to the log: it is used
    for position P only when it has caught up to P and its stored bytes at P are the log's."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, read_only=True)
        self.caught_up = self.position()
        (db,) = self.con.execute("SELECT current_database()").fetchone() or ("",)
        self.db = str(db)
        self.con.execute(_temp_views_sql(self.db))
        self.anchored: dict[int, bool] = {}

    def at(self, position: int) -> None:
        self.con.execute(f"SET VARIABLE replay_position = {int(position)}")

    def holds(self, position: int, data: bytes) -> bool:
        """Whether the projection has caught up to `position` with exactly `data` there."""
        if position > self.caught_up:
            return False
        known = self.anchored.get(position)
        if known is None:
            row = self.con.execute(
                f"SELECT raw FROM {self.db}.main.events WHERE position = ?", [position]
            ).fetchone()
            raw = None if row is None else row[0]
            stored = raw.encode() if isinstance(raw, str) else raw
            known = self.anchored[position] = stored == data
        return known


def _temp_views_sql(db: str) -> str:
    """`AS_OF_SQL` as temporary views over the catalog `db` (a read-only database cannot hold
    a new schema; temporary views shadow its tables, also inside its macros)."""
    return _views("TEMP VIEW ", f"{db}.main", ("jobs",))
