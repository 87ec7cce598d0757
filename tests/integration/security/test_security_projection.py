"""Red team, someone with store file access editing the projection (F6 of the attack on issue
25): `UPDATE job_intervals SET gpus = gpus * 1000` changes every user's fair share (the
dispatcher ranks from the projection's usage) and is in no event. `audit verify` builds the
projection afresh from the log up to the file's position and names the table and the first row
that differ, embedded and through a running server; an untouched projection verifies."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb

from tests.integration.serverkit import cli, make_token, set_up_ledger, start_server


def test_an_edit_of_the_projections_rows_is_named_by_audit_verify(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)  # job 1 by alice
    alice = make_token(home, "--user", "alice")
    server = start_server(home, "--executor", "record", "--interval", "0.2s")
    try:
        deadline = time.monotonic() + 60
        while True:  # job 1 placed (an interval opened), a few cycles recorded
            status, jobs = server.request("GET", "/v1/jobs", token=alice)
            assert status == 200, jobs
            if jobs and jobs[-1]["status"] != "pending":
                break
            assert time.monotonic() < deadline, jobs
            time.sleep(0.2)
        status, report = server.request("GET", "/v1/audit/verify", token=alice)
        assert status == 200 and report["problems"] == [], report
    finally:
        assert server.stop() == 0
    clean = cli(home, "audit", "verify")
    assert "chain intact" in clean.stdout, clean.stdout

    con = duckdb.connect(str(home / "projections" / "ledger.duckdb"))
    con.execute("UPDATE job_intervals SET gpus = gpus * 1000")
    con.close()
    verify = cli(home, "audit", "verify", ok=False)
    assert verify.returncode == 1, verify.stdout
    assert (
        "the projection's job_intervals differs from the log's fold: first at start_position"
        in (verify.stdout)
    ), verify.stdout

    server = start_server(home, "--executor", "record", "--interval", "1h", log_name="serve2.log")
    try:  # a service holding the file checks it through its own connection
        status, report = server.request("GET", "/v1/audit/verify", token=alice)
        assert status == 200, report
        details = [p["detail"] for p in report["problems"]]
        assert any(d.startswith("the projection's job_intervals differs") for d in details), report
    finally:
        assert server.stop() == 0
