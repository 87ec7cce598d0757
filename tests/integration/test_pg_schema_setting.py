"""`GPULEDGER_PG_SCHEMA`: the PostgreSQL schema of a store's tables, one setting that every entry
point reads (`ledger.store.pgread.store_schema`): the writes (`init`, the CLI's direct writes,
`serve`), the lease, the CLI's reads, `audit verify|check|sql`, `projection rebuild`, `replay`,
`store copy` and the relay (its recorder and its progress table). Before, only the server's
append path honoured it: the CLI's reads and the audit read `public` (an empty ledger, "intact"),
and the relay's recorder made and read a second, empty events table in `public`."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from tests.integration.serverkit import BUDGET, cli

SCHEMA = "ledger_s49"


def _tables(dsn: str) -> set[tuple[str, str]]:
    with psycopg.connect(dsn, autocommit=True) as con:
        rows = con.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_name LIKE 'gpuledger%'"
        ).fetchall()
    return {(str(s), str(t)) for s, t in rows}


def test_every_entry_point_uses_the_schema_the_store_is_in(
    tmp_path: Path, pg_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(pg_store, autocommit=True) as con:
        con.execute(f'CREATE SCHEMA "{SCHEMA}"')
    home = tmp_path / "ledger"
    env = {"GPULEDGER_PG_SCHEMA": SCHEMA}
    cli(home, "init", "--admin", "root", "--store", pg_store, **env)
    budget = tmp_path / "budget.toml"
    budget.write_text(BUDGET)
    cli(home, "budget", "apply", str(budget), GPULEDGER_USER="root", **env)
    cli(home, "node", "add", "n1", "--gpus", "8", "--gpu-type", "h100", GPULEDGER_USER="root",
        **env)  # fmt: skip
    cli(home, "submit", "-A", "ai2/olmo", "-G", "1", "--min-runtime", "1h",
        GPULEDGER_USER="alice", **env)  # fmt: skip

    # the CLI's direct reads (libpq alone) see the job the writes recorded
    assert "ai2/olmo" in cli(home, "jobs", GPULEDGER_USER="root", **env).stdout
    assert "ai2/olmo" in cli(home, "queue", GPULEDGER_USER="root", **env).stdout

    # the audit reads the same table: the chain over every event, the invariants, SQL
    with psycopg.connect(pg_store, autocommit=True) as con:
        row = con.execute(f'SELECT count(*) FROM "{SCHEMA}".gpuledger_events').fetchone()
    events = int(row[0]) if row else 0
    assert events > 5
    verified = cli(home, "audit", "verify", "--json", GPULEDGER_USER="root", **env)
    report = json.loads(verified.stdout)["store"]
    assert (report["events"], report["problems"]) == (events, []), verified.stdout
    cli(home, "audit", "check", GPULEDGER_USER="root", **env)
    sql = cli(home, "audit", "sql", "--json", "SELECT count(*) AS n FROM events",
              GPULEDGER_USER="root", **env)  # fmt: skip
    assert json.loads(sql.stdout) == [{"n": events}], sql.stdout
    rebuilt = cli(home, "projection", "rebuild", GPULEDGER_USER="root", **env)
    assert str(events) in rebuilt.stdout.replace(",", ""), rebuilt.stdout
    cli(home, "replay", "--all", GPULEDGER_USER="root", **env)

    # the relay's recorder reads the same events, and keeps its progress beside them
    monkeypatch.setenv("GPULEDGER_PG_SCHEMA", SCHEMA)
    from ledger.store import relay_progress
    from ledger.store.relay import open_store

    recorder = open_store(home)
    try:
        assert recorder.max_notification_id() == events
        relay_progress.keep(recorder, "topic-s49", events)
        assert relay_progress.read(recorder, "topic-s49") == events
    finally:
        recorder.datastore.close()

    # `store copy` out of it takes every event
    copy = tmp_path / "copy"
    cli(home, "store", "copy", pg_store, str(copy), GPULEDGER_USER="root", **env)
    assert "ai2/olmo" in cli(copy, "jobs", GPULEDGER_USER="root").stdout

    # nothing of the ledger anywhere but its schema (before: the relay made `public`'s tables)
    assert {s for s, _ in _tables(pg_store)} == {SCHEMA}, _tables(pg_store)
    assert (SCHEMA, "gpuledger_relay_progress") in _tables(pg_store)


def test_a_schema_setting_that_is_no_plain_name_or_no_schema_is_refused_in_one_line(
    tmp_path: Path, pg_store: str
) -> None:
    home = tmp_path / "ledger"
    bad = cli(home, "init", "--admin", "root", "--store", pg_store, ok=False,
              GPULEDGER_PG_SCHEMA="a b; drop")  # fmt: skip
    assert bad.returncode != 0
    lines = [ln for ln in bad.stderr.splitlines() if ln.strip()]
    assert lines and "GPULEDGER_PG_SCHEMA" in lines[0], bad.stderr
    assert "Traceback" not in bad.stderr
    missing = cli(home, "init", "--admin", "root", "--store", pg_store, ok=False,
                  GPULEDGER_PG_SCHEMA="nosuch")  # fmt: skip
    assert missing.returncode != 0
    lines = [ln for ln in missing.stderr.splitlines() if ln.strip()]
    assert len(lines) <= 2 and "no schema 'nosuch'" in lines[0], missing.stderr


def test_a_command_without_the_schema_setting_refuses_in_one_line_and_creates_nothing(
    tmp_path: Path, pg_store: str
) -> None:
    """atk49 F3: run without GPULEDGER_PG_SCHEMA (a cron job, an auditor's shell) against a
    ledger in another schema, the audit said "chain intact over 0 events", `jobs` listed none,
    and the reads and `serve` made eventsourcing's tables in `public`."""
    with psycopg.connect(pg_store, autocommit=True) as con:
        con.execute(f'CREATE SCHEMA "{SCHEMA}"')
    home = tmp_path / "ledger"
    cli(home, "init", "--admin", "root", "--store", pg_store, GPULEDGER_PG_SCHEMA=SCHEMA)
    before = _tables(pg_store)
    assert {s for s, _ in before} == {SCHEMA}, before
    for args in (("audit", "verify"), ("audit", "check"), ("audit", "sql", "SELECT 1"),
                 ("jobs",), ("replay", "--all")):  # fmt: skip
        got = cli(home, *args, ok=False, GPULEDGER_USER="root")
        lines = [ln for ln in got.stderr.splitlines() if ln.strip()]
        assert got.returncode != 0 and lines, (args, got.stdout, got.stderr)
        assert "holds no ledger in schema 'public'" in lines[0], (args, got.stderr)
        assert "GPULEDGER_PG_SCHEMA" in got.stderr and "Traceback" not in got.stderr, got.stderr
        assert "intact" not in got.stdout, got.stdout
    served = cli(tmp_path / "other", "serve", "--store", pg_store, "--listen", "127.0.0.1:0",
                 ok=False, timeout=60)  # fmt: skip
    assert served.returncode != 0, served.stderr
    assert "holds no ledger in schema 'public'" in served.stderr, served.stderr
    assert _tables(pg_store) == before  # nothing made in `public`
