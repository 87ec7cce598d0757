"""Exactly once under SIGKILL: the projector process is killed at random points of a catch-up,
again and again; after each kill the projection equals a clean build up to the same position.

A synthetic log (written straight into the SQLite store) is projected in small batches by a child
process; the test kills it at a random point (after 0 to 2 committed batches, plus a random part
of the next one: while reading, decoding, applying or committing), reopens the file (DuckDB replays
its WAL), reads the tracked position P and compares every table, row for row, with a clean
projection of the first P events. At the end one more run finishes the catch-up and the whole
projection equals a clean rebuild.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from ledger.store.embedded import EmbeddedSource, project
from projections.projector import Projector
from projections.store import Store, projection_path
from projections.testing import compare as audit
from projections.testing.synthetic import Shape, append_to_store, synthetic_events

KILLS = 20
EVENTS = 50_000
BATCH = 500
SEED = 20261129

_CTX = multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(["projections.projector"])
"""Children fork from a server that has imported DuckDB, Arrow and msgspec once: a new projector
process starts in milliseconds, so the kills land inside the catch-up, not in interpreter start."""


def child_main(home: Path, position: Any) -> None:
    """The projector process: catch up in small batches, publishing each committed position."""

    def progress(pos: int, head: int) -> None:
        position.value = pos

    project(home, batch_size=BATCH, progress=progress)


def run_child(home: Path, rng: random.Random, start: int) -> bool:
    """Run one projector process and SIGKILL it at a random point: after 0 to 2 committed batches,
    a random fraction of a batch later. True if it was killed before finishing."""
    position = _CTX.Value("q", start)
    child = _CTX.Process(target=child_main, args=(home, position))
    child.start()
    assert child.pid is not None
    wanted = start + BATCH * rng.randint(0, 2)
    deadline = time.monotonic() + 120
    while position.value < wanted and child.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.002)
    child.join(timeout=rng.uniform(0.0, 0.2))
    if child.exitcode is not None:
        assert child.exitcode == 0
        return False
    os.kill(child.pid, signal.SIGKILL)
    child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL
    return True


def test_sigkill_at_random_points_never_loses_or_repeats_an_event(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    home = tmp_path / "home"
    head = append_to_store(home, synthetic_events(EVENTS, seed=SEED, shape=Shape(nodes=32)))
    clean_path = tmp_path / "clean.duckdb"
    kills, position, positions = 0, 0, []
    while kills < KILLS:
        killed = run_child(home, rng, position)
        with Store.open(home) as store:
            position = store.position()
        with EmbeddedSource(home) as src, Store(clean_path) as clean:
            Projector(clean, src, batch_size=5_000).catch_up(until=position)
            assert clean.position() == position
        diff = audit.compare_files(projection_path(home), clean_path)
        assert diff == dict.fromkeys(audit.TABLES, (0, 0)), f"after kill {kills} at {position}"
        kills += killed
        positions.append(position)
        assert position < head, "the log is too short for the kills: raise EVENTS"
    project(home)  # the last restart catches up
    with EmbeddedSource(home) as src, Store(clean_path) as clean:
        Projector(clean, src).catch_up()
    assert audit.compare_files(projection_path(home), clean_path) == dict.fromkeys(
        audit.TABLES, (0, 0)
    )
    with Store.open(home, read_only=True) as store:
        assert store.position() == head
    assert len(set(positions)) >= KILLS // 4, f"kills should land at many places: {positions}"
