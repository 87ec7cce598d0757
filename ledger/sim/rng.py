"""A small seeded random generator for workloads (splitmix64).

Pure: a `Rng` is a value seeded explicitly; the same seed gives the same numbers on every
platform and Python version (the algorithm is spelled out here, not borrowed from a library whose
stream may change). Workload code takes an `Rng` as a parameter and never reads global state.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

_MASK = (1 << 64) - 1


class Rng:
    """splitmix64 (Steele, Lea and Flood, 2014): 64-bit state, one multiply-xorshift per draw."""

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    def fork(self, label: str) -> Rng:
        """An independent stream for one purpose (so adding draws to one purpose does not shift
        the numbers of another): seeded from this seed and the label, not from this stream."""
        h = self.state
        for ch in label.encode():
            h = ((h ^ ch) * 0x100000001B3) & _MASK
        return Rng(_mix(h ^ 0x9E3779B97F4A7C15))

    def next64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        return _mix(self.state)

    def random(self) -> float:
        """Uniform in [0, 1)."""
        return (self.next64() >> 11) * (1.0 / (1 << 53))

    def uniform(self, lo: float, hi: float) -> float:
        return lo + (hi - lo) * self.random()

    def randint(self, lo: int, hi: int) -> int:
        """Uniform integer in [lo, hi]."""
        return lo + self.next64() % (hi - lo + 1)

    def bernoulli(self, p: float) -> bool:
        return self.random() < p

    def expovariate(self, rate: float) -> float:
        return -math.log(1.0 - self.random()) / rate

    def normal(self, mu: float = 0.0, sigma: float = 1.0) -> float:
        """Box-Muller (one of the pair; simple and stable)."""
        u1 = 1.0 - self.random()
        u2 = self.random()
        return mu + sigma * math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)

    def lognormal(self, mu: float, sigma: float) -> float:
        return math.exp(self.normal(mu, sigma))

    def choice(self, items: Sequence[T], weights: Sequence[float] | None = None) -> T:
        if not items:
            raise ValueError("choice from an empty sequence")
        if weights is None:
            return items[self.next64() % len(items)]
        cum = list(itertools.accumulate(weights))
        x = self.random() * cum[-1]
        return items[min(bisect.bisect_right(cum, x), len(items) - 1)]

    def shuffle(self, items: list[T]) -> None:
        """Fisher-Yates, in place."""
        for i in range(len(items) - 1, 0, -1):
            j = self.next64() % (i + 1)
            items[i], items[j] = items[j], items[i]


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)
