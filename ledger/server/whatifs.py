"""The budget review page's what-if of a share change, run by the server (`POST
/ui/api/budget/whatif`): the last 4 weeks' submissions re-simulated with one child's shares
changed (`ledger.sim.whatif`, what `gpuledger whatif --budgets` runs), against the same
simulation with no change (the period simulated twice: the change's effect is the difference
between the two; atk49-29 F1), what happened beside them.

- **Who may**: whoever may set that account's shares (the manager of its parent's subtree, an
  admin): the change is planned as budgets as code plans it and tried on a copy of the state
  through `decide` (`budget.check`, the one authorisation table). Nothing is appended: a
  what-if never writes a budget.
- **Off the worker**: the simulation runs in a child process below the server's priority
  (`ledger.server.children.lowered`); what happened (`team_metrics` of the projection) in
  the read pool.
- **Decided once a minute** of the period (`STEP_S`, `gpuledger whatif --step 1m`), said in
  the answer's notes: the decisions are bounded by the period, not by its events.
- **Bounded**: one what-if at a time (another meanwhile: 429), stopped at `timeout_s()`
  (`GPULEDGER_WHATIF_TIMEOUT`, seconds; default 300) with one line saying so (503).

`main()` is the child: it reads a `_Job` on stdin and writes the `Simulated` side on stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ledger.core import budget as b
from ledger.server import children
from ledger.sim import whatif as wi
from schemas import commands as c
from schemas.bounds import AccountPath, Shares
from schemas.errors import InvalidCommand, NotAuthorised, Unavailable, UnknownEntity

log = logging.getLogger("gpuledger.server")

TIMEOUT_ENV = "GPULEDGER_WHATIF_TIMEOUT"
TIMEOUT_S = 300.0
REVIEW_S = 28 * 86400.0
"""The longest period a what-if re-simulates: the budget review's last 4 weeks."""
STEP_S = 60.0
"""The page's what-if decides once a minute of the period (`gpuledger whatif --step 1m`), not
at every submission and exit: deciding at each of 10,000 submissions a second apart, over a
queue growing to 10,000, took 265 s or ran past the time limit (atk48-29 F2). Said in its
notes and its `step_s`."""


class WhatIfAsk(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The page's question: `account` with `shares` in place of its own."""

    account: AccountPath
    shares: Shares


class BudgetWhatIf(msgspec.Struct, frozen=True, kw_only=True):
    account: str
    shares: int
    was: int
    """The account's shares in the ledger now."""
    report: wi.WhatIfReport | None = None
    """What `gpuledger whatif --budgets FILE --from START --to END --json` prints, FILE
    holding this one change; None when `shares` is `was` (no change: nothing simulated, the
    answer at once; it simulated the period twice, 107 s at 4 weeks, to show no difference:
    atk50-29 F3)."""


class _Job(msgspec.Struct, frozen=True):
    home: str
    parent: int
    start: float
    end: float
    where: str
    budgets: b.BudgetFile
    step_s: float | None = STEP_S


def timeout_s() -> float:
    """The what-if's time limit: `GPULEDGER_WHATIF_TIMEOUT` when set (a positive number)."""
    text = os.environ.get(TIMEOUT_ENV, "")
    if not text:
        return TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value != value or value == float("inf"):
        raise InvalidCommand(f"invalid {TIMEOUT_ENV} {text!r}", hint="give a positive number")
    return value


def parse_ask(body: bytes) -> WhatIfAsk:
    """The request body, or one InvalidCommand line naming what is wrong."""
    from schemas.bounds import describe

    hint = 'send {"account": "PATH", "shares": N} (N a whole number, 0-1000000000)'
    try:
        ask = msgspec.json.decode(body, type=WhatIfAsk)
    except msgspec.ValidationError as err:
        detail, data = str(err), None
        with contextlib.suppress(Exception):  # the offending value named, when it reads back
            data = msgspec.json.decode(body)
            detail = describe(err, data)
        if isinstance(data, dict) and data.get("shares") is None:  # the page's empty box
            raise InvalidCommand(
                "invalid what-if: no shares given; type a whole number from 0 to 1000000000"
            ) from err
        raise InvalidCommand(f"invalid what-if: {detail[:200]}", hint=hint) from err
    except (msgspec.DecodeError, RecursionError) as err:
        raise InvalidCommand(
            f"invalid what-if: the body is not JSON ({str(err)[:120]})", hint=hint
        ) from err
    if "\x00" in ask.account:  # as every POST body with a NUL in a string (docs/server.md)
        raise InvalidCommand("invalid what-if: a NUL character is refused in any string", hint=hint)
    return ask


def may_ask(state: Any, now: float, caller: Any, ask: WhatIfAsk) -> tuple[int, b.BudgetFile, float]:
    """In the read pool, on the published view of the live state (`state` at `now`): the
    account's shares, the budget file of the change, and the end of the period (`now`, in
    whole seconds); NotAuthorised unless the caller may set those shares (the change tried on
    a copy of the state through `decide`: nothing is appended, no id kept)."""
    from ledger.server import identity as ident
    from ledger.store.clock import random_ids

    change = c.SetShares(actor="", account=ask.account, shares=ask.shares, reason="what-if")
    unknown(state, caller.actor, ask.account)
    # who may first (a caller refused learns nothing of the account), then an open account
    b.check(state, [ident.act(caller, change)], now, random_ids())
    acct = state.accounts[ask.account]
    end = float(math.floor(now))
    budgets = b.BudgetFile(
        accounts={ask.account: b.BudgetAccount(kind=acct.kind, shares=ask.shares)}
    )
    return acct.shares, budgets, end


def unknown(state: Any, actor: str, account: str) -> None:
    """Pure: an account that does not exist, said as such (404, its whole name) to whoever may
    ask a what-if at all (an admin, or a manager of some account: every page answers "no
    account" for it); to anyone else 403 with no name (the shares check said "it needs a manager
    of '<b>x<'", the parent cut at a '/' inside the name: atk61-29a F6)."""
    if account in state.accounts:
        return
    if state.is_admin(actor) or state.managers.get(actor):
        raise UnknownEntity(f"no account {account!r}", hint="see `gpuledger account tree`")
    raise NotAuthorised(
        f"{actor!r} may not ask a what-if: only managers and admins may", actor=actor
    )


def period_start(end: float) -> float:
    """Where the what-if's period starts: the last 4 weeks before `end` (whole seconds). The
    changes of the organisation during the period (an account opened anywhere, members, shares)
    are made again at their recorded times in the what-if (`ledger.sim.scenario`), so none
    shortens it."""
    return end - REVIEW_S


def actual(start: float, end: float) -> Callable[[Any, Any], dict[str, wi.TeamMetrics]]:
    """In the read pool: what happened over [start, end), per team (`team_metrics`)."""

    def run(cursor: Any, limits: Any) -> dict[str, wi.TeamMetrics]:
        import duckdb

        try:
            store: Any = _Cursor(cursor)  # what `team_metrics` reads of a Store
            return wi.team_metrics(store, start, end)
        except duckdb.InterruptException as err:
            raise Unavailable(
                f"the what-if's reading of what happened ran past its time limit of "
                f"{limits.timeout_s:g} s and was stopped",
                hint="retry when the server is less busy",
            ) from err

    return run


def policy_known(end: float) -> Callable[[Any, Any], None]:
    """In the read pool, before any what-if starts: InvalidCommand at once, in one whole
    sentence, when the period's last decision before `end` (the policy the what-if decides it
    with, `ledger.sim.scenario`) names a policy version this build has no code for. (Found by
    the child after 31 s, it was a 503 whose message was cut mid-word: atk47-29 F7.)"""

    def run(cursor: Any, _limits: Any) -> None:
        from projections.history import decisions
        from schemas.policy import known_version, unknown_version

        last = decisions(cursor, until=end, limit=1)
        version = str(last[0][4]) if last else ""
        if version and not known_version(version):
            why = unknown_version(version)
            raise InvalidCommand(
                f"the what-if decides the period again with the policy its decisions recorded, "
                f"and {why.message.removeprefix('this decision needs ')}",
                hint="a what-if needs a period decided by a policy of this build; `gpuledger "
                "whatif --policy NAME` on a copy of the data directory decides it with another",
            )

    return run


def one_line(text: str, most: int = 1_000) -> str:
    """`text` as one line of at most `most` characters, cut between words with "…" when it is
    longer (a cut mid-word read as a garbled name: atk47-29 F7)."""
    flat = " ".join(text.split())
    if len(flat) <= most:
        return flat
    return flat[: flat.rfind(" ", 0, most)].rstrip(",;:") + " …"


@dataclass(frozen=True)
class _Cursor:
    """What `team_metrics` uses of a projection `Store`: its connection (a pool's cursor)."""

    con: Any


report = wi.report


SCRATCH = "tmp"
"""The what-ifs' directories: `<home>/tmp/whatif-*` (0700), the server's own."""


def sweep(home: Path) -> int:
    """At the server's start (the one server of its data directory, so no what-if runs): remove
    the what-if directories a server killed mid what-if left; how many there were."""
    gone = 0
    for left in sorted((home / SCRATCH).glob("whatif-*")):
        shutil.rmtree(left, ignore_errors=True)
        gone += 1
    if gone:
        log.info("removed %d what-if directories left by a server that was stopped mid what-if",
                 gone)  # fmt: skip
    return gone


async def simulate(
    home: Path,
    start: float,
    end: float,
    budgets: b.BudgetFile,
    limit_s: float,
    progress: Callable[[int, int], None] | None = None,
) -> wi.Simulated:
    """The what-if side over [start, end) in a child process, in a directory of its own under
    `<home>/tmp` that is removed after (whatever happened to the child), or at the server's
    next start (`sweep`) when the server was killed meanwhile. A failure or a timeout is
    logged (the answer's hint points there). `progress(done, total)`: the simulation's work
    (both runs', `scenario.expected_work`) as the child tells it."""
    scratch = home / SCRATCH
    scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
    where = Path(tempfile.mkdtemp(prefix="whatif-", dir=scratch))
    try:
        job = _Job(str(home), os.getpid(), start, end, str(where / "ledger"), budgets)
        try:
            ask = msgspec.msgpack.encode(job)
            out = await children.run("ledger.server.whatifs", ask, limit_s, progress)
        except RuntimeError as err:  # the child failed: its last line, as one line
            log.warning("what-if of %s failed: %s", _asked(budgets), err)
            raise Unavailable(
                f"the what-if failed: {one_line(str(err))}", hint="see the server's log"
            ) from err
        except children.TimedOut as err:
            log.warning("what-if of %s ran past its time limit of %g s (%s) and was stopped",
                        _asked(budgets), limit_s, TIMEOUT_ENV)  # fmt: skip
            raise Unavailable(
                f"the what-if ran past its time limit of {limit_s:g} s and was stopped",
                hint=f"an admin may raise the server's {TIMEOUT_ENV}; or run `gpuledger whatif "
                "--budgets FILE --from START --to END --home COPY` on a copy of the data "
                "directory taken with the server stopped (beside a running server it is refused)",
            ) from err
        return msgspec.msgpack.decode(out, type=wi.Simulated)
    finally:
        shutil.rmtree(where, ignore_errors=True)


NDJSON = "application/x-ndjson"
STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
"""A streamed what-if's headers: nothing keeps it, and nginx passes each line on at once."""
FRAME_S = 2.0
"""A streamed what-if says where it stands at least this often: a proxy's read timeout (nginx
`proxy_read_timeout`, per read) is never reached while it waits its turn or runs (atk50-29
F2: nothing was sent until the answer, and several what-ifs in line could pass 360 s)."""
STEP_S = 0.25
"""And at most this often when only its step moved."""


async def streamed(
    work: Awaitable[Any],
    where: Callable[[], dict[str, Any]],
    moved: asyncio.Event,
    answer: Callable[[Any], Any],
) -> AsyncIterator[bytes]:
    """The lines of a streamed what-if: `{"turn": where()}` at once, each time its step moved
    (`moved`) and every `FRAME_S`; then `{"result": answer(what work gave)}`, or
    `{"error": {status, code, detail}}` (the status the plain answer would have had). Closed
    early (its client left), `work` is cancelled: its child killed, its place freed."""
    from ledger.server.app import status_of_any
    from schemas.errors import LedgerError

    task = asyncio.ensure_future(work)
    try:  # (its client gone in its first steps: `work` cancelled too, atk51-29 F3)
        for _ in range(4):  # its first steps: in line (or under way) before the first line says so
            await asyncio.sleep(0)
        while not task.done():
            yield msgspec.json.encode({"turn": where()}) + b"\n"
            moved.clear()
            waking = asyncio.ensure_future(moved.wait())
            try:  # (its client gone mid-wait: cancelled too, never left pending, atk51-29 F3)
                await asyncio.wait({task, waking}, timeout=FRAME_S, return_when="FIRST_COMPLETED")
            finally:
                waking.cancel()
            if not task.done() and moved.is_set():
                await asyncio.wait({task}, timeout=STEP_S)
        frame: dict[str, Any] = {"result": answer(task.result())}
    except Exception as err:  # said in the stream: its status is sent already
        known = isinstance(err, LedgerError)
        if not known:
            log.exception("a streamed what-if failed")
        detail = err.line() if isinstance(err, LedgerError) else "internal error"
        code = err.code if isinstance(err, LedgerError) else "internal"
        frame = {"error": {"status": status_of_any(err), "code": code, "detail": detail}}
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    yield msgspec.json.encode(frame) + b"\n"


def _asked(budgets: b.BudgetFile) -> str:
    return ", ".join(f"{k} shares {a.shares}" for k, a in budgets.accounts.items()) or "no change"


def main() -> None:
    """The child: read the job, simulate the period, write the what-if side."""
    job = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=_Job)
    children.enter(job.parent)
    from schemas.errors import LedgerError

    said: list[int] = []
    try:
        sim = wi.simulate_period(
            Path(job.home), job.start, job.end, Path(job.where), budgets=job.budgets,
            step_s=job.step_s, baseline=Path(job.where).parent / "baseline",
            progress=lambda done, total: children.tell(done, total, said),
        )  # fmt: skip
    except LedgerError as err:  # one line for the server to answer with
        sys.stderr.write(err.line() + "\n")
        sys.exit(2)
    sys.stdout.buffer.write(msgspec.msgpack.encode(sim))


if __name__ == "__main__":
    main()
