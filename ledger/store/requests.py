"""Idempotency keys: a command sent again after its answer was lost is answered, not appended.

A client names each write with a key of its own (the HTTP `Idempotency-Key` header; the CLI and
the agents make one per command and send it again with every retry, on any server). The ledger
writes the first event of a keyed command with an event id derived from the caller and the key
(`keyed_id`): a UUID of version 8, so keyed events are told from the random (version 4) ids at a
glance, and a caller can never name another caller's event. The id is in the stored bytes, so
the log itself remembers which keys it holds: a server that starts (or takes over as leader)
finds the recent ones by scanning the tail's bytes (`Requests.scan`), without decoding.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

KEPT = 200_000
"""Keys remembered (the newest); a retry comes within seconds, and a server that follows the log
remembers every key it folds."""

SCANNED = 100_000
"""How many of the newest positions a start scans for keys."""

_KEYED = re.compile(rb'"event_id":"([0-9a-f]{12}8[0-9a-f]{19})"')


def keyed_id(actor: str, key: str, request: bytes = b"") -> str:
    """The event id of the first event of `actor`'s command keyed `key` (32 hex digits, UUID
    version 8 with RFC 4122's variant): the first 24 digits name (actor, key), the last 8 the
    request itself (`request`: the command's bytes), so the same key sent with a different
    request is told from a retry of the same one, from the log itself (after a failover too)."""
    digest = bytearray(hashlib.sha256(f"{actor}\0{key}".encode()).digest()[:16])
    digest[12:16] = hashlib.sha256(request).digest()[:4]
    digest[6] = (digest[6] & 0x0F) | 0x80
    digest[8] = (digest[8] & 0x3F) | 0x80
    return digest.hex()


KEY_PART = 24
"""The hex digits of a keyed id that name (actor, key); the rest names the request."""


def is_keyed(event_id: str) -> bool:
    return len(event_id) == 32 and event_id[12] == "8"


def valid_key(key: str) -> bool:
    """A key is 1-128 printable ASCII characters (a UUID is the usual choice)."""
    return 0 < len(key) <= 128 and key.isascii() and key.isprintable()


class Requests:
    """The keyed events the ledger has seen: event id -> log position (the newest `KEPT`)."""

    def __init__(self) -> None:
        self._at: dict[str, tuple[int, str]] = {}
        """(actor, key) part of the id -> (position, the whole id)."""

    def note(self, event_id: str, position: int) -> None:
        if is_keyed(event_id):
            self._at[event_id[:KEY_PART]] = (position, event_id)
            if len(self._at) > KEPT:
                del self._at[next(iter(self._at))]

    def scan(self, records: Iterable[tuple[int, bytes | str]]) -> None:
        """Note the keyed events among stored records (position, bytes), read without decoding;
        a row rewritten as TEXT (`audit verify` names it) as its bytes: a start stopped with
        "internal error: TypeError" on one (atk49-25 F5)."""
        for position, stored in records:
            data = stored.encode("utf-8", "surrogateescape") if isinstance(stored, str) else stored
            m = _KEYED.search(data, 0, 200)
            if m is not None:
                self.note(m.group(1).decode(), position)

    def find(self, event_id: str) -> int | None:
        """The position of the first event of the command with this id's (actor, key)."""
        got = self._at.get(event_id[:KEY_PART])
        return None if got is None else got[0]

    def same_request(self, event_id: str) -> bool:
        """Whether the command first sent with this id's key was this very request."""
        got = self._at.get(event_id[:KEY_PART])
        return got is None or got[1] == event_id

    def __len__(self) -> int:
        return len(self._at)
