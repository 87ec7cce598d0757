"""Property-based API tests from the committed OpenAPI document (schemathesis) against a live
`gpuledger serve`: bounded (a few examples per operation) so CI stays fast. Whatever the input:
no 5xx, and every documented response matches its schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.integration.serverkit import Server, make_token, set_up_ledger, start_server

SCHEMA = schemathesis.openapi.from_path(
    Path(__file__).resolve().parents[2] / "schemas" / "openapi.json",
    config=SchemathesisConfig.from_dict(
        {"operations": [{"include-path": "/v1/batch", "phases": {"coverage": {"enabled": False}}}]}
    ),
)
"""Every operation with schemathesis's phases (its examples, 8 generated cases, and the coverage
phase's boundary and negative cases of each field), but `POST /v1/batch` without the coverage
phase: its body is a list of the commands, each of which but `InitLedger` is the body of its own
route (`POST /v1/commands/...`), whose coverage phase sends the same cases; the batch's own
re-sent each in a one-command list: ~8,700 requests, 131 s in CI, 231 s at load 30 (2026-12-06,
s56-suite). Its examples and generated batches stay."""


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
    server, token = live
    case.call_and_validate(
        base_url=server.url,
        headers={"Authorization": f"Bearer {token}"},
        checks=[not_a_server_error, response_schema_conformance],
        timeout=ANSWER_S,
    )


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
