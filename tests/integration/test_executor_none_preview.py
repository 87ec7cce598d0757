"""Under `serve --executor none` nothing is placed, and the previews say so: `queue`, `explain`
and the Queue page's API give a job first in line the reason "nothing is placed: ..." and no
estimated start, never "placed in the next cycle" with a start of now (docs/dashboard.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.integration.dashkit import build
from tests.integration.serverkit import cli, make_token, start_server

NOTHING = "nothing is placed: the service runs with --executor none"


def test_previews_under_executor_none_promise_no_placement(tmp_path: Path) -> None:
    dash = build(tmp_path / "ledger", days=0.5)
    home = dash.home
    token = make_token(home, "--user", "root")
    server = start_server(home, "--executor", "none", "--interval", "1s")
    try:
        deadline = time.monotonic() + 60
        while server.request("GET", "/v1/health")[1]["cycles"] < 2:
            assert time.monotonic() < deadline, server.log_path.read_text()
            time.sleep(0.1)
        rows = json.loads(cli(home, "queue", "--json", GPULEDGER_USER="root").stdout)
        first = [r for r in rows if r["code"] == "NEXT_CYCLE"]
        assert first, rows  # free GPUs and jobs that fit: the next cycle would place them
        for r in first:
            assert r["reason"] == NOTHING and r["estimated_start_at"] is None, r
        job = first[0]["job_id"]
        said = cli(home, "explain", str(job), GPULEDGER_USER="root").stdout
        assert "placed in the next cycle, but nothing is placed" in said, said
        assert "Estimated start: unknown" in said or "estimated start: unknown" in said, said
        status, page = server.request("GET", "/ui/api/queue?state=pending", token=token)
        assert status == 200
        shown = {e["row"]["job_id"]: e["row"] for e in page["rows"]}
        assert shown[job]["reason"] == NOTHING and shown[job]["estimated_start_at"] is None
    finally:
        assert server.stop() == 0, server.log_path.read_text()
