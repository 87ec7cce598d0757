"""The reads the API serves, one table for both faces: the CLI runs the same function locally
(embedded) or asks the server for it (client), so `--json` is byte-identical either way.

Each read is a function `(handles, actor, args) -> result` with a typed `args` Struct (its query
parameters) and a result the codec encodes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import msgspec

from ledger.application import Ledger
from schemas.errors import InvalidCommand


class Handles(Protocol):
    """What a read may use: the ledger (folded state, the log)."""

    ledger: Ledger


class JobsArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    status: Literal["pending", "placed", "running", "finished", "active"] | None = None
    user: str | None = None
    account: str | None = None
    limit: int = msgspec.field(default=200)


class LogArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    after: int = 0
    limit: int = 100


class NoArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


def _jobs(h: Handles, actor: str, a: JobsArgs) -> list[dict[str, Any]]:
    from ledger.cli.read import job_row

    if not (0 <= a.limit <= 100_000):
        raise InvalidCommand("limit must be in 0..100000")
    selected = []
    for job in sorted(h.ledger.state.jobs.values(), key=lambda j: -j.job_id):
        if (a.status == "active" and not job.active) or (
            a.status not in (None, "active") and job.status != a.status
        ):
            continue
        if a.user and job.spec.user != a.user:
            continue
        if a.account and not (job.spec.account + "/").startswith(a.account.rstrip("/") + "/"):
            continue
        selected.append(job_row(job))
        if len(selected) >= a.limit:
            break
    return selected


def _nodes(h: Handles, actor: str, a: NoArgs) -> list[dict[str, Any]]:
    from ledger.cli.read import node_rows

    return node_rows(h.ledger.state)


def _accounts(h: Handles, actor: str, a: NoArgs) -> list[dict[str, Any]]:
    from ledger.cli.read import tree_rows

    return tree_rows(h.ledger.state)


def _log(h: Handles, actor: str, a: LogArgs) -> list[dict[str, Any]]:
    if not (0 <= a.limit <= 10_000) or a.after < 0:
        raise InvalidCommand("after must be >= 0 and limit in 0..10000")
    return [{"position": pos, "event": ev} for pos, ev in h.ledger.read(a.after, a.limit)]


@dataclass(frozen=True)
class ReadSpec:
    path: str
    args: type[msgspec.Struct]
    fn: Callable[[Any, str, Any], Any]
    returns: Any
    doc: str

    def parse(self, query: dict[str, Any]) -> Any:
        try:
            return msgspec.convert(query, self.args, strict=False)
        except msgspec.ValidationError as err:
            raise InvalidCommand(f"invalid query: {err}") from err

    def run(self, handles: Any, actor: str, args: Any) -> Any:
        return self.fn(handles, actor, args)

    def signature(self) -> list[inspect.Parameter]:
        """The query parameters as keyword parameters (for the OpenAPI document)."""
        from litestar.params import FromQuery  # only the server needs it

        return [
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=f.default,
                annotation=FromQuery[f.type],  # type: ignore[misc,name-defined]
            )
            for f in msgspec.structs.fields(self.args)
        ]


READS: dict[str, ReadSpec] = {
    "jobs": ReadSpec("jobs", JobsArgs, _jobs, list[dict[str, Any]], "Jobs, newest first."),
    "nodes": ReadSpec("nodes", NoArgs, _nodes, list[dict[str, Any]], "Nodes and free GPUs."),
    "accounts": ReadSpec(
        "accounts", NoArgs, _accounts, list[dict[str, Any]], "The budget tree, depth first."
    ),
    "log": ReadSpec("log", LogArgs, _log, list[dict[str, Any]], "The event log from a position."),
}
