"""What a read from the CLI loads: `jobs`, `shares` and `queue` on a caught-up projection use
DuckDB's engine only, never its Python API, Arrow, the HTTP server or Kafka, and read the live
state without eventsourcing; a plain table that fits a pipe is printed without rich (each of
them costs tens of milliseconds per command). A write through a server loads neither the store
(eventsourcing) nor the domain: the server decides."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.serverkit import cli, env_for, set_up_ledger, start_server, workdir

HEAVY = ("duckdb", "pyarrow", "litestar", "uvicorn", "kafka", "eventsourcing", "rich")

_PROBE = """
import json, sys
from ledger.cli import main
sys.argv = ["gpuledger", *sys.argv[1:]]
try:
    main()
except SystemExit as done:
    code = done.code
print(json.dumps({"code": code, "modules": sorted({m.split(".")[0] for m in sys.modules}),
                  "loaded": sorted(sys.modules)}), file=sys.stderr)
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("imports")
    home = tmp / "ledger"
    set_up_ledger(home, tmp)
    cli(home, "jobs", GPULEDGER_USER="root")  # catches the projection up
    return home


def _probe(
    home: Path, *args: str, user: str = "root"
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        env=env_for(home, GPULEDGER_USER=user),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=workdir(home),
    )
    probe: dict[str, Any] = json.loads(proc.stderr.strip().splitlines()[-1])
    assert probe["code"] in (0, None), proc.stderr
    return proc, probe


@pytest.mark.parametrize("command", ["jobs", "shares", "queue"])
def test_a_read_loads_no_heavy_package(home: Path, command: str) -> None:
    proc, probe = _probe(home, command)
    assert "olmo" in proc.stdout  # job 1 of ai2/olmo, or its team, is in the answer
    assert "_duckdb" in probe["modules"]  # it did read the projection
    assert [m for m in HEAVY if m in probe["modules"]] == []


def test_a_queue_with_nothing_schedulable_to_show_decides_no_preview(home: Path) -> None:
    proc, probe = _probe(home, "queue", "--state", "held", "--json")
    assert proc.stdout.strip() == "[]"  # job 1 is pending, not held
    assert "ledger.cycle.dispatcher" not in probe["loaded"]  # where the preview is decided
    _, probe = _probe(home, "queue", "--json")  # job 1 waits: the preview orders it
    assert "ledger.cycle.dispatcher" in probe["loaded"]


def test_a_write_through_a_server_loads_neither_the_store_nor_the_domain(tmp_path: Path) -> None:
    home = tmp_path / "served"
    set_up_ledger(home, tmp_path)
    server = start_server(home)  # its Unix socket on the home: the CLI is its client
    try:
        args = ("submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "1h", "--", "true")
        proc, probe = _probe(home, *args, user="alice")
        assert proc.stdout.startswith("submitted job 2 "), proc.stdout
        assert [m for m in HEAVY if m in probe["modules"]] == []
        assert "ledger.store.application" not in probe["loaded"]
        assert "ledger.core.decide" not in probe["loaded"]
    finally:
        server.stop()


READS_BESIDE_A_SERVER = [
    ("audit", "verify"),
    ("audit", "check", "--json"),
    ("audit", "preemptions", "--json"),
    ("audit", "budget-changes", "--json"),
]
"""Reads the server answers whole (`GET /v1/audit/...`, the views): their client needs neither
DuckDB, Arrow nor Kafka (`HEAVIEST`: they were ~0.35-0.5 s of CPU each, ~50 such processes in
one test of test_server.py)."""
HEAVIEST = ("duckdb", "pyarrow", "kafka", "litestar", "uvicorn")


def test_the_audit_and_projection_reads_through_a_server_load_no_heavy_package(
    tmp_path: Path,
) -> None:
    home = tmp_path / "served"
    set_up_ledger(home, tmp_path)
    server = start_server(home)  # its Unix socket on the home: the CLI is its client
    try:
        for args in READS_BESIDE_A_SERVER:
            proc, probe = _probe(home, *args)
            assert proc.stdout.strip(), args
            assert [m for m in HEAVIEST if m in probe["modules"]] == [], args
        # `projection status` loads `follow`'s module (its `--batch-size` default is the
        # projection store's row group, not the projector's: it loaded DuckDB's Python API),
        # neither DuckDB's Python API nor the Kafka client
        proc, probe = _probe(home, "projection", "status", "--json")
        assert proc.stdout.strip()
        assert [m for m in HEAVIEST if m in probe["modules"]] == []
        # a table's rows come as Arrow: Arrow, but neither DuckDB nor Kafka
        proc, probe = _probe(home, "audit", "job", "1", "--format", "csv")
        assert proc.stdout.startswith("job_id") or "," in proc.stdout, proc.stdout
        assert [m for m in HEAVIEST if m in probe["modules"]] == ["pyarrow"]
    finally:
        server.stop()


def test_a_servers_modules_load_neither_kafka_nor_psycopg() -> None:
    """Every `serve` and `up` imported the Kafka client and psycopg (its health's module,
    `ledger.store.relay_health`, imported the relay's errors), whatever its store and with no
    Kafka asked: ~0.18 s of its 0.74 s of imports' CPU at each of the suite's server starts.
    The relay's and PostgreSQL's own modules import them where they are used."""
    probe = "import json, sys, ledger.server.run; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = {m.split(".")[0] for m in json.loads(proc.stdout)}
    assert not loaded & {"kafka", "psycopg", "pyarrow"}, loaded & {"kafka", "psycopg", "pyarrow"}
