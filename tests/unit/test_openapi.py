"""The committed OpenAPI document (schemas/openapi.json) is what the server serves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

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


def test_every_operation_lists_its_errors_as_problem_json() -> None:
    """Every 4xx an operation may answer is in the document, with the body it really has
    (`api.Problem`, application/problem+json): 413 where there is a body, 409 on writes."""
    doc = json.loads(COMMITTED.read_bytes())
    assert doc["components"]["schemas"]["Problem"]["required"] == [
        "title", "status", "detail", "code"
    ]  # fmt: skip
    for path, ops in doc["paths"].items():
        for op in ops.values():
            if "security" not in op:
                continue
            want = {"400", "401", "403", "404", "429", "503"}
            want |= {"413"} if "requestBody" in op else set()
            want |= (
                {"409"} if path.startswith(("/v1/commands/", "/v1/batch", "/v1/agent/")) else set()
            )
            errors = {k for k in op["responses"] if k.startswith(("4", "5"))}
            assert errors == want, (path, errors)
            for code in errors:
                content = op["responses"][code]["content"]
                assert list(content) == ["application/problem+json"], (path, code)


def test_the_served_document_is_rendered_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """It needs no identity: rendered per request it held the event loop ~0.25 s each time,
    so anyone looping it delayed every submit (issue 25)."""
    from litestar.testing import TestClient

    from ledger.server import app as app_module

    rendered: list[int] = []
    real = app_module.render_openapi

    def counted(app: Any) -> bytes:
        rendered.append(1)
        return real(app)

    monkeypatch.setattr(app_module, "render_openapi", counted)
    with TestClient(app_module.offline_app()) as client:
        answers = [client.get("/v1/openapi.json") for _ in range(3)]
    assert [a.status_code for a in answers] == [200] * 3
    assert len({a.content for a in answers}) == 1 and len(rendered) == 1
