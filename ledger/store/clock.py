"""The edge that reads the wall clock and makes ids. Pure code receives these as parameters."""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    """Wall-clock seconds since the Unix epoch."""

    def now(self) -> float:
        return time.time()


class SimClock:
    """A virtual clock that only moves when told: simulations and tests."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance_to(self, t: float) -> None:
        if t < self.t:
            raise ValueError(f"a clock never goes back: {t} < {self.t}")
        self.t = t


class IdSource(Protocol):
    def __call__(self) -> str: ...


RANDOM_READ = 4096
"""Bytes of the kernel's randomness `random_ids` reads at once (256 ids)."""


def random_ids() -> IdSource:
    """Random UUIDs (version 4, as `uuid.uuid4().hex`) for production ledgers."""
    return _RandomIds()


class _RandomIds:
    """`uuid4` reads 16 bytes from the kernel per id, and `os.urandom` lets go of the
    interpreter lock for it: on the worker thread, each id of a group commit then waited for
    the event loop to give the lock back (a tenth of the worker's time under a stream of
    submits on PostgreSQL, 2026-12-07). The same kernel bytes are read `RANDOM_READ` at a time
    instead; a forked child never hands out its parent's unread bytes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = b""
        self._at = 0
        self._pid = 0

    def __call__(self) -> str:
        with self._lock:
            if self._at + 16 > len(self._bytes) or self._pid != os.getpid():
                self._bytes, self._at, self._pid = os.urandom(RANDOM_READ), 0, os.getpid()
            raw = bytearray(self._bytes[self._at : self._at + 16])
            self._at += 16
        raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
        raw[8] = (raw[8] & 0x3F) | 0x80  # the RFC 4122 variant
        return raw.hex()


def seeded_ids(seed: int) -> IdSource:
    """Deterministic UUID-shaped ids: the same seed gives the same sequence, byte for byte."""
    rng = random.Random(seed)
    return lambda: uuid.UUID(int=rng.getrandbits(128), version=4).hex


def new_token_secret() -> str:
    """A fresh bearer token secret (`ledger.core.tokens`): a random token id and 256 random
    bits. Record it with `tokens.issue`, which keeps only its hash. Its imports wait until a
    token is made: every CLI read imports this module, and `secrets` loads OpenSSL."""
    import secrets

    from ledger.core import tokens

    return tokens.secret(secrets.token_hex(8), secrets.token_urlsafe(32))
