"""One encoder and one decoder for the whole event vocabulary, built once at import.

Upcasting lives here and only here: `decode` reads every stored version of an event and returns
its latest version, so no reader handles old versions. An upcaster is a pure function from the
older Struct to the newer one; the golden corpus under `tests/golden/` holds stored bytes of every
older version that must keep decoding.
"""

from __future__ import annotations

import msgspec

from schemas.digest import summarise
from schemas.errors import EventDecodeError
from schemas.events import TAGS, AnyEvent, CycleDecided, CycleDecidedV1, StoredEvent

_encoder = msgspec.json.Encoder(order="deterministic")
_decoder = msgspec.json.Decoder(StoredEvent)


class _TagOnly(msgspec.Struct):
    type: str | None = None


_tag_decoder = msgspec.json.Decoder(_TagOnly)


def encode(event: AnyEvent) -> bytes:
    """Canonical bytes of an event: the same event always gives the same bytes."""
    return _encoder.encode(event)


def peek_tag(data: bytes) -> str | None:
    """The event tag of raw bytes, or None when the bytes are not a JSON object with one."""
    try:
        return _tag_decoder.decode(data).type
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


# --- upcasters: older version -> latest version (pure) ------------------------------------------


def decided_v1_to_v2(ev: CycleDecidedV1) -> CycleDecided:
    """Pure: a v1 decision record as v2. Placements and preemptions become references (their
    `JobPlaced`/`JobPreempted` events follow the record in the log); the considered list becomes
    the compact summary with the same order digest replay computes; the rank inputs, which v1 did
    not record, are None."""
    return CycleDecided(
        event_id=ev.event_id,
        at=ev.at,
        actor=ev.actor,
        prev_hash=ev.prev_hash,
        cycle_id=ev.cycle_id,
        based_on=ev.based_on,
        policy_version=ev.policy_version,
        config=ev.config,
        decided_at=ev.decided_at,
        placed=tuple(p.job_id for p in ev.placements),
        preempted=tuple(p.job_id for p in ev.preemptions),
        waiting=summarise(ev.considered),
        fragmentation_gpus=ev.fragmentation_gpus,
        wake_at=ev.wake_at,
    )


def upcast(event: StoredEvent) -> AnyEvent:
    """Pure: the latest version of a decoded event (the event itself when it is the latest)."""
    if isinstance(event, CycleDecidedV1):
        return decided_v1_to_v2(event)
    return event


def decode(data: bytes) -> AnyEvent:
    """Decode and validate one event, upcast to its latest version; raise EventDecodeError saying
    whether the tag is known."""
    try:
        event = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        tag = peek_tag(data)
        known = tag in TAGS
        what = (
            f"event {tag!r} is invalid"
            if known
            else (f"unknown event type {tag!r}" if tag else "bytes are not an event")
        )
        raise EventDecodeError(f"{what}: {e}", tag=tag, known=known) from e
    return upcast(event)
