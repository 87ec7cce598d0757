"""Red team (the attack atk25c on issue 25), against a real server:

- F1: a link hashes the previous event whole, so shown to someone who may not see that event it
  confirms a guess of its private fields offline. `audit verify`'s head link and the dashboard's
  decision record (its `prev_hash`) are an admin's alone; a plain user gets them empty.
- F7: a budget plan checked as it would be applied, by someone who manages nothing, is refused
  at once with one line (before the file is parsed), the same line embedded and served.
- F5: whole-log audits run one of each kind at a time for admins and one for everyone else:
  a plain user's audit never keeps an admin from theirs (`AuditLane`, tests/unit).
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration.serverkit import cli, make_token, set_up_ledger, start_server

BIG = "".join(f'[accounts."ai2/p{i}"]\nkind = "project"\n' for i in range(1500))


def test_hashes_of_events_a_viewer_may_not_see_are_an_admins_alone(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)  # job 1 by alice
    bob = make_token(home, "--user", "bob")
    root = make_token(home, "--user", "root")
    server = start_server(home, "--executor", "record", "--interval", "0.2s")
    try:
        deadline = time.monotonic() + 60
        while True:  # job 1 placed by a recorded decision
            status, rows = server.request("GET", "/ui/api/decisions", token=root)
            assert status == 200, rows
            rows = rows["rows"]
            if rows:
                break
            assert time.monotonic() < deadline, rows
            time.sleep(0.2)
        position = rows[0]["position"]
        status, theirs = server.request("GET", f"/ui/api/decision/{position}", token=bob)
        assert status == 200, theirs
        status, admins = server.request("GET", f"/ui/api/decision/{position}", token=root)
        assert status == 200, admins
        assert theirs["record"]["prev_hash"] == "" and admins["record"]["prev_hash"], admins
        assert {**theirs["record"], "prev_hash": ""} == {**admins["record"], "prev_hash": ""}
        status, verify = server.request("GET", "/v1/audit/verify", token=bob)
        assert status == 200 and verify["problems"] == [] and verify["head_hash"] == "", verify
        status, verify = server.request("GET", "/v1/audit/verify", token=root)
        assert status == 200 and verify["head_hash"].startswith("v"), verify
    finally:
        assert server.stop() == 0


def test_a_checked_plan_by_someone_who_manages_nothing_is_refused_before_any_work(
    tmp_path: Path,
) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    (tmp_path / "big.toml").write_text(BIG)
    embedded = cli(home, "budget", "apply", "big.toml", "--dry-run", ok=False, cwd=tmp_path,
                   GPULEDGER_USER="alice")  # fmt: skip
    assert "'alice' manages no account" in embedded.stderr, embedded.stderr
    alice = make_token(home, "--user", "alice")
    mgr = make_token(home, "--user", "mgr")
    server = start_server(home, "--interval", "1h")
    try:
        # refused before the file is parsed: a file that does not parse still gets the 403
        broken = {"name": "big.toml", "toml": BIG + "[accounts.\n", "check": True}
        status, answer = server.request("POST", "/v1/budget/plan", broken, token=alice)
        assert status == 403 and "manages no account" in answer["detail"], answer
        status, answer = server.request("POST", "/v1/budget/plan", broken, token=mgr)
        assert status == 400, answer  # a manager's file is parsed: its error is the parser's
        body = {"name": "big.toml", "toml": BIG, "check": True}
        served = cli(home, "budget", "apply", "big.toml", "--dry-run", ok=False, cwd=tmp_path,
                     GPULEDGER_USER="alice")  # fmt: skip
        assert (served.returncode, served.stderr) == (embedded.returncode, embedded.stderr)
        # a manager's plan is still made (and refused where it reaches beyond their subtree)
        status, answer = server.request("POST", "/v1/budget/plan", body, token=mgr)
        assert status == 403 and "manages no account" not in answer["detail"], answer
    finally:
        assert server.stop() == 0
