"""The committed OpenAPI document (schemas/openapi.json) is what the server serves."""

from __future__ import annotations

import json
from pathlib import Path

from ledger.server.app import SERVED_COMMANDS, offline_document

COMMITTED = Path(__file__).resolve().parents[2] / "schemas" / "openapi.json"


def test_the_committed_openapi_document_matches_the_code() -> None:
    assert COMMITTED.read_bytes() == offline_document(), (
        "schemas/openapi.json drifts from the API: run `gpuledger schemas openapi`"
    )


def test_every_command_struct_has_its_route_and_every_route_needs_a_token_but_health() -> None:
    doc = json.loads(COMMITTED.read_bytes())
    for cls in SERVED_COMMANDS:
        assert f"/v1/commands/{cls.__struct_config__.tag}" in doc["paths"]
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert (path == "/v1/health") == ("security" not in op), path
