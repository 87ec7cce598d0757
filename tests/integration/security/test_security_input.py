"""Red team, hostile bodies at the API (threat model row T14, docs/security.md), against a real
`gpuledger serve`: every POST route with a body (found in the OpenAPI document, so a new one
cannot be forgotten) is sent what a fuzzer or an attacker sends: nesting thousands deep, bodies
over the limit, malformed JSON, the wrong shape, a field nobody knows, a value of the wrong
type (`"gpus": "2"`, `0` for a boolean), strings and lists past their bounds, NUL characters.
Each is one problem+json line, 400 (413 past the size limit), never a 5xx, and appends nothing;
the server then takes a good command as before."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ledger.server.commands import MAX_BODY
from tests.integration.serverkit import Server, make_token, set_up_ledger, start_server


@dataclass
class Api:
    server: Server
    token: str
    node_token: str

    def post(self, path: str, body: bytes, token: str | None = None) -> tuple[int, str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {token or self.token}",
        }
        try:
            conn.request("POST", path, body=body, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            kind = resp.getheader("content-type", "")
        finally:
            conn.close()
        return resp.status, kind, json.loads(raw) if raw else None

    def head(self) -> int:
        status, health = self.server.request("GET", "/v1/health")
        assert status == 200, health
        return int(health["head"])


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("input")
    home = tmp / "ledger"
    set_up_ledger(home, tmp)
    token = make_token(home, "--user", "alice")
    node_token = make_token(home, "--node", "n1")
    server = start_server(home, "--executor", "agents")
    try:
        yield Api(server, token, node_token)
    finally:
        assert server.stop() == 0


def post_routes(api: Api) -> list[str]:
    status, doc = api.server.request("GET", "/v1/openapi.json", token=api.token)
    assert status == 200
    routes = sorted(p for p, ops in doc["paths"].items() if "requestBody" in ops.get("post", {}))
    assert {"/v1/commands/submit", "/v1/batch", "/v1/audit/table", "/v1/budget/plan",
            "/v1/agent/report", "/v1/agent/register",
            "/v1/agent/heartbeat"} <= set(routes)  # fmt: skip
    return routes


DEEP = 5_000
ANY_ROUTE: dict[str, tuple[bytes, int]] = {
    "arrays nested thousands deep": (b"[" * DEEP + b"]" * DEEP, 400),
    "objects nested thousands deep": (b'{"a":' * DEEP + b"1" + b"}" * DEEP, 400),
    "a field deep in nesting": (b'{"actor": ' + b"[" * DEEP + b"]" * DEEP + b"}", 400),
    "over the size limit": (b'{"actor": "' + b"x" * (MAX_BODY + 1) + b'"}', 413),
    "malformed JSON": (b'{"actor": ', 400),
    "not an object": (b"null", 400),
    "a list": (b"[1, 2]", 400),
    "an unknown field only": (b'{"zz_unknown": 1}', 400),
    "not UTF-8": (b'{"actor": "\xff\xfe"}', 400),
    "empty": (b"", 400),
}

SUBMIT = {"actor": "", "account": "ai2/olmo", "gpus": 1, "min_runtime_s": 0, "command": ["true"]}
"""A good submit of alice's: each case below spoils one thing of it."""


def spoilt(**change: Any) -> bytes:
    return json.dumps(SUBMIT | change).encode()


TARGETED: dict[str, tuple[str, bytes, int]] = {
    "a string for an integer": ("/v1/commands/submit", spoilt(gpus="2"), 400),
    "a float for an integer": ("/v1/commands/submit", spoilt(gpus=2.0), 400),
    "0 for a boolean": ("/v1/commands/submit", spoilt(resumable=0), 400),
    "a string for a boolean": ("/v1/commands/submit", spoilt(resumable="true"), 400),
    "an unknown field": ("/v1/commands/submit", spoilt(gpus_per_node=1), 400),
    "a NUL in the command": ("/v1/commands/submit", spoilt(command=["echo", "a\x00b"]), 400),
    "a NUL in a label": ("/v1/commands/submit", spoilt(labels={"k": "\x00"}), 400),
    "a huge string": ("/v1/commands/submit", spoilt(command=["x" * 100_000]), 400),
    "a huge list": ("/v1/commands/submit", spoilt(command=["x"] * 100_000), 400),
    "a huge map": ("/v1/commands/submit", spoilt(env={f"V{i}": "x" for i in range(20_000)}), 400),
    "labels nested deep": (
        "/v1/commands/submit",
        json.dumps(SUBMIT)[:-1].encode() + b', "labels": ' + b"[" * DEEP + b"]" * DEEP + b"}",
        400,
    ),
    "an integer past its bound": ("/v1/commands/submit", spoilt(gpus=2**70), 400),
    "a batch's command of the wrong type": (
        "/v1/batch",
        json.dumps({"commands": [{"op": "submit"} | SUBMIT | {"gpus": "1"}]}).encode(),
        400,
    ),
    "a batch with an unknown field": ("/v1/batch", b'{"commands": [], "atomic": true}', 400),
    "a batch's command with an unknown field": (
        "/v1/batch",
        json.dumps({"commands": [{"op": "submit"} | SUBMIT | {"x": 1}]}).encode(),
        400,
    ),
    "an audit table's job id as a string": (
        "/v1/audit/table",
        b'{"kind": "job", "job_id": "1"}',
        400,
    ),
    "an audit table with an unknown field": (
        "/v1/audit/table",
        b'{"kind": "preemptions", "limit": 1}',
        400,
    ),
    "TOML nested thousands deep": (
        "/v1/budget/plan",
        json.dumps({"toml": "a = " + "[" * DEEP + "]" * DEEP}).encode(),
        400,
    ),
    "TOML with a NUL": ("/v1/budget/plan", json.dumps({"toml": 'a = "\x00"'}).encode(), 400),
    "a budget plan with an unknown field": ("/v1/budget/plan", b'{"toml": "", "x": 1}', 400),
}

NODE: dict[str, tuple[str, bytes, int]] = {
    "a heartbeat with an unknown field": ("/v1/agent/heartbeat", b'{"node":"n1","x":1}', 400),
    "a node name as a number": ("/v1/agent/heartbeat", b'{"node": 1}', 400),
    "a report's job id as a string": (
        "/v1/agent/report",
        b'{"node":"n1","started":[{"job_id":"1","run":0}]}',
        400,
    ),
    "a report's item with an unknown field": (
        "/v1/agent/report",
        b'{"node":"n1","exited":[{"job_id":1,"run":0,"exit_code":0,"x":1}]}',
        400,
    ),
    "a register with GPUs as a string": (
        "/v1/agent/register",
        b'{"node":"n1","gpus":"8","gpu_type":"h100"}',
        400,
    ),
}


def check(api: Api, what: str, path: str, body: bytes, want: int, token: str | None) -> None:
    before = api.head()
    status, kind, problem = api.post(path, body, token)
    assert status == want, (what, path, status, problem)
    assert kind.startswith("application/problem+json"), (what, path, kind)
    code = "too_large" if want == 413 else "invalid"
    assert problem["status"] == want and problem["code"] == code, (what, problem)
    line = problem["detail"]
    assert "\n" not in line and 0 < len(line) < 1_000, (what, line)
    assert api.head() == before, (what, path)  # nothing appended


def test_every_post_route_refuses_hostile_bodies_with_one_line(api: Api) -> None:
    for path in post_routes(api):
        token = api.node_token if path.startswith("/v1/agent/") else None
        for what, (body, want) in ANY_ROUTE.items():
            check(api, what, path, body, want, token)


@pytest.mark.parametrize("what", sorted(TARGETED))
def test_a_body_that_is_almost_right_is_refused_naming_what(api: Api, what: str) -> None:
    path, body, want = TARGETED[what]
    check(api, what, path, body, want, None)


@pytest.mark.parametrize("what", sorted(NODE))
def test_a_node_agents_bodies_are_strict_too(api: Api, what: str) -> None:
    path, body, want = NODE[what]
    check(api, what, path, body, want, api.node_token)


def test_the_error_line_names_the_field_and_the_server_goes_on(api: Api) -> None:
    status, _kind, problem = api.post("/v1/commands/submit", spoilt(gpus="2"))
    assert status == 400
    assert problem["detail"] == (
        "the body of POST /v1/commands/submit is not a valid `submit` command: "
        "Expected `int`, got `str` - at `$.gpus` (see /v1/openapi.json)"
    )
    status, _kind, problem = api.post("/v1/commands/submit", spoilt(resumable=0, labels={"a": "b"}))
    assert "got `int` - at `$.resumable`" in problem["detail"]
    before = api.head()
    status, _kind, result = api.post("/v1/commands/submit", spoilt())
    assert status == 200, result
    assert api.head() == before + 1


def test_an_unidentified_caller_is_told_so_before_anything_about_its_body(api: Api) -> None:
    status, _kind, problem = api.post("/v1/commands/submit", b"[" * DEEP, token="glt_nope")
    assert status == 401 and problem["code"] == "unauthenticated", problem


def test_the_limits_are_those_the_docs_state() -> None:
    text = (Path(__file__).parents[3] / "docs" / "server.md").read_text()
    assert f"{MAX_BODY // (1024 * 1024)} MiB" in text
