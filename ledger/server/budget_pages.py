"""The dashboard's Budget review: a manager's children with their shares, usage, owed and
delivered over the last 4 weeks (`GET /ui/api/budget`), and the review's what-if
(`POST /ui/api/budget/whatif`, `GET /ui/api/budget/whatif/turn`: `ledger.server.whatifs`).

The routes share what every page route does (`pages.Kit`: the kept answers, the catch-up, the
read pool); the page is `web/budget.js`.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, get, post
from litestar.params import FromQuery
from litestar.response import Stream

from ledger.server import children, connections, copied
from ledger.server.fairlane import FairSlot
from ledger.server.pages import WEEK_S, json_response
from ledger.server.whatifs import REVIEW_S
from schemas.errors import UnknownEntity
from schemas.units import shorten

READ_SHARE = 19
"""A what-if's work after its simulation (the projection caught up, what happened read back), as
one part in `READ_SHARE` of the simulation's: its bar says at most 95% until it answers."""

if TYPE_CHECKING:
    from litestar.handlers import HTTPRouteHandler

    from ledger.server.pages import Kit


class BudgetChild(msgspec.Struct, frozen=True, kw_only=True):
    account: str
    kind: str
    raw_shares: int
    norm_shares: float
    """Of the parent (`shares`)."""
    usage_gpu_hours: float
    """Funded GPU-hours over the period (`usage --window 28d`)."""
    owed_gpu_hours: float
    delivered_gpu_hours: float
    by_period: float | None
    """Over the period (`report delivered --window 28d --team-depth` the children's depth)."""


class BudgetView(msgspec.Struct, frozen=True, kw_only=True):
    account: str
    """Whose children are reviewed ("": the programs under the root)."""
    managed: list[str]
    start: float
    at: float
    children: list[BudgetChild]


def routes(kit: Kit) -> list[HTTPRouteHandler]:
    """The Budget review's JSON and its what-if."""
    from ledger.reads import hours
    from ledger.reads import layer as reads

    worker, handles, person, pool, kept, caught_up, stopping = kit

    @get("/ui/api/budget", include_in_schema=False)
    async def budget(
        request: Request[Any, Any, Any], account: FromQuery[str | None] = None
    ) -> Response[bytes]:
        """A manager's review: each child of `account` (default: the first the caller manages,
        else the programs) with its shares, usage, owed and delivered over the last 4 weeks."""
        caller = person(request)

        def read(h: Any) -> BudgetView:
            from projections.fairshare import UsagePolicy

            ledger = h.ledger
            store = h.store()
            managed = sorted(ledger.state.managers.get(caller.actor, ()))
            chosen = (managed[0] if managed else "") if account is None else account.strip("/")
            at = float(math.floor(h.now()))  # whole seconds: `--at` of the CLI says it
            start = at - REVIEW_S
            rows = reads.shares(store, at, UsagePolicy(window_s=WEEK_S))
            kids = [r for r in rows if (r.parent or "") == chosen]
            if chosen and not any(r.account == chosen for r in rows):
                raise UnknownEntity(
                    f"no open account {shorten(chosen)}", account=chosen, param="account"
                )
            depth = chosen.count("/") + 2 if chosen else 1
            used = {
                r.name: r.usage_gpu_hours
                for r in reads.usage(store, at, "account", UsagePolicy(window_s=REVIEW_S))
            }
            # summed per team by the engine (one bucket: the period), not one row per team and
            # hour in Python: a project's people over 28 days cost ~0.55 s of CPU (atk48-29 F8)
            view, _ = hours.bucketed_series(store, start, at, depth, REVIEW_S, under=chosen or None)
            owed = {t.team: t for t in view.teams}
            return BudgetView(
                account=chosen,
                managed=managed,
                start=start,
                at=at,
                children=[
                    BudgetChild(
                        account=r.account, kind=r.kind, raw_shares=r.raw_shares,
                        norm_shares=r.norm_shares, usage_gpu_hours=used.get(r.account, 0.0),
                        owed_gpu_hours=owed[r.account].owed_gpu_hours if r.account in owed else 0.0,
                        delivered_gpu_hours=(
                            owed[r.account].delivered_gpu_hours if r.account in owed else 0.0
                        ),
                        by_period=owed[r.account].by_period if r.account in owed else None,
                    )
                    for r in kids
                ],
            )  # fmt: skip

        return await kept(caller, "shares", ("ui.budget", caller.actor, account), read)

    started = secrets.token_hex(8)
    """This server's start, in the turn route's answers: a what-if is lost with the server
    that ran it, and a tab that saw one under way under another start knows it was lost."""
    running = FairSlot("a what-if", per_person=1, max_waiting=16)
    """One what-if at a time, the managers waiting in turn (one of a person's at a time: her
    next meanwhile gets 429); a manager re-asking as soon as hers ended kept every other
    manager's refused (atk44-25 F2)."""

    steps: dict[str, tuple[int, int]] = {}
    """How far each person's what-if under way is: (work done, its work), as its child tells
    (`scenario.expected_work`)."""

    @post("/ui/api/budget/whatif", include_in_schema=False, status_code=200)
    async def budget_whatif(
        request: Request[Any, Any, Any], stream: FromQuery[bool] = False
    ) -> Response[Any]:
        """The what-if of one child's share change over the last 4 weeks, beside what
        happened (`ledger.server.whatifs`): for whoever may set its shares; nothing written.
        `stream=true`: once it is admitted, lines of JSON (`whatifs.streamed`): where it stands
        and its step as they change (every `whatifs.FRAME_S` at least), then its answer."""
        from ledger.server import whatifs

        caller = person(request)
        ask = whatifs.parse_ask(await request.body())
        limit_s = whatifs.timeout_s()
        with connections.apart():  # one of her reads while it runs, not while the what-if does
            was, budgets, end = await copied.read(  # on the published view, never the worker
                worker, pool, caller.actor, "the what-if's check",
                lambda h: whatifs.may_ask(h.ledger.state, h.now(), caller, ask),
            )  # fmt: skip
        pool.charge_answer(caller.actor)

        if ask.shares == was:  # no change: nothing to simulate, answered at once (atk50-29 F3)
            return json_response(
                whatifs.BudgetWhatIf(account=ask.account, shares=ask.shares, was=was)
            )

        async def whole() -> tuple[Any, Any]:
            await caught_up()  # the projection caught up, beside the worker
            # a period decided by a policy this build has not: refused before the child starts
            # the what-if's own reads, in its turn of the slot (one at a time server-wide):
            # none is one of its person's reads or of everyone's (atk51-29 F2)
            await pool.compute(whatifs.policy_known(end))
            start = whatifs.period_start(end)

            def told(done: int, total: int) -> None:
                # the read of what happened after it is the last part of its work: the bar
                # stays below 100% (and keeps its figure) until the answer (atk53-29 F5)
                steps[caller.actor] = (done, total + max(1, total // READ_SHARE))
                moved.set()

            try:
                sim = await whatifs.simulate(
                    handles.ledger.home, start, end, budgets, limit_s, told
                )
                # what happened up to `end`, all of it projected: the log caught up again (a
                # cycle that began before `end` may have appended since)
                await caught_up()
                return sim, await pool.compute(whatifs.actual(start, end))
            finally:
                steps.pop(caller.actor, None)

        def answer(got: tuple[Any, Any]) -> Any:
            sim, actual = got
            report = whatifs.report(sim, actual)
            return whatifs.BudgetWhatIf(account=ask.account, shares=ask.shares, was=was,
                                        report=report)  # fmt: skip

        asked = {"account": ask.account, "shares": ask.shares}  # for her other tabs
        moved = asyncio.Event()
        if stream:  # its client's leaving cancels the stream, and with it the what-if
            running.refuse(caller.actor)  # 429 now, not a line of the stream

            def where() -> dict[str, Any]:
                ahead, running_s = running.place(caller.actor)
                done, total = steps.get(caller.actor, (None, None))
                return {"ahead": ahead, "running_s": running_s, "step": done, "steps": total}

            work = children.attended_turn(
                children.never, stopping, running, caller.actor, whole, "what-if", asked
            )
            frames = whatifs.streamed(work, where, moved, answer)
            return Stream(frames, media_type=whatifs.NDJSON, headers=whatifs.STREAM_HEADERS)
        # all of it, the wait for its turn too, stopped (its child killed) when its client left
        # or the server stops: its place and the slot free at once (atk49-29 F11, F12; atk50-29 F1)
        got = await children.attended_turn(
            request.receive, stopping, running, caller.actor, whole, "what-if", asked
        )
        return json_response(answer(got))

    @get("/ui/api/budget/whatif/turn", include_in_schema=False)
    async def budget_whatif_turn(request: Request[Any, Any, Any]) -> Response[bytes]:
        """Where the caller's what-if stands, for the page to show while it waits: how many
        go before it (the one under way counted), how long it has run and how much of its
        simulation's work is done (`step` of `steps`, None before its child tells), and which
        (`account`, `shares`; None: none under way or waiting): another tab of hers shows it
        and waits for its end (atk53-29 F6). `id`: its number in this server's start,
        `server`: that start (another after a restart), `last`: her last what-if that ended in
        the last `FairSlot.keep_s` (its `id`, `account`, `shares`, `end`: "ok", "failed" or
        "stopped", `ended_s`: how long ago; None: none): a tab that saw hers under way tells
        its end from its loss with the server (atk55-29 F1: it said it had ended)."""
        who = person(request).actor
        ahead, running_s = running.place(who)
        done, total = steps.get(who, (None, None))
        asked = running.asked(who) or {"account": None, "shares": None}
        end = running.ended(who)
        last = None if end is None else {
            "id": end.number, **end.about, "end": end.how,
            "ended_s": round(running.clock() - end.at, 1),
        }  # fmt: skip
        return json_response({"ahead": ahead, "running_s": running_s, "step": done,
                              "steps": total, **asked, "id": running.number(who),
                              "server": started, "last": last})  # fmt: skip

    return [budget, budget_whatif, budget_whatif_turn]
