"""Replay checkpoints: the write side of a replay (the live state and the utilisation trackers) at
a log position, kept beside the store so a later replay starts near the decision it checks. An
edge: one SQLite file; a cache (deleting it only makes replay slower).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import msgspec

from ledger.store.snapshots import Folded

log = logging.getLogger("gpuledger.replay")

CHECKPOINTS_DB = "replay-checkpoints.sqlite"
"""Beside the store in the data directory: a cache (deleting it only makes replay slower)."""
CHECKPOINT_EVERY = 50_000
"""A replay walking the log stores a checkpoint once this many events past the last one."""


class Tracked(msgspec.Struct, frozen=True, array_like=True):
    """One utilisation tracker: its squat threshold and since when each job has been low."""

    threshold_pct: float
    low_since: list[tuple[int, float]]


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """The write side of a replay at `position`: the live state and the utilisation trackers,
    anchored to the log by `chain_hash` (the chain link to the stored event at `position`,
    `projections.chain.link`; v1 in older checkpoints)."""

    position: int
    chain_hash: str
    state: Folded
    trackers: list[Tracked]


_checkpoint_encoder = msgspec.msgpack.Encoder()
_checkpoint_decoder = msgspec.msgpack.Decoder(Checkpoint)


class Checkpoints:
    """Replay checkpoints in `<home>/replay-checkpoints.sqlite` (position, checkpoint bytes)."""

    def __init__(self, path: Path) -> None:
        self.con = sqlite3.connect(path, timeout=30, isolation_level=None)
        self.con.execute(
            "CREATE TABLE IF NOT EXISTS checkpoints (position INTEGER PRIMARY KEY, data BLOB)"
        )

    def put(self, checkpoint: Checkpoint) -> None:
        self.con.execute(
            "INSERT OR REPLACE INTO checkpoints VALUES (?, ?)",
            (checkpoint.position, _checkpoint_encoder.encode(checkpoint)),
        )

    def before(self, position: int) -> Iterator[Checkpoint]:
        """Checkpoints at or before `position`, newest first (unreadable ones skipped)."""
        rows = self.con.execute(
            "SELECT data FROM checkpoints WHERE position <= ? ORDER BY position DESC LIMIT 8",
            (position,),
        ).fetchall()
        for (data,) in rows:
            try:
                yield _checkpoint_decoder.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as err:
                log.warning("replay checkpoint skipped: %s", err)

    def positions(self) -> list[int]:
        return [r[0] for r in self.con.execute("SELECT position FROM checkpoints ORDER BY 1")]

    def close(self) -> None:
        self.con.close()
