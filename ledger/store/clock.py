"""The edge that reads the wall clock and makes ids. Pure code receives these as parameters."""

from __future__ import annotations

import random
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


def random_ids() -> IdSource:
    """Random UUIDs for production ledgers."""
    return lambda: uuid.uuid4().hex


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
