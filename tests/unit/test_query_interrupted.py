"""A query interrupted at its time limit while its result streams is said as its time limit in
one line: DuckDB's interruption reaches the Arrow reader between batches as an OSError, which
the server answered 500 "internal error: OSError" (the suite at load 13: the row-limit query of
test_security_reads ran past its 4 s)."""

from __future__ import annotations

import threading

import duckdb
import pytest

from ledger.history.tables import Limits, run_query
from schemas.errors import InvalidCommand


def test_an_interruption_while_the_result_streams_is_the_time_limit() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS i FROM range(200000)")
    limits = Limits(timeout_s=0.3, max_rows=2**62, max_bytes=2**62)
    timer = threading.Timer(limits.timeout_s, con.interrupt)
    timer.start()
    try:
        with pytest.raises(InvalidCommand) as err:
            run_query(con, "SELECT a.i, b.i FROM t a, t b", None, limits)
    finally:
        timer.cancel()
    assert err.value.line().startswith(
        "the query ran past its time limit of 0.3 s and was stopped"
    ), err.value.line()
