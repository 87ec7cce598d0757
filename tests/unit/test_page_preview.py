"""The server's shared values: the queue preview kept per log position, the window figures of
/metrics kept for a while wherever the log moved."""

from __future__ import annotations

from ledger.server.cache import ReadCache


def test_shared_value_is_kept_per_position_and_freshness() -> None:
    cache = ReadCache(fresh_s=2.0)
    made: list[int] = []

    def make() -> int:
        made.append(1)
        return len(made)

    assert cache.shared("p", 10, 100.0, make) == 1
    assert cache.shared("p", 10, 101.5, make) == 1  # same position, fresh
    assert cache.shared("p", 10, 102.5, make) == 2  # too old
    assert cache.shared("p", 11, 102.6, make) == 3  # the log moved
    assert cache.shared("q", 11, 102.6, make) == 4  # another name
    assert (cache.hits, cache.misses) == (1, 4)


def test_holds_says_whether_shared_would_compute() -> None:
    cache = ReadCache(fresh_s=2.0)
    assert not cache.holds("p", 10)
    cache.shared("p", 10, 100.0, lambda: 1)
    assert cache.holds("p", 10) and cache.holds("p", 10, 101.0)
    assert not cache.holds("p", 10, 102.5)  # too old for a read now ...
    assert cache.holds("p", 10)  # ... but computed at this position
    assert not cache.holds("p", 11)


def test_recent_values_are_reused_across_positions_for_fresh_s() -> None:
    cache = ReadCache(fresh_s=2.0)
    made: list[float] = []

    def make(at: float) -> float:
        made.append(at)
        return at

    assert cache.recent("m", 1, 100.0, lambda: make(100.0)) == 100.0
    assert cache.recent("m", 2, 101.9, lambda: make(101.9)) == 100.0  # the log moved: kept
    assert not cache.holds("m", 2) and cache.holds("m", 1)
    assert cache.recent("m", 2, 102.1, lambda: make(102.1)) == 102.1
    assert cache.holds("m", 2)
    assert cache.recent("m", 2, 101.0, lambda: make(101.0)) == 101.0  # the clock went back
    assert made == [100.0, 102.1, 101.0]
