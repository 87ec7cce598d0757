"""What a read from the CLI loads: `jobs`, `shares` and `queue` on a caught-up projection use
DuckDB's engine only, never its Python API, Arrow, the HTTP server or Kafka, and read the live
state without eventsourcing; a plain table that fits a pipe is printed without rich (each of
them costs tens of milliseconds per command)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.serverkit import cli, env_for, set_up_ledger

HEAVY = ("duckdb", "pyarrow", "litestar", "uvicorn", "kafka", "eventsourcing", "rich")

_PROBE = """
import json, sys
from ledger.cli import main
sys.argv = ["gpuledger", *sys.argv[1:]]
try:
    main()
except SystemExit as done:
    code = done.code
print(json.dumps({"code": code, "modules": sorted({m.split(".")[0] for m in sys.modules})}),
      file=sys.stderr)
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("imports")
    home = tmp / "ledger"
    set_up_ledger(home, tmp)
    cli(home, "jobs", GPULEDGER_USER="root")  # catches the projection up
    return home


@pytest.mark.parametrize("command", ["jobs", "shares", "queue"])
def test_a_read_loads_no_heavy_package(home: Path, command: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, command],
        env=env_for(home, GPULEDGER_USER="root"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    probe = json.loads(proc.stderr.strip().splitlines()[-1])
    assert probe["code"] in (0, None), proc.stderr
    assert "olmo" in proc.stdout  # job 1 of ai2/olmo, or its team, is in the answer
    assert "_duckdb" in probe["modules"]  # it did read the projection
    assert [m for m in HEAVY if m in probe["modules"]] == []
