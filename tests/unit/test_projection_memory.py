"""The projection's DuckDB memory limit (atk44z F10: DuckDB's default, 80% of the host's memory,
let a server grow 0.7-1 GB per 16 MiB request and keep it; `project follow` read a 330 MB topic
in 3.5 GB)."""

from __future__ import annotations

from pathlib import Path

import pytest

from projections.errors import ProjectionError
from projections.store import MEMORY_LIMIT_ENV, Store, memory_limit


def _setting(store: Store) -> str:
    row = store.con.execute("SELECT current_setting('memory_limit')").fetchone()
    assert row is not None
    return str(row[0])


def test_a_projection_opens_with_a_memory_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(MEMORY_LIMIT_ENV, raising=False)
    store = Store(tmp_path / "a" / "p.duckdb")
    try:
        assert _setting(store) == "2.0 GiB"  # was DuckDB's 80% of the host's memory
    finally:
        store.con.close()
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "300MB")
    store = Store(tmp_path / "b" / "p.duckdb")
    try:
        assert _setting(store) == "286.1 MiB"
    finally:
        store.con.close()


@pytest.mark.parametrize("text", ["lots", "2", "-1GB", "2 GiB; SET x=1", "1e9B"])
def test_a_memory_limit_that_is_no_size_is_one_line(text: str) -> None:
    with pytest.raises(ProjectionError) as err:
        memory_limit({MEMORY_LIMIT_ENV: text})
    assert err.value.message.startswith(f"{MEMORY_LIMIT_ENV}={text!r} is no size")


@pytest.mark.parametrize("text", ["512MB", "2GiB", "1.5 GB", "4gb"])
def test_sizes_in_duckdbs_units_pass(text: str) -> None:
    assert memory_limit({MEMORY_LIMIT_ENV: text}) == text
