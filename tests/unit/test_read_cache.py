"""The server's read cache: one computation per log position (and per moment, for reads that
look at the clock), never an answer from another position."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ledger.reads.table import READS
from ledger.server.cache import ReadCache


def _counting() -> tuple[list[int], Callable[[], bytes]]:
    calls: list[int] = []

    def compute() -> bytes:
        calls.append(1)
        return f"answer {len(calls)}".encode()

    return calls, compute


@pytest.mark.parametrize(
    ("case", "name", "args", "asks", "want_calls"),
    [
        ("same position, same args: computed once", "accounts", {}, [(5, 0.0), (5, 99.0)], 1),
        ("an append retires the answer", "accounts", {}, [(5, 0.0), (6, 0.0), (6, 1.0)], 2),
        ("nodes go stale after 2 s: foreign work moves", "nodes", {}, [(5, 0.0), (5, 2.1)], 2),
        ("a clocked read now is fresh for 2 s", "queue", {}, [(5, 0.0), (5, 1.9)], 1),
        ("a clocked read now goes stale after 2 s", "queue", {}, [(5, 0.0), (5, 2.1)], 2),
        ("a clocked read at a moment stays", "queue", {"at": 1e9}, [(5, 0.0), (5, 500.0)], 1),
        ("a clock that went back recomputes", "explain", {"job_id": 1}, [(5, 10.0), (5, 9.0)], 2),
    ],
)
def test_one_computation_per_position_and_moment(
    case: str, name: str, args: dict[str, object], asks: list[tuple[int, float]], want_calls: int
) -> None:
    cache = ReadCache()
    parsed = READS[name].parse(args)
    calls, compute = _counting()
    answers = [cache.answer(name, parsed, pos, now, compute) for pos, now in asks]
    assert len(calls) == want_calls, case
    assert answers[-1] == f"answer {want_calls}".encode()
    assert (cache.hits, cache.misses) == (len(asks) - want_calls, want_calls)


def test_different_arguments_are_different_answers() -> None:
    cache = ReadCache()
    calls, compute = _counting()
    a = cache.answer("queue", READS["queue"].parse({"limit": 5}), 1, 0.0, compute)
    b = cache.answer("queue", READS["queue"].parse({"limit": 6}), 1, 0.0, compute)
    assert (a, b, len(calls)) == (b"answer 1", b"answer 2", 2)


def test_the_cache_stays_bounded() -> None:
    cache = ReadCache(max_entries=4)
    _, compute = _counting()
    for i in range(10):
        cache.answer("queue", READS["queue"].parse({"limit": i + 1}), 1, 0.0, compute)
    assert len(cache._entries) <= 4


def test_a_shared_value_under_way_is_waited_for_not_computed_again_beside_it() -> None:
    """Two threads asking the shared preview at one position compute it once (the one computed
    ahead in the read pool and a page's read: both computed it, each slower for the other)."""
    import threading

    cache = ReadCache(clock=lambda: 100.0)
    started, release = threading.Event(), threading.Event()
    computed: list[str] = []

    def slow() -> str:
        computed.append("slow")
        started.set()
        release.wait(5)
        return "preview at 7"

    got: list[str] = []
    first = threading.Thread(target=lambda: got.append(cache.shared("p", 7, 100.0, slow)))
    first.start()
    assert started.wait(5)
    second = threading.Thread(
        target=lambda: got.append(
            cache.shared("p", 7, 99.0, lambda: computed.append("again") or "")
        )
    )
    second.start()
    second.join(0.2)
    assert second.is_alive()  # waiting for the one under way
    release.set()
    first.join(5)
    second.join(5)
    assert got == ["preview at 7", "preview at 7"] and computed == ["slow"]
    # another position is computed, not waited for
    assert cache.shared("p", 8, 100.0, lambda: "preview at 8") == "preview at 8"


def test_an_answer_read_from_the_shared_preview_is_kept_no_longer_than_that_preview() -> None:
    """A queue answer built on a preview became ready after it and was kept 2 s from then: once
    a newer preview answered another read at the same position, the kept answer still gave the
    older one's order (the queue's order moves with the clock: the dashboard's second page and
    `queue` read just after it disagreed at three workers, s54-suite)."""
    from ledger.server.cache import Basis

    t = [100.0]
    cache = ReadCache(fresh_s=2.0, clock=lambda: t[0])
    queue = READS["queue"].parse({"limit": 100_000})
    assert cache.shared("p", 10, 100.0, lambda: "order at 100") == "order at 100"
    t[0] = 101.5  # the whole queue's rows took 1.5 s to build on it
    cache.put("queue", queue, 10, 100.0, b"rows at 100", basis=Basis("p", 100.0))
    t[0] = 101.9
    assert cache.get("queue", queue, 10, 101.9) == b"rows at 100"  # the preview is still held
    t[0] = 102.2  # the preview is 2.2 s old: the next read takes a newer one ...
    assert cache.shared("p", 10, 102.2, lambda: "order at 102.2") == "order at 102.2"
    t[0] = 102.4  # ... and no read after it answers from the older one
    assert cache.get("queue", queue, 10, 102.4) is None
    cache.put("queue", queue, 10, 102.4, b"rows at 102.2", basis=Basis("p", 102.2))
    assert cache.get("queue", queue, 10, 102.5) == b"rows at 102.2"
    assert cache.get("queue", queue, 11, 102.5) is None  # an append retires it, as any answer


def test_an_answer_on_an_expired_preview_is_not_kept_past_it() -> None:
    """Nothing newer taken yet: an answer on a preview past `fresh_s` is not given either (the
    read computes the preview again, and its answer on it)."""
    from ledger.server.cache import Basis

    t = [100.0]
    cache = ReadCache(fresh_s=2.0, clock=lambda: t[0])
    cache.shared("p", 10, 100.0, lambda: "order at 100")
    t[0] = 101.8
    cache.put("queue", "args", 10, 100.0, b"rows at 100", basis=Basis("p", 100.0))
    assert cache.get("queue", "args", 10, 102.1) is None  # the preview's 2 s are over
    cache.put("jobs", "args", 10, 101.8, b"no preview")
    assert cache.get("jobs", "args", 10, 102.1) == b"no preview"  # 2 s from its own readiness
