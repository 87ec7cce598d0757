"""Property-based API tests from the committed OpenAPI document (schemathesis) against a live
`gpuledger serve`: bounded (a few examples per operation) so CI stays fast. Whatever the input:
no 5xx, and every documented response matches its schema."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.integration.serverkit import Server, make_token, set_up_ledger, start_server

OPENAPI = Path(__file__).resolve().parents[2] / "schemas" / "openapi.json"
_DECISION = "/v1/commands/decision.apply"
SCHEMA = schemathesis.openapi.from_path(
    OPENAPI,
    config=SchemathesisConfig.from_dict(
        {
            "operations": [
                {"include-path": path, "phases": {"coverage": {"enabled": False}}}
                for path in ("/v1/batch", _DECISION)
            ]
        }
    ),
)
"""Every operation with schemathesis's phases (its examples, 8 generated cases, and the coverage
phase's boundary and negative cases of each field), but `POST /v1/batch` without the coverage
phase: its body is a list of the commands, each of which but `InitLedger` is the body of its own
route (`POST /v1/commands/...`), whose coverage phase sends the same cases; the batch's own
re-sent each in a one-command list: ~8,700 requests, 131 s in CI, 231 s at load 30 (2026-12-06,
s56-suite). Its examples and generated batches stay. `POST /v1/commands/decision.apply`'s
coverage phase is `DECISION_OWN`'s."""


def _one_policy_in_a_decision(raw: dict[str, Any]) -> dict[str, Any]:
    """The document with `decision.apply`'s decision carrying only the newest policy (or none).
    The policy is `AnyPolicyConfig`, the union of every policy version, which
    `service.configure`'s body carries too: its coverage phase sends each version's boundary and
    negative cases (~4,400 requests); the decision's re-sent them all (4,376 of its 4,780
    requests, 93 s in CI, 2026-12-06)."""
    doc = copy.deepcopy(raw)
    schemas = doc["components"]["schemas"]
    body = copy.deepcopy(schemas["DecisionBody"])
    union = body["properties"]["policy"]["anyOf"]
    body["properties"]["policy"]["anyOf"] = [union[0], *(s for s in union if "$ref" not in s)]
    command = copy.deepcopy(schemas["ApplyDecision"])
    command["properties"]["decision"] = {"$ref": "#/components/schemas/DecisionBodyOnePolicy"}
    schemas["DecisionBodyOnePolicy"], schemas["ApplyDecisionOnePolicy"] = body, command
    request = doc["paths"][_DECISION]["post"]["requestBody"]["content"]["application/json"]
    request["schema"] = {"$ref": "#/components/schemas/ApplyDecisionOnePolicy"}
    return doc


DECISION_OWN = schemathesis.openapi.from_dict(
    _one_policy_in_a_decision(json.loads(OPENAPI.read_text())),
    config=SchemathesisConfig.from_dict(
        {"phases": {"examples": {"enabled": False}, "fuzzing": {"enabled": False}}}
    ),
).include(path=_DECISION)
"""`decision.apply`'s coverage phase on its own fields and the newest policy's: the other policy
versions' cases are `service.configure`'s (`_one_policy_in_a_decision`)."""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    tmp = tmp_path_factory.mktemp("schema")
    home = tmp / "ledger"
    set_up_ledger(home, tmp)
    token = make_token(home, "--user", "root")
    server = start_server(home, "--interval", "1h")
    try:
        yield server, token
    finally:
        assert server.stop() == 0


ANSWER_S = 60
"""How long a case waits for its answer (schemathesis's own is 10 s: at load ~30 beside other
files `GET /v1/audit/verify` took longer). What is checked is the answer, not its speed
(docs/benchmarks.md)."""


@SCHEMA.parametrize()
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_5xx_and_responses_match_the_schema(
    case: schemathesis.Case, live: tuple[Server, str]
) -> None:
    _checked(case, live)


def _checked(case: schemathesis.Case, live: tuple[Server, str]) -> None:
    """One case sent to the live server: no 5xx, and the response as the schema documents."""
    server, token = live
    case.call_and_validate(
        base_url=server.url,
        headers={"Authorization": f"Bearer {token}"},
        checks=[not_a_server_error, response_schema_conformance],
        timeout=ANSWER_S,
    )


@DECISION_OWN.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_a_decisions_own_boundaries_answer_no_5xx_and_match_the_schema(
    case: schemathesis.Case, live: tuple[Server, str]
) -> None:
    """`decision.apply`'s coverage phase with one policy version in its decision (`SCHEMA`)."""
    _checked(case, live)


_HOLD = {"op": "hold", "actor": "root", "job_id": 9007199254740992}
"""A command the ledger refuses (no such job): a batch of it appends nothing."""
_INIT = {"op": "init", "actor": "root", "admin": "root"}


@pytest.mark.parametrize(
    "body",
    [
        {}, [], "batch", {"commands": None}, {"commands": "hold"}, {"commands": {}},
        {"commands": []}, {"commands": [None]}, {"commands": [{}]}, {"commands": [{"op": "nope"}]},
        {"commands": [_HOLD] * 1999}, {"commands": [_HOLD] * 2000}, {"commands": [_HOLD] * 2001},
        {"commands": [_HOLD], "extra": 1},
        {"commands": [_INIT]}, {"commands": [{"op": "init"}]},
        {"commands": [_INIT | {"actor": 1}]}, {"commands": [_INIT | {"admin": "a" * 64}]},
        {"commands": [_INIT | {"cluster": None}]}, {"commands": [_INIT | {"cluster": "c" * 64}]},
        {"commands": [_INIT | {"min_runtime_cap_s": 0}]},
        {"commands": [_INIT | {"min_runtime_cap_s": 315360001}]},
        {"commands": [_INIT | {"expected_position": 4611686018427387905}]},
        {"commands": [_INIT | {"real_actor": "r" * 65}]},
    ],
    ids=lambda body: str(body)[:40],
)  # fmt: skip
def test_the_batchs_own_boundaries_answer_no_5xx_and_match_the_schema(
    body: object, live: tuple[Server, str]
) -> None:
    """The cases of `POST /v1/batch`'s coverage phase that no command route sends (`SCHEMA`):
    the list's own (no list, empty, 1,999 / 2,000 / 2,001 commands, an item of no command) and
    `InitLedger`'s fields, which only a batch carries."""
    server, token = live
    case = SCHEMA["/v1/batch"]["POST"].Case(body=body, media_type="application/json")
    case.call_and_validate(
        base_url=server.url,
        headers={"Authorization": f"Bearer {token}"},
        checks=[not_a_server_error, response_schema_conformance],
        timeout=ANSWER_S,
    )
