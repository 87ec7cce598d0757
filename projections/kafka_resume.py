"""Where a Kafka reader resumes, and what it says of a second record for a position: the pure
parts of `projections.kafka_source.KafkaSource` (split from it at its 800-line limit).

Pure: no I/O; records are anything with `headers`, `value` and `offset` (kafka-python's).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from projections.chain import Tip, names
from projections.errors import LogForked
from projections.kafka_wire import envelope

RECENT = 256
"""How many of the last accepted records a reader remembers, to name a second record for one of
their positions (a fork, or a copy)."""


def head_of(positions: Iterable[int | None], after: int) -> int:
    """Pure: the head of a log whose records up to position `after` are followed by records
    carrying `positions` (None: none readable): the largest, or one past it when the last one
    is not the one that carries it (poison at the tail: a reader reading to the head meets it)."""
    best = after
    last: int | None = after
    for last in positions:
        if last is not None and last > best:
            best = last
    return best if last == best else best + 1


def first_anchored(
    records: Iterable[Any], after: int, want: str
) -> tuple[Any, list[tuple[Tip, int]]] | None:
    """Pure: the first record, in the order given (offsets), at position `after` whose link
    the anchor `want` names, with the records before it that it links back to, newest first (up
    to `RECENT`, as (tip, offset)); None when there is none. Later records that the anchor
    names too are exact copies (the same bytes, so the same link): never the resume point."""
    seen: dict[int, list[tuple[Tip, int, bytes]]] = {}
    for rec in records:
        position, tag, _problem = envelope(rec.headers, rec.value, None)
        if position is None or tag is None or rec.value is None:
            continue
        if after - RECENT <= position < after and len(seen.get(position, ())) < 8:
            seen.setdefault(position, []).append(
                (Tip.of(position, tag, rec.value), rec.offset, rec.value)
            )
        if position == after and names(want, position, tag, rec.value):
            linked: list[tuple[Tip, int]] = []
            data = rec.value
            for p in range(after - 1, max(0, after - RECENT), -1):
                chained = [c for c in seen.get(p, ()) if c[0].problem(data) is None]
                if not chained:
                    break
                linked.append((chained[-1][0], chained[-1][1]))
                data = chained[-1][2]
            return rec, linked
    return None


def fork_error(
    topic: str, position: int, offset: int, first: int | None, signed: bool
) -> LogForked:
    """Pure: the error for a record at `offset` that claims `position` and links to the record
    before it like the record applied there (at offset `first`, None: not remembered); `signed`:
    the reader verified both with its keys."""
    at = "" if first is None else f" (offset {first})"
    said = (
        f"topic {topic} forks at position {position}: the record at offset {offset} "
        f"claims it too and links to position {position - 1} like the record applied{at}; "
    )
    if not signed:
        said += "one of them was not written by the relay"
        hint = (
            "turn on signing (GPULEDGER_KAFKA_SIGNING_KEYS) so a reader tells the relay's "
            "record, then rebuild this projection; find the producer that wrote the other"
        )
    else:  # both verified: it said "turn on signing" to a reader with keys (atk52-ha F2)
        said += (
            "both carry the relay's signature: two relays of this ledger published "
            "different events for it (a deposed leader's relay published a commit that a "
            "failover to a standby lost, then the new leader's relay its own event there: "
            "relays before s52, atk52-ha F1), or another producer holds the relay's keys"
        )
        hint = (
            f"the records from offset {offset} on are the later relay's; this topic "
            "holds two logs: publish to a new topic (the relay writes the whole log there) "
            "and read or restore from it, or restore the store from the promoted database"
        )
    return LogForked(said, hint=hint, topic=topic, position=position, offset=offset)
