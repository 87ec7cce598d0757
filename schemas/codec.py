"""One encoder and one decoder for the whole event vocabulary, built once at import."""

from __future__ import annotations

import msgspec

from schemas.errors import EventDecodeError
from schemas.events import TAGS, AnyEvent

_encoder = msgspec.json.Encoder(order="deterministic")
_decoder = msgspec.json.Decoder(AnyEvent)


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


def decode(data: bytes) -> AnyEvent:
    """Decode and validate one event; raise EventDecodeError saying whether the tag is known."""
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        tag = peek_tag(data)
        known = tag in TAGS
        what = (
            f"event {tag!r} is invalid"
            if known
            else (f"unknown event type {tag!r}" if tag else "bytes are not an event")
        )
        raise EventDecodeError(f"{what}: {e}", tag=tag, known=known) from e
