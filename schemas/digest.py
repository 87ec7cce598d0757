"""Digests and summaries that decision records carry instead of copies.

Pure: values in, values out. A decision record names its rank inputs and its order by digest;
replay recomputes the digests from what it rebuilds, so a record stays small and a difference
still shows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import msgspec

from schemas.events import Considered, WaitCount, WaitingJob, WaitSummary

WAITING_LISTED = 64
"""How many waiting jobs a decision record names (in order, with their codes); the rest are
counted per code and covered by the order digest."""

_encoder = msgspec.json.Encoder(order="deterministic")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rank_digest(ranks: Mapping[str, int], level_fs: Mapping[str, float]) -> str:
    """Pure: the digest of the ranks a cycle ordered by (account -> rank, account -> level fair
    share), independent of the mappings' order. Infinite level fair shares hash as `null`."""
    return _sha256(_encoder.encode((sorted(ranks.items()), sorted(level_fs.items()))))


def order_digest(considered: Sequence[Considered]) -> str:
    """Pure: the digest of a cycle's whole order: each considered job's id, sort key, code and
    reason text, in order."""
    return _sha256(_encoder.encode([(c.job_id, c.sort_key, c.code, c.reason) for c in considered]))


def summarise(considered: Sequence[Considered], listed: int = WAITING_LISTED) -> WaitSummary:
    """Pure: the compact form of a cycle's considered jobs (see `WaitSummary`)."""
    first: list[WaitingJob] = []
    counts: dict[str, int] = {}
    for c in considered:
        if c.code is None and c.reason is None:
            continue  # placed
        code = c.code or "WAIT"
        counts[code] = counts.get(code, 0) + 1
        if len(first) < listed:
            first.append(WaitingJob(c.job_id, code))
    return WaitSummary(
        considered=len(considered),
        first=tuple(first),
        counts=tuple(WaitCount(k, v) for k, v in sorted(counts.items())),
        order_digest=order_digest(considered),
    )
