"""Red team, a signed-in user reading another's secrets (threat model rows T1-T3,
docs/security.md): a secret planted in alice's job (its command and a label) appears on no read
path for anyone but its owner, the managers of its account or one above it, and admins. Every
GET route the server has (the OpenAPI document's and the dashboard's, found in the source so a
new route cannot be forgotten), every audit table kind, and the CLI's reads in both faces are
tried for every kind of reader. `audit sql` is for admins only, through the server and
embedded alike, with one clear line; the raw event payloads (`events.raw`) are reachable by no
one else."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.integration.serverkit import Server, cli, make_token, set_up_ledger, start_server

SECRET = "--wandb-key=wk_7f3c9a1e5b"
LABEL = "run-olmo-secret-77"
SEES = {"alice": True, "mgr": True, "root": True, "bob": False, "carol": False, "othermgr": False}
"""Job 2 is alice's in ai2/olmo (managed by mgr); root is the admin; bob shares her team but is
no manager; carol and othermgr are of ai2/tulu."""
SERVER = Path(__file__).parents[3] / "ledger" / "server"
ROUTE = re.compile(r"@get\(\s*\"(/[^\"]*)\"")


@dataclass
class World:
    home: Path
    server: Server
    tokens: dict[str, str]
    decision: int
    outputs: list[str]
    """Job 2's output files as its run reported them (`job.started`'s logs): private too."""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("privacy")
    home = tmp / "ledger"
    set_up_ledger(home, tmp)
    cli(
        home, "submit", "-A", "ai2/olmo", "-G", "1", "--label", f"run={LABEL}", "--",
        "sh", "-c", "exit 0", "train.py", SECRET, GPULEDGER_USER="alice",  # runs anywhere
    )  # fmt: skip
    tokens = {who: make_token(home, "--user", who) for who in SEES}
    # alice has no OS account here: `--run-as service` runs her job as nobody (a job whose owner
    # has no account is refused before it starts, and the plant needs its output files)
    server = start_server(home, "--interval", "0.2s", "--executor", "local", "--run-as", "service")
    try:
        deadline = time.monotonic() + 60
        while True:  # job 2 placed, started and ended
            status, rows = server.request("GET", "/v1/jobs", token=tokens["root"])
            assert status == 200, rows
            job = next((r for r in rows if r["job_id"] == 2 and r["status"] == "finished"), None)
            if job is not None:
                break
            assert time.monotonic() < deadline, rows
            time.sleep(0.1)
        status, decisions = server.request("GET", "/ui/api/decisions", token=tokens["root"])
        assert status == 200 and decisions["rows"], decisions
        assert job["logs"], json.dumps(job)  # it ran: its output files are planted too
        yield World(home, server, tokens, int(decisions["rows"][-1]["position"]), list(job["logs"]))
    finally:
        assert server.stop() == 0


def _fill(path: str, w: World) -> str:
    values = {"job_id": "2", "position": str(w.decision), "page": "job", "name": "app.js"}

    def one(m: re.Match[str]) -> str:
        name = m.group(1).split(":")[0]
        assert name in values, f"{path}: no value for {{{name}}}: add one to this test"
        return values[name]

    return re.sub(r"\{([^}]+)\}", one, path)


def get_routes(w: World) -> list[str]:
    """Every GET route: the OpenAPI document's (with their required query parameters) and the
    ones outside it, read from the server's source."""
    status, doc = w.server.request("GET", "/v1/openapi.json", token=w.tokens["root"])
    assert status == 200
    queries = {"job_id": "2", "limit": "10000", "node": "n1"}
    out = []
    for path, ops in doc["paths"].items():
        if "get" not in ops:
            continue
        needed = [
            p["name"]
            for p in ops["get"].get("parameters", [])
            if p.get("in") == "query" and p.get("required")
        ]
        query = {n: queries[n] for n in needed} | ({"limit": "10000"} if path == "/v1/log" else {})
        out.append(_fill(path, w) + ("?" + "&".join(f"{k}={v}" for k, v in query.items())))
    for source in sorted(SERVER.glob("*.py")):
        for path in ROUTE.findall(source.read_text()):
            if path.startswith("/v1/") or path == "/":
                continue  # in the OpenAPI document (or the redirect to the pages)
            out.append(_fill(path, w))
    assert {"/ui/api/job/2", "/ui/api/job/2/replay", "/v1/jobs?", "/v1/log?limit=10000"} <= {
        r.split("?")[0] if r.startswith("/ui") else r for r in out
    }, out
    return sorted(set(out))


def _text(body: Any) -> str:
    """A response as text, with audit tables' Arrow streams decoded."""
    if isinstance(body, dict) and "arrow" in body:
        table = pa.ipc.open_stream(base64.b64decode(body["arrow"])).read_all()
        return json.dumps(table.to_pylist(), default=str)
    return body.decode(errors="replace") if isinstance(body, bytes) else json.dumps(body)


AUDIT_KINDS = [
    {"kind": "job", "job_id": 2},
    {"kind": "preemptions"},
    {"kind": "budget-changes"},
]


@pytest.mark.parametrize("who", sorted(SEES))
def test_a_planted_secret_shows_on_no_read_path_to_those_who_may_not_see_it(
    world: World, who: str
) -> None:
    token = world.tokens[who]
    seen = []
    for route in get_routes(world):
        status, body = world.server.request("GET", route, token=token)
        assert status < 500, (route, body)
        seen.append((route, status, _text(body)))
    for query in AUDIT_KINDS:
        status, body = world.server.request("POST", "/v1/audit/table", query, token=token)
        assert status == 200, (query, body)
        seen.append((str(query), status, _text(body)))
    planted = [SECRET, LABEL, *world.outputs]
    leaks = [route for route, _s, text in seen if any(p in text for p in planted)]
    if SEES[who]:
        assert "/v1/jobs?" in leaks and "/ui/api/job/2" in leaks, leaks  # it is theirs to see
    else:
        assert leaks == [], leaks


SQL = [
    "SELECT raw FROM events",
    "SELECT command FROM jobs",
    "SELECT count(*) FROM events",  # even a harmless one: the rule is per caller, not per query
]


@pytest.mark.parametrize("who", sorted(SEES))
def test_audit_sql_is_for_admins_only_through_the_server(world: World, who: str) -> None:
    for sql in SQL:
        status, body = world.server.request(
            "POST", "/v1/audit/table", {"kind": "sql", "sql": sql}, token=world.tokens[who]
        )
        if who == "root":
            assert status == 200, body
            if "raw" in sql or "command" in sql:
                assert SECRET in _text(body)
            continue
        assert status == 403, body
        assert body["code"] == "forbidden"
        assert body["message"] == (
            f"{who!r} may not run audit sql: it reads every job's command, logs and event "
            "payloads, which only admins may"
        )
        assert SECRET not in json.dumps(body)


def test_the_cli_refuses_audit_sql_to_a_plain_user_in_both_faces(world: World) -> None:
    url = {"GPULEDGER_URL": world.server.url, "GPULEDGER_TOKEN": world.tokens["bob"]}
    remote = cli(world.home, "audit", "sql", "SELECT raw FROM events", ok=False, **url)
    assert remote.returncode == 1 and remote.stdout == ""
    assert remote.stderr.count("\n") == 1, remote.stderr
    assert "'bob' may not run audit sql" in remote.stderr and SECRET not in remote.stderr
    for query in (["audit", "job", "2", "--json"], ["jobs", "--json"], ["audit", "preemptions"]):
        out = cli(world.home, *query, **url)
        assert SECRET not in out.stdout and LABEL not in out.stdout, query
    # embedded: the server stopped, the same actor (`--as` of an admin on this host)
    assert world.server.stop() == 0
    local = cli(
        world.home, "audit", "sql", "SELECT raw FROM events", ok=False, GPULEDGER_USER="bob"
    )
    assert local.returncode == 1 and local.stdout == ""
    assert "'bob' may not run audit sql" in local.stderr and SECRET not in local.stderr
    for query in (
        ["audit", "job", "2", "--json"],
        ["jobs", "--json"],
        ["log", "--json", "--limit", "10000"],
    ):
        out = cli(world.home, *query, GPULEDGER_USER="bob")
        assert SECRET not in out.stdout and LABEL not in out.stdout, query
        mine = cli(world.home, *query, GPULEDGER_USER="alice")
        if query[0] != "audit":
            assert SECRET in mine.stdout, query
    admin = cli(world.home, "audit", "sql", "SELECT raw FROM events", "--json")
    assert SECRET in admin.stdout
