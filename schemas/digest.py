"""Digests and summaries that decision records carry instead of copies.

Pure: values in, values out. A decision record names its rank inputs and its order by digest;
replay recomputes the digests from what it rebuilds, so a record stays small and a difference
still shows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from schemas.bounds import SortKey
from schemas.events import Considered, WaitCount, Waiting, WaitingJob, WaitSummary

WAITING_LISTED = 64
"""How many waiting jobs a decision record names (in order, with their codes); the rest are
counted per code and covered by the order digest."""

_encoder = msgspec.json.Encoder(order="deterministic")
_packer = msgspec.msgpack.Encoder()


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


Run = tuple[int, int, str, str]
"""`(start, stop, code, reason text)`: the jobs at `order[start:stop]` all waited for one reason."""


def canonical_runs(runs: Iterable[Run]) -> list[Run]:
    """Pure: `runs` (in order, not overlapping) with adjacent runs of the same code and text
    merged, so that one per-job reading gives one list of runs whoever cut them."""
    out: list[Run] = []
    for start, stop, code, text in runs:
        if start == stop:
            continue
        if out and out[-1][1] == start and out[-1][2] == code and out[-1][3] == text:
            out[-1] = (out[-1][0], stop, code, text)
        else:
            out.append((start, stop, code, text))
    return out


def runs_digest(ids: Sequence[int], keys: Sequence[SortKey], runs: Sequence[Run]) -> str:
    """Pure: the digest of a cycle's whole order as `cycle.decided.v4` records it: the considered
    jobs' ids and their sort keys, in order, then the canonical runs of waiting jobs (start, stop,
    code, reason text), as MessagePack (floats as their 8 bytes, never formatted as text). The
    same facts as `order_digest`, without a record per job."""
    return _sha256(_packer.encode((ids, keys, runs)))


def summarise_runs(
    ids: Sequence[int],
    keys: Sequence[SortKey],
    runs: Iterable[Run],
    listed: int = WAITING_LISTED,
) -> Waiting:
    """Pure: the compact form of a cycle's considered jobs (`ids` and their sort `keys`, in
    order) and why those not placed waited (`runs`), as `cycle.decided.v4` records it
    (`Waiting`). Reads each run once, and the order only for its first `listed` waiting jobs
    and the digest."""
    merged = canonical_runs(runs)
    first: list[WaitingJob] = []
    counts: dict[str, int] = {}
    for start, stop, code, _ in merged:
        counts[code] = counts.get(code, 0) + stop - start
        for i in range(start, min(stop, start + listed - len(first))):
            first.append(WaitingJob(ids[i], code))
    return Waiting(
        considered=len(ids),
        first=tuple(first),
        counts=tuple(WaitCount(k, v) for k, v in sorted(counts.items())),
        order_digest=runs_digest(ids, keys, merged),
        runs=len(merged),
        digest_of="runs",
    )


def summary_of(considered: Sequence[Considered]) -> Waiting:
    """Pure: a v3 summary (`summarise`, one digest entry per job) as v4's `Waiting`, with
    `digest_of="jobs"`: how a record upcast from v3 or older reads, and what replay recomputes
    for one."""
    s = summarise(considered)
    return Waiting(
        considered=s.considered,
        first=s.first,
        counts=s.counts,
        order_digest=s.order_digest,
        digest_of="jobs",
    )
