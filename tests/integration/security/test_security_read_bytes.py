"""Red team (threat model row T5, docs/security.md; atk47-29 F1): one signed-in plain user
loops a legal 1,000-row queue page that is kept for its log position. A kept answer takes no
turn in the read pool, and before, nothing charged its bytes: within her 50 requests a second
and her minute's 1,200 reads, she was sent ~67 MB/s of JSON and everyone else's pages slowed
8-60x. Now every answer a person is sent, kept or not, is charged its bytes against their
allowance (`ReadPool.sent`), and past it their reads are 429 with Retry-After while another
person's are answered. A real server, counted (not timed); the allowance is set small
(`GPULEDGER_READ_SENT_RATE`, `GPULEDGER_READ_SENT_BURST`) so that a few pages pass it."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ledger.store.application import Ledger
from schemas import commands as c
from tests.integration.serverkit import make_token, set_up_ledger, start_server

PENDING = 1000
RATE = 1 << 20
BURST = 4 << 20
BIG = "/ui/api/queue?sort=user&descending=true&limit=1000"
"""The looped page: every pending job, ~1 MB (kept once read at a position)."""
SMALL = ("/ui/api/queue?limit=5", "/ui/api/nodes", "/v1/whoami")


def _get(port: int, path: str, token: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, raw


def test_one_users_loop_of_kept_big_pages_is_refused_past_her_bytes_anothers_reads_answered(
    tmp_path: Path,
) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    ledger = Ledger(home)
    try:
        for _ in range(PENDING // 100):  # 8 GPUs each on one 8-GPU node: they wait
            ledger.execute_all(
                [c.SubmitJob(actor="bob", account="ai2/olmo", gpus=8, min_runtime_s=3600)] * 100
            )
    finally:
        ledger.close()
    tokens = {who: make_token(home, "--user", who) for who in ("root", "alice", "carol")}
    env = {"GPULEDGER_READ_SENT_RATE": str(RATE), "GPULEDGER_READ_SENT_BURST": str(BURST)}
    server = start_server(home, "--interval", "1s", env=env)
    try:
        port = server.port
        status, _h, page = _get(port, BIG, tokens["root"])
        assert status == 200 and len(json.loads(page)["rows"]) == 1000, page[:200]
        size = len(page)
        assert size > 500_000, size

        stop = threading.Event()
        carol: Counter[int] = Counter()
        failures: list[Any] = []

        def victim() -> None:
            while not stop.is_set():
                for path in SMALL:
                    got, _h, body = _get(port, path, tokens["carol"])
                    carol[got] += 1
                    if got != 200:
                        failures.append((path, got, body[:300]))
                time.sleep(0.1)

        thread = threading.Thread(target=victim)
        thread.start()
        alice: Counter[int] = Counter()
        refusals: list[tuple[dict[str, str], bytes]] = []
        began = time.monotonic()
        try:
            while time.monotonic() - began < 20 and len(refusals) < 8:
                got, headers, body = _get(port, BIG, tokens["alice"])  # one at a time
                alice[got] += 1
                if got == 429:
                    refusals.append((headers, body))
        finally:
            took = time.monotonic() - began
            stop.set()
            thread.join()
    finally:
        assert server.stop() == 0
    print(f"alice {dict(alice)} pages of {size} bytes in {took:.1f} s; carol {dict(carol)}")
    assert set(alice) <= {200, 429}, alice
    assert refusals, f"alice was never refused: {alice} pages of {size} bytes in {took:.1f} s"
    headers, body = refusals[0]
    problem = json.loads(body)
    assert "MiB of answers" in problem["message"] and "\n" not in problem["detail"], problem
    assert int(headers["retry-after"]) >= 1, headers
    # what she was sent: her allowance (and the one page past it that found it above zero)
    assert alice[200] * size <= BURST + RATE * took + size, (alice, size, took)
    # carol's reads, all the while: every one answered
    assert not failures, failures[:3]
    assert carol[200] >= 3 * len(SMALL), carol


def test_an_allowance_that_is_not_a_positive_number_stops_the_server_saying_so(
    tmp_path: Path,
) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    with pytest.raises(AssertionError, match="GPULEDGER_READ_SENT_RATE"):
        start_server(home, env={"GPULEDGER_READ_SENT_RATE": "-5"})
