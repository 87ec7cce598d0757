"""The Budget review's what-if of a period decided by a policy this build has no code for is
refused at once, in one whole sentence (atk47-29 F7: on the pages benchmark's history, whose
decisions name `synthetic-1`, it was a 503 after 31 s, its message cut mid-word)."""

from __future__ import annotations

import time
from pathlib import Path

from projections.testing.synthetic import Shape, append_to_store, synthetic_events
from tests.integration.serverkit import make_token, start_server


def test_a_whatif_of_a_period_decided_by_an_unknown_policy_is_refused_at_once(
    tmp_path: Path,
) -> None:
    home = tmp_path / "ledger"
    append_to_store(home, synthetic_events(5_000, seed=3, shape=Shape(nodes=16)))
    token = make_token(home)  # root: may set any account's shares
    server = start_server(home, "--executor", "none")
    try:
        began = time.monotonic()
        status, body = server.request(
            "POST", "/ui/api/budget/whatif",
            {"account": "prog0/proj0/user0_0_0", "shares": 8}, token=token,
        )  # fmt: skip
        took = time.monotonic() - began
    finally:
        assert server.stop() == 0, server.log_path.read_text()
    assert status == 400 and body["code"] == "invalid", body
    detail = body["detail"]
    assert "'synthetic-1', whose code this build of gpu-ledger does not have (it has " in detail
    assert body["message"].endswith(")") and "fairshare-7" in body["message"], body
    assert took < 10, f"refused after {took:.1f} s"
