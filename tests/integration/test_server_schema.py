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
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.integration.serverkit import Server, make_token, set_up_ledger, start_server

SCHEMA = schemathesis.openapi.from_path(
    Path(__file__).resolve().parents[2] / "schemas" / "openapi.json"
)


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
    )
