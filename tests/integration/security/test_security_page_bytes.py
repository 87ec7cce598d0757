"""Red team, pages bounded in rows only (atk44-25 F10: 52 of a user's own 4 MB jobs made each
`/v1/jobs` and `/v1/log` page a 214 MB answer and grew the server from 0.9 to 3.3 GB): a page
ends before the row that would pass `pooled.MAX_PAGE_BYTES` and says so in a header. A real
server; on the old code the page was whole (~40 MB) and said nothing."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

from ledger.server.meters import READ_BURST_ENV
from ledger.server.pooled import MAX_PAGE_BYTES
from tests.integration.serverkit import make_token, set_up_ledger, start_server

WHOLE_PAGES = {READ_BURST_ENV: str(1 << 30)}
"""These tests read several 32 MiB pages at once, more than a person's allowance of answers'
bytes (`meters.READ_BYTES_BURST`, one such page): that allowance has its own test
(test_security_read_bytes)."""


def get(port: int, path: str, token: str) -> tuple[int, dict[str, str], Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, raw


def test_a_page_of_large_rows_ends_at_its_bytes_and_says_so(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    root, alice = make_token(home, "--user", "root"), make_token(home, "--user", "alice")
    server = start_server(home, env=WHOLE_PAGES)
    try:
        big = ["/bin/true", *["z" * 4000] * 200]  # 800 KB each, 50 of them: 40 MB of rows
        body = {"actor": "", "account": "ai2/olmo", "user": "alice", "gpus": 1, "command": big}
        for _ in range(50):  # by an admin for her (an admin's writes are not metered)
            status, answer = server.request("POST", "/v1/commands/submit", body, root)
            assert status == 200, answer
        status, headers, raw = get(server.port, "/v1/jobs?user=alice&limit=10000", alice)
        assert status == 200
        rows = json.loads(raw)
        assert len(raw) <= MAX_PAGE_BYTES + 2 and 30 <= len(rows) < 51
        assert headers["x-gpuledger-truncated"] == str(len(rows))
        status, headers, raw = get(server.port, "/v1/log?limit=10000", alice)
        assert status == 200 and len(raw) <= MAX_PAGE_BYTES + 2
        assert headers["x-gpuledger-truncated"] == str(len(json.loads(raw)))
        for _ in range(50):  # finished: the dashboard's Finished page
            status, answer = server.request(
                "POST", "/v1/commands/cancel", {"actor": "", "job_id": 2 + _}, root
            )
            assert status == 200, answer
        status, headers, raw = get(server.port, "/ui/api/finished?limit=1000", alice)
        page = json.loads(raw)
        assert status == 200 and len(raw) <= MAX_PAGE_BYTES + 200 and page["total"] == 50
        assert 30 <= len(page["rows"]) < 51 and page["limit"] == len(page["rows"])
        status, headers, raw = get(server.port, "/v1/jobs?user=alice&limit=5", alice)
        assert status == 200 and len(json.loads(raw)) == 5  # a page within its bytes: whole
        assert "x-gpuledger-truncated" not in headers
    finally:
        assert server.stop() == 0


def test_a_page_cut_at_its_bytes_is_continued_after_its_last_job(tmp_path: Path) -> None:
    """atk44z F6: a page cut at 32 MiB could not be continued: /v1/jobs had nothing that means
    "after this row", and paging by `until` (the last row's time, inclusive) repeated a page
    once a group commit's rows shared their `submitted_at`: some jobs were never listed.
    `before_id` (the last row's job id, which no two jobs share) pages through them all."""
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    root, alice = make_token(home, "--user", "root"), make_token(home, "--user", "alice")
    server = start_server(home, env=WHOLE_PAGES)
    try:
        big = ["/bin/true", *["z" * 4000] * 200]  # 800 KB each
        submit = {"op": "submit", "actor": "", "account": "ai2/olmo", "user": "alice",
                  "gpus": 1, "command": big}  # fmt: skip
        for _ in range(12):  # 4 jobs a batch (a body is at most 4 MiB), one commit each:
            body = {"commands": [submit] * 4}  # one submitted_at for the four
            status, answer = server.request("POST", "/v1/batch", body, root)
            assert status == 200, answer
        seen: list[int] = []
        cuts = 0
        path = "/v1/jobs?user=alice&limit=10000"
        for _ in range(10):
            status, headers, raw = get(server.port, path, alice)
            assert status == 200, raw  # was 400: `before_id` unknown
            rows = json.loads(raw)
            if not rows:
                break
            seen += [row["job_id"] for row in rows]
            cuts += "x-gpuledger-truncated" in headers
            path = f"/v1/jobs?user=alice&limit=10000&before_id={rows[-1]['job_id']}"
        assert cuts >= 1
        assert sorted(seen, reverse=True) == seen and len(set(seen)) == len(seen) == 49
        status, _headers, raw = get(server.port, f"/v1/jobs?user=alice&before_id={seen[10]}", alice)
        assert [row["job_id"] for row in json.loads(raw)] == seen[11:]  # a page within its bytes
    finally:
        assert server.stop() == 0
