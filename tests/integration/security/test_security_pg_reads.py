"""Red team, reads on a PostgreSQL store (threat model rows T5-T6, docs/security.md): the
projection's reads (`/v1/jobs`, `/v1/log`, ...) run in the read pool there too, under its bounds
(pages of at most 10,000 rows, a person's two reads at once: the third 429), and go on while
PostgreSQL is down: each answers at once from what the server has folded, saying the position it
answers at (`X-Gpuledger-Position`), never waiting for the store. A private PostgreSQL (its own
data directory and port) is stopped for real."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ledger.store.application import Ledger
from schemas import commands as c
from tests.integration.hakit import free_port
from tests.integration.serverkit import BUDGET, Server, cli, make_token, start_server

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "postgres" / "postgres"
HISTORY = 3_000
"""Submissions (each cancelled) before the server starts: 6,000 events, pages of 10,000 rows."""


@dataclass
class World:
    home: Path
    server: Server
    tokens: dict[str, str]
    pg_env: dict[str, str]

    def get(self, path: str, who: str = "bob") -> tuple[int, dict[str, str], Any, float]:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
        began = time.monotonic()
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {self.tokens[who]}"})
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        headers = {k.lower(): x for k, x in resp.getheaders()}
        return resp.status, headers, json.loads(raw) if raw else None, time.monotonic() - began

    def pg(self, *args: str) -> str:
        out = subprocess.run([str(SCRIPT), *args], env=self.pg_env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("pgreads")
    data = Path(tempfile.mkdtemp(prefix="gpuledger-pgreads-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_PG")}
    env |= {"GPULEDGER_PG_DATA": str(data), "GPULEDGER_PG_PORT": str(free_port())}
    w = World(tmp / "ledger", None, {}, env)  # type: ignore[arg-type]
    try:
        dsn = w.pg("up")
        home = w.home
        cli(home, "init", "--admin", "root", "--store", dsn)
        (tmp / "budget.toml").write_text(BUDGET)
        cli(home, "budget", "apply", str(tmp / "budget.toml"), GPULEDGER_USER="root")
        cli(home, "node", "add", "n1", "--gpus", "8", "--gpu-type", "h100", GPULEDGER_USER="root")
        ledger = Ledger(home)
        try:
            for _ in range(HISTORY // 500):
                first = ledger.state.next_job_id
                ledger.execute_all(
                    [c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=0)] * 500
                )
                ledger.execute_all(
                    [c.CancelJob(actor="alice", job_id=j) for j in range(first, first + 500)]
                )
        finally:
            ledger.close()
        w.tokens = {who: make_token(home, "--user", who) for who in ("alice", "bob", "root")}
        w.server = start_server(home, "--interval", "0.5s")
        yield w
    finally:
        if w.server is not None:
            w.server.stop()
        subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True, timeout=300)
        subprocess.run(["rm", "-rf", str(data)], check=False)


def pages_at_once(w: World, n: int = 6) -> list[tuple[int, Any]]:
    answers: list[tuple[int, Any]] = []
    lock = threading.Lock()

    def page(i: int) -> None:
        status, _h, body, _t = w.get(f"/v1/log?limit=10000&after={i}")
        with lock:
            answers.append((status, body))

    threads = [threading.Thread(target=page, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def admitted_by_the_pool(w: World) -> None:
    """Six of bob's pages at once: the read pool admits two, the others hear 429 (on the worker
    thread they would queue, each holding scheduling behind it)."""
    for _attempt in range(5):  # a page may end before the third arrives on a fast machine
        answers = pages_at_once(w)
        assert all(status in (200, 429) for status, _ in answers), answers
        busy = [body for status, body in answers if status == 429]
        if busy:
            assert busy[0]["message"] == "'bob' has 2 queries running already", busy
            return
    raise AssertionError("no page was refused 429: the reads did not go through the read pool")


def test_reads_of_the_projection_run_in_the_read_pool_on_postgresql(world: World) -> None:
    status, headers, body, _t = world.get("/v1/health")
    assert status == 200 and body["store"] == "postgresql", body
    admitted_by_the_pool(world)
    status, _h, body, _t = world.get("/v1/log?limit=10001")
    assert status == 400 and body["message"].startswith("log answers at most 10,000 rows"), body
    status, headers, body, _t = world.get("/v1/log?tail=1")
    assert status == 200 and int(headers["x-gpuledger-position"]) == body[-1]["position"]


def test_with_postgresql_down_reads_answer_at_once_from_what_is_folded(world: World) -> None:
    status, headers, before, _t = world.get("/v1/jobs?limit=10000")
    assert status == 200 and len(before) >= HISTORY
    folded = int(headers["x-gpuledger-position"])
    world.pg("down")
    try:
        down_at = time.monotonic()
        while time.monotonic() - down_at < 15:  # past the store's connect timeout, several times
            for path in ("/v1/jobs?limit=10000", "/v1/log?tail=5", "/v1/shares", "/v1/usage"):
                status, headers, body, took = world.get(path)
                assert status == 200, (path, body)
                assert int(headers["x-gpuledger-position"]) == folded, (path, headers)
                assert took < 10, (path, took, world.server.log_path.read_text()[-3000:])
                if path.startswith("/v1/jobs"):
                    assert body == before
            # about 3 MB a round: a pause keeps bob under the read pool's 4 MiB a second of
            # answers (one round after another was refused 429 once reads got fast)
            time.sleep(1.0)
        admitted_by_the_pool(world)  # still bounded, still beside the worker
    finally:
        world.pg("up")
    # back: a write goes through (once the server has its store again) and the next read
    # answers at its position
    body = {"actor": "", "account": "ai2/olmo", "gpus": 1, "min_runtime_s": 60}
    deadline = time.monotonic() + 120
    while True:
        status, got = world.server.request(
            "POST", "/v1/commands/submit", body, token=world.tokens["alice"]
        )
        if status == 200:
            break
        assert status == 503 and time.monotonic() < deadline, (status, got)
        time.sleep(1)
    status, headers, tail, _t = world.get("/v1/log?tail=1")
    assert status == 200 and int(headers["x-gpuledger-position"]) >= got["position"] > folded
    assert tail[-1]["position"] >= got["position"]


def test_with_postgresql_down_every_get_route_answers_within_ten_seconds(world: World) -> None:
    """Every GET route of the app (found in its source, as the query gate's test finds them),
    asked while PostgreSQL is stopped for real, answers within 10 s: from what is folded, or 503
    in one line when it needs the worker thread and the worker waits on the store; never a 500,
    never a hang (finding F5). Asked all at once, by three people (a 429 is an answer too)."""
    from tests.integration.security.test_security_query import get_routes

    routes = [path for path, _schema in get_routes()]
    assert len(routes) >= 30, routes
    status, _h, _body, _t = world.get("/v1/jobs?limit=5")
    assert status == 200
    world.pg("down")
    answers: dict[str, tuple[int, Any, float]] = {}
    lock = threading.Lock()

    def ask(i: int, path: str) -> None:
        who = ("alice", "bob", "root")[i % 3]
        conn = http.client.HTTPConnection("127.0.0.1", world.server.port, timeout=60)
        began = time.monotonic()
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {world.tokens[who]}"})
            resp = conn.getresponse()
            raw = resp.read()
            status, took = resp.status, time.monotonic() - began
            body: Any = json.loads(raw) if "json" in (resp.getheader("content-type") or "") else ""
        except OSError as err:  # no answer within the minute
            status, body, took = -1, repr(err), 99.0
        finally:
            conn.close()
        with lock:
            answers[path] = (status, body, took)

    try:
        for _round in range(2):  # the second round after the worker has met the store away
            threads = [threading.Thread(target=ask, args=(i, p)) for i, p in enumerate(routes)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            answers = {p: got for p, got in answers.items() if p in routes}
            wrong = {
                path: (status, body if status >= 500 else "", round(took, 1))
                for path, (status, body, took) in answers.items()
                if took >= 10 or status == -1 or (status >= 500 and status != 503)
            }
            assert not wrong, (wrong, world.server.log_path.read_text()[-3000:])
            assert set(answers) == set(routes), set(routes) - set(answers)  # none left hanging
            for status, body, _took in answers.values():
                if status == 503:
                    assert body["code"] == "unavailable" and "\n" not in body["detail"], body
    finally:
        world.pg("up")
    deadline = time.monotonic() + 120  # back: the worker's reads answer again
    while world.get("/v1/queue?limit=2")[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(1)
