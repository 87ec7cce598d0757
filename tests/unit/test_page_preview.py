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


def test_freshness_counts_from_when_an_answer_became_ready() -> None:
    """A preview that took longer than `fresh_s` to compute (a loaded machine) still serves the
    read that waited for it and the ones right after."""
    t = [100.0]
    cache = ReadCache(fresh_s=2.0, clock=lambda: t[0])

    def slow() -> int:
        t[0] += 3.0  # computing took 3 s
        return 7

    assert cache.shared("p", 10, 100.0, slow) == 7
    assert cache.holds("p", 10, 103.5)  # ready at 103, asked 0.5 s later
    assert not cache.holds("p", 10, 105.5)
    assert cache.answer("queue", "args", 10, 103.0, lambda: (t.__setitem__(0, 106.0), b"x")[1])
    assert cache.answer("queue", "args", 10, 107.5, lambda: b"y") == b"x"  # ready at 106
    assert cache.answer("queue", "args", 10, 108.5, lambda: b"z") == b"z"
