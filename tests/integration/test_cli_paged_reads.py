"""Reads past a server's page (`MAX_READ_ROWS` rows) answer through a server as they do embedded:
the CLI pages them (atk50-29 F8: `log --tail 15000` and `jobs --limit 15000` answered embedded
and were refused through a server, the hint naming the API's `after=`, not `--after`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ledger.store.application import Ledger
from schemas import commands as c
from schemas.bounds import MAX_READ_ROWS
from tests.integration.serverkit import Server, cli, make_token, set_up_ledger, start_server

JOBS = 12_000


def test_log_and_jobs_past_a_page_print_the_same_through_a_server(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    ledger = Ledger(home)
    try:
        submit = c.SubmitJob(actor="bob", account="ai2/olmo", gpus=1, min_runtime_s=60)
        for _ in range(JOBS // 500):
            ledger.execute_all([submit] * 500)
    finally:
        ledger.close()
    # a server that decides once (it places what fits), then one with nothing to record
    token = make_token(home, "--user", "root")
    server = start_server(home, "--interval", "1h")
    _one_cycle(server)
    assert server.stop() == 0
    n = MAX_READ_ROWS + 500
    at = f"{time.time():.3f}"
    reads = [
        ("log", "--tail", str(n), "--json"),
        ("log", "--tail", str(n)),  # the table too
        ("log", "--after", "17", "--limit", str(n), "--json"),
        ("log", "--after", "17", "--tail", str(3 * MAX_READ_ROWS), "--json"),  # all after 17
        ("jobs", "--limit", str(n), "--at", at, "--json"),
        ("jobs", "--limit", str(n), "--before-id", "11000", "-u", "bob", "--at", at, "--json"),
        ("jobs", "--limit", str(2 * JOBS), "--at", at, "--json"),  # all of them, fewer than asked
    ]
    embedded = [cli(home, *r).stdout for r in reads]
    server = start_server(home, "--interval", "1h", log_name="serve2.log")
    try:
        _one_cycle(server)
        head = server.head()
        url = {"GPULEDGER_URL": server.url, "GPULEDGER_TOKEN": token}
        over_http = [cli(tmp_path / "nowhere", *r, **url).stdout for r in reads]
        over_socket = [cli(home, *r).stdout for r in reads]
        assert server.head() == head, "the log moved under the reads"
    finally:
        assert server.stop() == 0
    for r, a, b, want in zip(reads, over_http, over_socket, embedded, strict=True):
        assert a == want, r
        assert b == want, r
    counts = [
        len(json.loads(out)) if "--json" in r else None
        for r, out in zip(reads, embedded, strict=True)
    ]
    assert counts[0] == counts[2] == counts[4] == counts[5] == n, counts
    assert counts[3] == head - 17 and counts[6] == JOBS + 1, (counts, head)
    said = cli(home, "log", "--tail", "100001", ok=False).stderr  # the bound stands, one line
    assert said.count("\n") == 1 and "[invalid]" in said, said


def _one_cycle(server: Server) -> None:
    deadline = time.monotonic() + 30
    while server.request("GET", "/v1/health")[1]["cycles"] < 1:
        assert time.monotonic() < deadline, "no cycle ran"
        time.sleep(0.1)
