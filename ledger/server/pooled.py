"""The API's reads of the projection (`/v1/jobs`, `/v1/log`, `/v1/shares`, `/v1/usage`,
`/v1/report/delivered`, `/v1/audit/preemptions|budget-changes`: the `READS` entries marked
`pooled`) in the read pool, never on the worker thread (docs/security.md, rows T5 and T6).

One mechanism for every heavy read: the audit tables' pool (`ledger.server.readpool`), so the
same cursor of its own, lower-priority threads, time limit with interruption and per-caller
admission bound them. The worker only catches the projection up and copies who may see what
(a few microseconds); the read itself, its JSON included, is built beside it. A page is at most
`PAGE_MAX` rows (`limit`, `tail`): a client wanting more pages with `after`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from ledger.reads import layer as reads
from schemas.errors import InvalidCommand

if TYPE_CHECKING:
    import duckdb

    from ledger.history.tables import Limits
    from ledger.reads.table import ReadSpec
    from ledger.server.readpool import ReadPool
    from ledger.server.worker import Worker

PAGE_MAX = 10_000
"""The most rows one read of `jobs` or `log` answers through the server."""


@dataclass(frozen=True)
class _CursorStore:
    """What the read layer uses of a projection `Store`: its connection (here a cursor)."""

    con: duckdb.DuckDBPyConnection


@dataclass(frozen=True)
class _Live:
    state: Any


@dataclass(frozen=True)
class PooledHandles:
    """The `Handles` a pooled read runs with: the pool's cursor, a copy of what the viewer may
    see (taken on the worker), the service's clock."""

    cursor: duckdb.DuckDBPyConnection
    viewer: str
    seen: Any
    clock: Callable[[], float]

    @property
    def ledger(self) -> Any:
        return _Live(self.seen)

    def store(self) -> Any:
        return _CursorStore(self.cursor)

    def now(self) -> float:
        return self.clock()

    def foreign(self) -> Mapping[str, frozenset[int]]:
        """None known here: no pooled read shows nodes (`node list` is answered on the worker)."""
        return {}


def check_page(name: str, args: Any) -> None:
    """One line for a page larger than `PAGE_MAX`."""
    for field in ("limit", "tail"):
        asked = getattr(args, field, None)
        if name in ("jobs", "log") and asked is not None and asked > PAGE_MAX:
            raise InvalidCommand(
                f"{name} answers at most {PAGE_MAX:,} rows a page through the server, "
                f"asked for {field}={asked:,}",
                hint="page: ask again with after=<the last position>"
                if name == "log"
                else "narrow the filter (user, account, status, since)",
            )


async def answer(
    worker: Worker, pool: ReadPool, name: str, spec: ReadSpec, args: Any, viewer: str
) -> bytes:
    """The encoded answer of a pooled read for `viewer`, computed in `pool`."""
    check_page(name, args)
    service = worker.service

    def prepare() -> Any:  # on the worker: the log so far, and who may see what now
        assert service.projector is not None
        service.projector.catch_up()
        return reads.Viewer(viewer, service.ledger.state).detached().state

    seen = await worker.call(prepare)
    clock = service.clock.now

    def run(cursor: duckdb.DuckDBPyConnection, limits: Limits) -> bytes:
        import duckdb

        handles = PooledHandles(cursor, viewer, seen, clock)
        try:
            return _encode(spec.run(handles, args))
        except duckdb.InterruptException as err:
            raise InvalidCommand(
                f"the {name} read ran past its time limit of {limits.timeout_s:g} s and was "
                "stopped",
                hint="ask for a smaller window or page, or narrow the filter",
            ) from err

    data: bytes = await pool.run(viewer, run, read=True)
    return data


def _encode(value: Any) -> bytes:
    """JSON of a read's answer; a list item by item (one encode of 10,000 rows would hold the
    interpreter lock for all of them: the worker and the event loop wait meanwhile)."""
    if not isinstance(value, list):
        return msgspec.json.encode(value)
    encode = msgspec.json.Encoder().encode
    return b"[" + b",".join([encode(x) for x in value]) + b"]"
