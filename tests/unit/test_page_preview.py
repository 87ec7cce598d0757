"""The dashboard's shared queue preview: kept per log position, filtered like `reads.queue`."""

from __future__ import annotations

from ledger.server.cache import ReadCache
from ledger.server.pages import pick
from schemas import views as v


def _row(job_id: int, user: str, account: str, state: str = "pending") -> v.QueueRow:
    held = state == "held"
    return v.QueueRow(
        order=None if held else job_id, job_id=job_id, account=account, user=user, gpus=8,
        funded=True, debug=False, state="held" if held else "pending",
        sort_key=[] if held else [job_id], code="HELD" if held else "WAIT_GPUS", reason="",
        submitted_at=0.0, waiting_s=0.0, estimated_start_at=None,
    )  # fmt: skip


ROWS = [
    _row(1, "ann", "phys/astro"),
    _row(2, "bob", "phys/astrology"),
    _row(3, "ann", "chem"),
    _row(4, "bob", "phys/astro/deep", "held"),
]


def ids(f: v.QueueFilter) -> list[int]:
    return [r.job_id for r in pick(ROWS, f)]


def test_pick_filters_like_squeue() -> None:
    assert ids(v.QueueFilter(limit=100)) == [1, 2, 3, 4]
    assert ids(v.QueueFilter(user="ann", limit=100)) == [1, 3]
    assert ids(v.QueueFilter(account="phys/astro", limit=100)) == [1, 4]  # not phys/astrology
    assert ids(v.QueueFilter(account="phys/astro/", limit=100)) == [1, 4]
    assert ids(v.QueueFilter(state="held", limit=100)) == [4]
    assert ids(v.QueueFilter(state="pending", limit=2)) == [1, 2]


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
