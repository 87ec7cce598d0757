"""Compare a projection with a clean rebuild or with the Python reference, table by table.

`dump` reads every read-model table in key order as plain rows; `reference_dump` gives the same
shape from a `reference.RefState`. Two dumps are equal exactly when the projections hold the same
rows (floats compared exactly: both sides copy the events' own values). Used by the tests and by
the reliability benchmark; also a way to check a projection by hand against a fresh fold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb

from projections.store import READ_MODELS, Store
from projections.testing.reference import RefState

Row = dict[str, Any]

# table -> the columns that order it (a key)
TABLES: dict[str, str] = {"tracking": "projection", **READ_MODELS}

_JSON_COLUMNS = {"events": ("raw",), "decisions": ("policy",)}


def dump(store: Store, tables: tuple[str, ...] | None = None) -> dict[str, list[Row]]:
    """Every row of the read-model tables, in key order, JSON columns parsed."""
    out = {}
    for table in tables or tuple(TABLES):
        cur = store.con.execute(f"SELECT * FROM {table} ORDER BY {TABLES[table]}")
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        for col in _JSON_COLUMNS.get(table, ()):
            for r in rows:
                if r[col] is not None:
                    r[col] = json.loads(r[col])
        out[table] = rows
    return out


REFERENCE_TABLES = (
    "account_history",
    "node_history",
    "jobs",
    "job_intervals",
    "preemptions",
    "decisions",
)


def reference_dump(ref: RefState) -> dict[str, list[Row]]:
    """The reference's rows in the shape of `dump` (the tables the reference keeps)."""
    return {
        "account_history": sorted(ref.account_history, key=lambda r: (r["position"], r["account"])),
        "node_history": sorted(ref.node_history, key=lambda r: (r["position"], r["node"])),
        "jobs": [ref.jobs[k] for k in sorted(ref.jobs)],
        "job_intervals": sorted(ref.intervals, key=lambda r: r["start_position"]),
        "preemptions": sorted(ref.preemptions, key=lambda r: r["position"]),
        "decisions": sorted(ref.decisions, key=lambda r: r["position"]),
    }


def differences(a: dict[str, list[Row]], b: dict[str, list[Row]], limit: int = 5) -> list[str]:
    """Human-readable differences between two dumps (empty when equal)."""
    out: list[str] = []
    for table in sorted(set(a) | set(b)):
        ra, rb = a.get(table), b.get(table)
        if ra is None or rb is None:
            out.append(f"{table}: only on one side")
            continue
        if len(ra) != len(rb):
            out.append(f"{table}: {len(ra)} rows against {len(rb)}")
        for i, (x, y) in enumerate(zip(ra, rb, strict=False)):
            if x != y:
                cols = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
                out.append(
                    f"{table} row {i}: "
                    + ", ".join(f"{c}: {x.get(c)!r} != {y.get(c)!r}" for c in cols)
                )
                if len(out) >= limit:
                    return out
    return out


def compare_files(a: Path | str, b: Path | str) -> dict[str, tuple[int, int]]:
    """Rows only in `a` and only in `b`, per read-model table, for two projection files.

    Set difference with multiplicity (EXCEPT ALL) inside DuckDB, so it stays fast on millions of
    rows. Neither file may be open read-write in another process.
    """
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{a}' AS a (READ_ONLY)")
        con.execute(f"ATTACH '{b}' AS b (READ_ONLY)")
        out = {}
        for table in TABLES:
            only_a = con.execute(
                f"SELECT count(*) FROM (FROM a.{table} EXCEPT ALL FROM b.{table})"
            ).fetchall()[0][0]
            only_b = con.execute(
                f"SELECT count(*) FROM (FROM b.{table} EXCEPT ALL FROM a.{table})"
            ).fetchall()[0][0]
            out[table] = (int(only_a), int(only_b))
        return out
    finally:
        con.close()
