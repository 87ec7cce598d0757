"""The hash chain: what links each stored event to the one before it, and how a reader checks it.

Every stored event carries `prev_hash`, the SHA-256 (hex) of the previous event's stored bytes
(the first event ""): `chain_hash` is that link, stated once for everyone who computes it (the
writer, `ledger.store.application`, chaining what it appends; snapshots and replay checkpoints
anchored to a position; the audit recomputing the chain; every reader of a copy). A copy of the
log (the Kafka topic) can be checked record by record against the last record applied: the next
record must carry the next position and link to that record's bytes (`broken_link`). A record
that does not is not part of the log (another producer wrote it), whatever its headers say.

The chain alone cannot tell the relay from someone who read the topic and computed the right
`prev_hash`. *Signing* can: the relay adds an HMAC-SHA256 of the stored bytes under a key it
shares with the readers, named by a key id so keys can be rotated (readers accept every id they
know, the relay signs with one). Keys come from `GPULEDGER_KAFKA_SIGNING_KEYS`
(`id:secret[,id:secret...]`, the first is the one the relay signs with); without it nothing is
signed or checked.

Pure, except `signing_keys()`, which reads the environment. This module never imports `ledger`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import msgspec

from schemas.errors import InvalidCommand

SIGNATURE_HEADER = "gpuledger.sig"
"""HMAC-SHA256 (hex) of the record's value under the key named by KEY_HEADER."""
KEY_HEADER = "gpuledger.key"
"""The id of the signing key."""
KEYS_ENV = "GPULEDGER_KAFKA_SIGNING_KEYS"


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


# --- signing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SigningKeys:
    """Named HMAC keys: `signer` signs, every key in `keys` verifies."""

    keys: Mapping[str, bytes]
    signer: str

    def sign(self, data: bytes) -> list[tuple[str, bytes]]:
        """Pure: the headers that sign `data` with the signer's key."""
        mac = hmac.new(self.keys[self.signer], data, hashlib.sha256).hexdigest()
        return [(KEY_HEADER, self.signer.encode()), (SIGNATURE_HEADER, mac.encode())]

    def problem(
        self, headers: Iterable[tuple[str, bytes | None]] | None, data: bytes
    ) -> str | None:
        """Pure: why a record is not signed by one of our keys (None: it is)."""
        ids = [v for k, v in headers or () if k == KEY_HEADER]
        sigs = [v for k, v in headers or () if k == SIGNATURE_HEADER]
        if not ids or not sigs:
            return "not signed (no gpuledger.key / gpuledger.sig header)"
        if len(ids) != 1 or len(sigs) != 1 or ids[0] is None or sigs[0] is None:
            return "garbled signature headers"
        key_id = ids[0].decode("utf-8", "replace")
        key = self.keys.get(key_id)
        if key is None:
            return f"signed with unknown key id {key_id!r}"
        mac = hmac.new(key, data, hashlib.sha256).hexdigest().encode()
        if not hmac.compare_digest(mac, sigs[0]):
            return f"signature does not match key id {key_id!r}"
        return None


_KEYS_HINT = "give id:secret pairs separated by commas; the first one signs"


def parse_keys(text: str) -> SigningKeys | None:
    """`id:secret[,id:secret...]` (the first signs); None for an empty string.

    Raises InvalidCommand naming what is wrong (never the secret)."""
    keys: dict[str, bytes] = {}
    order: list[str] = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        if not part:
            continue
        key_id, sep, secret = part.partition(":")
        if not sep or not key_id or not secret:
            raise InvalidCommand(f"{KEYS_ENV}: key {i + 1} is not ID:SECRET", hint=_KEYS_HINT)
        if key_id in keys:
            raise InvalidCommand(f"{KEYS_ENV}: key id {key_id!r} given twice", hint=_KEYS_HINT)
        keys[key_id] = secret.encode()
        order.append(key_id)
    if not keys:
        return None
    return SigningKeys(keys, order[0])


def signing_keys(environ: Mapping[str, str] | None = None) -> SigningKeys | None:
    """The keys in GPULEDGER_KAFKA_SIGNING_KEYS (None: signing is off)."""
    env = os.environ if environ is None else environ
    return parse_keys(env.get(KEYS_ENV, ""))
