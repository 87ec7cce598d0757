"""The hash chain: what links each stored event to the one before it, and how a reader checks it.

Every stored event carries `prev_hash`, the SHA-256 (hex) of the previous event's stored bytes
(the first event ""): `chain_hash` is that link, stated once for everyone who computes it (the
writer, `ledger.store.application`, chaining what it appends; snapshots and replay checkpoints
anchored to a position; the audit recomputing the chain; every reader of a copy). A copy of the
log (the Kafka topic) can be checked record by record against the last record applied: the next
record must carry the next position and link to that record's bytes (`broken_link`). A record
that does not is not part of the log (another producer wrote it), whatever its headers say.

The chain alone cannot tell the relay from someone who read the topic and computed the right
`prev_hash`; a signature can (`projections.kafka_wire.SigningKeys`).

Pure. This module never imports `ledger`.
"""

from __future__ import annotations

import hashlib

import msgspec


def chain_digest(stored: bytes) -> bytes:
    """Pure: the link to the next event as 32 raw bytes (what `chain_hash` spells in hex)."""
    return hashlib.sha256(stored).digest()


def chain_hash(stored: bytes) -> str:
    """Pure: the link to the next event: SHA-256 of an event's stored bytes, hex (what the next
    event's `prev_hash` holds)."""
    return hashlib.sha256(stored).hexdigest()


class _Link(msgspec.Struct):
    prev_hash: str | None = None


_link_decoder = msgspec.json.Decoder(_Link)


def prev_hash(data: bytes | None) -> str | None:
    """Pure: the `prev_hash` an event's bytes carry, read without decoding the event; None when
    they are not a JSON object with a string `prev_hash` (the writer always writes one)."""
    if data is None:
        return None
    try:
        return _link_decoder.decode(data).prev_hash
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def broken_link(data: bytes | None, previous: int, previous_hash: str) -> str | None:
    """Pure: why the record `data` does not continue the chain after the record at position
    `previous` whose bytes hash to `previous_hash` (None: it does)."""
    link = prev_hash(data)
    if link is None:
        return "no readable prev_hash in the value"
    if link != previous_hash:
        at = f"position {previous}" if previous else "the start of the log"
        return f"prev_hash {_short(link)} does not match {at} (hash {_short(previous_hash)})"
    return None


def _short(digest: str) -> str:
    return f'"{digest[:16]}..."' if len(digest) > 16 else f'"{digest}"'
