"""The read pool's admission (per person at once, per minute, everyone's under way) and its
limits on an in-memory DuckDB: a query stopped at its time limit and at its row limit with one
line each (docs/security.md, row T5)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import duckdb
import pytest

from ledger.history import tables
from ledger.server.readpool import ReadPool
from schemas.errors import InvalidCommand, TooBusy


def pool(**kw: Any) -> ReadPool:
    base = duckdb.connect()
    # every query on its caller's thread, as the server's projection (`ledger.server.tables`):
    # the time limit counts that thread's CPU (`readpool.ReadTime`)
    base.execute("SET threads = 1")
    base.execute("CREATE TABLE t AS SELECT range AS i FROM range(3000)")

    async def on_worker(fn: Any) -> Any:
        return fn()

    return ReadPool(lambda: base, on_worker, **kw)


def test_a_person_gets_two_queries_at_once_and_sixty_a_minute() -> None:
    p = pool(per_caller=2, per_minute=3)
    p._running["alice"] = 2
    with pytest.raises(TooBusy, match="'alice' has 2 queries running already") as busy:
        p.admit("alice", 0.0)
    assert busy.value.fields["retry_after"] == 1
    p.admit("bob", 0.0)
    p.admit("bob", 10.0)
    p.admit("bob", 20.0)
    with pytest.raises(TooBusy, match="'bob' ran 3 queries in the last minute") as busy:
        p.admit("bob", 30.0)
    assert busy.value.fields["retry_after"] == 30  # when the first one leaves the minute
    p.admit("bob", 60.5)


def test_everyones_queries_under_way_are_bounded() -> None:
    p = pool(max_waiting=4)
    p._running.update({"a": 2, "b": 2})
    with pytest.raises(TooBusy, match="the server has 4 queries under way"):
        p.admit("c", 0.0)


def run(p: ReadPool, sql: str) -> Any:
    async def go() -> Any:
        p.start()
        try:
            return await p.run("alice", lambda con, lim: tables.run_query(con, sql, None, lim))
        finally:
            p.stop()

    return asyncio.run(go())


def test_a_query_is_stopped_at_its_time_limit() -> None:
    p = pool()
    p.limits = tables.Limits(timeout_s=0.5)
    with pytest.raises(InvalidCommand, match=r"ran past its time limit of 0\.5 s and was stopped"):
        run(p, "SELECT count(*) FROM t a, t b, t c WHERE a.i + b.i + c.i = 7")
    assert p.timed_out == 1 and not p._running


def test_a_result_is_stopped_at_its_row_limit() -> None:
    p = pool()
    p.limits = tables.Limits(max_rows=10_000)
    with pytest.raises(InvalidCommand, match="larger than 10,000 rows: it was stopped"):
        run(p, "SELECT * FROM t a, t b")
    assert run(pool(), "SELECT count(*) AS n FROM t").to_pylist() == [{"n": 3000}]


def test_a_persons_small_reads_never_wait_behind_anothers_big_pages() -> None:
    """Alice loops big pages (each holds its thread `BIG_S`, then earns a rest three times as
    long); bob's small reads meanwhile answer in far less than one of her pages: they run in
    their own lane, neither behind her page nor behind its rest (finding F3)."""
    big_s = 0.6

    def page(con: Any, lim: Any) -> int:
        time.sleep(big_s)
        return 1

    def small(con: Any, lim: Any) -> int:
        return int(con.execute("SELECT count(*) FROM t WHERE i < 5").fetchone()[0])

    async def go() -> tuple[list[float], int]:
        p = pool(per_caller=2, rest=3.0).start()
        try:
            stop = asyncio.Event()
            pages = 0

            async def alice() -> None:
                nonlocal pages
                while not stop.is_set():
                    await p.run("alice", page, read=True, big=True)
                    pages += 1

            loop_ = asyncio.ensure_future(alice())
            await asyncio.sleep(0.1)  # her first page is under way
            took = []
            for _ in range(8):
                began = time.monotonic()
                assert await p.run("bob", small, read=True) == 5
                took.append(time.monotonic() - began)
                await asyncio.sleep(0.25)
            stop.set()
            await loop_
            return took, pages
        finally:
            p.stop()

    took, pages = asyncio.run(go())
    assert pages >= 1, pages
    assert max(took) < big_s, took  # never one of her pages (nor its rest) in front of his read


def test_a_persons_looped_live_reads_never_delay_anothers_dashboard() -> None:
    """Alice loops reads of the live state two at a time (each holds a thread of the live lane
    `live_s`); bob's dashboard reads meanwhile wait for none of hers: she has one read under
    way at a time, the lane's other thread takes his, and the rests are the readers' own
    (`ledger.server.fairlane`; before, bob waited for her read, its rest of three times as
    long and her next: 1.2-2.4 s here)."""
    live_s = 0.3

    def heavy(con: Any, lim: Any) -> int:
        time.sleep(live_s)
        return 1

    def small(con: Any, lim: Any) -> int:
        return int(con.execute("SELECT count(*) FROM t WHERE i < 5").fetchone()[0])

    async def go() -> tuple[list[float], int]:
        p = pool(per_caller=2, rest=3.0).start()
        try:
            stop = asyncio.Event()
            reads = 0

            async def alice() -> None:
                nonlocal reads
                while not stop.is_set():
                    with p.admitted("alice", read=True):
                        await p.compute(heavy, read=True, live=True, person="alice")
                    reads += 1

            loops = [asyncio.ensure_future(alice()) for _ in range(2)]
            await asyncio.sleep(0.1)  # her reads are under way and queued
            took = []
            for _ in range(6):
                began = time.monotonic()
                with p.admitted("bob", read=True):
                    assert await p.compute(small, read=True, live=True, person="bob") == 5
                took.append(time.monotonic() - began)
                await asyncio.sleep(0.2)
            stop.set()
            await asyncio.gather(*loops)
            return took, reads
        finally:
            p.stop()

    took, reads = asyncio.run(go())
    assert reads >= 2, reads
    assert max(took) < live_s / 2, took  # none of her reads (nor their rests): a thread free
