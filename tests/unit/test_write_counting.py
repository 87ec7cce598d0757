"""A write counts for the reads to give way to (`pooled.Writes`, docs/security.md row T5) once
its body has arrived and its caller is known, and only on the routes that change the ledger
(issue 25: a client sending a body slowly, or a caller who is no one, or a read asked with a
body, made every page give way to a write that was not there)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ledger.server import identity as ident
from ledger.server import pooled
from ledger.server.app import SERVED_COMMANDS, error_response, offline_app
from ledger.server.commands import CommandPath
from schemas import api
from schemas.errors import NotAuthenticated


class _Worker:
    def __init__(self, writes: pooled.Writes, seen: list[int]) -> None:
        self.writes, self.seen = writes, seen

    async def execute(self, cmd: Any, key: Any) -> Any:
        self.seen.append(self.writes.under_way)
        return api.CommandResult(position=1, events=[])


def _who(uid: Any, bearer: str | None) -> ident.Identity:
    if bearer != "Bearer good":
        raise NotAuthenticated("no such token")
    return ident.Identity(actor="alice", via="token:x")


def _serve(path: str, bearer: str, body: bytes) -> tuple[list[int], list[int], int]:
    """POST `body` to `path` in two parts; the writes under way while each part arrived, and
    while the command was executed or the route served; the status."""
    writes = pooled.Writes()
    executed: list[int] = []
    path_app = CommandPath(offline_app(), _Worker(writes, executed), _who,  # type: ignore[arg-type]
                           SERVED_COMMANDS, lambda *a: None, error_response, writes)  # fmt: skip
    writes.app = path_app
    framework = path_app.app

    async def route(scope: Any, receive: Any, send: Any) -> None:  # a read asked with a body
        executed.append(writes.under_way)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    path_app.app = route if path not in path_app.commands else framework
    parts = [body[: len(body) // 2], body[len(body) // 2 :]]
    arriving: list[int] = []
    statuses: list[int] = []

    async def receive() -> Any:
        arriving.append(writes.under_way)
        await asyncio.sleep(0.01)  # a body that comes slowly
        return {"type": "http.request", "body": parts.pop(0), "more_body": bool(parts)}

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    scope = {"type": "http", "method": "POST", "path": path, "headers":
             [(b"authorization", bearer.encode()), (b"content-type", b"application/json")],
             "query_string": b"", "scheme": "http", "server": ("t", 80), "client": ("c", 1),
             "root_path": "", "app": None}  # fmt: skip
    asyncio.run(writes(scope, receive, send))
    assert writes.under_way == 0 and writes.idle.is_set()
    return arriving, executed, statuses[0]


SUBMIT = b'{"actor": "", "account": "ai2/olmo", "gpus": 1}'


def test_a_submit_counts_once_its_body_is_in_and_its_caller_known() -> None:
    arriving, executed, status = _serve("/v1/commands/submit", "Bearer good", SUBMIT)
    assert status == 200
    assert arriving == [0, 0]  # nothing counted while the body came
    assert executed == [1]  # counted while it was decided and appended


@pytest.mark.filterwarnings("ignore:Use of deprecated parameter 'app'")  # CommandPath._error's
def test_a_caller_who_is_no_one_is_never_a_write() -> None:
    arriving, executed, status = _serve("/v1/commands/submit", "Bearer bad", SUBMIT)
    assert status == 401 and executed == []
    assert arriving == []  # answered before its body was read (atk44w F4: read and decoded)


@pytest.mark.parametrize("path", ["/v1/audit/table", "/v1/budget/plan"])
def test_a_read_asked_with_a_body_is_not_a_write(path: str) -> None:
    body = (b'{"kind": "preemptions"}' if path == "/v1/audit/table"
            else b'{"name": "b.toml", "toml": ""}')  # fmt: skip
    arriving, executed, status = _serve(path, "Bearer good", body)
    assert status == 200 and arriving == [0, 0] and executed == [0]
