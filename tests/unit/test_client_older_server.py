"""A newer CLI's command reaches an older server: a field the caller did not ask for is not
sent (the server fills its default), so an older server, whose commands refuse the fields they
do not know, takes it (stop51: `node remove` always sent `force` and was refused)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ledger.store.appended import Appended
from ledger.wire.client import Client
from schemas import commands as c


class RemoveNodeBefore(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="node.remove",
    forbid_unknown_fields=True,
):  # fmt: skip
    """`node.remove` as a server before `force` decodes it."""

    actor: str = ""
    node: str
    reason: str = ""


def _sent(cmd: c.AnyCommand, *, batch: bool = False) -> list[bytes]:
    bodies: list[bytes] = []
    client = Client("http://127.0.0.1:9")

    def request(method: str, path: str, body: bytes | None = None, **_: Any) -> bytes:
        assert body is not None
        bodies.append(body)
        return b'{"events": [], "position": 1}'

    client.request = request  # type: ignore[method-assign]  (the transport: what is sent)
    done = client.execute_all([cmd]) if batch else client.execute(cmd)
    assert isinstance(done, Appended)
    return bodies


@pytest.mark.parametrize("batch", [False, True])
def test_node_remove_without_force_is_taken_by_a_server_that_has_no_force(batch: bool) -> None:
    (body,) = _sent(c.RemoveNode(actor="root", node="n1", reason="gone"), batch=batch)
    one = msgspec.json.decode(body)["commands"][0] if batch else msgspec.json.decode(body)
    older = msgspec.json.decode(msgspec.json.encode(one), type=RemoveNodeBefore)
    assert older == RemoveNodeBefore(actor="root", node="n1", reason="gone")
    # and this server reads the same command back
    assert msgspec.json.decode(msgspec.json.encode(one), type=c.AnyCommand) == c.RemoveNode(
        actor="root", node="n1", reason="gone"
    )


def test_force_asked_is_sent_and_an_older_server_refuses_it_by_name() -> None:
    (body,) = _sent(c.RemoveNode(actor="root", node="n1", force=True))
    assert msgspec.json.decode(body)["force"] is True
    with pytest.raises(msgspec.ValidationError, match="force"):
        msgspec.json.decode(body, type=RemoveNodeBefore)
    assert msgspec.json.decode(body, type=c.AnyCommand) == c.RemoveNode(
        actor="root", node="n1", force=True
    )
