"""Red team, hostile query strings at the API (threat model row T14, docs/security.md), against a
real `gpuledger serve`: every GET route of the app (found in its routes, so a new one cannot be
forgotten, the dashboard's JSON and /metrics included) is sent what a fuzzer sends: a parameter
nobody declared, a declared one twice, values of the wrong type or in a looser text than their
type's (`5.0` for an integer, `nan` for a number, `yes` for a boolean), NUL and other control
characters, bytes that are not UTF-8, values and query strings past their limits. Each is one
problem+json line, 400 `invalid`, never a 5xx (an unidentified caller: 401 first); good queries
(the CLI's lists as repeated names, the dashboard's booleans) still answer."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ledger.server import query
from ledger.server.app import PAGE_SHELLS, offline_app
from ledger.wire.client import Client
from tests.integration.serverkit import Server, make_token, set_up_ledger, start_server


@dataclass
class Api:
    server: Server
    token: str

    def get(self, path: str, token: str | None = None) -> tuple[int, str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
        headers = {"Authorization": f"Bearer {token or self.token}"}
        conn._encode_request = lambda r: r.encode("latin-1")  # type: ignore[attr-defined]
        try:
            conn.putrequest("GET", path, skip_accept_encoding=True)
            for k, x in headers.items():
                conn.putheader(k, x)
            conn.endheaders()
            resp = conn.getresponse()
            raw = resp.read()
            kind = resp.getheader("content-type", "")
        finally:
            conn.close()
        try:
            return resp.status, kind, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, kind, raw


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("query")
    home = tmp / "ledger"
    set_up_ledger(home, tmp)
    token = make_token(home, "--user", "root")
    server = start_server(home, "--executor", "agents")
    try:
        yield Api(server, token)
    finally:
        assert server.stop() == 0


def get_routes() -> list[tuple[str, query.Schema]]:
    """Every GET route of the app with its path parameters filled, and what its query takes."""
    out = []
    gate = query.QueryGate(lambda _r: None, lambda h: bool(set(h.paths) & PAGE_SHELLS))
    for route in offline_app().routes:
        for handler in getattr(route, "route_handlers", ()):
            if "GET" not in handler.http_methods:
                continue
            path = re.sub(r"\{file_path:path\}", "app.js", route.path)
            path = re.sub(r"\{page:str\}", "queue", path)
            path = re.sub(r"\{path:str\}", "zzz", path)
            path = re.sub(r"\{\w+:int\}", "1", path)
            out.append((path, gate.schema(handler)))
    paths = {p for p, _ in out}
    assert {"/v1/jobs", "/v1/log", "/v1/report/delivered", "/metrics", "/ui/api/queue",
            "/ui/api/job/1", "/v1/agent/poll", "/v1/audit/verify"} <= paths  # fmt: skip
    return out


def one_line_400(api: Api, path: str, why: str, status: int = 400) -> None:
    got, kind, body = api.get(path)
    assert got == status, (path, why, got, body)
    assert kind.startswith("application/problem+json"), (path, why, kind)
    assert body["code"] == "invalid" and "\n" not in body["detail"], (path, why, body)


ANY_ROUTE: dict[str, str] = {
    "a NUL in a value": "zz=a%00b",
    "a NUL in a name": "z%00z=1",
    "a raw control character": "zz=a%0Ab",
    "bytes that are not UTF-8": "zz=%ff%fe",
    "a value over the limit": "zz=" + "x" * (query.MAX_VALUE + 1),
    "a query over the limit": "&".join(f"z{i}=" + "x" * 900 for i in range(20)),
    "too many parameters": "&".join(f"z{i}=1" for i in range(query.MAX_PARAMS + 1)),
    "a parameter without a value": "zz",
}


def test_every_get_route_refuses_a_hostile_query_string_with_one_line(api: Api) -> None:
    for path, schema in get_routes():
        for why, q in ANY_ROUTE.items():
            if schema.free and why == "a value over the limit":  # the page's script's (below)
                continue
            one_line_400(api, f"{path}?{q}", why)


def test_a_page_shell_takes_a_long_value_its_script_drops_and_the_api_names_it(api: Api) -> None:
    """atk61-29c F4: `/ui/queue?account=A*1025` was answered by the page route with a 400
    problem+json, raw JSON in place of the page; the page's script drops a value the API
    refuses, named by its `param`."""
    long = "A" * (query.MAX_VALUE + 1)
    for page in ("queue", "finished", "decisions", "preemptions", "budget"):
        got, kind, _body = api.get(f"/ui/{page}?account={long}&sort={long}")
        assert got == 200 and kind.startswith("text/html"), (page, got, kind)
    got, _kind, body = api.get(f"/ui/api/queue?account={long}")
    assert got == 400 and body["param"] == "account", body


def test_bytes_not_percent_encoded_are_refused_by_the_http_parser_in_one_line(api: Api) -> None:
    got, _kind, body = api.get("/v1/jobs?user=\xe9")
    assert got == 400, body
    text = body if isinstance(body, bytes) else json.dumps(body).encode()
    assert text.strip().count(b"\n") == 0, text


def test_every_get_route_refuses_an_unknown_or_repeated_parameter(api: Api) -> None:
    checked = 0
    for path, schema in get_routes():
        if schema.free:  # a page shell: its query is the browser script's
            continue
        one_line_400(api, f"{path}?nosuchparameter=1", "an unknown parameter")
        for name, param in schema.params.items():
            if not param.many:
                value = {"int": "1", "float": "1", "bool": "true"}.get(param.text, "x")
                one_line_400(api, f"{path}?{name}={value}&{name}={value}", "given twice")
                checked += 1
    assert checked >= 40


LOOSE = {
    "int": [
        "5.0",
        "1e3",
        "0x10",
        "%2B5",
        "%205",
        "five",
        "",
        "99999999999999999999999",
        "05",
        "-05",
    ],
    "float": ["nan", "inf", "-inf", "1_000", "0x1p3", "one", "", "05.5", "00"],
    "bool": ["yes", "1", "TRUE", "on", "", "True", "False"],
}


def test_every_typed_parameter_refuses_a_looser_text_than_its_type(api: Api) -> None:
    checked = 0
    for path, schema in get_routes():
        for name, param in schema.params.items():
            for value in LOOSE.get(param.text, []):
                one_line_400(api, f"{path}?{name}={value}", f"{param.text} {value!r}")
                checked += 1
    assert checked >= 100


def test_bounds_and_words_are_checked_at_the_gate(api: Api) -> None:
    for path in ("/v1/log?limit=0", "/v1/log?limit=100001", "/v1/jobs?status=zombie",
                 "/v1/jobs?since=-1", "/ui/api/queue?limit=1001", "/ui/api/queue?offset=-1",
                 "/ui/api/teams?window=1y", "/v1/report/delivered?start=0&end=1e40",
                 "/v1/jobs?job_ids=0", "/v1/agent/poll?node=n1&wait=-1",
                 "/v1/agent/poll?node=n1&wait=99999999", "/ui/api/decision/99999999999999999999",
                 "/ui/api/decision/9223372036854775808", "/ui/api/job/9223372036854775808",
                 "/ui/api/job/99999999999999999999/replay"):  # fmt: skip
        one_line_400(api, path, "out of bounds")


def test_one_gate_answers_an_integer_with_a_leading_zero(api: Api) -> None:
    """`limit=05` is refused by the gate in its own words, not by a second decoder's."""
    got, _kind, body = api.get("/v1/jobs?limit=05")
    assert got == 400, body
    assert body["message"] == "query parameter 'limit' of GET /v1/jobs is not an integer: '05'"
    assert body["hint"] == "give decimal digits without a leading zero", body


def test_an_unidentified_caller_hears_401_before_anything_about_its_query(api: Api) -> None:
    got, _kind, body = api.get("/v1/jobs?nosuchparameter=%00", token="glt_nope_nope")
    assert got == 401, body
    got, _kind, body = api.get("/v1/health?nosuchparameter=1")
    assert got == 400 and body["code"] == "invalid", body


def test_good_queries_still_answer(api: Api) -> None:
    for path in ("/v1/jobs?job_ids=1&job_ids=2&limit=5", "/v1/log?after=0&limit=5",
                 "/v1/log?tail=3", "/v1/jobs?since=0.5&status=active",
                 "/v1/jobs?reasons=time_limit&reasons=node_lost",
                 "/ui/api/queue?state=all&sort=order&descending=true&offset=0&limit=100",
                 "/ui/api/queue?descending=false", "/ui/api/teams?window=7d",
                 "/ui/queue?user=x&descending=true&mine=true", "/ui/job?id=1",
                 "/v1/queue?state=pending&limit=3", "/v1/usage?by=user&window_s=3600",
                 "/ui/api/decisions?limit=500", "/v1/health", "/ui/static/app.js",
                 "/v1/report/delivered?start=0&end=3600&team_depth=2"):  # fmt: skip
        got, _kind, body = api.get(path)
        assert got == 200, (path, body)
    client = Client(api.server.url, api.token)  # the CLI's own queries
    try:
        got = client.get("jobs", {"job_ids": [1, 2, 99], "limit": 5})
        assert {j["job_id"] for j in got} <= {1, 2} and got
        assert client.get("jobs", {"reasons": ["time_limit", "failed"]}) == []  # F2 served
        assert isinstance(client.get("log", {"after": 0, "limit": 2}), list)
    finally:
        client.close()
