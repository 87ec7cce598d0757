"""A server's stop ends its read threads before the interpreter's end (s55: a server exited
SIGABRT, "FATAL: exception not rethrown", at its stop in `test_server.py`'s unread-answers
test). A lane's thread is a daemon; one still in a DuckDB query (run without the interpreter
lock) when the interpreter finalised was ended by a forced unwind through DuckDB's C++ as it
took the lock back, which aborted the process (reproduced with a plain daemon thread in a
DuckDB query at exit: 1 exit in 10 aborted so). `ReadPool.stop` now interrupts the queries
under way and waits for their threads."""

from __future__ import annotations

import asyncio
import threading
import time

import duckdb
import pytest

from ledger.server.readpool import ReadPool

ENDLESS = "SELECT count(*) FROM range(100000000000) t(i) WHERE i % 7 = 3"
"""A query that runs far longer than any test (minutes), inside DuckDB."""


async def _no_worker(fn: object) -> object:
    raise AssertionError("not used")


def test_a_stop_interrupts_the_reads_under_way_and_waits_for_their_threads() -> None:
    base = duckdb.connect()
    pool = ReadPool(lambda: base, _no_worker).start().connect_now()
    inside = threading.Event()

    def endless(cur: duckdb.DuckDBPyConnection, _limits: object) -> object:
        inside.set()
        return cur.execute(ENDLESS).fetchall()

    async def go() -> tuple[bool, float]:
        big = asyncio.ensure_future(pool.compute(endless, read=True, big=True, person="bob"))
        while not inside.is_set():
            await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(pool.compute(endless, read=True, big=True, person="bob"))
        await asyncio.sleep(0.3)  # bob's first read is in DuckDB, his second waits its turn
        began = time.monotonic()
        ended = pool.stop()
        took = time.monotonic() - began
        with pytest.raises(duckdb.InterruptException):
            await big
        with pytest.raises(asyncio.CancelledError):  # never run
            await waiting
        return ended, took

    ended, took = asyncio.run(go())
    assert ended is True, "a read thread was still alive after the stop"
    alive = [t.name for t in threading.enumerate() if t.name.endswith("-reads")]
    assert not alive, alive
    assert took < 10, took  # interrupted, not run to its end (minutes)


def test_nothing_is_run_beside_once_the_pool_is_stopped() -> None:
    """atk58 F6: an HA leader's SIGTERM logged `ERROR idle work failed` with a traceback
    (`metrics.warm -> copied.ahead -> ReadPool.beside: RuntimeError: cannot schedule new
    futures after shutdown`): the server stops its reads first, and the worker's idle hooks run
    on while it finishes its cycle and hands over. Work ahead after the stop is not taken (it
    raised)."""
    base = duckdb.connect()
    pool = ReadPool(lambda: base, _no_worker).start().connect_now()
    ran = threading.Event()
    assert pool.beside(lambda cur, _limits: ran.set())
    assert ran.wait(10)
    assert pool.stop() is True
    late = threading.Event()
    assert pool.beside(lambda cur, _limits: late.set()) is False  # before: RuntimeError
    assert not late.wait(0.2)
