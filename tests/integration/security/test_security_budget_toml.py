"""Red team, a budget file that costs the parser more than its size (atk44-25 F14: a plain
user's 200 KB plan of one dotted key, `a.a.a...=1`, grew the server past 16 GB in tomllib, no
answer). A real server: one 400 line at once, and the server's memory stays where it was."""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration.serverkit import make_token, set_up_ledger, start_server


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_budget_file_of_one_long_dotted_key_is_one_line_at_once(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    alice = make_token(home, "--user", "alice")  # manages nothing
    server = start_server(home)
    try:
        before = rss_kb(server.proc.pid)
        for toml in ("a" + ".a" * 100_000 + "=1", "x = " + "[" * 5_000 + "]" * 5_000):
            body = {"name": "x.toml", "toml": toml, "prune": False, "check": False, "actor": ""}
            began = time.monotonic()
            status, answer = server.request("POST", "/v1/budget/plan", body, alice)
            assert time.monotonic() - began < 5
            assert status == 400, answer
            assert answer["message"].startswith("x.toml: line 1: ")
            assert "refused before parsing" in answer["message"]
        assert rss_kb(server.proc.pid) < before + 200_000  # was past 16 GB
    finally:
        assert server.stop() == 0
