"""Replay checkpoints: the write side of a replay (the live state and the utilisation trackers) at
a log position, kept beside the store so a later replay starts near the decision it checks. An
edge: one SQLite file; a cache (deleting it only makes replay slower).

A checkpoint is trusted only under the service's state key (`ledger.store.snapshots.state_key`,
as snapshots are): its chain hash says *where* in the log it stands, not that its state is the
fold of the log up to there, so one written by someone with file access (a forged state anchored
at a real position) would make a targeted replay certify a tampered decision (atk33-26 F2).
Without the key no checkpoint is written or read: replay folds from the start.
"""

from __future__ import annotations

import hashlib
import hmac
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
    mac: str = ""
    """HMAC-SHA256 of the rest under the service's state key ("": none, never trusted)."""


_checkpoint_encoder = msgspec.msgpack.Encoder()
_checkpoint_decoder = msgspec.msgpack.Decoder(Checkpoint)


def _mac(key: bytes, checkpoint: Checkpoint) -> str:
    body = _checkpoint_encoder.encode(msgspec.structs.replace(checkpoint, mac=""))
    return hmac.new(key, b"gpuledger.replay-checkpoint.v1\0" + body, hashlib.sha256).hexdigest()


class Checkpoints:
    """Replay checkpoints in `<home>/replay-checkpoints.sqlite` (position, checkpoint bytes),
    signed and checked under `key` (None: none written, none read)."""

    def __init__(self, path: Path, key: bytes | None) -> None:
        self.key = key
        self.con = sqlite3.connect(path, timeout=30, isolation_level=None)
        self.con.execute(
            "CREATE TABLE IF NOT EXISTS checkpoints (position INTEGER PRIMARY KEY, data BLOB)"
        )

    def put(self, checkpoint: Checkpoint) -> None:
        if self.key is None:
            return
        signed = msgspec.structs.replace(checkpoint, mac=_mac(self.key, checkpoint))
        self.con.execute(
            "INSERT OR REPLACE INTO checkpoints VALUES (?, ?)",
            (checkpoint.position, _checkpoint_encoder.encode(signed)),
        )

    def before(self, position: int) -> Iterator[Checkpoint]:
        """Checkpoints at or before `position` that verify under the key, newest first
        (unreadable or unsigned ones skipped, with a warning)."""
        if self.key is None:
            return
        rows = self.con.execute(
            "SELECT data FROM checkpoints WHERE position <= ? ORDER BY position DESC LIMIT 8",
            (position,),
        ).fetchall()
        for (data,) in rows:
            try:
                cp = _checkpoint_decoder.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as err:
                log.warning("replay checkpoint skipped: %s", err)
                continue
            if not cp.mac or not hmac.compare_digest(cp.mac, _mac(self.key, cp)):
                log.warning(
                    "replay checkpoint at %d skipped: not signed with the service's state key",
                    cp.position,
                )
                continue
            yield cp

    def positions(self) -> list[int]:
        return [r[0] for r in self.con.execute("SELECT position FROM checkpoints ORDER BY 1")]

    def close(self) -> None:
        self.con.close()
