"""The PostgreSQL submit benchmark runs (docs/benchmarks.md's #28 row): at a few submits a
client, on the suite's PostgreSQL, it makes its store as `init --store` does, serves it, and
prints its figures (it had stopped at "holds no ledger in schema 'public'" since the stores
stopped making tables on open, atk49 F3, unseen until a run on 2026-12-07)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_pg_runs_a_round_on_the_suites_postgresql() -> None:
    from tests.conftest import drop_database, pg_admin_dsn

    admin = pg_admin_dsn()
    env = {**os.environ, "GPULEDGER_PG_DSN": admin, "PYTHONPATH": str(ROOT)}
    got = subprocess.run(
        [sys.executable, "scripts/bench_pg.py", "--clients", "2", "--per-client", "20",
         "--rounds", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    for name in ("bench_http_0", "bench_raw_0"):  # the bench's own databases
        drop_database(admin, name)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "HTTP on PostgreSQL, 2 clients x 20, median of 1:" in got.stdout, got.stdout
    assert "0 errors" in got.stdout, got.stdout
