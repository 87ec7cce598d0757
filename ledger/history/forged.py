"""The anchors `audit verify` cannot take on trust: the store's snapshots and the projection's
rows, each checked against a fold of the log itself (a snapshot's digest, even its MAC, can be
made by whoever holds the store and the key; the fold cannot be argued with).

The second and third stages of `tamper.verify_store` (`tamper.STAGES`): each tells its progress
(`tamper.Steps`: events folded of the position it checks) at every page, so a bar moves while
it runs and a caller who left stops it within a page (the server's audit lane raises from it).

Edges: they read the store and the projection.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ledger.history.tamper import ChainProblem, Steps
from ledger.store import snapshots
from ledger.store.locate import open_source
from ledger.store.snapshots import STREAM_ID
from projections.source import follow
from projections.store import Store, projection_path

if TYPE_CHECKING:
    import duckdb

FOLD_PAGE = 5_000
"""Events read at a time by the snapshots' fold: a progress step, and a stop checked, per page."""

BUILD_BATCH = 16_384
"""Events per batch of the projection's fresh build (a progress step and a stop checked per
batch: ~0.3 s on a 2-core machine; the projector's own batches, 122,880 events, took ~6 s)."""


def snapshot_problems(home: Path, progress: Steps | None = None) -> list[ChainProblem]:
    """Edge: each stored snapshot whose state is not the fold of the log up to its position
    (forged or edited). One fold of the log up to the newest snapshot, compared at each;
    `progress` is told ("snapshots", events folded, the newest snapshot's position)."""
    from ledger.core.evolve import evolve
    from ledger.core.state import State
    from ledger.store.live import decode_at

    with open_source(home) as source:
        found = []
        out: list[ChainProblem] = []
        for data in source.snapshots(STREAM_ID.hex, snapshots.KEEP):
            try:
                found.append(snapshots.decode(data))
            except snapshots.SnapshotError as e:  # never used, but an edit all the same (F5)
                out.append(_unreadable(data, e))
        if not found:
            return out
        found.sort(key=lambda got: got[0].position)
        total = found[-1][0].position
        if progress is not None:
            progress("snapshots", 0, total)
        state, position = State(live_only=True), 0
        for snap, held in found:
            if snap.position > position:
                for records in follow(source, position, snap.position, page=FOLD_PAGE):
                    for r in records:
                        evolve(state, decode_at(r.position, r.data))
                        position = r.position
                    if progress is not None:
                        progress("snapshots", position, total)
            if position != snap.position or not snapshots.same(state, held):
                out.append(
                    ChainProblem(
                        position=snap.position,
                        kind="edited",
                        detail="the snapshot stored for this position is not the fold of the "
                        "log up to it: it was forged or edited (a start refuses it)",
                    )
                )
        return out


def _unreadable(data: bytes, e: snapshots.SnapshotError) -> ChainProblem:
    """Pure: a stored snapshot that does not read (its payload digest differs, or its bytes are
    not a snapshot), named as an edit: a start skips it with a warning, and `audit verify` said
    nothing, "chain intact" (atk47-25 F5)."""
    named = snapshots.anchors([data])
    position = named[0][0] if named else 0
    return ChainProblem(
        position=position,
        kind="edited",
        detail=f"a stored snapshot does not read ({e}): it was edited (a start skips it)",
    )


def projection_problems(
    home: Path, con: duckdb.DuckDBPyConnection, progress: Steps | None = None
) -> list[ChainProblem]:
    """Edge: where the projection `con` reads (the dispatcher ranks from its usage) differs from
    a fresh build of the log up to the projection's position: one problem per read-model table
    that differs, naming its first differing row by key (an edit of `job_intervals.gpus` changes
    fair share and is in no event). Empty when they hold the same rows. `progress` is told
    ("projection", events built, the projection's position)."""
    con.execute("BEGIN TRANSACTION")  # one snapshot of every table, whatever applies beside
    try:
        return _projection_differs(home, con, progress)
    finally:
        con.execute("ROLLBACK")


def _projection_differs(
    home: Path, con: duckdb.DuckDBPyConnection, progress: Steps | None
) -> list[ChainProblem]:
    from projections.projector import Projector
    from projections.store import READ_MODELS

    got = con.execute("SELECT max(position) FROM tracking").fetchone()
    position = int(got[0]) if got and got[0] else 0
    if not position:
        return []
    out: list[ChainProblem] = []
    with open_source(home) as source, Store(":memory:") as fresh:
        build = Projector(fresh, source, batch_size=BUILD_BATCH)
        if progress is not None:
            progress("projection", 0, position)
        build.catch_up(
            until=position,
            progress=None
            if progress is None
            else lambda done, _: progress("projection", done, position),
        )
        for table, key in READ_MODELS.items():
            sql = f"SELECT {key}, hash(t) FROM {table} t ORDER BY {key}"
            mine, want = con.execute(sql).fetchall(), fresh.con.execute(sql).fetchall()
            if mine == want:
                continue
            at = next(
                (i for i, (a, b) in enumerate(zip(mine, want, strict=False)) if a != b),
                min(len(mine), len(want)),
            )
            row = mine[at] if at < len(mine) else want[at]
            names = [k.strip() for k in key.split(",")]
            where = ", ".join(f"{n} {v}" for n, v in zip(names, row, strict=False))
            out.append(
                ChainProblem(
                    position=position,
                    kind="edited",
                    detail=f"the projection's {table} differs from the log's fold: first at "
                    f"{where} ({len(mine):,} rows against {len(want):,}); rebuild it "
                    "(`gpuledger projection rebuild`) and find who edited it",
                )
            )
    return out


def projection_rows(
    home: Path, con: duckdb.DuckDBPyConnection | None, progress: Steps | None = None
) -> list[ChainProblem]:
    """Edge: `projection_problems` through `con`, else of `home`'s projection file opened
    read-only (none when there is no file, or a running service holds it: it checks its own)."""
    if con is not None:
        return projection_problems(home, con, progress)
    from projections.errors import ProjectionError

    if not projection_path(home).exists():
        return []
    try:
        with Store.open(home, read_only=True) as store:
            return projection_problems(home, store.con, progress)
    except ProjectionError:
        return []  # a running service holds it: it checks its own
